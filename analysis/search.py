"""What a selection stage (an Optuna search or an ASHA scheduler, run per data setting) chose:
`tables/search_best.tex` (the chosen configuration per cell beside the anchors) and
`figures/search_history.{png,pdf}` (search history, parameter importance), from trials.parquet.

A trial row's `stage` is "grid", "anchor" (a baseline run to the end on every data setting and
seed), "select" (sampled or scheduled on one seed; STOPPED when stopped early) or "confirm" (the
chosen configuration on the study's seeds). A sweep with a search seed of its own (`search_seed`)
confirms on every reported seed and never counts a select run; an older one selected on its first
seed and counted its select run as that seed's); `objective` names
the metric the selection maximised ("acc_val_mean"; "acc_mean" without a validation split).
A cell is a data setting, with its local epochs where they vary outside the selection stage (a
study axis, not a searched knob). The chosen configuration is the COMPLETED select trial with the
highest objective (ties: the smaller config hash), as the sweep flags it (`selected`). It and the
anchors stand side by side only over the same seeds at the same final round; a value that does not
carries analysis.render's dagger.
"""
from __future__ import annotations

import warnings
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from matplotlib.ticker import MaxNLocator

from fl_core.config import DATA_KNOBS
from fl_core.results import KNOB_SYMBOLS, across_seeds

from .common import (ANCHOR, CONFIRM, SELECT, SELECTED, chosen_row, config_keys, config_knobs, methods_order,
                     selection_objective, selection_rows, settings_order, stage_column)
from .figures import method_colors, save_figure
from .load import load_trials, unfinished
from .numbers import as_printed
from .render import DAGGER, Caption, Table, frame_latex, frame_markdown, latex_label, rounds_reached

OBJECTIVES = {"acc_val_mean": "validation accuracy", "acc_mean": "test accuracy"}
NAMES = KNOB_SYMBOLS | {"local_epochs": "epochs"}


def cell_columns(trials: pd.DataFrame) -> list[str]:
    """["setting"], and "local_epochs" where it varies within a setting outside the selection stage."""
    rest = trials[stage_column(trials) != SELECT]
    axis = "local_epochs" in rest and bool((rest.groupby("setting")["local_epochs"].nunique() > 1).any())
    return ["setting", "local_epochs"] if axis else ["setting"]


def searched_knobs(select_rows: pd.DataFrame, cells=("setting",)) -> list[str]:
    """The knobs that vary among the select rows of some cell (never a data knob, the seed or a
    column of the cell)."""
    knobs = [k for k in config_knobs(select_rows) if k not in DATA_KNOBS and k not in cells]
    if select_rows.empty or not knobs:
        return []
    shown = select_rows[knobs].astype(str).assign(**{c: select_rows[c] for c in cells})
    varies = shown.groupby(list(cells))[knobs].nunique().max() > 1
    return [k for k in knobs if varies[k]]


def _cells(select: pd.DataFrame, cells: list[str]) -> list[tuple[tuple, pd.DataFrame]]:
    """(cell key, its select rows in start order), in the tables' order of data settings (then
    local epochs, then methods: `methods_order`)."""
    settings = settings_order(select)
    methods = {method: i for i, method in enumerate(methods_order(select))}
    groups = [(key if isinstance(key, tuple) else (key,), part) for key, part in
              select.sort_values("started_at", kind="stable").groupby(cells)]

    def rank(key: tuple) -> tuple:
        return (settings.index(key[0]), *(methods.get(v, len(methods)) if c == "method" else v
                                         for c, v in zip(cells[1:], key[1:])))
    return sorted(groups, key=lambda group: rank(group[0]))


def _label(key: tuple) -> str:
    return key[0] + "".join(f", E{epochs:g}" for epochs in key[1:])


