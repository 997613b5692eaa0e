"""Helpers for the sweep tests: tiny sweep flags, reading MLflow, recomputing trials without Ray."""
from __future__ import annotations

from pathlib import Path

import pandas as pd

from fl_core.config import RunConfig
from fl_core.simulation import Simulation

# 3 clients on the synthetic source, a few rounds: each trial takes about a second of compute.
TINY_SWEEP = ["--dataset", "synthetic", "--num-clients", "3", "--partition", "shards", "--shards-per-client", "3",
              "--batch-size", "16", "--dir-alpha", "0.5", "--local-epochs", "1", "--pers-limit", "0.8",
              "--verbose", "0"]


def sweep_args(tmp_path: Path, name: str, *extra: str, rounds: int = 2) -> list[str]:
    return TINY_SWEEP + ["--rounds", str(rounds), "--results", str(tmp_path), "--name", name, *extra]


def final_rows(rounds: pd.DataFrame) -> pd.DataFrame:
    last = rounds.groupby("config_hash")["round"].transform("max")
    cols = ["config_hash", "client", "round", "acc", "acc_local", "acc_global", "loss", "personal_fraction", "bytes_up"]
    return rounds[rounds["round"] == last][cols].sort_values(["config_hash", "client"], ignore_index=True)


def direct_final_rows(trials: pd.DataFrame) -> pd.DataFrame:
    """The same trials run by fl_core alone (no Ray, one thread): what every sweep must reproduce."""
    rows = []
    for row in trials.itertuples():
        keys = {f for f in RunConfig.__dataclass_fields__ if hasattr(row, f) and f not in ("data_root", "download", "device", "threads")}
        config = RunConfig(**{k: _plain(getattr(row, k)) for k in keys}, threads=1)
        assert config.config_hash() == row.config_hash
        final = list(Simulation(config).run())[-1]
        for c in final.clients:
            rows.append({"config_hash": row.config_hash, "client": c.client, "round": final.round, "acc": c.acc,
                         "acc_local": c.acc_local, "acc_global": c.acc_global, "loss": c.loss,
                         "personal_fraction": c.personal_fraction, "bytes_up": c.bytes_up})
    return pd.DataFrame(rows).sort_values(["config_hash", "client"], ignore_index=True)


def _plain(value):
    if pd.isna(value) if not isinstance(value, (list, tuple)) else False:
        return None
    return value.item() if hasattr(value, "item") else value


def mlflow_runs(results: Path, experiment: str = "fedselect_grid"):
    import mlflow
    client = mlflow.MlflowClient(f"sqlite:///{results / 'mlflow.db'}")
    exp = client.get_experiment_by_name(experiment)
    runs = client.search_runs([exp.experiment_id])
    parents = [r for r in runs if r.data.tags.get("role") == "sweep"]
    children = [r for r in runs if r.data.tags.get("role") != "sweep"]
    return client, parents, children
