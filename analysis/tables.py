"""The paper's tables as LaTeX (pandas Styler, booktabs), read from sweep results (Parquet only).

    python -m analysis.tables RESULTS... [--table {auto,methods,limit,ablation,grid,traffic,cost,fedl2p,convergence}]
                                         [--out DIR]
                                         [--unfinished {mark,drop}]

Tables (cell = final mean personalized accuracy `acc_mean` in %, "mean ± std" over seeds):
  methods   rows = methods (FedSelect ablations are separate rows), columns = data settings
  limit     FedSelect (gradselect) by personalization limit α, at the most common p and epochs
  ablation  FedSelect variants × data settings
  grid      for each (data setting, local epochs): FedSelect p × α
  traffic   (with DisPFL or D-PSGD) per method and setting: accuracy and the busiest node's total
            MB, finished trials only (analysis.traffic)
  cost      (with methods that report their training cost: PerFedMask and its baselines) per method:
            accuracy before / after fine-tuning per participation rate c, trainable parameters and
            forward / backward FLOPs per sample, finished trials only (analysis.cost)
  fedl2p    (with FT, L2P or FedL2P: fine-tuning a pretrained model) per (data setting, seen/unseen
            clients, fine-tuning epochs e): Global Acc and each method's accuracy, the paper's
            Tables 2-5; and fedl2p_policy, FedL2P's learned policy (analysis.fedl2p). These trials
            enter no other table, which would pool e (their pretrainings still do)
  convergence  (with 2+ seeds) per (data setting, method, configuration): has the mean accuracy over
            seeds moved by less than one seed std over the last 20 % of the rounds (analysis.convergence)
Marks and bold come from paired t-tests over the seeds two cells share, from 5 common seeds on
(analysis.stats; references: methods FedAvg ▲/▼ and Local △/▽, ablation FedSelect, traffic
D-PSGD, cost FedAvg+FT, fedl2p FT (BN C)); with fewer common seeds there is no test and no mark.
Bold is the best of each column (in the grid: of the table) and every cell not significantly
worse than it (untested: every cell that prints the best value); the caption names the test and
the correction. `<out>/summary.parquet`: per cell, the 95 % CI, the paired difference against each
reference with its interval, p-values, mark and bold.
A run marked `diverged` in trials.parquet is left out of its cell's numbers and of every paired
test, the cell saying "(k of n seeds diverged)" (only "n of n seeds diverged" where all did) and
never bold; summary.parquet counts them (`diverged`). Where a study reports each run's round with
the best mean validation accuracy (`report_round` = best_val), the caption says so in place of
"Final", and the per-client accuracies behind the intervals are taken at that round.
A missing cell is "--". The std is over seeds (ddof=1; one seed shows just the mean). When every
cell has the same number of seeds the caption says how many; otherwise cells that differ from the
usual count are marked "(n=k)" and the caption explains the mark. Mean and std over seeds are
`fl_core.results.across_seeds`; row and column names are the `method` and `setting` columns that
every result row carries (filled by `analysis.load.labelled` for sweeps of engine v1).

Unfinished trials (`analysis.load.unfinished`: status other than COMPLETED, e.g. ERROR or STOPPED by
ASHA, or fewer recorded rounds than `rounds`, the only test for a sweep without trials.parquet)
never pass for final results. `--unfinished mark` (default) keeps them at their last recorded round
and daggers their cells, the caption naming the rounds reached; `--unfinished drop` leaves them out
("--" or "(n=k)"), the caption counting them. Both modes pick the same configurations, rows and
columns; finished trials alone print exactly as they did before either mode existed.

Every table is a float for a two-column paper (analysis.render: a `table` where it fits the
column, a `table*` across both columns, or its value columns split over tabulars stacked under one
caption), its rows by data setting (analysis.common.settings_order, a setting's label once) and
method (methods_order), its caption at most 3 lines: the title and what fits of the legend, the
rest (tests, marks, choices, models evaluated, threads) in a footnote-size note under the table;
the Markdown twin says the same in a paragraph each.

A sweep with a selection stage (Optuna search or ASHA per data setting; `stage` "select") also gets
`search_best` (analysis.search); its select trials enter no other table, which holds the anchors and
each confirmed configuration (its select run as its first seed) and no knob-keyed table.
"""
from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pandas as pd


