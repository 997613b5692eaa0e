"""Traffic of the busiest node, and how far apart DisPFL's personal masks end up.

DisPFL's claim is not less traffic in total but a lighter load on the busiest node: with a server,
every upload and download goes through the server; without one, each client carries only its own
exchanges with its neighbours. This module measures that load from the round rows and sets it
against accuracy:
- `busiest_node_mb`: per (trial, round), the busiest node's cumulative MB (the definition).
- figure `accuracy_vs_busiest_traffic`: mean accuracy over clients against that load, one line per
  method, one panel per data setting (mean over seeds, each method at the configuration the tables
  show: analysis.common.chosen_trials).
- figure `mask_hamming` (the DisPFL paper's Fig. 6): for the best DisPFL trial with masks, the
  clients' label similarity next to the normalised Hamming distance of their final masks.
- table `traffic` (`tables/traffic.tex`): per method and data setting, the final accuracy and the
  busiest node's total MB over the run, finished trials only; accuracies marked where they differ
  significantly from D-PSGD's (the DisPFL paper's decentralised baseline; a paired t-test over 5
  or more common seeds, none below), bold by analysis.stats.
`build_traffic_outputs` writes the figures (called by analysis.plots.build_plots) and
`write_traffic_table` the table (called by analysis.tables.build_tables).
"""
from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from analysis.load import load_clients, load_masks, load_rounds, reported_rounds, unfinished
from analysis.common import (TableError, chosen_trials, cosine_matrix, counted, final_rows, method_curves,
                             methods_order, selection_phrase, settings_order)
from analysis.figures import heatmap, method_colors, save_figure
from analysis.render import MISSING, Caption, accuracy_words, latex_label, summarize, unfinished_note, write_table
from analysis.stats import load_final_accuracies
from fl_core.results import MB, across_seeds

REFERENCE = ("D-PSGD",)
BUSIEST = "the server for methods with one (it carries every client's traffic), else the most loaded client"


def method_fact(rows: pd.DataFrame, fact: str) -> pd.Series:
    """Per row, the boolean method fact `fact` ("has_server", "communicates") its files carry
    (fl_core.algorithms.METHOD_FACTS); a TableError naming the methods whose rows lack it (an
    external method that does not import where the results are read)."""
    values = rows[fact] if fact in rows else pd.Series(None, index=rows.index, dtype=object)
    if values.isna().any():
        unknown = sorted(map(str, rows.loc[values.isna(), "algorithm"].unique()))
        raise TableError(f"the results do not say whether {', '.join(unknown)} {fact.replace('_', ' a ')} "
                         f"(rows without `{fact}`; make the method importable here to read it from its class)")
    return values.astype(bool)


def serverless_communicating(rows: pd.DataFrame) -> pd.Series:
    """Per row, whether its method exchanges models without a server (DisPFL, D-PSGD; not Local)."""
    return method_fact(rows, "communicates") & ~method_fact(rows, "has_server")


# ---------------------------------------------------------------- computations (pure)

def busiest_node_mb(rounds: pd.DataFrame) -> pd.DataFrame:
    """Cumulative traffic of each trial's busiest node, in MB (1e6 bytes), per round.

    A client's bytes in round s are its `bytes_up + bytes_down`. For a method with a server
    (its rows' `has_server`) the busiest node is the server, which carries every client's traffic: its load
    at round t is the sum over rounds s <= t and over all clients k of bytes[k, s]. Otherwise (a
    server-less method, or Local) it is the client with the largest cumulative load,
    max over k of (sum over s <= t of bytes[k, s]) -- not the sum of per-round maxima.
    Returns columns `config_hash`, `round`, `busiest_node_mb`, sorted by trial and round."""
    sent = (rounds["bytes_up"].astype(float) + rounds["bytes_down"].astype(float)).fillna(0.0)
    per_client = sent.groupby([rounds["config_hash"], rounds["round"], rounds["client"]]).sum()
    cumulative = per_client.unstack("client", fill_value=0.0).groupby(level="config_hash").cumsum()
    server_of = method_fact(rounds, "has_server").groupby(rounds["config_hash"]).first()
    hashes = cumulative.index.get_level_values("config_hash")
    server = hashes.map(server_of).to_numpy(dtype=bool)
    load = np.where(server, cumulative.sum(axis=1), cumulative.max(axis=1)) / MB
    return pd.DataFrame({"config_hash": hashes, "round": cumulative.index.get_level_values("round"),
                         "busiest_node_mb": load})


