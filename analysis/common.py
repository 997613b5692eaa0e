"""What the tables and figures share: which trials count, in what order, and their curves.

Selection (`counted`, `final_rows`, `selection_rows`, `chosen_trials`): the trials a table or a
figure reports, a selection stage's losers left out. Order (`settings_order`, `methods_order`):
rows and panels in the same order everywhere. Configurations (`config_knobs`, `config_keys`):
the seeds of one configuration share a key. Curves (`trial_curves`, `method_curves`): per round,
from the Parquet rows. Pure pandas and numpy; the figures' matplotlib helpers are in
analysis/figures.py.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from fl_core.config import ALGORITHMS, NON_SEMANTIC
from fl_core.results import KNOB_SYMBOLS, across_seeds, knob_columns, summarize_trial

from .load import labelled
from .load import unfinished as unfinished_trials
from .render import UNFINISHED

CURVES = ("acc_mean", "personal_fraction_mean", "mb_total")   # summarize_trial keys that are plotted


class TableError(ValueError):
    """The results cannot make the table asked for."""


def counted(trials: pd.DataFrame, mode: str = "mark") -> pd.DataFrame:
    """The trials with an accuracy, finished or not (the cells mark or drop the unfinished ones:
    `summarize`), with their `method` and `setting` labels. With `mode` "drop" some trial must
    have finished."""
    check_unfinished_mode(mode)
    trials = final_rows(trials)  # a selection stage's trials are single-seed, partly stopped: search_best.tex
    if trials.empty or "status" not in trials:
        raise TableError("no trials in the results")
    keep = trials[trials["acc_mean"].notna()].copy()
    if "config_hash" in keep:  # the same run found in two sweeps counts once, finished if it finished once
        finished = ~unfinished_trials(keep)
        keep = keep[finished | ~finished.groupby(keep["config_hash"]).transform("any")]
        keep = keep.drop_duplicates("config_hash", keep="last")
    if keep.empty:
        raise TableError("no trials with results")
    if mode == "drop" and unfinished_trials(keep).all():
        raise TableError("no finished trials in the results (--unfinished mark shows the unfinished ones)")
    return labelled(keep).reset_index(drop=True)


def check_unfinished_mode(mode: str) -> None:
    if mode not in UNFINISHED:
        raise TableError(f"unknown --unfinished {mode!r}; choose from {', '.join(UNFINISHED)}")


def settings_order(trials: pd.DataFrame) -> list[str]:
    """Per dataset: shards (fewest first), then Dirichlet (most skewed first; the papers' scheme,
    then the per-class one), then the rest."""
    keys = trials[["setting", "dataset", "partition", "shards_per_client", "dir_alpha"]].copy()
    keys["rank"] = keys["partition"].map({"shards": 0, "dirichlet": 1, "dirichlet_class": 2}).fillna(3)
    keys = keys.sort_values(["dataset", "rank", "partition", "shards_per_client", "dir_alpha"])
    return list(dict.fromkeys(keys["setting"]))


def methods_order(trials: pd.DataFrame) -> list[str]:
    """Method labels in the registry's order of their algorithms (the values `algorithm` may take),
    then alphabetically (FedSelect before its ablations)."""
    rank = {name: i for i, name in enumerate(ALGORITHMS)}
    pairs = trials[["method", "algorithm"]].drop_duplicates()
    order = sorted(zip(pairs["method"], pairs["algorithm"]), key=lambda p: (rank.get(p[1], len(rank)), p[0]))
    return list(dict.fromkeys(method for method, _ in order))


SELECT, CONFIRM, ANCHOR = "select", "confirm", "anchor"
SELECTED = "selected"  # the chosen configuration's label among the compared columns


def stage_column(trials: pd.DataFrame) -> pd.Series:
    return trials["stage"] if "stage" in trials else pd.Series(None, index=trials.index, dtype=object)


def selection_rows(trials: pd.DataFrame) -> pd.DataFrame:
    """The rows of the selection stage (none when the trials carry no `stage`)."""
    return trials[stage_column(trials) == SELECT]


def selection_objective(rows: pd.DataFrame) -> str:
    if "objective" in rows and rows["objective"].notna().any():
        return str(rows["objective"].mode().iloc[0])
    return "acc_val_mean" if "acc_val_mean" in rows and rows["acc_val_mean"].notna().any() else "acc_mean"


def chosen_row(rows: pd.DataFrame):
    """The index of the row the sweep chose (its `selected` flag), else of the finished row with
    the highest objective, ties to the smaller config hash as sweeps.stages.best_completed; None
    when no row finished."""
    if "selected" in rows and rows["selected"].fillna(False).astype(bool).any():
        return rows.index[rows["selected"].fillna(False).astype(bool)][0]
    objective = selection_objective(rows)
    done = rows[~unfinished_trials(rows) & rows[objective].notna()]
    if not len(done):
        return None
    order = done.assign(_neg=-done[objective]).sort_values(["_neg", "config_hash"] if "config_hash" in done
                                                          else ["_neg"], kind="stable")
    return order.index[0]


def final_rows(trials: pd.DataFrame) -> pd.DataFrame:
    """The rows fit for tables of final results: all but the selection stage's. A sweep that
    selected on a seed of its own (`search_seed`) confirms on every reported seed, so none of its
    select runs is a result; an older one selected on its first seed and confirmed on the others,
    so its select run of each confirmed configuration counts as that seed's run."""
    stage = stage_column(trials)
    if not (stage == SELECT).any():
        return trials
    if "search_seed" in trials and trials.loc[stage == SELECT, "search_seed"].notna().all():
        return trials[stage != SELECT]
    keys = config_keys(trials)
    select = trials[(stage == SELECT) & keys.isin(set(keys[stage == CONFIRM]))]
    select = select.sort_values("started_at", kind="stable")
    chosen = [chosen_row(rows) for _, rows in select.groupby(keys[select.index], sort=False)]
    return trials[(stage != SELECT) | trials.index.isin(chosen)]


