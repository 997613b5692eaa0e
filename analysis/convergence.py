"""Has a study run long enough? The convergence check of every (data setting, method, configuration).

    python -m analysis.convergence RESULTS... [--out DIR] [--markdown] [--tail 0.2]

A configuration has converged when its mean accuracy over seeds changed, over the last 20 % of the
rounds, by less than one seed standard deviation:

    Δ = mean over seeds of acc(R) − mean over seeds of acc(R_tail),   converged ⇔ |Δ| < std over seeds of acc(R)

where acc(r) is a trial's mean personalized accuracy over its (seen) clients at round r (the curve of
`analysis.plots`, `fl_core.results.summarize_trial`), R its last evaluated round and R_tail the
evaluated round nearest to (1 − tail)·R. Only the seeds evaluated at both rounds count; with one
seed there is no std and the verdict is "n/a". The std is the sample std (ddof = 1), as in every
table (`fl_core.results.across_seeds`).

Writes `<out>/convergence.tex` (and `.md` with --markdown; default out: RESULTS[0]/tables) and
prints the table; `python -m analysis.tables` writes it too (`--table convergence`, and with `auto`
whenever a configuration ran on two or more seeds). The curves themselves are
figures/accuracy_vs_round.png (analysis.plots).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import pandas as pd

from fl_core.results import KNOB_SYMBOLS, across_seeds

from .common import config_keys, config_knobs, final_rows, methods_order, settings_order, trial_curves
from .load import load_rounds, load_trials
from .numbers import pct
from .render import Caption, fits_across, in_order, latex_label, write_table

TAIL = 0.2
NAMES = KNOB_SYMBOLS | {"local_epochs": "epochs"}   # a knob's name in a configuration's label
# the printed table's headers (`convergence_cells`' columns, shorter), defined in its caption
HEADERS = {"Acc (tail)": "Tail", "Acc (last)": "Last", "Seed std": "Std", "Converged": "Conv."}


def tail_round(evaluated: list[int], tail: float = TAIL) -> int:
    """The evaluated round nearest to (1 − tail) × the last one (the earlier of two equally near)."""
    last = max(evaluated)
    target = (1 - tail) * last
    return min(evaluated, key=lambda r: (abs(r - target), r))


def convergence(rounds: pd.DataFrame, trials: pd.DataFrame, tail: float = TAIL) -> pd.DataFrame:
    """One row per (setting, method, configuration), in the tables' order (`table_order`): rounds
    R_tail and R (and the configured `rounds`: R is below it while trials run), mean accuracy over
    seeds at both, Δ, the seed std at R, the number of seeds and `converged` (True / False / NA
    with one seed)."""
    if not 0 < tail < 1:
        raise ValueError(f"tail={tail!r} must lie strictly between 0 and 1 (the share of the last rounds)")

    trials = final_rows(trials)
    trials = trials[trials["acc_mean"].notna()].drop_duplicates("config_hash", keep="last").copy()
    trials["config_key"] = config_keys(trials)
    trials["config_text"] = _varying_knobs(trials)
    curves = trial_curves(rounds[rounds["config_hash"].isin(set(trials["config_hash"]))])
    curves = curves[curves["acc_mean"].notna()].merge(
        trials[["config_hash", "setting", "method", "config_key"]], on="config_hash")
    out = []
    for (setting, method, key), group in curves.groupby(["setting", "method", "config_key"], sort=False):
        evaluated = sorted(group["round"].unique())
        last, early = max(evaluated), tail_round(evaluated, tail)
        at = group.pivot_table(index="config_hash", columns="round", values="acc_mean")
        # one evaluated round only (early == last): no tail to compare, no verdict
        both = at[[early, last]].dropna() if early != last else at.iloc[:0, :0]
        end_mean, end_std, n = across_seeds(both[last].to_numpy()) if len(both) else (np.nan, np.nan, 0)
        start_mean = float(both[early].mean()) if len(both) else np.nan
        delta = end_mean - start_mean
        verdict = pd.NA if n < 2 else bool(abs(delta) < end_std)
        if early == last:  # no tail to compare: report the last round over every seed that has it
            end_mean, end_std, n = across_seeds(at[last].dropna().to_numpy())
        planned = trials.loc[trials["config_key"] == key, "rounds"].max() if "rounds" in trials else last
        text = trials.loc[trials["config_key"] == key, "config_text"].iloc[0]
        out.append({"setting": setting, "method": method, "config": text, "config_key": key,
                    "round_tail": int(early), "round_last": int(last),
                    "rounds": int(planned) if pd.notna(planned) else int(last),
                    "acc_tail": start_mean, "acc_last": end_mean, "delta": delta,
                    "std": end_std if n > 1 else np.nan, "seeds": n, "converged": verdict,
                    "evaluated_once": early == last})
    return table_order(pd.DataFrame(out), trials)


def table_order(table: pd.DataFrame, trials: pd.DataFrame) -> pd.DataFrame:
    """The rows by data setting (`settings_order`), method (`methods_order`), then configuration
    (its knobs' values in the grid's order), renumbered; `config_key` dropped."""
    if table.empty:
        return table
    knobs = [k for k in config_knobs(trials) if k != "algorithm"]
    try:
        grid = trials.sort_values(knobs, na_position="first", kind="stable")["config_key"]
    except TypeError:  # a knob column of mixed types: the keys' text order
        grid = trials["config_key"].sort_values(kind="stable")
    placed = {"setting", "dataset", "partition", "shards_per_client", "dir_alpha"} <= set(trials.columns)
    orders = {"setting": settings_order(trials) if placed else [], "method": methods_order(trials),
              "config_key": list(dict.fromkeys(grid))}
    return in_order(table, orders).drop(columns="config_key").reset_index(drop=True)


def _varying_knobs(trials: pd.DataFrame) -> pd.Series:
    """Per trial, the knobs (k=v) that tell its configuration apart from the others of its (setting,
    method); "" where the method has one configuration in the setting."""

    knobs = [k for k in config_knobs(trials) if k not in ("algorithm",)]
    text = pd.Series("", index=trials.index, dtype=object)
    for _, group in trials.groupby(["setting", "method"], sort=False):
        varying = [k for k in knobs if group[k].astype(str).nunique() > 1]
        text[group.index] = [", ".join(f"{NAMES.get(k, k)}={_value(v)}" for k, v in zip(varying, values))
                             for values in group[varying].itertuples(index=False, name=None)]
    return text


def _value(value) -> str:
    """A knob's value in a label: a number to 3 significant digits (a search's draws carry more)."""
    if isinstance(value, (float, np.floating)) and np.isfinite(value):
        return f"{value:.3g}"
    return str(value)


def convergence_cells(table: pd.DataFrame) -> pd.DataFrame:
    """The printed table: accuracies and Δ in % (one decimal), the verdict as yes / NO / n/a."""
    varied = table.groupby(["setting", "method"])["config"].transform("nunique") > 1
    label = table["method"].where(~varied, table["method"] + " [" + table["config"] + "]")
    repeat = label.groupby([table["setting"], label]).cumcount()  # never two rows alike (LaTeX needs it)
    label = label.where(repeat == 0, label + " #" + (repeat + 1).astype(str))
    verdict = table["converged"].map(lambda v: "n/a" if pd.isna(v) else ("yes" if v else "NO"))
    return pd.DataFrame({
        "Setting": table["setting"], "Method": label,
        "Rounds": [f"{a} → {b}" + (f" (of {r}: unfinished)" if b < r else "")
                   for a, b, r in zip(table["round_tail"], table["round_last"], table["rounds"])],
        "Acc (tail)": table["acc_tail"].map(pct), "Acc (last)": table["acc_last"].map(pct),
        "Δ": table["delta"].map(lambda v: pct(v, sign=True)),
        "Seed std": table["std"].map(pct), "Seeds": table["seeds"].astype(int), "Converged": verdict,
    })


def caption(table: pd.DataFrame, tail: float = TAIL) -> Caption:
    """The caption's sentences: how many configurations converged, then what the printed columns
    (`HEADERS`) hold."""
    known = table["converged"].dropna()
    done = int(known.astype(bool).sum())
    once = int(table["evaluated_once"].sum()) if "evaluated_once" in table else 0
    single = len(table) - len(known) - once
    unknown = [f"{once} evaluated at the last round only (no tail to compare)"] * bool(once) + \
        [f"{single} with one seed"] * bool(single)
    return Caption([f"Convergence over the last {100 * tail:g} % of the rounds: {done} of {len(known)} configurations "
                    "converged" + (f"; {' and '.join(unknown)}: n/a." if unknown else "."),
                    f"Tail, Last: mean accuracy (%) over seeds at the evaluated round nearest to {1 - tail:g} R and "
                    "at the last round R; Δ = Last − Tail; Std: the seed std at R (sample std); Conv.: converged, "
                    "|Δ| below Std."])


def convergence_frame(table: pd.DataFrame, tail: float = TAIL) -> tuple[pd.DataFrame, Caption]:
    """(cells, caption) as printed: `convergence_cells` by (Setting, Method) under the `HEADERS`;
    Rounds and Seeds, where every row has the same, said once in the caption instead of a column;
    configurations too long for a table across a page's two columns named c1, c2, ... in the
    methods' labels and spelled out in the caption."""
    cells, parts = _printed(table)
    if not fits_across(cells):
        varied = table.groupby(["setting", "method"])["config"].transform("nunique") > 1
        tags = pd.Series("", index=table.index, dtype=object)
        tags[varied] = [f"c{i + 1}" for i in range(int(varied.sum()))]
        cells, parts = _printed(table.assign(config=tags))
        parts.append("Configurations: " + "; ".join(f"{t}: {c}" for t, c in zip(tags[varied], table["config"][varied]))
                     + ".")
    return cells, Caption([*caption(table, tail).parts, *parts])