def hamming_matrix(masks: list[np.ndarray]) -> np.ndarray:
    """Pairwise normalised Hamming distance of boolean masks of one length: the fraction of
    entries where two masks differ (0 on the diagonal; 0 for empty masks)."""
    flat = np.stack([np.asarray(m, dtype=bool).ravel() for m in masks]).astype(np.int64)
    ones = flat.sum(axis=1)
    differ = ones[:, None] + ones[None, :] - 2 * (flat @ flat.T)
    return differ / max(flat.shape[1], 1)


def trial_hamming(masks: pd.DataFrame, trial: str) -> tuple[list, np.ndarray]:
    """(client ids, client x client Hamming distance) of one trial's final masks, each client's
    tensors joined in name order (the tensors every client has)."""
    rows = masks[masks["config_hash"] == trial].drop_duplicates(["client", "tensor"])
    ids = sorted(rows["client"].unique())
    per_client = rows.groupby("client")["tensor"].agg(set)
    tensors = sorted(set.intersection(*per_client))
    by_key = rows.set_index(["client", "tensor"])["mask"]
    joined = [np.concatenate([np.asarray(by_key[(c, t)], dtype=bool).ravel() for t in tensors]) for c in ids]
    return ids, hamming_matrix(joined)


def traffic_curves(rounds: pd.DataFrame, trials: pd.DataFrame) -> pd.DataFrame:
    """Per (setting, method, round), for the configuration of `chosen_trials`: `acc` (mean over
    clients, then over seeds; NaN where not evaluated) and `busiest_node_mb` (mean over seeds)."""
    chosen = chosen_trials(trials)[["config_hash", "setting", "method"]]
    rounds = rounds[rounds["config_hash"].isin(set(chosen["config_hash"]))]
    acc = method_curves(rounds, trials)[["setting", "method", "round", "acc_mean_mean"]]
    load = busiest_node_mb(rounds).merge(chosen, on="config_hash")
    load = load.groupby(["setting", "method", "round"], as_index=False)["busiest_node_mb"].mean()
    return load.merge(acc, on=["setting", "method", "round"], how="left").rename(columns={"acc_mean_mean": "acc"})


# ---------------------------------------------------------------- figures