def cosine_matrix(hists: list[np.ndarray]) -> np.ndarray:
    """Pairwise cosine similarity of label histograms (0 against an all-zero histogram)."""
    h = np.stack([np.asarray(x, dtype=float) for x in hists])
    norms = np.linalg.norm(h, axis=1)
    norms[norms == 0] = 1.0
    unit = h / norms[:, None]
    return unit @ unit.T


def trial_curves(rounds: pd.DataFrame) -> pd.DataFrame:
    """One row per (trial, round): `config_hash`, `round` and the plotted `summarize_trial` keys
    (mean accuracy and personal fraction over clients, cumulative MB up + down)."""
    out = []
    for key, rows in rounds.groupby("config_hash", sort=True):
        history = pd.DataFrame(summarize_trial(rows))
        out.append(history[["round", *CURVES]].assign(config_hash=key))
    columns = ["config_hash", "round", *CURVES]
    return pd.concat(out, ignore_index=True)[columns] if out else pd.DataFrame(columns=columns)


def config_knobs(trials: pd.DataFrame) -> list[str]:
    """The columns of `trials` that are knobs of a run (common or a method's, a method outside the
    registry included: `fl_core.results.knob_columns`) and change its results, but the seed and
    `pretrained` (a two-stage study pretrains once per seed: the pretraining's hash changes with
    the seed as the seed does)."""
    if not isinstance(trials, pd.DataFrame):
        raise TypeError("config_knobs takes the rows (a DataFrame): a method outside the registry names its "
                        "knobs in their `method_knobs` column")
    return [c for c in knob_columns(trials) if c not in NON_SEMANTIC and c not in ("seed", "pretrained")]


def config_keys(trials: pd.DataFrame) -> pd.Series:
    """A key per trial shared by the seeds of one configuration: its knob values but the seed."""
    if trials.empty:
        return pd.Series(index=trials.index, dtype=object)
    return trials[config_knobs(trials)].astype(object).map(str).agg("|".join, axis=1)


VALIDATED, DECLARED = "validation", "declared"


def selection_basis(trials: pd.DataFrame) -> str:
    """How `chosen_trials` picks among configurations: VALIDATED where every trial has a mean
    validation accuracy (a validation split), else DECLARED. Test accuracy never decides."""
    ok = "acc_val_mean" in trials and len(trials) and trials["acc_val_mean"].notna().all()
    return VALIDATED if ok else DECLARED


SELECTION_TEXT = {VALIDATED: "the best mean validation accuracy over its seeds",
                  DECLARED: "the declared one (run on the most seeds; ties: the first of its grid), as there is "
                            "no validation split to select on"}


def tuning_note(trials: pd.DataFrame) -> str:
    """For a table of final rows of a sweep that selected on its own seed (`search_seed`): which
    methods were tuned, with what budget, and which ran as declared; "" for any other sweep."""
    stage = stage_column(trials)
    if "search_seed" not in trials or not trials["search_seed"].notna().any() or not (stage == CONFIRM).any():
        return ""
    seed = int(trials["search_seed"].dropna().iloc[0])
    budgets = trials[stage == CONFIRM].groupby("method", sort=False)["search_budget"].first() \
        if "search_budget" in trials else pd.Series(dtype=float)
    if budgets.notna().all() and budgets.nunique() == 1:
        note = (f"Tuned alike on validation accuracy, {int(budgets.iloc[0])} configurations per data setting on "
                f"search seed {seed} (never reported): {', '.join(budgets.index)}.")
    else:
        note = (f"Tuned on validation accuracy on search seed {seed} (never reported), configurations per data "
                f"setting: " + ", ".join(f"{m} {'?' if pd.isna(b) else int(b)}" for m, b in budgets.items()) + ".")
    fixed = list(dict.fromkeys(trials.loc[stage == ANCHOR, "method"]))
    return note + (f" Run as declared (not tuned): {', '.join(fixed)}." if fixed else "")


