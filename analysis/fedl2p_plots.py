"""FedL2P's figures (Lee et al., NeurIPS 2023, Figs. 2-5): the policy its meta-nets give each client,
per layer, and how far apart the clients' policies are.

- `fedl2p_policy` (the paper's Figs. 2/4): per data setting, two panels: the final evaluated β of
  each BN layer (`beta:<layer>` columns) and η of each parameter tensor (`eta:<tensor>`), one box
  per layer over the clients (seen and unseen) of one trial, the first seed (seeds are not pooled:
  each has its own pretrained model, which would pass for a spread over clients); the η panel's
  title gives the sparsity (share of tensors at rate 0, mean over those clients).
- `fedl2p_policy_distance` (Figs. 3/5): per data setting, a β panel and an η panel of the
  Euclidean distances between the clients' final policy vectors, for the same trial.
  When the clients' data come from domains (`domain` in clients.parquet), clients are grouped by
  domain: d(j, k) = the mean distance between a client of domain j and one of domain k (within a
  domain: over pairs of distinct clients), shown as log(d(j,k) / sqrt(d(j,j) d(k,k))): about 0
  for a grouping the policies do not follow, > 0 off the diagonal where they separate the
  domains. Where a domain has one client, or its clients share one policy, the within-domain
  distance is 0 or undefined and the panel shows d(j, k) itself. Without domains: the client ×
  client distance (d(j,j) = 0 would make the log undefined).

The trials shown, per data setting: FedL2P (else the first other FedL2P label, else L2P) at the
configuration of table fedl2p (analysis.fedl2p.study_trials), at the (pretraining, rounds, e) of
the best mean validation accuracy where there is a split, else the first of them (`first_of`). A
panel without two clients with different policies shows a note instead of a matrix (and prints it);
a figure without any panel to draw is skipped with a printed note.
"""
from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from analysis.common import VALIDATED, TableError, selection_basis, settings_order
from analysis.fedl2p import META, fedl2p_wanted, method_columns, study_trials
from analysis.figures import save_figure
from analysis.load import load_clients, load_rounds

BETA, ETA = "beta:", "eta:"
NO_DOMAIN = ("mixed",)  # clients.parquet's domain of a client whose data mix domains


# ---------------------------------------------------------------- computations (pure)

def policy_columns(rows: pd.DataFrame) -> tuple[list[str], list[str]]:
    """The per-layer β and η columns that hold a value in `rows`, in their stored (layer) order."""
    present = [c for c in rows.columns if rows[c].notna().any()]
    return [c for c in present if c.startswith(BETA)], [c for c in present if c.startswith(ETA)]


def final_policies(rounds: pd.DataFrame) -> pd.DataFrame:
    """Per trial, the rows of its last round with a per-layer policy (`beta:*` / `eta:*`), one
    per client that has one."""
    beta, eta = policy_columns(rounds)
    if not beta + eta:
        return rounds.iloc[:0]
    has = rounds[beta + eta].notna().any(axis=1)
    rows = rounds[has]
    return rows[rows["round"] == rows.groupby("config_hash")["round"].transform("max")].reset_index(drop=True)


def pairwise_distances(vectors) -> np.ndarray:
    """Euclidean distance between every two rows of `vectors` (clients × entries)."""
    x = np.asarray(vectors, dtype=float)
    return np.sqrt(((x[:, None, :] - x[None, :, :]) ** 2).sum(axis=-1))


def group_distances(vectors, groups) -> tuple[list, np.ndarray]:
    """(group names, sorted; d) with d[j, k] the mean Euclidean distance between a client of
    group j and one of group k; within a group over pairs of distinct clients (NaN for a group of
    one client)."""
    dist = pairwise_distances(vectors)
    groups = np.asarray(list(groups), dtype=object)
    names = sorted(set(groups), key=str)
    d = np.full((len(names), len(names)), np.nan)
    for j, a in enumerate(names):
        for k, b in enumerate(names):
            block = dist[np.ix_(groups == a, groups == b)]
            if j != k:
                d[j, k] = block.mean()
            elif len(block) > 1:  # the zero diagonal (a client with itself) left out
                d[j, k] = block.sum() / (len(block) * (len(block) - 1))
    return names, d


def normalized_log_distance(d: np.ndarray) -> np.ndarray | None:
    """log(d(j,k) / sqrt(d(j,j) d(k,k))) (the paper's Figs. 3/5); None when some within-group
    distance d(j,j) is 0 or undefined."""
    within = np.diag(d)
    if not (np.isfinite(within) & (within > 0)).all():
        return None
    return np.log(d / np.sqrt(np.outer(within, within)))


# ---------------------------------------------------------------- the trials shown

def _preferred(methods) -> str:
    labels = method_columns(methods)
    fedl2p = [m for m in labels if m.startswith("FedL2P")]
    return fedl2p[0] if fedl2p else labels[0]


