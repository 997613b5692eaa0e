"""Statistics for the tables: a 95 % confidence interval of a mean over seeds, the paired
difference of two cells with its interval and test, Benjamini-Hochberg within a table, and from
them each table's marks and bold cells. The tests are scipy.stats' (through analysis.paired).

Pairing. Runs with the same seed share the data partition and the initial model, so two cells of
one comparison group (a column: one data setting; in analysis.fedl2p a row) pair by seed: the
seed is the unit. The clients of one run are not independent samples (they share the model and
the seed's partition), so no test is ever made over (client, seed) pairs. `paired_comparison`:
- the difference: the mean over the common seeds of the paired per-seed differences a - b
  (`analysis.paired.difference`), with a 95 % interval;
- 5 or more common seeds (`analysis.paired.MIN_SEEDS`): the paired t-test on the per-seed means,
  and the t interval; only such a test gives a mark or a "significantly worse" (identical cells:
  p = 1);
- 2-4 common seeds: no test, so no mark; the interval is descriptive, the hierarchical bootstrap
  (`analysis.paired.hierarchical_bootstrap`: seeds, then clients within a seed) of the
  per-(seed, client) differences of the final accuracies where every common seed has them
  (`final_accuracies`), else the t interval; 1 common seed: the difference alone; none: nothing.

Within one table (`compare`) the distinct pairs of cells tested (against a reference, against the
best) are one family, corrected with Benjamini-Hochberg (`scipy.stats.false_discovery_control`),
alpha = 0.05; a pair tested for both purposes (a cell against a reference that is also the best)
counts once and gets one adjusted p, so a mark and bold never disagree about it:
- marks: every cell against each reference present in its group; "▲"/"▼" significantly
  better/worse than the first reference, "△"/"▽" than the second (LaTeX: amssymb's
  \\blacktriangle, \\blacktriangledown, \\vartriangle, \\triangledown as superscripts);
- bold: the best cell of its group (or of the table) and every cell not significantly worse than
  it; a cell without a test against the best (fewer than 5 common seeds) is bold only where it
  prints the best value.

Divergence is a result, not a number: a run marked `diverged` (fl_core.results.divergence: its
training loss was lost, or its accuracy fell to chance after learning) is left out of its cell's
mean, std, n and interval and out of every comparison (two cells pair over their common seeds where
neither run diverged); the cell counts it (`diverged`), is never bold (nor the best others are
tested against), and the caption says so once (`DIVERGED_NOTE`).

Which round. A run's accuracy is the one its trial row reports (`acc_mean`: the last evaluated
round, or with `report_round` "best_val" the round with the best mean validation accuracy,
`reported_round`); the per-client values behind a bootstrap are taken at that same round
(`final_accuracies` with `analysis.load.reported_rounds`).
`Verdict.summary` gives the rows of `<tables>/summary.parquet` (`write_summary`), each with the
difference against its reference and its interval.
"""
from __future__ import annotations

import math
import warnings
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, fields
from pathlib import Path

import numpy as np
import pandas as pd
from scipy import stats as scipy_stats

from fl_core.results import across_seeds, write_parquet

from .load import diverged, load_rounds
from .numbers import pct
from .paired import MIN_SEEDS, client_differences, difference, hierarchical_bootstrap

ALPHA = 0.05
CONFIDENCE = 0.95
T_TEST = "paired t-test"         # the one test: over the per-seed means, from MIN_SEEDS common seeds
SAME = 1e-12                     # paired values closer than this count as equal
MARKS = (("▲", "▼"), ("△", "▽"))  # (better, worse) against the first and the second reference
LATEX_MARKS = {"▲": r"$^{\blacktriangle}$", "▼": r"$^{\blacktriangledown}$", "△": r"$^{\vartriangle}$",
               "▽": r"$^{\triangledown}$"}  # amssymb
SUMMARY = "summary.parquet"
DIVERGED_NOTE = ("k of n seeds diverged: runs whose training loss was lost or whose accuracy fell to chance after "
                 "learning (diverged in trials.parquet), left out of the mean and the tests; a cell with such a run "
                 "is never bold, and bold is decided among the other cells.")
SUMMARY_COLUMNS = ("table", "row", "column", "mean", "std", "n", "diverged", "ci_low", "ci_high", "reference", "diff",
                   "diff_low", "diff_high", "interval", "p_value", "p_adjusted", "test", "seeds", "marked", "bold")


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