def _seeds(seeds) -> str:
    seeds = sorted(int(s) for s in seeds)
    contiguous = len(seeds) > 2 and seeds == list(range(seeds[0], seeds[-1] + 1))
    return f"{seeds[0]}–{seeds[-1]}" if contiguous else ", ".join(map(str, seeds))


def best_per_cell(trials: pd.DataFrame) -> pd.DataFrame:
    """Per cell: the chosen `method` and searched knobs, `objective`, `objective_value`, the select
    run's `select_acc` (test) and `select_seed`, the select `trials`, `completed`, `stopped`; with
    confirm rows, `<who>_mean`, `_std`, `_n`, `_marked` over seeds for `selected` and each anchor
    method, the cell's `seeds` and a `note` on what is marked."""
    trials = trials.reset_index(drop=True)
    select = selection_rows(trials)
    if select.empty:
        return pd.DataFrame()
    cells, stage, late, keys = cell_columns(trials), stage_column(trials), unfinished(trials), config_keys(trials)
    knobs, rows = searched_knobs(select, cells), []
    # a study that tunes several methods (`tune`) searched each apart: one row per (cell, method)
    per_method = bool((select.groupby(cells)["method"].nunique() > 1).any())
    groups = [*cells, "method"] if per_method else cells
    for key, part in _cells(select, groups):
        key = key[:len(cells)]
        row = dict(zip(cells, key)) | {"objective": selection_objective(part), "trials": len(part), "note": "",
                                       "completed": int((part["status"] == "COMPLETED").sum()),
                                       "stopped": int((part["status"] == "STOPPED").sum())}
        best = chosen_row(part)
        if best is None:
            rows.append(row | {"note": "no completed selection trial"})
            continue
        row |= {"method": trials.at[best, "method"], **trials.loc[best, knobs].to_dict(),
                "objective_value": trials.at[best, row["objective"]], "select_acc": trials.at[best, "acc_mean"],
                "select_seed": trials.at[best, "seed"]}
        if (stage == CONFIRM).any():
            here = pd.concat([trials[c] == v for c, v in zip(cells, key)], axis=1).all(axis=1)
            mine = trials[(stage == CONFIRM) & (keys == keys[best])]
            own_seed = "search_seed" in trials and pd.notna(trials.at[best, "search_seed"])
            compared = {SELECTED: mine if own_seed else pd.concat([trials.loc[[best]], mine])}
            compared |= dict(list(trials[here & (stage == ANCHOR)].groupby("method")))
            row |= _compare(compared, late, elsewhere=mine.empty and bool((here & (stage == CONFIRM)).any()))
        rows.append(row)
    return pd.DataFrame(rows)


def _compare(groups: dict[str, pd.DataFrame], late: pd.Series, elsewhere: bool) -> dict:
    """Each group's test accuracy over seeds, marked where its seeds or rounds differ from the
    cell's or a run did not finish. `elsewhere`: the confirm runs are of another configuration."""
    union = set().union(*(set(group["seed"]) for group in groups.values()))
    rounds = int(groups[SELECTED]["rounds"].max())
    out, notes = {"seeds": tuple(sorted(union))}, [f"{SELECTED}: the confirm runs are of another configuration"]
    notes = notes if elsewhere else []
    for who, group in groups.items():
        mean, std, n = across_seeds(group["acc_mean"].to_numpy())
        behind = list(zip(group["rounds_done"][late[group.index]], group["rounds"][late[group.index]]))
        why = [f"seeds {_seeds(group['seed'])} of {_seeds(union)}" if set(group["seed"]) != union else "",
               f"{_seeds(group['rounds'].unique())} rounds, not {rounds}" if set(group["rounds"]) != {rounds} else "",
               f"unfinished: {rounds_reached(behind)}" if behind else ""]
        why = [w for w in why if w]
        out |= {f"{who}_mean": mean, f"{who}_std": std, f"{who}_n": n, f"{who}_marked": bool(why)}
        notes += [f"{who}: {', '.join(why)}"] if why else []
    return out | {"note": "; ".join(notes)}


