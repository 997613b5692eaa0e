"""Does FedL2P learn its policy? Two signals from a sweep's round rows (Parquet only), per data
setting and meta-learning method (FedL2P, its ablations, L2P):

1. **The validation loss over meta rounds.** Every seen client reports, each round it takes part,
   `val_loss`: the validation loss after fine-tuning under the λ it received (the objective the
   meta-gradient lowers; `val_loss_after`: after its own K meta steps). With partial
   participation the clients of round 1 and of the last round differ, so the comparison is per
   client: its loss at its first meta round ("first") against its loss at its last one ("last"),
   averaged over the seen clients weighted by training samples (`n_train`, the server's weights),
   per seed. "fell" says whether the mean over seeds of last − first is below 0; with two or more
   seeds, `p` is the paired t-test over seeds (`scipy.stats.ttest_rel`, two-sided). "within" is
   the weighted mean of `val_loss_after − val_loss` over all client rounds: what one client's K
   meta steps do to its own loss.
2. **The learned λ against the initial one, on the same batches.** On evaluated rounds each
   client also reports `val_loss_learned` and `val_loss_init`: the validation loss after
   fine-tuning under the λ it is scored with and under the initial λ, both with the same batches
   (common random numbers), so their difference is λ's alone. Per trial at its last evaluated
   round, the weighted mean over the pool's clients of each; per (setting, method, pool) the mean
   change learned − initial over seeds, the paired t-test over seeds (`scipy.stats.ttest_rel`),
   and the share of client × seed pairs where the learned λ is lower.
3. **How far the policy moved.** On evaluated rounds each client has its learned policy (`beta:
   <BN layer>`, `eta:<tensor>`) and the one the initial λ gives it (`beta_init:*`, `eta_init:*`;
   fl_core/fedl2p/algorithm.py). At each trial's last evaluated round: |Δβ| = the mean over
   clients and layers of |β − β_init|; |Δη| / η_init the mean relative change of the rates
   (tensors with η_init = 0 left out). Between domains (feature shift: `domain` in
   clients.parquet): d = Euclidean distance between two clients' policy vectors (β per layer;
   η / η_init per tensor, so that every tensor counts alike); "between" = mean d over pairs of
   clients of different domains, "within" = over distinct pairs of one domain; the ratio
   between / within is 1 when the policy ignores the domain. Reported for the learned policy and
   the initial one (the meta-nets already read the client's statistics at initialisation), with a
   one-sample t-test over seeds (`scipy.stats.ttest_1samp`, alternative "greater") that the
   learned policy's log ratio exceeds the initial one's.

Usage: `python -m analysis.fedl2p_learning results/<sweep> [--markdown] [--out FILE] [--plot PNG]`.

Values: mean over seeds (± std where a cell says so); p-values are `nan` with fewer than 2 seeds.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import pandas as pd
from scipy import stats

from analysis.common import chosen_trials, final_rows, methods_order, settings_order
from analysis.load import DamagedFile, load_clients, load_rounds, load_trials
from analysis.render import in_order

META = ("fedl2p", "l2p")
BETA, ETA = "beta:", "eta:"
KEYS = ["setting", "method"]


def _weighted(values: pd.Series, weights: pd.Series) -> float:
    ok = values.notna() & weights.notna()
    return float(np.average(values[ok], weights=weights[ok])) if ok.any() and weights[ok].sum() > 0 else np.nan


def _seen_meta_rows(rounds: pd.DataFrame) -> pd.DataFrame:
    rows = rounds[rounds["algorithm"].isin(META) & rounds["val_loss"].notna()]
    return rows[rows["pool"].ne("unseen")] if "pool" in rows else rows


def loss_per_seed(rounds: pd.DataFrame) -> pd.DataFrame:
    """Per trial: the weighted mean over seen clients of each client's `val_loss` at its first
    and its last meta round (`first`, `last`), and of `val_loss_after − val_loss` (`within`)."""
    out = []
    for trial, rows in _seen_meta_rows(rounds).groupby("config_hash", sort=True):
        rows = rows.sort_values("round")
        firsts, lasts = rows.groupby("client").head(1), rows.groupby("client").tail(1)
        step = rows["val_loss_after"] - rows["val_loss"] if "val_loss_after" in rows else rows["val_loss"] * np.nan
        out.append({"config_hash": trial, **{k: rows[k].iloc[0] for k in KEYS}, "seed": rows["seed"].iloc[0],
                    "first": _weighted(firsts["val_loss"], firsts["n_train"]),
                    "last": _weighted(lasts["val_loss"], lasts["n_train"]),
                    "within": _weighted(step, rows["n_train"]), "meta_rounds": int(rows["round"].max())})
    return pd.DataFrame(out)


def loss_curve(rounds: pd.DataFrame) -> pd.DataFrame:
    """Per (setting, method, round), means over seeds of: `val_loss`, the weighted mean of the
    round's clients; `change`, the weighted mean of each of those clients' `val_loss` minus its
    own at its first meta round (free of which clients the round happened to sample)."""
    rows = _seen_meta_rows(rounds).sort_values("round")
    first = rows.groupby(["config_hash", "client"])["val_loss"].transform("first")
    rows = rows.assign(change=rows["val_loss"] - first)
    per_seed = rows.groupby([*KEYS, "seed", "round"]).apply(
        lambda g: pd.Series({c: _weighted(g[c], g["n_train"]) for c in ("val_loss", "change")}), include_groups=False)
    return per_seed.groupby([*KEYS, "round"]).mean().reset_index()


def loss_summary(rounds: pd.DataFrame) -> pd.DataFrame:
    """Per (setting, method): seeds, first, last, change (last − first), fell, p, within."""
    out = []
    for key, group in loss_per_seed(rounds).groupby(KEYS, sort=True):
        change = group["last"] - group["first"]
        p = stats.ttest_rel(group["last"], group["first"]).pvalue if len(group) >= 2 else np.nan
        out.append(dict(zip(KEYS, key)) | {"seeds": len(group), "first": group["first"].mean(),
                                           "last": group["last"].mean(), "change": change.mean(),
                                           "change_std": change.std(ddof=1) if len(group) >= 2 else np.nan,
                                           "fell": bool(change.mean() < 0), "p": float(p),
                                           "within": group["within"].mean()})
    return pd.DataFrame(out)


def gain_per_seed(rounds: pd.DataFrame) -> pd.DataFrame:
    """Per trial and pool: weighted means over clients of `val_loss_learned` and `val_loss_init`
    at the trial's last round that has them, and the share of clients where learned < initial."""
    if not {"val_loss_learned", "val_loss_init"} <= set(rounds.columns):
        return pd.DataFrame()
    rows = rounds[rounds["algorithm"].isin(META) & rounds["val_loss_learned"].notna() & rounds["val_loss_init"].notna()]
    rows = rows[rows["round"] == rows.groupby("config_hash")["round"].transform("max")]
    pool = rows["pool"] if "pool" in rows else pd.Series("seen", index=rows.index)
    out = []
    for (trial, name), group in rows.groupby([rows["config_hash"], pool], sort=True):
        out.append({"config_hash": trial, **{k: group[k].iloc[0] for k in KEYS}, "pool": name,
                    "seed": group["seed"].iloc[0], "learned": _weighted(group["val_loss_learned"], group["n_train"]),
                    "init": _weighted(group["val_loss_init"], group["n_train"]),
                    "lower": int((group["val_loss_learned"] < group["val_loss_init"]).sum()), "clients": len(group)})
    return pd.DataFrame(out)