from .common import (TableError, counted, final_rows, knob_text, methods_order, selection_rows, settings_order,
                     tuning_note)
from .load import DamagedFile, is_gradselect, load_trials, reported_rounds
from .render import MISSING, UNFINISHED, Table, format_cell, latex_label, preview, summarize, to_latex, to_markdown  # noqa: F401 (the public API)
from .stats import load_final_accuracies, write_summary

METHODS_REFERENCES = ("FedAvg", "Local")  # the FedSelect paper's Table 1 baselines
ABLATION_REFERENCE = ("FedSelect",)        # GradSelect, the label of fedselect_variant = gradselect
TABLES = ("methods", "limit", "ablation", "grid", "traffic", "cost", "fedl2p", "convergence")  # the last 4: round rows
ROUND_TABLES = ("traffic", "cost", "fedl2p", "convergence")


# ----------------------------------------------------------------------------- selecting trials

def _labelled(trials: pd.DataFrame) -> pd.DataFrame:
    """Trials that already went through `counted` stay as they are."""
    ready = {"method", "setting"} <= set(trials.columns) and not trials[["method", "setting"]].isna().any().any()
    return final_rows(trials) if ready else counted(trials)


def _most_common(trials: pd.DataFrame, knobs: list[str]) -> tuple:
    """The most common combination of `knobs` (ties: the smallest)."""
    counts = trials.groupby(knobs, dropna=False).size()
    best = counts[counts == counts.max()].index.sort_values()[0]
    return tuple(best) if len(knobs) > 1 else (best,)


def _at(trials: pd.DataFrame, knobs: list[str], values: tuple) -> pd.DataFrame:
    match = np.ones(len(trials), dtype=bool)
    for knob, value in zip(knobs, values):
        match &= (trials[knob] == value).to_numpy()
    return trials[match]


# ----------------------------------------------------------------------------- the numbers

def _evaluated_note(trials: pd.DataFrame) -> str:
    """Which model each method's accuracy measures (one training can be reported at two points:
    FedSelect at p = 0 after local training, FedAvg after the broadcast): the rows' `evaluated_model`."""
    if "evaluated_model" not in trials:
        return ""
    point_of = dict(zip(trials["method"], trials["evaluated_model"]))
    by_point: dict[str, list[str]] = {}
    for method in methods_order(trials):
        if isinstance(point_of.get(method), str):  # empty for an external method that did not import here
            by_point.setdefault(point_of[method], []).append(method)
    if not by_point:
        return ""
    parts = [f"{', '.join(methods)}: {point}" for point, methods in by_point.items()]
    return "Model evaluated: " + "; ".join(parts) + "."


def _threads_note(trials: pd.DataFrame) -> str:
    """The torch thread count of the runs (results on CPU depend on it), when the sweep recorded it."""
    if "threads" not in trials or trials["threads"].isna().all():
        return ""
    counts = sorted({int(t) for t in trials["threads"].dropna()})
    return f"Torch threads per run: {', '.join(map(str, counts))}."


def _one_configuration(trials: pd.DataFrame) -> tuple[pd.DataFrame, list[str]]:
    """Per (method, setting) cell, the trials of one configuration: where a cell holds several
    (FedSelect's grid, two learning rates of one method), those `common.chosen_trials` picks
    without test data, each choice named in a note (one note for a method chosen alike in every
    setting); other cells as they are."""
    from .common import SELECTION_TEXT, chosen_trials, config_keys, config_knobs, selection_basis

    keys = config_keys(trials)
    mixed = [(label, cell) for label, cell in trials.groupby(["method", "setting"], sort=False)
             if keys[cell.index].nunique() > 1]
    if not mixed:
        return trials, []
    chosen = set(chosen_trials(trials)["config_hash"])
    knobs = [k for k in config_knobs(trials) if k != "algorithm"]
    keep = pd.Series(True, index=trials.index)
    said: dict[tuple, list[str]] = {}
    for (method, setting), cell in mixed:
        keep[cell.index] = cell["config_hash"].isin(chosen)
        picked = cell[keep[cell.index]].iloc[0]
        varying = [k for k in knobs if cell[k].astype(str).nunique() > 1]
        how = SELECTION_TEXT[selection_basis(cell)]
        values = knob_text(varying, tuple(picked[k] for k in varying))
        said.setdefault((method, values, keys[cell.index].nunique(), how), []).append(setting)
    everywhere = set(trials["setting"])
    notes = [f"{method} {'in every data setting' if set(settings) == everywhere else 'in ' + '; '.join(settings)}: "
             f"at {values}, chosen among its {count} configurations as {how} (the others not shown)."
             for (method, values, count, how), settings in said.items()]
    return trials[keep], notes


