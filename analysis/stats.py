"""Statistics for the tables: a 95 % confidence interval of a mean over seeds, a paired test of two
cells, Benjamini-Hochberg within a table, and from them each table's marks and bold cells. Every
statistic is scipy.stats'; nothing here computes a test by hand.

Pairing. Runs with the same seed share the data partition and the initial model, so two cells of
one comparison group (a column: one data setting; in analysis.fedl2p a row) pair by seed, and
their per-client accuracies by (seed, client). `paired_test`:
- 5 or more common seeds: paired t-test (`scipy.stats.ttest_rel`) on the per-seed mean accuracies;
- fewer (the quick studies have 3): Wilcoxon signed-rank test (`scipy.stats.wilcoxon`) over the
  (client, seed) pairs of final per-client accuracies (`final_accuracies`). The clients of one run
  are treated as independent pairs: a rule of the project, weaker than a test over seeds;
- all differences zero: p = 1; fewer than 2 pairs, or fewer than 5 seeds without per-client
  accuracies: no test (p NaN), so no mark.

Within one table (`compare`) the distinct pairs of cells tested (against a reference, against the
best) are one family, corrected with Benjamini-Hochberg (`scipy.stats.false_discovery_control`;
scipy 1.17 has no Holm procedure), alpha = 0.05; a pair tested for both purposes (a cell against a
reference that is also the best) counts once and gets one adjusted p, so a mark and bold never
disagree about it:
- marks: every cell against each reference present in its group; "▲"/"▼" significantly
  better/worse than the first reference, "△"/"▽" than the second (LaTeX: amssymb's
  \\blacktriangle, \\blacktriangledown, \\vartriangle, \\triangledown as superscripts);
- bold: the best cell of its group (or of the table) and every cell not significantly worse than
  it; a cell that has no test against the best is bold only where it prints the best value.
`Verdict.summary` gives the rows of `<tables>/summary.parquet` (`write_summary`).
"""
from __future__ import annotations

import math
import warnings
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
from scipy import stats as scipy_stats

from fl_core.results import across_seeds, write_parquet

from .load import load_rounds

ALPHA = 0.05
CONFIDENCE = 0.95
T_TEST_SEEDS = 5                 # fewer common seeds: Wilcoxon over (client, seed) pairs
T_TEST, WILCOXON = "paired t-test", "Wilcoxon signed-rank"
SAME = 1e-12                     # paired values closer than this count as equal
MARKS = (("▲", "▼"), ("△", "▽"))  # (better, worse) against the first and the second reference
LATEX_MARKS = {"▲": r"$^{\blacktriangle}$", "▼": r"$^{\blacktriangledown}$", "△": r"$^{\vartriangle}$",
               "▽": r"$^{\triangledown}$"}  # amssymb
SUMMARY = "summary.parquet"
SUMMARY_COLUMNS = ("table", "row", "column", "mean", "std", "n", "ci_low", "ci_high", "reference", "p_value",
                   "p_adjusted", "test", "pairs", "marked", "bold")


def mean_ci(values, confidence: float = CONFIDENCE) -> tuple[float, float]:
    """The t interval (`scipy.stats.t.interval`, standard error `scipy.stats.sem`) of the mean of
    the finite `values` (e.g. one accuracy per seed); NaN for fewer than 2 values, the mean itself
    when they are all equal."""
    array = np.asarray(values, dtype=float)
    array = array[np.isfinite(array)]
    if array.size < 2:
        return math.nan, math.nan
    mean = across_seeds(array)[0]
    if np.all(array == array[0]):
        return mean, mean
    low, high = scipy_stats.t.interval(confidence, array.size - 1, loc=mean, scale=scipy_stats.sem(array))
    return float(low), float(high)


def final_accuracies(rounds: pd.DataFrame, column: str = "acc", pool: str = "seen") -> pd.DataFrame:
    """Each run's per-client `column` at its last round where a client of `pool` has it ("seen":
    rows whose pool is not "unseen"; "unseen"): columns `run` (the config hash), `client`, `value`."""
    pools = rounds["pool"].fillna("seen") if "pool" in rounds else pd.Series("seen", index=rounds.index)
    scored = rounds[pools.eq("unseen").eq(pool == "unseen") & rounds[column].notna()]
    final = scored[scored["round"] == scored.groupby("config_hash")["round"].transform("max")]
    return pd.DataFrame({"run": final["config_hash"].to_numpy(), "client": final["client"].to_numpy(),
                         "value": final[column].astype(float).to_numpy()})