def gain_summary(rounds: pd.DataFrame) -> pd.DataFrame:
    """Per (setting, method, pool): seeds, initial, learned, change ± std, paired-t p, share lower."""
    per_seed = gain_per_seed(rounds)
    out = []
    for key, group in (per_seed.groupby([*KEYS, "pool"], sort=True) if not per_seed.empty else []):
        change = group["learned"] - group["init"]
        p = stats.ttest_rel(group["learned"], group["init"]).pvalue if len(group) >= 2 else np.nan
        out.append(dict(zip([*KEYS, "pool"], key)) | {
            "seeds": len(group), "init": group["init"].mean(), "learned": group["learned"].mean(),
            "change": change.mean(), "change_std": change.std(ddof=1) if len(group) >= 2 else np.nan,
            "p": float(p), "lower": f"{group['lower'].sum()} of {group['clients'].sum()}"})
    return pd.DataFrame(out)


def final_policy_rows(rounds: pd.DataFrame) -> pd.DataFrame:
    """Per meta-learning trial, its clients' rows at its last round with a per-layer policy."""
    beta = [c for c in rounds.columns if c.startswith(BETA)]
    rows = rounds[rounds["algorithm"].isin(META)]
    rows = rows[rows[beta].notna().any(axis=1)] if beta else rows.iloc[:0]
    return rows[rows["round"] == rows.groupby("config_hash")["round"].transform("max")]