def first_of(trials: pd.DataFrame, key: list[str]) -> pd.Series:
    """The values of `key` whose trials are shown: the best mean validation accuracy where every
    trial has one (a validation split), else the first in sorted order; never test accuracy."""
    if selection_basis(trials) == VALIDATED:
        return pd.Series(trials.groupby(key)["acc_val_mean"].mean().idxmax(), index=key)
    return trials[key].sort_values(key, kind="stable").iloc[0]


def shown_trials(trials: pd.DataFrame) -> pd.DataFrame:
    """Per data setting, the trials (one per seed) of its FedL2P configuration at `first_of`'s
    (pretraining, rounds, e) (see the module docstring)."""
    chosen, _ = study_trials(trials)
    chosen = chosen[chosen["algorithm"].isin(META)]
    parts = []
    for setting in settings_order(chosen) if len(chosen) else []:
        mine = chosen[chosen["setting"] == setting]
        mine = mine[mine["method"] == _preferred(mine["method"])]
        key = ["pretraining", "rounds", "ft_epochs"]
        parts.append(mine[(mine[key] == first_of(mine, key)).all(axis=1)])
    return pd.concat(parts, ignore_index=True) if parts else chosen


def first_trials(policies: pd.DataFrame, shown: pd.DataFrame) -> list[tuple[pd.Series, pd.DataFrame]]:
    """Per data setting (in the tables' order): the shown trial of the first seed that has a
    per-layer policy, and its final policy rows sorted by client."""
    out = []
    for setting in settings_order(shown):
        trials = shown[(shown["setting"] == setting) & shown["config_hash"].isin(set(policies["config_hash"]))]
        if len(trials):
            first = trials.sort_values(["seed", "config_hash"]).iloc[0]
            out.append((first, policies[policies["config_hash"] == first["config_hash"]].sort_values("client")))
    return out


def _title(trial: pd.Series) -> str:
    return (f"{trial['setting']}: {trial['method']}, e = {int(trial['ft_epochs'])}, pretrained with "
            f"{trial['pretraining']}, seed {trial['seed']} (trial {trial['config_hash']})")


def _short(column: str) -> str:
    return column.split(":", 1)[1]


# ---------------------------------------------------------------- figures

def plot_policy(policies: pd.DataFrame, shown: pd.DataFrame, out: Path) -> list[Path]:
    firsts = first_trials(policies, shown)
    counts = [tuple(max(len(c), 2) for c in policy_columns(rows)) for _, rows in firsts]
    ratios = [max(b for b, _ in counts), max(e for _, e in counts)]
    fig = plt.figure(figsize=(max(8.0, 2.5 + 0.3 * sum(ratios)), 4.4 * len(firsts)), layout="constrained")
    for panel, (trial, rows) in zip(np.atleast_1d(fig.subfigures(len(firsts), 1)), firsts):
        beta, eta = policy_columns(rows)
        for ax, columns, name in zip(panel.subplots(1, 2, width_ratios=ratios), (beta, eta),
                                     ("β (BN mixing; 1 = the client's statistics)", "η (learning rate)")):
            if not columns:
                ax.text(0.5, 0.5, f"no per-layer {name.split(' ')[0]}", ha="center", va="center",
                        transform=ax.transAxes)
                ax.axis("off")
                continue
            ax.boxplot([rows[c].dropna().to_numpy() for c in columns], widths=0.6)
            ax.set_xticks(range(1, len(columns) + 1), [_short(c) for c in columns], rotation=90, fontsize=6)
            ax.grid(alpha=0.3, axis="y")
            ax.set_ylabel(name, fontsize=8)
            if columns is eta:
                sparsity = (rows[eta] == 0).sum(axis=1) / rows[eta].notna().sum(axis=1)
                ax.set_title(f"η per tensor; sparsity (tensors at rate 0) {100 * sparsity.mean():.1f}%", fontsize=8)
            else:
                ax.set_title("β per BN layer", fontsize=8)
        panel.suptitle(f"{_title(trial)}: final policy of its {rows['client'].nunique()} clients (seen and unseen)",
                       fontsize=9)
    return save_figure(fig, out, "fedl2p_policy")


def client_groups(clients: pd.DataFrame, trial: str, ids) -> list | None:
    """The domain of each client in `ids` of `trial` (clients.parquet's `domain`), or None when
    the data come from no domains, a client mixes domains, or all share one domain."""
    if clients.empty or not {"config_hash", "domain"} <= set(clients.columns):
        return None
    known = clients[clients["config_hash"] == trial].drop_duplicates("client").set_index("client")["domain"]
    domains = [known.get(c) for c in ids]
    if any(d is None or pd.isna(d) or d in NO_DOMAIN for d in domains) or len(set(domains)) < 2:
        return None
    return domains