def load_final_accuracies(paths, runs: Iterable) -> pd.DataFrame | None:
    """`final_accuracies` of the seen clients of the runs (config hashes) at `paths`; None for none."""
    hashes = {h for h in runs if isinstance(h, str)}
    if not hashes:
        return None
    rounds = load_rounds(paths, columns=["acc", "pool"], trials=hashes, labels=False)
    return final_accuracies(rounds) if not rounds.empty and "acc" in rounds else None


@dataclass(frozen=True)
class Samples:
    """One cell's values to pair: per seed (index: seed), and per (seed, client) where known."""
    seeds: pd.Series
    clients: pd.Series | None = None


@dataclass(frozen=True)
class Test:
    """A paired test of cell a against cell b: p NaN and test "" where none was possible."""
    p: float
    test: str
    pairs: int
    seeds: int    # common seeds
    diff: float   # mean of the paired differences a - b


def paired_test(a: Samples, b: Samples) -> Test:
    """The test of the module docstring for cells a and b of one group."""
    common = a.seeds.index.intersection(b.seeds.index)
    if len(common) >= T_TEST_SEEDS:
        x, y, test = a.seeds[common], b.seeds[common], T_TEST
    elif a.clients is not None and b.clients is not None:
        pairs = a.clients.index.intersection(b.clients.index)
        x, y, test = a.clients[pairs], b.clients[pairs], WILCOXON
    else:
        return Test(math.nan, "", 0, len(common), math.nan)
    x, y = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    if x.size < 2:
        return Test(math.nan, "", int(x.size), len(common), math.nan)
    differences = np.where(np.abs(x - y) < SAME, 0.0, x - y)  # float noise of a mean is no difference
    if not differences.any():
        return Test(1.0, test, int(x.size), len(common), 0.0)
    with warnings.catch_warnings():  # differences that are all alike: scipy warns, p is still right
        warnings.simplefilter("ignore", RuntimeWarning)
        p = scipy_stats.ttest_rel(x, y).pvalue if test == T_TEST else scipy_stats.wilcoxon(differences).pvalue
    if not np.isfinite(p):
        return Test(math.nan, "", int(x.size), len(common), math.nan)
    return Test(float(p), test, int(x.size), len(common), float(np.mean(x - y)))


def cell_samples(runs: pd.DataFrame, finals: pd.DataFrame | None = None) -> dict[tuple, Samples]:
    """(row, column) -> Samples of the cell: the mean `value` of its runs per seed and, through
    `run`, the mean per (seed, client) of their `finals`."""
    seeds = runs.groupby(["row", "column", "seed"], sort=False)["value"].mean()
    clients = {}
    if finals is not None and "run" in runs and not finals.empty:
        joined = runs[["row", "column", "seed", "run"]].merge(finals, on="run")
        per_client = joined.groupby(["row", "column", "seed", "client"], sort=False)["value"].mean()
        clients = {key: part.droplevel([0, 1]) for key, part in per_client.groupby(level=[0, 1], sort=False)}
    return {key: Samples(part.droplevel([0, 1]), clients.get(key))
            for key, part in seeds.groupby(level=[0, 1], sort=False)}


def _span(values) -> str:
    low, high = int(min(values)), int(max(values))
    return f"{low}" if low == high else f"{low}–{high}"