def reported_rows(scored: pd.DataFrame, reported: Mapping[str, int] | None = None) -> pd.DataFrame:
    """The round rows of `scored` (one pool's rows that have the accuracy wanted) at the round each
    run reports: `reported[config_hash]` where given (a "best_val" trial's `reported_round`:
    `analysis.load.reported_rounds`), else the run's last round among them."""
    last = scored.groupby("config_hash")["round"].transform("max")
    wanted = scored["config_hash"].map(dict(reported or {})).astype(float).fillna(last)
    return scored[scored["round"] == wanted]


def final_accuracies(rounds: pd.DataFrame, column: str = "acc", pool: str = "seen",
                     reported: Mapping[str, int] | None = None) -> pd.DataFrame:
    """Each run's per-client `column` at its reported round where a client of `pool` has it
    ("seen": rows whose pool is not "unseen"; "unseen"): `reported` maps a run to its round (see
    `reported_rows`; the unseen clients, scored after the last round only, always at their last),
    other runs at their last such round. Columns `run` (the config hash), `client`, `value`."""
    pools = rounds["pool"].fillna("seen") if "pool" in rounds else pd.Series("seen", index=rounds.index)
    scored = rounds[pools.eq("unseen").eq(pool == "unseen") & rounds[column].notna()]
    final = reported_rows(scored, reported if pool != "unseen" else None)
    return pd.DataFrame({"run": final["config_hash"].to_numpy(), "client": final["client"].to_numpy(),
                         "value": final[column].astype(float).to_numpy()})


def load_final_accuracies(paths, runs: Iterable, reported: Mapping[str, int] | None = None) -> pd.DataFrame | None:
    """`final_accuracies` of the seen clients of the runs (config hashes) at `paths`, each at its
    `reported` round where given (`analysis.load.reported_rounds` of their trials); None for none."""
    hashes = {h for h in runs if isinstance(h, str)}
    if not hashes:
        return None
    rounds = load_rounds(paths, columns=["acc", "pool"], trials=hashes, labels=False)
    return final_accuracies(rounds, reported=reported) if not rounds.empty and "acc" in rounds else None


@dataclass(frozen=True)
class Samples:
    """One cell's values to pair: per seed (index: seed), and per (seed, client) where known."""
    seeds: pd.Series
    clients: pd.Series | None = None


@dataclass(frozen=True)
class Comparison:
    """Cell a against cell b over their common seeds: the mean paired difference a - b, its 95 %
    interval and how it was got (`interval`, "" where none), and the paired t-test (p NaN and
    test "" below MIN_SEEDS common seeds)."""
    seeds: int
    diff: float
    diff_low: float
    diff_high: float
    interval: str
    p: float
    test: str


def snapped(a: pd.Series | None, b: pd.Series | None) -> pd.Series | None:
    """a, except where its value lies within SAME of b's at the same index: b's value there (the
    float noise of a mean is no difference)."""
    if a is None or b is None:
        return a
    other = b.reindex(a.index)
    return a.where(~((a - other).abs() < SAME), other)


def paired_comparison(a: Samples, b: Samples) -> Comparison:
    """The comparison of the module docstring for cells a and b of one group."""
    with warnings.catch_warnings():  # differences alike to float noise: scipy warns, p is still right
        warnings.simplefilter("ignore", RuntimeWarning)
        d = difference(snapped(a.seeds, b.seeds), b.seeds)
    if d.tested:
        return Comparison(d.n, d.mean, d.ci_low, d.ci_high, f"t over {d.n} seeds", d.p, T_TEST)
    low, high, interval = d.ci_low, d.ci_high, f"t over {d.n} seeds" if d.n >= 2 else ""
    if d.n >= 2 and a.clients is not None and b.clients is not None:
        within = client_differences(snapped(a.clients, b.clients), b.clients)
        common = a.seeds.index.intersection(b.seeds.index)
        if set(within.index.get_level_values(0)) == set(common):
            low, high = hierarchical_bootstrap(within)
            interval = f"hierarchical bootstrap over {d.n} seeds"
    return Comparison(d.n, d.mean, low, high, interval, math.nan, "")


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


CELL_COLUMNS = ("row", "column", "mean", "std", "n", "ci_low", "ci_high", "diverged")


def cell_stats(runs: pd.DataFrame) -> pd.DataFrame:
    """Per cell (row, column) of `compare`'s runs, in the order they name them: mean, std and n over
    its runs that did not diverge (`across_seeds`), their 95 % interval (`mean_ci`), and
    `diverged`, how many of its runs diverged (their `diverged` True: left out of the rest)."""
    rows = []
    for (row, column), part in runs.groupby(["row", "column"], sort=False):
        values = part.loc[~part["diverged"], "value"].to_numpy(dtype=float)
        rows.append({"row": row, "column": column, **dict(zip(("mean", "std", "n"), across_seeds(values))),
                     **dict(zip(("ci_low", "ci_high"), mean_ci(values))), "diverged": int(part["diverged"].sum())})
    return pd.DataFrame(rows, columns=list(CELL_COLUMNS))


