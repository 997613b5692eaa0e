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

from fl_core.results import across_seeds

from .common import config_keys, config_knobs, final_rows, trial_curves
from .load import load_rounds, load_trials
from .numbers import pct
from .render import frame_latex, latex_cells, latex_label

TAIL = 0.2


def tail_round(evaluated: list[int], tail: float = TAIL) -> int:
    """The evaluated round nearest to (1 − tail) × the last one (the earlier of two equally near)."""
    last = max(evaluated)
    target = (1 - tail) * last
    return min(evaluated, key=lambda r: (abs(r - target), r))


def convergence(rounds: pd.DataFrame, trials: pd.DataFrame, tail: float = TAIL) -> pd.DataFrame:
    """One row per (setting, method, configuration): rounds R_tail and R (and the configured `rounds`:
    R is below it while trials run), mean accuracy over seeds at both, Δ, the seed std at R, the
    number of seeds and `converged` (True / False / NA with one seed)."""
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
        out.append({"setting": setting, "method": method, "config": text, "round_tail": int(early),
                    "round_last": int(last), "rounds": int(planned) if pd.notna(planned) else int(last),
                    "acc_tail": start_mean, "acc_last": end_mean, "delta": delta,
                    "std": end_std if n > 1 else np.nan, "seeds": n, "converged": verdict,
                    "evaluated_once": early == last})
    return pd.DataFrame(out)


def _varying_knobs(trials: pd.DataFrame) -> pd.Series:
    """Per trial, the knobs (k=v) that tell its configuration apart from the others of its (setting,
    method); "" where the method has one configuration in the setting."""

    knobs = [k for k in config_knobs(trials) if k not in ("algorithm",)]
    text = pd.Series("", index=trials.index, dtype=object)
    for _, group in trials.groupby(["setting", "method"], sort=False):
        varying = [k for k in knobs if group[k].astype(str).nunique() > 1]
        text[group.index] = [", ".join(f"{k}={v}" for k, v in zip(varying, values))
                             for values in group[varying].astype(str).itertuples(index=False, name=None)]
    return text


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


def caption(table: pd.DataFrame, tail: float = TAIL) -> str:
    known = table["converged"].dropna()
    done = int(known.astype(bool).sum())
    once = int(table["evaluated_once"].sum()) if "evaluated_once" in table else 0
    single = len(table) - len(known) - once
    unknown = [f"{once} evaluated at the last round only (no tail to compare)"] * bool(once) + \
        [f"{single} with one seed"] * bool(single)
    return (f"Convergence: mean accuracy (%) over seeds at the evaluated round nearest to {1 - tail:g} R and at "
            f"the last round R; Δ = change over the last {100 * tail:g} % of the rounds; converged when |Δ| is "
            f"below the seed std at R (sample std). {done} of {len(known)} configurations converged"
            + (f"; {' and '.join(unknown)}: n/a." if unknown else "."))


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
    cells = convergence_cells(table).set_index(["Setting", "Method"])
    text = caption(table, tail)
    out = Path(out) if out is not None else Path(paths[0]) / "tables"
    out.mkdir(parents=True, exist_ok=True)
    path = out / "convergence.tex"
    bold = pd.DataFrame(False, index=cells.index, columns=cells.columns)
    path.write_text(frame_latex(latex_cells(cells.astype(str)), bold, text, latex_label("convergence", trials)))
    shown = cells.reset_index()
    md = "| " + " | ".join(shown.columns) + " |\n|" + "---|" * len(shown.columns) + "\n"
    md += "".join("| " + " | ".join(map(str, row)) + " |\n" for row in shown.to_numpy().tolist())
    md += f"\n{text}\n"
    if markdown:
        path.with_suffix(".md").write_text(md)
    if echo:
        print(md if markdown else f"[convergence] {text}\n{shown.to_string(index=False)}", end="\n\n")
    return path


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