def plot_accuracy_vs_busiest(curves: pd.DataFrame, out: Path) -> list[Path]:
    settings = sorted(curves["setting"].unique())
    colors = method_colors(curves["method"])
    fig, axes = plt.subplots(1, len(settings), figsize=(4.8 * len(settings), 3.7), squeeze=False, sharey=True)
    for ax, setting in zip(axes[0], settings):
        panel = curves[(curves["setting"] == setting) & curves["acc"].notna()]
        positive = panel.loc[panel["busiest_node_mb"] > 0, "busiest_node_mb"]
        for method, group in panel.groupby("method"):
            if (group["busiest_node_mb"] > 0).any():
                ax.plot(group["busiest_node_mb"], group["acc"], marker="o", markersize=3, label=method,
                        color=colors[method])
            else:  # no traffic at all (Local): its final accuracy as a reference line
                ax.axhline(group.sort_values("round")["acc"].iloc[-1], color=colors[method], linestyle=":",
                           label=f"{method} (no communication)")
        if len(positive) and positive.max() > 100 * positive.min():
            ax.set_xscale("log")
        ax.set(title=setting, xlabel="cumulative traffic of the busiest node (MB)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    axes[0][0].set_ylabel("accuracy (mean over clients)")
    fig.suptitle(f"Accuracy vs cumulative traffic (up + down) of the busiest node, mean over seeds\n"
                 f"busiest node: {BUSIEST}", fontsize=8)
    fig.tight_layout()
    return save_figure(fig, out, "accuracy_vs_busiest_traffic")


def _pick_dispfl_trial(masks: pd.DataFrame, trials: pd.DataFrame) -> str:
    """The first seed's DisPFL trial with masks at the configuration the tables show
    (`chosen_trials`, finished trials first); else the first trial with masks."""
    have = trials[trials["config_hash"].isin(set(masks["config_hash"]))] if "config_hash" in trials else trials
    if have.empty or "acc_mean" not in have or have["acc_mean"].isna().all():
        return min(masks["config_hash"])
    done = have[~unfinished(have)]
    have = done if not done.empty else have
    if {"setting", "method"} <= set(have.columns):
        have = chosen_trials(have)
    order = [c for c in ("seed", "config_hash") if c in have]
    return have.sort_values(order, kind="stable")["config_hash"].iloc[0]


def plot_mask_hamming(masks: pd.DataFrame, clients: pd.DataFrame, trials: pd.DataFrame, out: Path) -> list[Path]:
    trial = _pick_dispfl_trial(masks, trials)
    ids, distance = trial_hamming(masks, trial)
    hists = clients[clients["config_hash"] == trial].drop_duplicates("client").set_index("client") \
        if "config_hash" in clients else pd.DataFrame()
    similar = not hists.empty and set(ids) <= set(hists.index)
    fig, axes = plt.subplots(1, 2 if similar else 1, figsize=(7.4 if similar else 3.8, 3.4), squeeze=False)
    if similar:
        heatmap(axes[0][0], cosine_matrix([hists.loc[c, "train_label_hist"] for c in ids]), ids,
                 "label similarity\n(cosine of train label histograms)")
    else:
        print("mask Hamming heatmap: no label histograms for this trial; the masks alone")
    heatmap(axes[0][-1], distance, ids, "normalised Hamming distance of final masks\n(all tensors)")
    info = trials[trials["config_hash"] == trial] if "config_hash" in trials else trials.iloc[:0]
    label = f"{info.iloc[0]['method']}, {info.iloc[0]['setting']}, seed {info.iloc[0]['seed']}" \
        if not info.empty else trial
    fig.suptitle(f"Client × client: data vs DisPFL masks — {label} (trial {trial})", fontsize=9)
    fig.tight_layout()
    return save_figure(fig, out, "mask_hamming")


def build_traffic_outputs(sweeps, trials: pd.DataFrame, out_dir, masks: pd.DataFrame | None = None) -> list[Path]:
    """Write `accuracy_vs_busiest_traffic` (when a server-less method that communicates ran) and
    `mask_hamming` (when DisPFL masks exist) under `out_dir`; print a note for each one skipped.
    `masks`: `load_masks(sweeps)` if already read."""
    out, written = Path(out_dir), []
    known = not trials.empty and {"acc_mean", "algorithm"} <= set(trials.columns)
    if not known or not serverless_communicating(trials).any():
        print("skipping accuracy vs busiest-node traffic: no server-less method that communicates (DisPFL, D-PSGD)")
    else:
        rounds = load_rounds(sweeps, trials=chosen_trials(trials)["config_hash"])
        written += plot_accuracy_vs_busiest(traffic_curves(rounds, trials), out)
    masks = load_masks(sweeps) if masks is None else masks
    dispfl = set(trials.loc[trials["algorithm"] == "dispfl", "config_hash"]) if known else set()
    masks = masks[masks["config_hash"].isin(dispfl)] if not masks.empty else masks
    if masks.empty:
        print("skipping mask Hamming heatmap: no DisPFL masks in these results")
    else:
        written += plot_mask_hamming(masks, load_clients(sweeps), trials, out)
    return written


# ---------------------------------------------------------------- table

def traffic_wanted(trials: pd.DataFrame) -> bool:
    """Whether the results hold a finished trial of a server-less method that communicates."""

    if trials.empty or not {"algorithm", "acc_mean"} <= set(trials.columns):
        return False
    trials = final_rows(trials)
    wanted = serverless_communicating(trials) & trials["acc_mean"].notna() & ~unfinished(trials)
    return bool(wanted.any())


def _mb_text(value: float) -> str | None:
    return None if pd.isna(value) else f"{value:.1f}" if value >= 1 or value == 0 else f"{value:.2g}"


def traffic_table(sweeps, trials: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame, str, pd.DataFrame]:
    """(cell texts, bold mask, caption, summary rows) of the traffic table: rows = methods, per
    data setting the final accuracy (%, mean ± std over seeds, marks against D-PSGD and bold by
    `analysis.stats.compare`) and the busiest node's total MB (the last round's `busiest_node_mb`,
    mean over seeds). Finished trials only, each method at the configuration `chosen_trials` picks
    in the setting (never by test accuracy)."""
    trials = counted(trials, "drop")
    late = unfinished(trials)
    finished = chosen_trials(trials[~late])
    if finished.empty:
        raise TableError("traffic table: no finished trials")
    load = busiest_node_mb(load_rounds(sweeps, trials=finished["config_hash"]))
    final = load.loc[load.groupby("config_hash")["round"].idxmax()].set_index("config_hash")["busiest_node_mb"]
    finished = finished.assign(busiest_node_mb=finished["config_hash"].map(final))
    methods, settings = methods_order(finished), settings_order(finished)
    acc = summarize(finished, "method", "setting", "traffic", methods, settings, mode="drop", references=REFERENCE)
    acc.finals = load_final_accuracies(sweeps, finished["config_hash"], reported_rounds(finished))
    acc_cells, bold, verdict = acc.cells(pm="±", dagger=""), acc.best_mask(), acc.verdict()
    mb = finished.groupby(["method", "setting"])["busiest_node_mb"].agg(lambda v: across_seeds(v.to_numpy())[0])
    columns = pd.MultiIndex.from_product([settings, ["Acc. (%)", "Busiest node (MB)"]])
    cells = pd.DataFrame(None, index=pd.Index(methods, name="Method"), columns=columns, dtype=object)
    marks = pd.DataFrame(False, index=methods, columns=columns)
    for setting in settings:
        cells[(setting, "Acc. (%)")] = acc_cells[setting]
        marks[(setting, "Acc. (%)")] = bold[setting]
        cells[(setting, "Busiest node (MB)")] = [_mb_text(mb.get((m, setting), np.nan)) for m in methods]
    seeds = acc.usual_n
    count = (f"{seeds} seed{'s' if seeds != 1 else ''} per cell"
             + ("" if acc.seeds_uniform() else " unless marked (n=k)"))
    dropped = list(trials.loc[late].reindex(columns=["rounds_done", "rounds"]).itertuples(index=False, name=None))
    caption = Caption(["Accuracy and traffic of the busiest node.",
                       f"{accuracy_words(acc.reported)}, mean ± std over seeds ({count}).", verdict.caption(),
                       "Total traffic (up + down, 1 MB = 1,000,000 bytes) of the busiest node over the run, mean over "
                       f"seeds; busiest node: {BUSIEST}.",
                       f"Each method at {selection_phrase(finished)} per data setting; finished trials only; {MISSING} "
                       "= no result.", unfinished_note(dropped, dropped=True)])
    return cells, marks, caption, verdict.summary("traffic")


def write_traffic_table(sweeps, trials: pd.DataFrame, out, markdown: bool = False, echo: bool = False,
                        summaries: list | None = None) -> Path:
    """Write `<out>/traffic.tex` (and with `markdown` `<out>/traffic.md`); returns the .tex file.
    The table's summary rows (`analysis.stats.Verdict.summary`) are appended to `summaries`."""
    cells, bold, caption, summary = traffic_table(sweeps, trials)
    if summaries is not None:
        summaries.append(summary)
    return write_table("traffic", cells, bold, caption, out, markdown, echo, latex_label("traffic", trials))