def selection_phrase(trials: pd.DataFrame) -> str:
    """How the cells of `trials` (setting x method) were chosen, for a caption."""
    bases = {selection_basis(cell) for _, cell in trials.groupby(["setting", "method"], sort=False, dropna=False)}
    if bases == {VALIDATED}:
        return "the configuration with " + SELECTION_TEXT[VALIDATED]
    if bases == {DECLARED}:
        return "the declared configuration, run on the most seeds (ties: the first of its grid): no validation split"
    return "validation accuracy where a split exists, else the declared configuration"


def chosen_trials(trials: pd.DataFrame) -> pd.DataFrame:
    """For each (setting, method): the trials (one per seed) of one configuration, chosen without
    test data (`selection_basis`): the best mean validation accuracy over seeds where the cell has
    a validation split; otherwise the configuration run on the most seeds, ties to the smallest
    knob values (the grid's first point). Adds `config_key`. Tables, figures and the sweep's
    summary all choose with this one rule."""
    trials = trials[trials["acc_mean"].notna()].drop_duplicates("config_hash", keep="last").copy()
    trials["config_key"] = config_keys(trials)
    knobs = config_knobs(trials)
    chosen = {cell: chosen_key(part, knobs) for cell, part in trials.groupby(["setting", "method"], sort=False)}
    keep = [chosen.get((setting, method)) == key
            for setting, method, key in zip(trials["setting"], trials["method"], trials["config_key"])]
    return trials[np.asarray(keep, dtype=bool)]


def chosen_key(cell: pd.DataFrame, knobs: list[str]) -> str:
    """The config_key `chosen_trials` takes in one cell (its trials, `config_key` set)."""
    try:
        ordered = cell.sort_values(knobs, na_position="first", kind="stable")["config_key"]
    except TypeError:  # a knob column of mixed types: the keys' text order
        ordered = cell["config_key"].sort_values(kind="stable")
    ordered = list(dict.fromkeys(ordered))
    if selection_basis(cell) == VALIDATED:
        score = cell.groupby("config_key")["acc_val_mean"].mean()
    else:
        score = cell.groupby("config_key").size().astype(float)
    return max(ordered, key=lambda key: score[key])  # the first of equal scores in grid order


def knob_text(knobs: list[str], values: tuple) -> str:
    """`p = 0.53, α = 0.359`: numbers to 3 significant digits (a search's draws carry six)."""
    names = KNOB_SYMBOLS | {"local_epochs": "local epochs"}
    return ", ".join(f"{names.get(k, k)} = {v:.3g}" if isinstance(v, (int, float, np.number))
                     else f"{names.get(k, k)} = {v}" for k, v in zip(knobs, values))


def chosen_labels(trials: pd.DataFrame, chosen: pd.DataFrame | None = None) -> dict[tuple[str, str], str]:
    """(setting, method) -> the method's name with the knobs of its chosen configuration
    (`chosen`: `chosen_trials(trials)` unless given) that vary among its trials in that setting,
    a search's included, e.g. `FedSelect (p = 0.53, α = 0.359, lr = 0.1)`; the plain name where it
    ran one configuration."""
    labels = {}
    chosen = chosen_trials(trials) if chosen is None else chosen
    for (setting, method), rows in chosen.groupby(["setting", "method"], sort=False):
        mine = trials[(trials["setting"] == setting) & (trials["method"] == method)]
        varying = [k for k in config_knobs(mine) if mine[k].astype(str).nunique() > 1]
        first = rows.iloc[0]
        labels[(setting, method)] = f"{method} ({knob_text(varying, tuple(first[k] for k in varying))})" if varying \
            else method
    return labels


def method_curves(rounds: pd.DataFrame, trials: pd.DataFrame) -> pd.DataFrame:
    """Per (setting, method, round): `<key>_mean`, `<key>_std` over seeds of the trial curves of
    `chosen_trials`, and `label`: the method with its chosen configuration (`chosen_labels`)."""
    picked = chosen_trials(trials)
    labels = chosen_labels(trials, picked)
    chosen = picked[["config_hash", "setting", "method"]]
    curves = (trial_curves(rounds[rounds["config_hash"].isin(set(chosen["config_hash"]))])
              .merge(chosen, on="config_hash"))
    rows = []
    for (setting, method, rnd), group in curves.groupby(["setting", "method", "round"], sort=True):
        row = {"setting": setting, "method": method, "round": rnd, "label": labels[(setting, method)]}
        for key in CURVES:
            mean, std, _ = across_seeds(group[key].to_numpy())
            row |= {f"{key}_mean": mean, f"{key}_std": std}
        rows.append(row)
    return pd.DataFrame(rows)