def _at_common_epochs(trials: pd.DataFrame) -> tuple[pd.DataFrame, list[str]]:
    """Every method at the most common local epochs; a method that never ran at them (sweeps
    combined) at its own most common instead, which a note says, never left out."""
    epochs = _most_common(trials, ["local_epochs"])
    kept = _at(trials, ["local_epochs"], epochs)
    if not trials["local_epochs"].notna().all():
        return kept, []
    others = []
    for method, own in trials[~trials["method"].isin(set(kept["method"]))].groupby("method", sort=False):
        mine = _most_common(own, ["local_epochs"])
        kept = pd.concat([kept, _at(own, ["local_epochs"], mine)])
        others.append(f"{method} at {mine[0]:g}")
    note = f"Local epochs = {epochs[0]:g}" + (f" ({'; '.join(others)}: never run at {epochs[0]:g})." if others else ".")
    return kept, [note]


def methods_table(trials: pd.DataFrame, mode: str = "mark") -> Table:
    """Table 1: methods × data settings, every method at the most common local epochs (or its
    own, said in the caption: `_at_common_epochs`), and a cell with several configurations
    (FedSelect's p × α grid) at the one chosen without test data (`_one_configuration`, said in a
    note), so that no cell mixes configurations."""
    trials = _labelled(trials)
    trials, notes = _at_common_epochs(trials)
    if "stage" in trials and (trials["stage"] == "confirm").any():  # one chosen configuration per setting
        notes.append(tuning_note(trials) or "Tuned methods at the configuration chosen per data setting (table "
                                            "search_best).")
    trials, chosen = _one_configuration(trials)
    notes += chosen
    fedselect = trials[is_gradselect(trials)]
    knobs = ["pers_rate", "pers_limit"]
    if len(fedselect) and not any(n.startswith("FedSelect ") for n in chosen) and \
            len(fedselect[knobs].drop_duplicates()) == 1:  # one configuration everywhere: name it
        notes.append(f"FedSelect at {knob_text(knobs, tuple(fedselect[knobs].iloc[0]))}.")
    notes.append(_evaluated_note(trials))
    notes.append(_threads_note(trials))
    table = summarize(trials, "method", "setting", "methods", methods_order(trials),
                      settings_order(trials), mode, caption="Methods by data setting.",
                      references=METHODS_REFERENCES)
    table.row_title = "Method"
    table.notes = [n for n in notes if n]
    return table


def limit_table(trials: pd.DataFrame, mode: str = "mark") -> Table:
    """Table 2: FedSelect (gradselect) by personalization limit α × data settings, at the most
    common (p, local epochs)."""
    trials = _labelled(trials)
    fedselect = trials[is_gradselect(trials)]
    if fedselect.empty:
        raise TableError("limit table: no FedSelect trials")
    knobs = ["pers_rate", "local_epochs"]
    values = _most_common(fedselect, knobs)
    chosen = _at(fedselect, knobs, values)
    chosen = chosen.assign(α=chosen["pers_limit"].map(lambda a: f"{a:g}"))
    table = summarize(chosen, "α", "setting", "limit", [f"{a:g}" for a in sorted(chosen["pers_limit"].unique())],
                      settings_order(chosen), mode, caption=f"FedSelect by personalization limit α "
                                                       f"({knob_text(knobs, values)}).")
    table.row_title = "α"
    return table