def _printed(table: pd.DataFrame) -> tuple[pd.DataFrame, list[str]]:
    """`convergence_frame`'s cells, and the caption's sentences on the columns it left out."""
    cells = convergence_cells(table).set_index(["Setting", "Method"]).astype(str)
    same = {column: cells[column].iloc[0] for column in ("Rounds", "Seeds") if cells[column].nunique() == 1}
    said = [f"rounds {same['Rounds']} (R_tail → R)"] if "Rounds" in same else []
    said += [f"{same['Seeds']} seed{'s' * (same['Seeds'] != '1')}"] if "Seeds" in same else []
    parts = [] if "Rounds" in same else ["Rounds: R_tail → R."]
    parts += [f"Every row: {', '.join(said)}."] if said else []
    return cells.drop(columns=list(same)).rename(columns=HEADERS), parts


def convergence_wanted(trials: pd.DataFrame) -> bool:
    """Some configuration ran on two or more seeds (one seed has no std: nothing to check against)."""
    done = trials[trials["acc_mean"].notna()] if "acc_mean" in trials else trials.iloc[:0]
    return not done.empty and bool((done.assign(key=config_keys(done)).groupby("key")["seed"].nunique() > 1).any())


def write_convergence(paths, out=None, markdown: bool = False, echo: bool = False,
                      tail: float = TAIL) -> Path | None:
    """Write `<out>/convergence.tex` (and `.md`); returns the .tex path, or None (nothing written)
    when the results hold no round rows (a trials.parquet alone has no curves)."""
    paths = [paths] if isinstance(paths, (str, Path)) else list(paths)
    trials = load_trials(paths)
    rounds = load_rounds(paths, trials=trials.loc[trials["acc_mean"].notna(), "config_hash"])
    if rounds.empty or "config_hash" not in rounds:
        return None
    table = convergence(rounds, trials, tail)
    cells, text = convergence_frame(table, tail)
    out = Path(out) if out is not None else Path(paths[0]) / "tables"
    bold = pd.DataFrame(False, index=cells.index, columns=cells.columns)
    return write_table("convergence", cells, bold, text, out, markdown, echo, latex_label("convergence", trials))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m analysis.convergence", description=__doc__.split("\n")[0])
    parser.add_argument("results", nargs="+", help="sweep folders or folders of sweeps")
    parser.add_argument("--out", type=Path, default=None, help="output folder (default: RESULTS[0]/tables)")
    parser.add_argument("--markdown", action="store_true", help="also write convergence.md and print it")
    parser.add_argument("--tail", type=float, default=TAIL, help=f"share of the last rounds checked (default: {TAIL})")
    args = parser.parse_args(argv)
    try:
        path = write_convergence(args.results, args.out, args.markdown, echo=True, tail=args.tail)
        print(f"wrote {path}" if path else "no round rows in the results: no curves to check")
    except (FileNotFoundError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
