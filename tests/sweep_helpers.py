"""Helpers for the sweep and analysis tests: tiny sweep flags, reading MLflow, recomputing trials
without Ray, and a small sweep folder written in the layout of engine v1."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from sweeps.parquet_sink import read_rounds

from fl_core.config import config_from_row
from fl_core.simulation import Simulation

# 3 clients on the synthetic source, a few rounds: each trial takes about a second of compute.
TINY_SWEEP = ["--dataset", "synthetic", "--num-clients", "3", "--partition", "shards", "--shards-per-client", "3",
              "--batch-size", "16", "--dir-alpha", "0.5", "--local-epochs", "1", "--pers-limit", "0.8",
              "--seeds", "0", "--verbose", "0"]
FINAL_COLUMNS = ["config_hash", "client", "round", "participated", "acc", "acc_local", "acc_global", "loss",
                 "personal_fraction", "bytes_up", "bytes_down"]


def sweep_args(tmp_path: Path, name: str, *extra: str, rounds: int = 2) -> list[str]:
    return TINY_SWEEP + ["--rounds", str(rounds), "--results", str(tmp_path), "--name", name, *extra]


STAGED = ["--partition", "shards", "iid", "--val-fraction", "0.2", "--seeds", "0", "1", "--anchors", "fedavg"]


def check_staged(folder, rounds: int, samples: int, anchors: int = 2 * 2, search_seed: int = 1000,
                 seeds: tuple[int, int] = (0, 1)) -> pd.DataFrame:
    """What every staged sweep (search or scheduler) must give: per data setting, a select stage on
    the search seed (completed or stopped early), the best COMPLETED select trial by validation
    accuracy confirmed on both `seeds`, anchors on both seeds to the final round."""
    trials = pd.read_parquet(folder / "trials.parquet")
    assert (trials.objective == "acc_val_mean").all()
    count = anchors
    anchors, select, confirm = (trials[trials.stage == kind] for kind in ("anchor", "select", "confirm"))
    assert len(anchors) == count and (anchors.status == "COMPLETED").all() and (anchors.rounds_done == rounds).all()
    assert len(select) == 2 * samples and (select.seed == search_seed).all()
    assert set(select.status) <= {"COMPLETED", "STOPPED"} and (trials.search_seed == search_seed).all()
    assert (select.loc[select.status == "STOPPED", "rounds_done"] < rounds).all()
    assert (select.loc[select.status == "COMPLETED", "rounds_done"] == rounds).all()   # never Tune's `done` alone
    assert len(confirm) == 2 * 2 and set(confirm.seed) == set(seeds) and (confirm.status == "COMPLETED").all()
    for setting, rows in select.groupby("setting"):
        assert rows.partition.nunique() == 1                       # the data are never searched
        done = rows[rows.status == "COMPLETED"]
        best = done.sort_values(["acc_val_mean", "config_hash"], ascending=[False, True]).iloc[0]  # ties: smaller hash
        assert rows.selected.sum() == 1 and rows.loc[rows.selected].config_hash.item() == best.config_hash
        for again in confirm[confirm.setting == setting].itertuples():
            assert (again.pers_rate, again.pers_limit) == (best.pers_rate, best.pers_limit)
    rows = read_rounds(folder)
    assert (len(rows) == int(trials.rounds_done.sum()) * 3
            and not rows.duplicated(["config_hash", "round", "client"]).any())
    assert {p.name for p in folder.glob("tune-*")} == {"tune-anchors", "tune-select-0", "tune-select-1", "tune-confirm"}
    assert (folder / "tables" / "search_best.tex").exists() and (folder / "figures" / "search_history.png").exists()
    return trials


def final_rows(rounds: pd.DataFrame) -> pd.DataFrame:
    last = rounds.groupby("config_hash")["round"].transform("max")
    return rounds[rounds["round"] == last][FINAL_COLUMNS].sort_values(["config_hash", "client"], ignore_index=True)


def direct_final_rows(trials: pd.DataFrame) -> pd.DataFrame:
    """The same trials run by fl_core alone (no Ray, one thread): what every sweep must reproduce.
    Each trial's config is rebuilt from its trials.parquet row and must hash as the row says."""
    rows = []
    for _, row in trials.iterrows():
        config = config_from_row(row).replace(threads=1)
        assert config.config_hash() == row["config_hash"]
        final = list(Simulation(config).run())[-1]
        rows += [{"config_hash": row["config_hash"]} | r for r in final.rows()]
    return pd.DataFrame(rows)[FINAL_COLUMNS].sort_values(["config_hash", "client"], ignore_index=True)