def _text(value, form: str = ".1f", scale: float = 100.0) -> str | None:
    if pd.isna(value):
        return None
    return f"{scale * value:{form}}" if isinstance(value, (float, np.floating)) else str(value)


def search_table_latex(df: pd.DataFrame, objective: str, label: str = "search_best") -> str:
    """`best_per_cell` as a booktabs table (analysis.render.frame_latex): per cell the chosen
    configuration, its objective and test accuracy on the select seed, the select trials, and
    the chosen configuration beside the anchors over seeds (the best of each row in bold)."""
    return frame_latex(*search_table_frame(df, objective), label)


def search_table_markdown(df: pd.DataFrame, objective: str) -> str:
    """The same table in Markdown (analysis.render.frame_markdown), for the docs."""
    return frame_markdown(*search_table_frame(df, objective))


def _rows(df: pd.DataFrame, cells: list[str]) -> tuple[pd.Index, list[str]]:
    """The table's row index: the cell's label (`_label`), and where a cell searched several methods
    (`tune`) the method under it (two levels); and each row's label as one text."""
    labels = [_label(tuple(key)) for key in df[cells].itertuples(index=False)]
    if len(set(labels)) == len(labels):
        return pd.Index(labels), labels
    methods = [_text(method) for method in df["method"]]
    index = pd.MultiIndex.from_arrays([labels, methods], names=["data setting", "method"])
    return index, [f"{label} / {method}" for label, method in zip(labels, methods)]


def search_table_frame(df: pd.DataFrame, objective: str) -> tuple[pd.DataFrame, pd.DataFrame, Caption]:
    """The search table's cell texts (plain), where they are bold, and its caption."""
    df = df.assign(**{c: np.nan for c in ("method", "objective_value", "select_acc", "select_seed") if c not in df})
    cells = [c for c in ("setting", "local_epochs") if c in df]
    compared = [c.removesuffix("_mean") for c in df.columns if c.endswith("_mean")]
    seed = int(df["select_seed"].dropna().iloc[0]) if df["select_seed"].notna().any() else 0
    index, labels = _rows(df, cells)
    text = pd.DataFrame({"method": [_text(m) for m in df["method"]]}, index=index)
    if index.nlevels > 1:  # the method is the row's own label
        text = text.drop(columns="method")
    for knob in [k for k in config_knobs(df) if k not in cells and k != "algorithm"]:  # the method names it
        text[NAMES.get(knob, knob)] = [_text(v, ".3g", 1.0) for v in df[knob]]
    text[f"{'val.' if objective == 'acc_val_mean' else 'test'} s{seed}"] = [_text(v) for v in df["objective_value"]]
    text[f"test s{seed}"] = [_text(v) for v in df["select_acc"]]
    text["trials"] = [f"{t} ({s} stopped)" if s else f"{t}" for t, s in zip(df["trials"], df["stopped"])]
    bold = pd.DataFrame(False, index=index, columns=text.columns)
    what = OBJECTIVES.get(objective, objective)
    caption = [f"Configuration chosen per data setting{' and local epochs' if len(cells) > 1 else ''} by a "
               "selection stage.",
               f"Chosen: the completed trial with the best {what} ({objective}) of seed {seed}; trials the scheduler "
               "stopped early are never chosen; trials: selection trials run (those stopped early)."]
    if objective == "acc_mean":
        caption.append("The data has no validation split, so the selection used test accuracy: optimistic, "
                       "the same test data chose the configuration and scores it.")
    if compared:
        numbers = [df[[f"{who}_{part}" for who in compared]].set_axis(compared, axis=1).set_axis(index)
                   for part in ("mean", "std", "n", "marked")]
        table = Table("search_best", numbers[0], numbers[1], numbers[2].fillna(0).astype(int),
                      marked=numbers[3].fillna(False).astype(bool))
        text = text.join(table.cells())
        shown = as_printed(numbers[0])
        several = len(compared) > 1   # a row to compare within: the selected configuration and anchors
        bold = bold.join(shown.eq(shown.max(axis=1), axis=0) & shown.notna() & several)
        seeds = set().union(*df["seeds"].dropna())
        caption.append(f"Test accuracy (%) at the final round; {SELECTED}{' and anchors' if several else ''}: "
                       f"mean ± std over seeds {_seeds(seeds)}"
                       + (f" (seed {seed} of the {SELECTED} configuration is its selection run)" if seed in seeds else
                          f", not the search seed {seed}")
                       + ("; best of each row in bold" if several else "")
                       + ("." if table.seeds_uniform() else "; (n=k): over k seeds."))
    else:
        caption.append(f"Test accuracy (%) at the final round of seed {seed} only: no confirmation runs yet.")
    chosen = df["method"].notna().to_numpy()
    notes = [f"{cell}: {note}" for cell, note, ok in zip(labels, df["note"], chosen) if note and ok]
    if notes:
        caption.append(f"{DAGGER} = not over the same seeds at the same final round as the rest of its row; "
                       f"{'; '.join(notes)}.")
    if not chosen.all():
        caption.append(f"No completed selection trial: {', '.join(np.array(labels)[~chosen])}.")
    text.columns.name = "data setting" + (", epochs" if len(cells) > 1 else "")
    return text, bold, Caption(caption)