def _span(values) -> str:
    low, high = int(min(values)), int(max(values))
    return f"{low}" if low == high else f"{low}–{high}"


@dataclass
class Verdict:
    """What `compare` found: `cells` (row, column, mean, std, n, ci_low, ci_high, diverged, marks, bold) and
    `comparisons` (row, column, kind "reference" or "best", against, the `Comparison` fields with
    p as p_value, p_adjusted, direction +1/-1 where significant, else 0)."""
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
        """What the marks and bold mean and which test and correction gave them; `ranked`: the
        columns bold is decided in, where not all (e.g. "after fine-tuning")."""
        tested = self.comparisons[self.comparisons["test"] == T_TEST]
        counts = tested["kind"].value_counts()
        parts = [self._legend(counts.get("reference", 0))] if self.references else []
        best = f"Bold{', ' + ranked if ranked else ''}: " + \
            (f"the best of its {self.within}" if self.best == "group" else "the best cell of the table")
        if counts.get("best", 0):
            parts.append(f"{best} and every cell not significantly worse than it ({self._correction()}); a cell "
                         f"without a paired test only where it prints the best value.")
        else:
            parts.append(f"{best}{' and every cell that prints its value' if len(self.comparisons) else ''}.")
        if len(tested):
            parts.append(f"Test: {T_TEST} on the per-seed mean accuracies over {_span(tested['seeds'])} common "
                         f"seeds; a seed pairs runs with the same partition and initial model.")
        untested = self.comparisons[self.comparisons["test"] != T_TEST]
        if len(untested):
            which = "Cells" if not len(tested) else "Other pairs of cells"
            parts.append(f"{which} share fewer than {MIN_SEEDS} seeds ({_span(untested['seeds'])} in common): no "
                         f"test and no mark, as a test over so few seeds has too little power and the clients of "
                         f"one run are not independent samples.")
        if (self.cells["diverged"] > 0).any():
            parts.append(DIVERGED_NOTE)
        return " ".join(parts)

    def _correction(self) -> str:
        """The one family the marks and bold share (`compare`), as the captions say it."""
        pairs = f"{self.family} distinct pair{'s' if self.family != 1 else ''} of cells"
        return (f"p < {ALPHA:g} after Benjamini–Hochberg over the table's {pairs} tested, with the references and "
                f"with the best")

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
        when the table has no reference), accuracies as fractions, the paired difference against
        the reference (`Comparison`'s fields); `marked`: "better", "worse" or ""; row and column
        labels as text."""
        found = {(c.row, c.column, c.against): c for c in self.comparisons.itertuples(index=False)
                 if c.kind == "reference"}
        rows = []
        for cell in self.cells.itertuples(index=False):
            for ref in self.references or (None,):
                rows.append({"table": table, "row": _text(cell.row), "column": _text(cell.column), "mean": cell.mean,
                             "std": cell.std, "n": int(cell.n), "diverged": int(cell.diverged),
                             "ci_low": cell.ci_low, "ci_high": cell.ci_high,
                             "reference": ref, "bold": bool(cell.bold),
                             **_against(found.get((cell.row, cell.column, ref)))})
        return pd.DataFrame(rows, columns=list(SUMMARY_COLUMNS))


def _against(c) -> dict:
    """A summary row's fields of its comparison with the reference (None: no comparison)."""
    if c is None:
        return {"diff": math.nan, "diff_low": math.nan, "diff_high": math.nan, "interval": "", "p_value": math.nan,
                "p_adjusted": math.nan, "test": "", "seeds": 0, "marked": ""}
    return {"diff": c.diff, "diff_low": c.diff_low, "diff_high": c.diff_high, "interval": c.interval,
            "p_value": c.p_value, "p_adjusted": c.p_adjusted, "test": c.test, "seeds": int(c.seeds),
            "marked": {1: "better", -1: "worse"}.get(c.direction, "")}


def _text(label) -> str:
    parts = label if isinstance(label, tuple) else (label,)
    return " / ".join(f"{p:g}" if isinstance(p, (float, np.floating)) else str(p) for p in parts)


def _pairing(samples: dict, key: tuple, other: tuple, kind: str, against: str) -> dict:
    """One row of `Verdict.comparisons` (before the correction): cell `key` against cell `other`."""
    return {"row": key[0], "column": key[1], "kind": kind, "against": against, "pair": frozenset((key, other)),
            **vars(paired_comparison(samples[key], samples[other]))}


def corrected(rows: list[dict]) -> tuple[pd.DataFrame, int]:
    """The comparisons of one table with Benjamini-Hochberg over the distinct pairs of cells tested
    (one adjusted p per pair), and `direction` (+1/-1 where p_adjusted < ALPHA, else 0); also the
    size of that family."""
    columns = ["row", "column", "kind", "against", "pair", *(f.name for f in fields(Comparison))]
    comparisons = pd.DataFrame(rows, columns=columns).rename(columns={"p": "p_value"})
    family = comparisons[comparisons["p_value"].notna()].drop_duplicates("pair")
    p_values = family["p_value"].to_numpy(dtype=float)
    adjusted = dict(zip(family["pair"], scipy_stats.false_discovery_control(p_values) if len(family) else []))
    comparisons["p_adjusted"] = [adjusted.get(pair, math.nan) for pair in comparisons["pair"]]
    comparisons = comparisons.drop(columns="pair")
    significant = comparisons["p_adjusted"] < ALPHA
    comparisons["direction"] = np.where(significant, np.sign(comparisons["diff"].fillna(0)), 0).astype(int)
    return comparisons, len(family)


def compare(runs: pd.DataFrame, finals: pd.DataFrame | None = None, references: Sequence[str] = (),
            within: str = "column", best: str = "group", ranked: Collection | None = None) -> Verdict:
    """Marks and bold of one table (see the module docstring). `runs`: one row per run in a cell,
    columns `row`, `column`, `seed`, `value` (its final accuracy) and optionally `run`, the key of
    its per-client values in `finals` (columns run, client, value), and `diverged` (True: the run
    is left out of its cell's numbers and tests, and counted in the cell's `diverged`). `within`
    "column": the groups are the columns and a reference names a row; "row": the other way.
    `best` "group" or "table": where the best cell is taken. `ranked`: the groups in which bold is
    decided (None: all)."""
    if len(references) > len(MARKS):
        raise ValueError(f"at most {len(MARKS)} references per table, got {list(references)}")
    runs = runs.assign(diverged=diverged(runs))
    runs = runs[runs["value"].notna() | runs["diverged"]]
    cells = cell_stats(runs)
    samples = cell_samples(runs[~runs["diverged"]], finals)
    group_of = (lambda key: key[1]) if within == "column" else (lambda key: key[0])
    comparisons = []
    for key in samples:
        for ref in references:
            other = (ref, key[1]) if within == "column" else (key[0], ref)
            if other != key and other in samples:
                comparisons.append(_pairing(samples, key, other, "reference", ref))
    means, scopes, best_of = dict(zip(zip(cells["row"], cells["column"]), cells["mean"])), {}, {}
    clean = {key for key, k in zip(zip(cells["row"], cells["column"]), cells["diverged"]) if k == 0}
    for key in samples:
        if key in clean and (ranked is None or group_of(key) in ranked):  # a cell with diverged seeds: never bold
            scopes.setdefault(group_of(key) if best == "group" else "table", []).append(key)
    for keys in scopes.values():
        top = max(keys, key=lambda k: means[k])  # the first of equal means
        for key in keys:
            best_of[key] = top
            if key != top:
                comparisons.append(_pairing(samples, key, top, "best", _text(top)))
    comparisons, family = corrected(comparisons)
    marks, bold = {}, {}
    for c in comparisons.itertuples(index=False):
        key, i = (c.row, c.column), references.index(c.against) if c.kind == "reference" else -1
        if i >= 0 and c.direction:
            marks.setdefault(key, {})[i] = MARKS[i][c.direction < 0]
        elif c.kind == "best":
            shown = pct(means[key]) == pct(means[best_of[key]])
            bold[key] = shown if math.isnan(c.p_value) else c.direction >= 0
    keys = list(zip(cells["row"], cells["column"]))
    cells["marks"] = ["".join(m for _, m in sorted(marks.get(k, {}).items())) for k in keys]
    cells["bold"] = [bold.get(k, best_of.get(k) == k) for k in keys]
    return Verdict(cells, comparisons, tuple(references), within, best, family)


def write_summary(frames: Iterable[pd.DataFrame], out) -> Path | None:
    """`<out>/summary.parquet` from the tables' `Verdict.summary` rows, atomically (temp file and
    rename: fl_core.results.write_parquet); None when no table has a cell."""
    frames = [f for f in frames if f is not None and not f.empty]
    return write_parquet(pd.concat(frames, ignore_index=True), Path(out) / SUMMARY) if frames else None