def mlflow_runs(results: Path, experiment: str = "fedselect_grid"):
    import mlflow
    client = mlflow.MlflowClient(f"sqlite:///{results / 'mlflow.db'}")
    exp = client.get_experiment_by_name(experiment)
    runs = client.search_runs([exp.experiment_id])
    parents = [r for r in runs if r.data.tags.get("role") == "sweep"]
    children = [r for r in runs if r.data.tags.get("role") != "sweep"]
    return client, parents, children


# ---------------------------------------------------------------------------- engine v1 layout
# Every knob of engine v1 with its value for these tests: rows carried all of them, whatever the
# method (anchors with p = α = 0), and no `method`, `setting` or `version`.
V1_KNOBS = {"dataset": "synthetic", "model": "auto", "num_clients": 3, "partition": "shards", "shards_per_client": 3,
            "dir_alpha": 0.5, "samples_per_client": None, "test_samples_per_client": None, "min_samples": 10,
            "rounds": 2, "local_epochs": 1, "batch_size": 16, "lr": 0.1, "momentum": 0.0, "weight_decay": 0.0,
            "pers_rate": 0.25, "pers_limit": 0.8, "select_params": "weights", "fedselect_mode": "default",
            "mask_every": 1, "fedselect_variant": "gradselect", "layer_block": "A", "weighting": "uniform",
            "ft_epochs": 1, "head_epochs": 10, "ditto_lambda": 1.0, "fedpac_lambda": 1.0,
            "lottery_acc_threshold": 0.5, "lottery_prune_step": 0.2, "lottery_target_sparsity": 0.5}
# Final-round accuracy of each client, per (algorithm, seed); round 1 is 0.1 lower.
V1_FINAL_ACC = {("fedselect", 0): [0.9, 0.8, 0.7], ("fedselect", 1): [1.0, 0.9, 0.8],
                ("fedavg", 0): [0.5, 0.4, 0.3], ("fedavg", 1): [0.6, 0.5, 0.4],
                ("local", 0): [0.7, 0.7, 0.7], ("local", 1): [0.8, 0.8, 0.8]}


def write_v1_sweep(folder: Path, with_trials: bool = True) -> pd.DataFrame:
    """A small sweep as engine v1 wrote it: `rounds/<hash>-r<round>.parquet` per (trial, round),
    optionally trials.parquet, masks for FedSelect. Returns the round rows written."""
    all_rows, trials = [], []
    for n, ((algorithm, seed), final) in enumerate(V1_FINAL_ACC.items()):
        key = f"{n:012x}"  # an old-style 12-hex-digit hash
        knobs = V1_KNOBS | {"algorithm": algorithm, "seed": seed}
        if algorithm != "fedselect":
            knobs |= {"pers_rate": 0.0, "pers_limit": 0.0}
        for rnd in (1, 2):
            rows = [knobs | {"config_hash": key, "sweep": folder.name, "trial_id": f"t{n}", "round": rnd, "client": k,
                             "acc": acc - 0.1 * (rnd == 1), "acc_local": acc, "acc_global": acc - 0.2, "loss": 0.5,
                             "n_train": 40, "n_test": 10 + k,
                             "personal_fraction": 0.2 * rnd * (algorithm == "fedselect"),
                             "bytes_up": 1000, "bytes_down": 1000, "seconds": 0.1, "round_seconds": 0.3}
                    for k, acc in enumerate(final)]
            path = folder / "rounds" / f"{key}-r{rnd:04d}.parquet"
            path.parent.mkdir(parents=True, exist_ok=True)
            pd.DataFrame(rows).to_parquet(path, index=False)
            all_rows += rows
        trials.append(knobs | {"config_hash": key, "sweep": folder.name, "status": "COMPLETED", "rounds_done": 2,
                               "acc_mean": float(np.mean(final)), "acc_std": float(np.std(final)),
                               "wall_seconds": 1.0})
        if algorithm == "fedselect":
            mask = np.array([True, False, True, True])
            masks = [{"config_hash": key, "client": k, "tensor": "fc.weight", "shape": [2, 2], "numel": 4,
                      "bits": np.packbits(np.roll(mask, k)).tobytes()} for k in range(3)]
            (folder / "masks").mkdir(exist_ok=True)
            pd.DataFrame(masks).to_parquet(folder / "masks" / f"{key}.parquet", index=False)
    if with_trials:
        pd.DataFrame(trials).to_parquet(folder / "trials.parquet", index=False)
    return pd.DataFrame(all_rows)