def _matrix(ax, matrix: np.ndarray, labels, title: str, diverging: bool, axis_name: str) -> None:
    finite = matrix[np.isfinite(matrix)]
    if diverging:
        limit = max(float(np.abs(finite).max()) if finite.size else 0.0, 1e-12)
        image = ax.imshow(matrix, cmap="RdBu_r", vmin=-limit, vmax=limit)

        def dark(v):
            return abs(v) > 0.6 * limit
    else:
        top = float(finite.max()) if finite.size else 0.0
        image = ax.imshow(matrix, cmap="viridis", vmin=0)

        def dark(v):
            return v < 0.6 * top

    ax.set_xticks(range(len(labels)), labels, rotation=90 if len(labels) > 6 else 0, fontsize=7)
    ax.set_yticks(range(len(labels)), labels, fontsize=7)
    ax.set(xlabel=axis_name, ylabel=axis_name)
    ax.set_title(title, fontsize=8)
    if len(labels) <= 10:
        for i in range(len(labels)):
            for j in range(len(labels)):
                ax.text(j, i, f"{matrix[i, j]:.2g}", ha="center", va="center", fontsize=6,
                        color="white" if dark(matrix[i, j]) else "black")
    plt.colorbar(image, ax=ax, fraction=0.046)


def distance_panel(ax, vectors: np.ndarray, ids, groups, what: str) -> str | None:
    """Draw one distance panel (see the module docstring); returns a note instead where there is
    nothing to draw (fewer than two clients, or one policy shared by all)."""
    if len(ids) < 2:
        note = f"{what}: fewer than two clients with a policy, no distances"
    elif not pairwise_distances(vectors).any():
        note = f"{what}: every client has the same policy (all distances 0)"
    else:
        note = None
    if note:
        ax.text(0.5, 0.5, note, ha="center", va="center", wrap=True, fontsize=8, transform=ax.transAxes)
        ax.axis("off")
        return note
    if groups is None:
        _matrix(ax, pairwise_distances(vectors), list(ids), f"{what}: Euclidean distance, client × client", False,
                "client")
        return None
    names, d = group_distances(vectors, groups)
    scaled = normalized_log_distance(d)
    if scaled is None:
        _matrix(ax, d, names, f"{what}: mean distance between domains (a domain with one client or one shared "
                "policy: not normalised)", False, "domain")
    else:
        _matrix(ax, scaled, names, f"{what}: log(d(j,k) / √(d(j,j)·d(k,k)))", True, "domain")
    return None


def plot_policy_distance(policies: pd.DataFrame, clients: pd.DataFrame, shown: pd.DataFrame, out: Path) -> list[Path]:
    firsts = first_trials(policies, shown)
    fig = plt.figure(figsize=(10, 4.6 * len(firsts)), layout="constrained")
    drawn = False
    for panel, (trial, rows) in zip(np.atleast_1d(fig.subfigures(len(firsts), 1)), firsts):
        setting, ids = trial["setting"], rows["client"].tolist()
        groups = client_groups(clients, trial["config_hash"], ids)
        for ax, columns, what in zip(panel.subplots(1, 2), policy_columns(rows), ("β", "η")):
            vectors = rows[columns].to_numpy(dtype=float) if columns else np.zeros((len(ids), 0))
            usable = ~np.isnan(vectors).any(axis=1)
            note = distance_panel(ax, vectors[usable], [c for c, u in zip(ids, usable) if u],
                                  None if groups is None else [g for g, u in zip(groups, usable) if u], what)
            if note:
                print(f"FedL2P policy distance, {setting}: {note}")
            drawn |= note is None
        by = "clients grouped by domain" if groups is not None else "no domains: client × client"
        panel.suptitle(f"{_title(trial)}: final policies, {by}", fontsize=9)
    if not drawn:
        plt.close(fig)
        print("skipping FedL2P policy distance heatmap: no trial has two clients with different policies")
        return []
    return save_figure(fig, out, "fedl2p_policy_distance")


def build_fedl2p_plots(sweeps, trials: pd.DataFrame, out) -> list[Path]:
    """Write `fedl2p_policy` and `fedl2p_policy_distance` under `out` when the results hold
    FedL2P or L2P trials with a per-layer policy; print a note for each figure skipped."""
    out = Path(out)
    wanted = fedl2p_wanted(trials) and trials["algorithm"].isin(META).any()
    try:
        shown = shown_trials(trials) if wanted else pd.DataFrame()
    except TableError:
        shown = pd.DataFrame()
    if shown.empty:
        print("skipping FedL2P policy figures: no finished FedL2P or L2P trial")
        return []
    rounds = load_rounds(sweeps, trials=shown["config_hash"])
    policies = final_policies(rounds)
    if policies.empty:
        print("skipping FedL2P policy figures: no per-layer policy (beta:/eta: columns) in these results")
        return []
    policies = policies.drop(columns=["setting"], errors="ignore").merge(shown[["config_hash", "setting"]])
    return plot_policy(policies, shown, out) + plot_policy_distance(policies, load_clients(sweeps), shown, out)