def _vectors(rows: pd.DataFrame, initial: bool) -> np.ndarray:
    """Clients × (β per layer, η / η_init per tensor) of the learned (or the initial) policy."""
    beta = [c for c in rows.columns if c.startswith(BETA)]
    eta = [c for c in rows.columns if c.startswith(ETA)]
    b = rows[[c.replace(":", "_init:", 1) for c in beta]].to_numpy(float) if initial else rows[beta].to_numpy(float)
    e0 = rows[[c.replace(":", "_init:", 1) for c in eta]].to_numpy(float)
    e = e0 if initial else rows[eta].to_numpy(float)
    with np.errstate(divide="ignore", invalid="ignore"):
        scaled = np.where(e0 != 0, e / e0, np.nan)
    return np.nan_to_num(np.concatenate([b, scaled], axis=1), nan=0.0)


def domain_distances(vectors: np.ndarray, domains: list) -> tuple[float, float]:
    """(mean distance between clients of different domains, between distinct clients of one domain)."""
    d = np.sqrt(((vectors[:, None, :] - vectors[None, :, :]) ** 2).sum(axis=-1))
    same = np.equal.outer(np.asarray(domains, dtype=object), np.asarray(domains, dtype=object))
    pairs = ~np.eye(len(domains), dtype=bool)
    between, within = d[~same], d[same & pairs]
    return (float(between.mean()) if between.size else np.nan, float(within.mean()) if within.size else np.nan)


def policy_per_seed(rounds: pd.DataFrame, clients: pd.DataFrame | None = None) -> pd.DataFrame:
    """Per trial: |Δβ|, |Δη|/η_init and, with ≥ 2 domains, the between / within distance ratios."""
    rows = final_policy_rows(rounds)
    beta = [c for c in rows.columns if c.startswith(BETA)]
    eta = [c for c in rows.columns if c.startswith(ETA)]
    has_init = beta and all(c.replace(":", "_init:", 1) in rows for c in beta + eta)
    domain = ({} if clients is None or clients.empty or "domain" not in clients else
              clients.drop_duplicates(["config_hash", "client"]).set_index(["config_hash", "client"])["domain"])
    out = []
    for trial, group in rows.groupby("config_hash", sort=True):
        row = {"config_hash": trial, **{k: group[k].iloc[0] for k in KEYS}, "seed": group["seed"].iloc[0],
               "clients": len(group)}
        if has_init:
            init_b = group[[c.replace(":", "_init:", 1) for c in beta]].to_numpy(float)
            e, e0 = group[eta].to_numpy(float), group[[c.replace(":", "_init:", 1) for c in eta]].to_numpy(float)
            with np.errstate(divide="ignore", invalid="ignore"):
                rel = np.where(e0 != 0, np.abs(e - e0) / np.abs(e0), np.nan)
            row |= {"beta_moved": float(np.abs(group[beta].to_numpy(float) - init_b).mean()),
                    "eta_moved": float(np.nanmean(rel)) if np.isfinite(rel).any() else np.nan}
            names = [domain.get((trial, c)) for c in group["client"]] if len(domain) else []
            if names and all(isinstance(n, str) and n != "mixed" for n in names) and len(set(names)) >= 2:
                for tag, initial in (("learned", False), ("init", True)):
                    between, within = domain_distances(_vectors(group, initial), names)
                    row |= {f"between_{tag}": between, f"within_{tag}": within,
                            f"ratio_{tag}": between / within if within > 0 else np.nan}
        out.append(row)
    return pd.DataFrame(out)


