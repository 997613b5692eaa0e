"""Per-round summary metrics of a trial, computed from its Parquet rows.

One function serves the live trial (which reports them to Tune) and the MLflow callback (which
back-fills rounds it never saw, e.g. the last round before a driver was interrupted), so the two
can never disagree.
"""
from __future__ import annotations

import pandas as pd

MB = 1e6
METRIC_KEYS = ("acc_mean", "acc_std", "acc_weighted", "acc_local_mean", "acc_global_mean", "loss_mean",
               "personal_fraction_mean", "personal_fraction_std", "mb_round", "mb_total", "round_seconds")


def round_metrics(rows: pd.DataFrame, mb_before: float) -> dict[str, float]:
    """Summary of one round (`rows`: one per client); `mb_before`: MB communicated in earlier rounds."""
    sent = float((rows.bytes_up + rows.bytes_down).sum()) / MB
    return {
        "round": int(rows["round"].iloc[0]),
        "acc_mean": float(rows.acc.mean()),                       # unweighted over clients, as papers report
        "acc_std": float(rows.acc.std(ddof=0)),
        "acc_weighted": float((rows.acc * rows.n_test).sum() / rows.n_test.sum()),
        "acc_local_mean": float(rows.acc_local.mean()),
        "acc_global_mean": float(rows.acc_global.mean()),
        "loss_mean": float(rows.loss.mean()),
        "personal_fraction_mean": float(rows.personal_fraction.mean()),
        "personal_fraction_std": float(rows.personal_fraction.std(ddof=0)),
        "mb_round": sent,
        "mb_total": mb_before + sent,
        "round_seconds": float(rows.round_seconds.iloc[0]),
    }


def history(round_files: list) -> list[dict[str, float]]:
    """Metrics of every round of one trial, from its round files (in round order)."""
    out, total = [], 0.0
    for path in sorted(round_files):
        metrics = round_metrics(pd.read_parquet(path), total)
        total = metrics["mb_total"]
        out.append(metrics)
    return out