def _space(values: pd.Series):
    """An Optuna distribution spanning the values a knob took (log scale over two decades or more)."""
    from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution

    low, high = values.min(), values.max()
    if values.dtype.kind in "iu":
        return IntDistribution(int(low), int(high))
    if values.dtype.kind == "f":
        return FloatDistribution(float(low), float(high), log=bool(low > 0 and high >= 100 * low))
    return CategoricalDistribution(sorted({_plain(v) for v in values}, key=str))


def _plain(value):
    return value.item() if isinstance(value, np.generic) else value


def param_importances(rows: pd.DataFrame, knobs: list[str], objective: str) -> tuple[dict[str, float], str]:
    """Optuna's importance (its default evaluator, PED-ANOVA; shares summing to 1) of each of
    `knobs` that varies among the completed `rows`, on an in-memory study of those trials; or ({},
    why not: fewer than 2 completed trials, fewer than 2 varying knobs (one alone has importance
    1), or no knob sets the best trials apart (every importance 0))."""
    import optuna

    done = rows[~unfinished(rows) & rows[objective].notna()]
    varying = [k for k in knobs if done[k].nunique() > 1]
    if len(done) < 2:
        return {}, f"{len(done)} completed trial{'s' * (len(done) != 1)}: importance needs 2 or more"
    if len(varying) < 2:
        return {}, f"{len(varying)} searched knob{'s' * (len(varying) != 1)} varied: importance ranks 2 or more"
    spaces = {k: _space(done[k].dropna()) for k in varying}
    verbosity = optuna.logging.get_verbosity()
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # optuna's notes on few trials and on the experimental `normalize`
            study = optuna.create_study(direction="maximize")
            for _, row in done.iterrows():
                params = {k: _plain(row[k]) for k in varying if pd.notna(row[k])}
                study.add_trial(optuna.trial.create_trial(params=params, value=float(row[objective]),
                                                          distributions={k: spaces[k] for k in params}))
            raw = optuna.importance.get_param_importances(study, normalize=False)
    finally:
        optuna.logging.set_verbosity(verbosity)
    total = sum(raw.values())
    if total <= 0:
        return {}, "every importance is 0: no knob sets the best trials apart"
    return {k: v / total for k, v in raw.items()}, ""


