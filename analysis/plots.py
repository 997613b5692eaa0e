"""Figures from sweep results (Parquet only): `python -m analysis.plots RESULTS... [--out DIR]`.

Writes each figure as PNG and PDF and prints the paths:
- `accuracy_vs_round`: mean-over-clients accuracy per round, one line per method, one panel per
  data setting; mean ± std over seeds.
- `mask_iou`: client × client IoU of the final FedSelect masks per tensor for one trial (the best
  one), next to the clients' label-distribution similarity (cosine of train label histograms).
- `personal_fraction_communication`: personal fraction and cumulative communication (MB) per round.
- `final_acc_vs_knobs`: final FedSelect accuracy against each swept knob that varies.
- `accuracy_vs_busiest_traffic`, `mask_hamming`: busiest-node traffic and DisPFL mask distances
  (analysis.traffic).
- `fedl2p_policy`, `fedl2p_policy_distance`: FedL2P's per-layer policy across clients and the
  distances between the clients' policies (analysis.fedl2p_plots).

Where a method was run with several configurations in a setting, the curves show the one the tables
show (`analysis.common.chosen_trials`: the best mean validation accuracy where there is a
validation split, else the declared configuration; never test accuracy). Per-round numbers are
`fl_core.results.summarize_trial` of each shown trial; bands over seeds are
`fl_core.results.across_seeds`; rounds that were not evaluated (`eval_every`) have no accuracy
point. Labels are the rows' `method` and `setting` columns. A figure the results do not support is
skipped with a printed note.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from matplotlib.ticker import MaxNLocator

from analysis.common import chosen_trials, cosine_matrix, method_curves
from analysis.figures import heatmap, method_colors, save_figure
from analysis.load import DamagedFile, find_sweeps, is_gradselect, load_clients, load_masks, load_rounds, load_trials
from fl_core.config import DIRICHLET_PARTITIONS

KNOBS = ("pers_rate", "pers_limit", "dir_alpha", "local_epochs")


# ---------------------------------------------------------------- computations (pure)

def iou_matrix(masks: list[np.ndarray]) -> np.ndarray:
    """Pairwise intersection-over-union of boolean masks (same shape); 1.0 where both are empty."""
    flat = np.stack([np.asarray(m, dtype=bool).ravel() for m in masks]).astype(np.int64)
    inter = flat @ flat.T
    sizes = flat.sum(axis=1)
    union = sizes[:, None] + sizes[None, :] - inter
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(union == 0, 1.0, inter / np.maximum(union, 1))


# ---------------------------------------------------------------- figures

def _label(group: pd.DataFrame, method: str) -> str:
    """A curve's legend: the method with its chosen configuration (`method_curves`' label)."""
    return str(group["label"].iloc[0]) if "label" in group and len(group) else method


def _band(ax, x, mean, std, label, color):
    ax.plot(x, mean, marker="o", markersize=3, label=label, color=color)
    ax.fill_between(x, mean - std, mean + std, color=color, alpha=0.2)


def plot_per_setting(stats: pd.DataFrame, mean: str, std: str, ylabel: str, title: str, out: Path,
                     name: str) -> list[Path]:
    """One panel per data setting, one band (mean ± std over seeds) per method against the round;
    rounds where `mean` is NaN (not evaluated) have no point."""
    settings = sorted(stats["setting"].unique())
    colors = method_colors(stats["method"])
    fig, axes = plt.subplots(1, len(settings), figsize=(4.5 * len(settings), 3.5), squeeze=False, sharey=True)
    for ax, setting in zip(axes[0], settings):
        for method, group in stats[stats["setting"] == setting].groupby("method"):
            group = group[group[mean].notna()]
            _band(ax, group["round"], group[mean], group[std], _label(group, method), colors[method])
        ax.set(title=setting, xlabel="round")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    axes[0][0].set_ylabel(ylabel)
    fig.suptitle(title)
    fig.tight_layout()
    return save_figure(fig, out, name)


def plot_accuracy(stats: pd.DataFrame, out: Path) -> list[Path]:
    return plot_per_setting(stats, "acc_mean_mean", "acc_mean_std", "accuracy (mean over clients)",
                            "Accuracy vs round (mean ± std over seeds)", out, "accuracy_vs_round")


def plot_personal_communication(stats: pd.DataFrame, out: Path) -> list[Path]:
    settings = sorted(stats["setting"].unique())
    colors = method_colors(stats["method"])
    fig, axes = plt.subplots(2, len(settings), figsize=(4.5 * len(settings), 6.5), squeeze=False, sharex="col")
    for col, setting in enumerate(settings):
        for method, group in stats[stats["setting"] == setting].groupby("method"):
            label = _label(group, method)
            _band(axes[0][col], group["round"], group["personal_fraction_mean_mean"],
                  group["personal_fraction_mean_std"], label, colors[method])
            _band(axes[1][col], group["round"], group["mb_total_mean"], group["mb_total_std"], label, colors[method])
        axes[0][col].set_title(setting)
        axes[1][col].set_xlabel("round")
        for ax in axes[:, col]:
            ax.grid(alpha=0.3)
            ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        axes[0][col].legend(fontsize=7)
    axes[0][0].set_ylabel("personal fraction")
    axes[1][0].set_ylabel("cumulative communication (MB)")
    fig.suptitle("Personal fraction and cumulative communication (all clients, up + down) vs round")
    fig.tight_layout()
    return save_figure(fig, out, "personal_fraction_communication")


def plot_mask_churn(rounds: pd.DataFrame, trials: pd.DataFrame, out: Path) -> list[Path]:
    """Sparse methods' mask churn (DisPFL's `mask_churn`: the share of entries whose mask changed
    in a round, mean over the clients) vs round, mean ± std over the seeds of the chosen trials:
    where the curve has flattened near zero the masks have settled. Nothing without the column."""
    if "mask_churn" not in rounds or rounds["mask_churn"].isna().all():
        return []
    churn = rounds.groupby(["config_hash", "round"])["mask_churn"].mean().dropna().reset_index()
    churn = churn.merge(chosen_trials(trials)[["config_hash", "setting", "method"]], on="config_hash")
    stats = churn.groupby(["setting", "method", "round"])["mask_churn"].agg(["mean", "std"]).fillna(0.0).reset_index()
    return plot_per_setting(stats, "mean", "std", "share of mask entries changed",
                            "Mask churn vs round (mean over clients; mean ± std over seeds)", out, "mask_churn")


def _pick_mask_trial(masks: pd.DataFrame, trials: pd.DataFrame) -> str:
    """The first seed's trial of the FedSelect (GradSelect) configuration the tables show
    (`chosen_trials`, in the first data setting that has masks); else the first trial with masks."""
    have = set(masks["config_hash"])
    if trials.empty or "acc_mean" not in trials:
        return min(have)
    candidates = trials[trials["config_hash"].isin(have) & trials["acc_mean"].notna()]
    main = candidates[is_gradselect(candidates)]
    candidates = main if not main.empty else candidates
    if candidates.empty:
        return min(have)
    if {"setting", "method"} <= set(candidates.columns):
        candidates = chosen_trials(candidates)
    return candidates.sort_values(["seed", "config_hash"] if "seed" in candidates else ["config_hash"],
                                  kind="stable")["config_hash"].iloc[0]


def plot_mask_iou(masks: pd.DataFrame, clients: pd.DataFrame, trials: pd.DataFrame, out: Path) -> list[Path]:
    trial = _pick_mask_trial(masks, trials)
    rows = masks[masks["config_hash"] == trial].drop_duplicates(["client", "tensor"]).sort_values("client")
    tensors = list(dict.fromkeys(rows["tensor"]))
    weights = [t for t in tensors if t.endswith("weight")]
    tensors = weights or tensors  # one panel per layer; biases are tiny and left out when weights exist
    ids = sorted(rows["client"].unique())

    hists = clients[clients["config_hash"] == trial].drop_duplicates("client").set_index("client") \
        if "config_hash" in clients else pd.DataFrame()  # sweeps without client histograms
    panels = len(tensors) + (1 if not hists.empty else 0)
    ncols = min(panels, 4)
    nrows = -(-panels // ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(3.6 * ncols, 3.3 * nrows), squeeze=False)
    axes = axes.ravel()
    for ax, tensor in zip(axes, tensors):
        by_client = rows[rows["tensor"] == tensor].set_index("client")["mask"]
        heatmap(ax, iou_matrix([by_client[c] for c in ids]), ids, f"mask IoU: {tensor}")
    if not hists.empty:
        similarity = cosine_matrix([hists.loc[c, "train_label_hist"] for c in ids])
        heatmap(axes[len(tensors)], similarity, ids, "label similarity\n(cosine of train label histograms)")
    for ax in axes[panels:]:
        ax.axis("off")
    info = trials[trials["config_hash"] == trial]
    label = f"{info.iloc[0]['method']}, {info.iloc[0]['setting']}, seed {info.iloc[0]['seed']}" \
        if not info.empty else trial
    fig.suptitle(f"Final-round client × client mask IoU per layer — {label} (trial {trial})")
    fig.tight_layout()
    return save_figure(fig, out, "mask_iou")


def plot_knobs(fedselect: pd.DataFrame, knobs: list[str], out: Path) -> list[Path]:
    fig, axes = plt.subplots(1, len(knobs), figsize=(4 * len(knobs), 3.5), squeeze=False, sharey=True)
    for ax, knob in zip(axes[0], knobs):
        # dir_alpha only means something for Dirichlet splits, and is part of their setting label.
        trials, group_cols = (_dirichlet(fedselect), ["dataset"]) if knob == "dir_alpha" else (fedselect, ["setting"])
        for name, group in trials.groupby(group_cols):
            stats = group.groupby(knob)["acc_mean"].agg(["mean", "std"]).fillna(0.0).reset_index()
            ax.errorbar(stats[knob], stats["mean"], yerr=stats["std"], marker="o", capsize=3,
                        label=", ".join(map(str, name)))
        ax.set(xlabel=knob, title=f"final accuracy vs {knob}")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    axes[0][0].set_ylabel("final accuracy (mean over clients)")
    fig.suptitle("FedSelect: final accuracy vs swept knobs (mean ± std over seeds and other knobs)")
    fig.tight_layout()
    return save_figure(fig, out, "final_acc_vs_knobs")


def _dirichlet(trials: pd.DataFrame) -> pd.DataFrame:
    return trials[trials["partition"].isin(DIRICHLET_PARTITIONS)]


def _varies(trials: pd.DataFrame, knob: str) -> bool:
    trials = _dirichlet(trials) if knob == "dir_alpha" else trials
    return knob in trials and trials[knob].nunique() > 1


def build_plots(paths, out: str | Path | None = None) -> list[Path]:
    """Write every figure the results support under `out` (default: `<first path>/figures`)."""
    paths = [paths] if isinstance(paths, (str, Path)) else list(paths)
    out = Path(out) if out is not None else Path(paths[0]) / "figures"
    from analysis.common import final_rows, selection_rows
    from analysis.search import plot_search

    sweeps = find_sweeps(paths)
    searched = load_trials(sweeps)
    selecting = not selection_rows(searched).empty
    trials = final_rows(searched)  # a selection stage's trials are shown by plot_search alone
    written: list[Path] = []

    shown = chosen_trials(trials)["config_hash"] if not trials.empty and "acc_mean" in trials else []
    rounds = load_rounds(sweeps, trials=shown) if len(shown) else pd.DataFrame()
    if rounds.empty:
        print("skipping round figures: no per-round results")
    else:
        stats = method_curves(rounds, trials)
        written += plot_accuracy(stats, out)
        written += plot_personal_communication(stats, out)
        written += plot_mask_churn(rounds, trials, out)

    masks = load_masks(sweeps)
    if masks.empty:
        print("skipping mask IoU heatmap: no masks in these results")
    else:
        written += plot_mask_iou(masks, load_clients(sweeps), trials, out)
    from analysis.traffic import build_traffic_outputs  # busiest-node traffic, DisPFL mask distances
    written += build_traffic_outputs(sweeps, trials, out, masks)
    from analysis.fedl2p_plots import build_fedl2p_plots  # FedL2P's policies per layer and their distances
    written += build_fedl2p_plots(sweeps, trials, out)

    if selecting:
        print("skipping final accuracy vs knobs: a selection stage chose the knobs (see search_history)")
        return written + plot_search(searched, out)
    fedselect = pd.DataFrame()
    if not trials.empty and "acc_mean" in trials:
        fedselect = trials[is_gradselect(trials) & trials["acc_mean"].notna()].copy()
    knobs = [k for k in KNOBS if _varies(fedselect, k)]
    if not knobs:
        print("skipping final accuracy vs knobs: no FedSelect knob varies")
    else:
        written += plot_knobs(fedselect, knobs, out)
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m analysis.plots", description=__doc__.splitlines()[0])
    parser.add_argument("results", nargs="+", help="sweep folders or folders of sweeps")
    parser.add_argument("--out", help="output folder (default: the first RESULTS path's figures/)")
    args = parser.parse_args(argv)
    try:
        for path in build_plots(args.results, args.out):
            print(path)
    except (FileNotFoundError, DamagedFile) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