def policy_summary(rounds: pd.DataFrame, clients: pd.DataFrame | None = None) -> pd.DataFrame:
    """Per (setting, method): means over seeds of `policy_per_seed`, and `p_domain` (learned log
    ratio > initial log ratio over seeds, one-sided)."""
    per_seed = policy_per_seed(rounds, clients)
    out = []
    for key, group in per_seed.groupby(KEYS, sort=True):
        row = dict(zip(KEYS, key)) | {"seeds": len(group)}
        for column in ("beta_moved", "eta_moved", "between_learned", "ratio_learned", "between_init", "ratio_init"):
            row[column] = group[column].mean() if column in group else np.nan
        lift = (np.log(group["ratio_learned"]) - np.log(group["ratio_init"])).dropna() \
            if {"ratio_learned", "ratio_init"} <= set(group.columns) else pd.Series(dtype=float)
        row["p_domain"] = (float(stats.ttest_1samp(lift, 0.0, alternative="greater").pvalue)
                           if len(lift) >= 2 else np.nan)
        out.append(row)
    return pd.DataFrame(out)


LOSS_HEAD = {"setting": "Data setting", "method": "Method", "seeds": "Seeds", "first": "L_V first",
             "last": "L_V last", "change": "Δ (last − first)", "p": "p (paired t)", "fell": "fell",
             "within": "within-round Δ"}
GAIN_HEAD = {"setting": "Data setting", "method": "Method", "pool": "Clients", "seeds": "Seeds",
             "init": "L_V initial λ", "learned": "L_V learned λ", "change": "Δ (learned − initial)",
             "p": "p (paired t)", "lower": "clients lower"}
POLICY_HEAD = {"setting": "Data setting", "method": "Method", "seeds": "Seeds", "beta_moved": "mean abs Δβ",
               "eta_moved": "mean abs Δη / η_init", "between_learned": "β/η between domains",
               "ratio_learned": "between/within", "between_init": "between (initial λ)",
               "ratio_init": "between/within (initial λ)", "p_domain": "p (ratio > initial)"}


def _text(value) -> str:
    if isinstance(value, (bool, np.bool_)):
        return "yes" if value else "no"
    if isinstance(value, (float, np.floating)):
        return "nan" if not np.isfinite(value) else f"{value:.4g}"
    return str(value)


def render(frame: pd.DataFrame, heads: dict[str, str], markdown: bool) -> str:
    """`frame`'s columns of `heads`, as a Markdown table or aligned text; a row's setting, method
    and clients printed only where they, or one before them, differ from the row above's."""
    if frame.empty:
        return "(no FedL2P or L2P rows with these numbers)"
    columns = [c for c in heads if c in frame]
    if "change_std" in frame and "change" in columns:
        frame = frame.assign(change=[f"{_text(m)} ± {_text(s)}" for m, s in zip(frame["change"], frame["change_std"])])
    rows = [[_text(v) for v in row] for row in frame[columns].itertuples(index=False)]
    keys = [i for i, c in enumerate(columns) if c in (*KEYS, "pool")]
    for above, row in reversed(list(zip(rows, rows[1:]))):  # from the bottom: each row against the original above
        for i in keys:
            if row[:i + 1] != above[:i + 1]:
                break
            row[i] = ""
    cells = [[heads[c] for c in columns]] + rows
    if markdown:
        lines = ["| " + " | ".join(r) + " |" for r in cells]
        return "\n".join([lines[0], "|" + "---|" * len(columns), *lines[1:]])
    widths = [max(len(r[i]) for r in cells) for i in range(len(columns))]
    return "\n".join("  ".join(v.ljust(w) for v, w in zip(r, widths)) for r in cells)