def plot_search(trials: pd.DataFrame, out_dir) -> list[Path]:
    """`search_history`, a row per cell: (a) the objective of each select trial in start order
    (completed: dots; unfinished, e.g. stopped early: hollow grey at the round reached), the
    running best of the completed ones and the chosen one (star); (b) `param_importances`."""
    trials = trials.reset_index(drop=True)
    select, cells = selection_rows(trials), cell_columns(trials)
    if select.empty:
        return []
    knobs, groups, colors = searched_knobs(select, cells), _cells(select, cells), method_colors(select["method"])
    fig, axes = plt.subplots(len(groups), 2, figsize=(11, 3.4 * len(groups)), squeeze=False,
                             gridspec_kw={"width_ratios": [3, 2]})
    for (key, part), (history, importance) in zip(groups, axes):
        objective, x = selection_objective(part), np.arange(1, len(part) + 1)
        value = part[objective].to_numpy(dtype=float)
        done = ~unfinished(part).to_numpy() & np.isfinite(value)
        late = ~done & np.isfinite(value)
        for method in part["method"][done].unique():
            mine = done & (part["method"] == method).to_numpy()
            history.scatter(x[mine], value[mine], color=colors[method], s=18, label=f"{method}, completed", zorder=3)
        if late.any():
            history.scatter(x[late], value[late], facecolors="none", edgecolors="grey", s=22, zorder=3,
                            label="unfinished: stopped early or failed (at the round reached)")
        for i in np.flatnonzero(late):  # the round each reached
            history.annotate(f"r{part['rounds_done'].iloc[i]:g}", (x[i], value[i]), fontsize=6, color="grey",
                             xytext=(3, -8), textcoords="offset points")
        history.step(x, pd.Series(np.where(done, value, np.nan)).cummax().ffill(), where="post", color="black",
                     lw=1, label="best completed so far")
        if done.any():
            best = part.index.get_loc(chosen_row(part))
            history.scatter(x[best], value[best], marker="*", s=140, color="gold", edgecolors="black", zorder=4,
                            label="chosen")
        history.set(title=f"{_label(key)}: search history", xlabel="trial (start order)",
                    ylabel=f"{OBJECTIVES.get(objective, objective)} ({objective})")
        history.xaxis.set_major_locator(MaxNLocator(integer=True))
        history.grid(alpha=0.3)
        history.legend(fontsize=7)
        shares, why = param_importances(part, knobs, objective)
        importance.set_title(f"parameter importance ({int(done.sum())} completed trials)")
        if shares:
            names = list(shares)[::-1]
            importance.barh([NAMES.get(k, k) for k in names], [shares[k] for k in names], color="tab:blue")
            importance.set(xlabel="importance (Optuna PED-ANOVA, sums to 1)", xlim=(0, 1))
        else:
            importance.text(0.5, 0.5, f"not computed:\n{why}", ha="center", va="center", wrap=True, fontsize=9)
            importance.set_axis_off()
    fig.suptitle("Selection stage per data setting: search history and parameter importance")
    fig.tight_layout()
    return save_figure(fig, Path(out_dir), "search_history")


def write_search_table(trials: pd.DataFrame, out, markdown: bool = False) -> Path:
    """`<out>/search_best.tex` (and with `markdown` its twin `search_best.md`); its caption warns
    when any cell was selected on test accuracy."""
    best, path = best_per_cell(trials), Path(out) / "search_best.tex"
    objective = "acc_mean" if (best["objective"] == "acc_mean").any() else str(best["objective"].iloc[0])
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(search_table_latex(best, objective, latex_label("search_best", trials)))
    if markdown:
        path.with_suffix(".md").write_text(search_table_markdown(best, objective))
    return path


def build_search_outputs(folder) -> list[Path]:
    """`<folder>/tables/search_best.tex` and `<folder>/figures/search_history.{png,pdf}` from
    `<folder>/trials.parquet`; [] when it has no selection stage."""
    folder = Path(folder)
    trials = load_trials([folder])
    if selection_rows(trials).empty:
        return []
    return [write_search_table(trials, folder / "tables"), *plot_search(trials, folder / "figures")]