@dataclass
class Verdict:
    """What `compare` found: `cells` (row, column, mean, std, n, ci_low, ci_high, marks, bold) and
    `comparisons` (row, column, kind "reference" or "best", against, the `Test` fields, p_adjusted,
    direction +1/-1 where significant, else 0)."""
    cells: pd.DataFrame
    comparisons: pd.DataFrame
    references: tuple[str, ...]
    within: str
    best: str

    family: int = 0  # distinct pairs of cells tested: the size of the Benjamini-Hochberg family

    def lookup(self, field: str) -> dict:
        """(row, column) -> `field` of each cell."""
        return dict(zip(zip(self.cells["row"], self.cells["column"]), self.cells[field]))

    def frame(self, field: str, index, columns, fill) -> pd.DataFrame:
        """`field` of the cells laid out as index x columns (`fill` where there is no cell)."""
        out = pd.DataFrame(fill, index=index, columns=columns)
        found = self.lookup(field)
        for i, row in enumerate(out.index):
            for j, column in enumerate(out.columns):
                if (row, column) in found:
                    out.iat[i, j] = found[(row, column)]
        return out

    def caption(self, ranked: str = "") -> str:
        """What the marks and bold mean and which tests and corrections gave them; `ranked`: the
        columns bold is decided in, where not all (e.g. "after fine-tuning")."""
        tested = self.comparisons[self.comparisons["p_value"].notna()]
        counts = tested["kind"].value_counts()
        parts = [self._legend(counts.get("reference", 0))] if self.references else []
        best = f"Bold{', ' + ranked if ranked else ''}: " + \
            (f"the best of its {self.within}" if self.best == "group" else "the best cell of the table")
        if counts.get("best", 0):
            parts.append(f"{best} and every cell not significantly worse than it ({self._correction()}); a cell "
                         f"without a paired test only where it prints the best value.")
        else:
            parts.append(f"{best}{' and every cell that prints its value' if len(self.comparisons) else ''}.")
        tests = [f"{T_TEST} on the per-seed mean accuracies over {_span(tested.loc[tested['test'] == T_TEST, 'seeds'])} "
                 f"common seeds"] if (tested["test"] == T_TEST).any() else []
        if (tested["test"] == WILCOXON).any():
            tests.append(f"{WILCOXON} test over {_span(tested.loc[tested['test'] == WILCOXON, 'pairs'])} (client, seed) "
                         f"pairs of final per-client accuracies (fewer than {T_TEST_SEEDS} common seeds)")
        if tests:
            parts.append(f"Tests: {'; '.join(tests)}; a seed pairs runs with the same partition and initial model.")
        elif len(self.comparisons):
            parts.append(f"No paired test was possible (fewer than {T_TEST_SEEDS} common seeds and no per-client "
                         f"accuracies).")
        return " ".join(parts)

    def _correction(self) -> str:
        """The one family the marks and bold share (`compare`), as the captions say it."""
        return (f"p < {ALPHA:g} after Benjamini–Hochberg over the table's {self.family} distinct paired "
                f"comparisons, with the references and with the best")

    def _legend(self, tested: int) -> str:
        """The marks' sentence: which reference each mark is against, the correction, and the
        groups a reference is missing from."""
        legend = [f"{up}/{down}: significantly better/worse than {ref}" if i == 0 else f"{up}/{down}: than {ref}"
                  for i, ((up, down), ref) in enumerate(zip(MARKS, self.references))]
        other = "row" if self.within == "column" else "column"
        groups = set(self.cells[self.within])
        notes = [self._correction()] if tested else []
        for ref in self.references:
            has = set(self.cells.loc[self.cells[other] == ref, self.within])
            if not has:
                notes.append(f"{ref} is not in this table: no marks against it")
            elif groups - has:
                notes.append(f"{ref} is missing from {len(groups - has)} {self.within}(s): no marks there")
        return ", ".join(legend) + f", in the same {self.within}" + (f" ({'; '.join(notes)})" if notes else "") + "."

    def summary(self, table: str) -> pd.DataFrame:
        """The rows of summary.parquet for this table: one per (cell, reference) (one per cell
        when the table has no reference), accuracies as fractions; `marked`: "better", "worse" or
        ""; row and column labels as text."""
        found = {(c.row, c.column, c.against): c for c in self.comparisons.itertuples(index=False)
                 if c.kind == "reference"}
        rows = []
        for cell in self.cells.itertuples(index=False):
            for ref in self.references or (None,):
                test = found.get((cell.row, cell.column, ref))
                rows.append({"table": table, "row": _text(cell.row), "column": _text(cell.column), "mean": cell.mean,
                             "std": cell.std, "n": int(cell.n), "ci_low": cell.ci_low, "ci_high": cell.ci_high,
                             "reference": ref, "p_value": test.p_value if test else math.nan,
                             "p_adjusted": test.p_adjusted if test else math.nan, "test": test.test if test else "",
                             "pairs": test.pairs if test else 0, "bold": bool(cell.bold),
                             "marked": {1: "better", -1: "worse"}.get(test.direction if test else 0, "")})
        return pd.DataFrame(rows, columns=list(SUMMARY_COLUMNS))


def _text(label) -> str:
    parts = label if isinstance(label, tuple) else (label,)
    return " / ".join(f"{p:g}" if isinstance(p, (float, np.floating)) else str(p) for p in parts)