def report(rounds: pd.DataFrame, clients: pd.DataFrame | None = None, markdown: bool = False) -> str:
    """The three tables, rows by data setting (`settings_order`), method (`methods_order`), then
    seen before unseen clients."""
    gap = "\n\n" if markdown else "\n"  # Markdown starts a table after a blank line only
    known = {"setting", "dataset", "partition", "shards_per_client", "dir_alpha"} <= set(rounds.columns)
    orders = {"setting": settings_order(rounds) if known else [],
              "method": methods_order(rounds) if {"method", "algorithm"} <= set(rounds.columns) else [],
              "pool": ["seen", "unseen"]}
    parts = [("Validation loss over meta rounds (seen clients, weighted by training samples):",
              loss_summary(rounds), LOSS_HEAD),
             ("The learned λ against the initial λ, same batches (last evaluated round):", gain_summary(rounds),
              GAIN_HEAD),
             ("Policy: distance from the initial λ's, and between domains (last evaluated round):",
              policy_summary(rounds, clients), POLICY_HEAD)]
    return "\n\n".join(title + gap + render(in_order(frame, {c: o for c, o in orders.items() if c in frame}),
                                              heads, markdown) for title, frame, heads in parts)


def reported(rounds: pd.DataFrame, trials: pd.DataFrame) -> pd.DataFrame:
    """The rows of the trials the sweep's tables report: per (setting, method) the configuration
    chosen on validation, on the reported seeds (`analysis.common.chosen_trials`). A tuned sweep's
    search trials (its search seed, the configurations not chosen) are left out, as the tables
    leave them out: they are not seeds of the reported method."""
    keep = set(chosen_trials(final_rows(trials))["config_hash"]) if len(trials) else set()
    return rounds[rounds["config_hash"].isin(keep)]


def load(paths: list[str]) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(round rows, client rows) of sweep folders (analysis.load; the reported trials only,
    `reported`) and of single runs' output folders (`python -m fl_core --results DIR`:
    DIR/rounds.parquet, DIR/clients.parquet)."""
    runs = [Path(p) for p in paths if (Path(p) / "rounds.parquet").exists()]
    sweeps = [p for p in paths if Path(p) not in runs]
    rounds = [pd.read_parquet(r / "rounds.parquet") for r in runs]
    rounds += [reported(load_rounds(sweeps), load_trials(sweeps))] if sweeps else []
    clients = [pd.read_parquet(r / "clients.parquet") for r in runs if (r / "clients.parquet").exists()]
    clients += [load_clients(sweeps)] if sweeps else []
    return pd.concat(rounds, ignore_index=True), pd.concat(clients, ignore_index=True) if clients else pd.DataFrame()


def plot_loss_curve(rounds: pd.DataFrame, out: str | Path) -> Path:
    """Each client's validation loss over meta rounds against its own at its first meta round
    (`loss_curve`'s `change`): one panel per data setting, one line per method. The raw mean over
    a round's clients mostly shows which clients were sampled (their losses differ tenfold)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if _seen_meta_rows(rounds).empty:
        raise ValueError("no meta-learning rows with val_loss to plot")
    curve = loss_curve(rounds)
    settings = list(dict.fromkeys(curve["setting"]))
    fig, axes = plt.subplots(1, len(settings), figsize=(5.2 * len(settings), 3.4), squeeze=False, sharey=True)
    for ax, setting in zip(axes[0], settings):
        for method, line in curve[curve["setting"] == setting].groupby("method", sort=True):
            ax.plot(line["round"], line["change"], marker=".", label=method)
        ax.axhline(0.0, color="grey", linewidth=0.8)
        ax.set_title(setting, fontsize=9)
        ax.set_xlabel("meta round")
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("validation loss − the client's first")
    axes[0][0].legend(fontsize=8)
    fig.suptitle("Change of each client's validation loss since its first meta round (the round's seen clients, "
                 "mean over seeds)", fontsize=10)
    fig.tight_layout()
    out = Path(out)
    fig.savefig(out, dpi=130)
    plt.close(fig)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("results", nargs="+", help="sweep folders, results folders holding sweeps, or a single "
                        "run's --results folder (rounds.parquet)")
    parser.add_argument("--markdown", action="store_true", help="Markdown tables (default: aligned text)")
    parser.add_argument("--out", help="also write the report to this file")
    parser.add_argument("--plot", help="also draw the validation loss over meta rounds to this image file")
    args = parser.parse_args(argv)
    try:
        rounds, clients = load(args.results)
    except (FileNotFoundError, DamagedFile) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    text = report(rounds, clients, args.markdown)
    print(text)
    if args.plot:
        print(f"wrote {plot_loss_curve(rounds, args.plot)}")
    if args.out:
        with open(args.out, "w", encoding="utf-8") as f:
            f.write(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