def ablation_table(trials: pd.DataFrame, mode: str = "mark") -> Table:
    """Table 3: FedSelect variants × data settings, marked against GradSelect: at the most common
    (p, α, local epochs), or in a tuned study each variant at its own chosen configuration."""
    trials = _labelled(trials)
    fedselect = trials[trials["algorithm"] == "fedselect"]
    if fedselect.empty:
        raise TableError("ablation table: no FedSelect trials")
    notes = [tuning_note(fedselect)]
    if notes[0]:  # each variant searched alike: its chosen configuration, named in search_best
        chosen, picked = _one_configuration(fedselect)
        notes += picked
        caption = "FedSelect ablations, each variant at the configuration its search chose (table search_best)."
    else:
        knobs = ["pers_rate", "pers_limit", "local_epochs"]
        values = _most_common(fedselect, knobs)
        chosen = _at(fedselect, knobs, values)
        caption = f"FedSelect ablations ({knob_text(knobs, values)})."
    table = summarize(chosen, "method", "setting", "ablation", methods_order(chosen),
                      settings_order(chosen), mode, caption=caption, references=ABLATION_REFERENCE)
    table.row_title = "Variant"
    table.notes = [n for n in notes if n]
    return table


def grid_tables(trials: pd.DataFrame, mode: str = "mark") -> dict[str, Table]:
    """For each (data setting, local epochs): FedSelect (gradselect) p (rows) × α (columns)."""
    trials = _labelled(trials)
    fedselect = trials[is_gradselect(trials)].copy()
    if fedselect.empty:
        raise TableError("grid table: no FedSelect trials")
    fedselect["p"] = fedselect["pers_rate"].map(lambda v: f"{v:g}")
    fedselect["α"] = fedselect["pers_limit"].map(lambda v: f"α = {v:g}")
    tables = {}
    for setting in settings_order(fedselect):
        for epochs in sorted(fedselect["local_epochs"].unique()):
            part = fedselect[(fedselect["setting"] == setting) & (fedselect["local_epochs"] == epochs)]
            if part.empty:
                continue
            rows = [f"{v:g}" for v in sorted(part["pers_rate"].unique())]
            cols = [f"α = {v:g}" for v in sorted(part["pers_limit"].unique())]
            name = f"grid_{_slug(setting)}_e{epochs:g}"
            table = summarize(part, "p", "α", name, rows, cols, mode, best="table",
                              caption=f"FedSelect by personalization rate p (rows) and limit α "
                                      f"({setting}, local epochs = {epochs:g}).")
            table.row_title = "p"
            tables[name] = table
    return tables


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "_", text.lower()).strip("_")


# ----------------------------------------------------------------------------- building

def supported(trials: pd.DataFrame) -> list[str]:
    """The tables the results support."""
    trials = _labelled(trials)
    gradselect = trials[is_gradselect(trials)]
    variants = trials.loc[trials["algorithm"] == "fedselect", "method"].nunique()
    def varies(knob: str) -> bool:  # a sweep without FedSelect has no FedSelect knob columns at all
        return knob in gradselect and gradselect[knob].nunique() > 1

    found = []
    if trials["algorithm"].nunique() > 1:
        found.append("methods")
    if "stage" in trials and trials["stage"].isin(["select", "confirm"]).any():
        # knob-keyed tables of sampled values: search_best.tex instead; the variants' table stays
        return found + (["ablation"] if variants > 1 else [])
    if varies("pers_limit"):
        found.append("limit")
    if variants > 1:
        found.append("ablation")
    if varies("pers_limit") and varies("pers_rate"):
        found.append("grid")
    return found


def make_tables(trials: pd.DataFrame, which: str = "auto", unfinished: str = "mark") -> dict[str, Table]:
    """The Tables named by `which` ("auto": every one the results support); `unfinished`: "mark"
    or "drop" the trials that stopped before their last round (see the module docstring)."""
    trials = counted(trials, unfinished)
    if which == "auto":
        names = supported(trials) or ["methods"]
    elif which in TABLES and which not in ROUND_TABLES:  # tables from round rows: build_tables
        names = [which]
    else:
        raise TableError(f"unknown table {which!r}; choose from auto, {', '.join(TABLES)}")
    builders: dict[str, Callable] = {"methods": methods_table, "limit": limit_table, "ablation": ablation_table}
    tables: dict[str, Table] = {}
    for name in names:
        if name == "grid":
            tables.update(grid_tables(trials, unfinished))
        else:
            tables[name] = builders[name](trials, unfinished)
    return tables