def compare(runs: pd.DataFrame, finals: pd.DataFrame | None = None, references: Sequence[str] = (),
            within: str = "column", best: str = "group", ranked: Collection | None = None) -> Verdict:
    """Marks and bold of one table (see the module docstring). `runs`: one row per run in a cell,
    columns `row`, `column`, `seed`, `value` (its final accuracy) and optionally `run`, the key of
    its per-client values in `finals` (columns run, client, value). `within` "column": the groups
    are the columns and a reference names a row; "row": the other way. `best` "group" or "table":
    where the best cell is taken. `ranked`: the groups in which bold is decided (None: all)."""
    if len(references) > len(MARKS):
        raise ValueError(f"at most {len(MARKS)} references per table, got {list(references)}")
    runs = runs[runs["value"].notna()]
    samples = cell_samples(runs, finals)
    values = runs.groupby(["row", "column"], sort=False)["value"].agg(list)
    cells = pd.DataFrame([{"row": r, "column": c, **dict(zip(("mean", "std", "n"), across_seeds(v))),
                           **dict(zip(("ci_low", "ci_high"), mean_ci(v)))} for (r, c), v in values.items()],
                         columns=["row", "column", "mean", "std", "n", "ci_low", "ci_high"])
    group_of = (lambda key: key[1]) if within == "column" else (lambda key: key[0])
    comparisons = []
    for key in samples:
        for ref in references:
            other = (ref, key[1]) if within == "column" else (key[0], ref)
            if other != key and other in samples:
                comparisons.append({"row": key[0], "column": key[1], "kind": "reference", "against": ref,
                                    "pair": frozenset((key, other)), **vars(paired_test(samples[key], samples[other]))})
    means, ranked, scopes, best_of = dict(zip(zip(cells["row"], cells["column"]), cells["mean"])), ranked, {}, {}
    for key in samples:
        if ranked is None or group_of(key) in ranked:
            scopes.setdefault(group_of(key) if best == "group" else "table", []).append(key)
    for keys in scopes.values():
        top = max(keys, key=lambda k: means[k])  # the first of equal means
        for key in keys:
            best_of[key] = top
            if key != top:
                comparisons.append({"row": key[0], "column": key[1], "kind": "best", "against": _text(top),
                                    "pair": frozenset((key, top)), **vars(paired_test(samples[key], samples[top]))})
    comparisons = pd.DataFrame(comparisons, columns=["row", "column", "kind", "against", "pair", "p", "test", "pairs",
                                                     "seeds", "diff"]).rename(columns={"p": "p_value"})
    pairs = comparisons[comparisons["p_value"].notna()].drop_duplicates("pair")  # the table's one family
    adjusted = dict(zip(pairs["pair"], scipy_stats.false_discovery_control(pairs["p_value"].to_numpy(dtype=float))
                        if len(pairs) else []))
    comparisons["p_adjusted"] = [adjusted.get(pair, math.nan) for pair in comparisons["pair"]]
    comparisons = comparisons.drop(columns="pair")
    significant = comparisons["p_adjusted"] < ALPHA
    comparisons["direction"] = np.where(significant, np.sign(comparisons["diff"].fillna(0)), 0).astype(int)
    marks, bold = {}, {}
    for c in comparisons.itertuples(index=False):
        key, i = (c.row, c.column), references.index(c.against) if c.kind == "reference" else -1
        if i >= 0 and c.direction:
            marks.setdefault(key, {})[i] = MARKS[i][c.direction < 0]
        elif c.kind == "best":
            shown = round(100 * means[key], 1) == round(100 * means[best_of[key]], 1)
            bold[key] = shown if math.isnan(c.p_value) else c.direction >= 0
    keys = list(zip(cells["row"], cells["column"]))
    cells["marks"] = ["".join(m for _, m in sorted(marks.get(k, {}).items())) for k in keys]
    cells["bold"] = [bold.get(k, best_of.get(k) == k) for k in keys]
    return Verdict(cells, comparisons, tuple(references), within, best, len(pairs))


def write_summary(frames: Iterable[pd.DataFrame], out) -> Path | None:
    """`<out>/summary.parquet` from the tables' `Verdict.summary` rows, atomically (temp file and
    rename: fl_core.results.write_parquet); None when no table has a cell."""
    frames = [f for f in frames if f is not None and not f.empty]
    return write_parquet(pd.concat(frames, ignore_index=True), Path(out) / SUMMARY) if frames else None