def build_tables(paths, which: str = "auto", out=None, echo: bool = False, unfinished: str = "mark",
                 markdown: bool = False) -> dict[str, Path]:
    """Write the tables of the results at `paths` as `<out>/<name>.tex` (default out: the first
    path's `tables/`), and with `markdown` also `<out>/<name>.md` (without it, an older `.md` twin of
    a table written is removed, never left stale), and their cells' statistics as
    `<out>/summary.parquet` (analysis.stats); returns name -> .tex file. With `echo`, prints each
    preview (or Markdown table) and file. `unfinished`: as in `make_tables`."""
    from .fedl2p import fedl2p_wanted, personalizing, write_fedl2p_tables
    from .search import write_search_table

    paths = [paths] if isinstance(paths, (str, Path)) else list(paths)
    trials = load_trials(paths)
    out = Path(out) if out is not None else Path(paths[0]) / "tables"
    written = {}
    if which == "auto" and not selection_rows(trials).empty:
        written["search_best"] = write_search_table(trials, out, markdown)
    fedl2p = fedl2p_wanted(trials)
    generic = trials[~personalizing(trials)] if fedl2p else trials  # their e would be pooled: fedl2p.tex
    skip = which in ROUND_TABLES or (written and final_rows(trials).empty) or (which == "auto" and generic.empty)
    tables = make_tables(generic, which, unfinished) if not skip else {}
    finals = load_final_accuracies(paths, {h for t in tables.values() for h in t.runs["run"]}, reported_rounds(trials))
    summaries = []
    out.mkdir(parents=True, exist_ok=True)
    for name, table in tables.items():
        table.finals = finals
        summaries.append(table.verdict().summary(name))
        path = out / f"{name}.tex"
        path.write_text(to_latex(table, latex_label(name, trials)))
        written[name] = path
        if markdown:
            path.with_suffix(".md").write_text(to_markdown(table))
        if echo:
            print(to_markdown(table) if markdown else preview(table), end="\n\n")
    from .traffic import traffic_wanted, write_traffic_table
    if which == "traffic" or (which == "auto" and traffic_wanted(trials)):
        written["traffic"] = write_traffic_table(paths, trials, out, markdown, echo, summaries)
    from .cost import cost_wanted, write_cost_table
    if which == "cost" or (which == "auto" and cost_wanted(trials)):
        written["cost"] = write_cost_table(paths, trials, out, markdown, echo, summaries)
    if which == "fedl2p" or (which == "auto" and fedl2p):
        written |= write_fedl2p_tables(paths, trials, out, markdown, echo, summaries)
    from .convergence import convergence_wanted, write_convergence
    if which == "convergence" or (which == "auto" and convergence_wanted(trials)):
        path = write_convergence(paths, out, markdown, echo)
        if path is not None:
            written["convergence"] = path
    summary = write_summary(summaries, out)
    stale = [md for tex in written.values() if not markdown and (md := tex.with_suffix(".md")).exists()]
    for md in stale:  # an older run's Markdown twin would disagree with the fresh .tex beside it
        md.unlink()
        print(f"removed {md}: an earlier Markdown twin of a table written again without --markdown")
    if echo:
        if summary is not None:
            print(f"wrote {summary}")
        for path in written.values():
            print(f"wrote {path}")
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m analysis.tables", description=__doc__.split("\n")[0])
    parser.add_argument("results", nargs="+", help="sweep folders or folders of sweeps")
    parser.add_argument("--table", default="auto", choices=("auto", *TABLES))
    parser.add_argument("--out", type=Path, default=None, help="output folder (default: RESULTS[0]/tables)")
    parser.add_argument("--unfinished", default="mark", choices=UNFINISHED,
                        help="trials that did not finish (early-stopped, failed, still running): mark = keep "
                             "them at their last recorded round, dagger their cells and explain it in the caption "
                             "(default); drop = leave them out and say how many in the caption")
    parser.add_argument("--markdown", action="store_true",
                        help="also write each table as Markdown (<name>.md, for a README or an issue) and print "
                             "that instead of the text preview")
    args = parser.parse_args(argv)
    try:
        build_tables(args.results, args.table, args.out, echo=True, unfinished=args.unfinished,
                     markdown=args.markdown)
    except (FileNotFoundError, TableError, DamagedFile) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
