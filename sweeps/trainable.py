"""The Tune trainable: one full federated run per trial.

It rebuilds the `RunConfig` from the trial's config, takes its data from the object store (loaded
once per sweep on the driver), resumes from the trial's saved state if there is one, and then per
round: writes the round's Parquet rows, saves the simulation state (every `checkpoint_every`
rounds and at the last round) and reports summary metrics. Batch orders depend only on (seed,
round, client), so a resumed trial ends with exactly the metrics of an uninterrupted one.

Where the state lives: one file per trial, `<sweep>/state/<config_hash>.pt`, replaced atomically,
rather than Tune checkpoints. Reason: when the driver is killed (SIGKILL), Tune's last experiment
snapshot can name a trial checkpoint that `CheckpointConfig(num_to_keep)` has already deleted, and
`Tuner.restore` then fails for that trial; keeping every checkpoint instead costs one state per
round. With one file per trial, a retry (`FailureConfig`), a `--resume` after SIGINT and one after
SIGKILL all continue from the newest saved round. The file also keeps the final FedSelect masks.
"""
from __future__ import annotations

import json
import logging
import time
from pathlib import Path
from typing import Any

import ray
import torch
from ray import tune

from fl_core.config import RunConfig
from fl_core.data import FederatedData
from fl_core.results import client_rows, round_rows
from fl_core.simulation import Simulation, load_data

import pandas as pd

from . import parquet_sink
from .metrics import round_metrics
from .resources import TrialResources


def trial_config(config: dict[str, Any]) -> dict[str, Any]:
    """Flatten a Tune config: grid sweeps nest each trial's knobs under "trial"; Optuna sweeps
    over several data settings sample one under "data"."""
    flat = {k: v for k, v in config.items() if k not in ("trial", "data")}
    if "data" in config:                   # Optuna: a sampled data setting, as JSON text
        flat.update(json.loads(config["data"]))
    flat.update(config.get("trial", {}))
    return flat


def data_key(config: RunConfig) -> str:
    """What determines a trial's data: trials with equal keys share one loaded copy."""
    return "|".join(str(getattr(config, k)) for k in (
        "dataset", "num_clients", "partition", "shards_per_client", "dir_alpha", "samples_per_client",
        "test_samples_per_client", "min_samples", "seed", "data_root"))


def state_path(sweep_dir: str | Path, config_hash: str) -> Path:
    return Path(sweep_dir) / "state" / f"{config_hash}.pt"


def run_trial(config: dict[str, Any], *, data_refs: dict[str, Any], sweep_dir: str, sweep: str,
              resources: TrialResources, checkpoint_every: int = 1, crash_at_round: int | None = None) -> None:
    """Tune function trainable (wrapped with `tune.with_parameters` by the study)."""
    logging.getLogger("ray").setLevel(logging.WARNING)
    started_at = time.time()
    use_cuda = resources.gpus > 0 and torch.cuda.is_available()
    run_config = RunConfig.from_dict(trial_config(config)).replace(
        device="cuda" if use_cuda else "cpu", threads=resources.threads)
    ref = data_refs.get(data_key(run_config))
    data: FederatedData = ray.get(ref) if ref is not None else load_data(run_config)
    sim = Simulation(run_config, data)
    config_hash = run_config.config_hash()
    saved = state_path(sweep_dir, config_hash)
    extra = {"sweep": sweep, "trial_id": tune.get_context().get_trial_id()}

    progress: dict[str, Any] = {"mb_total": 0.0, "last_metrics": None}
    if saved.exists():
        progress = sim.restore(saved)
    else:
        parquet_sink.write_clients(Path(sweep_dir), config_hash,
                                   [row | extra for row in client_rows(sim.data, run_config)])
    if sim.completed == run_config.rounds and progress["last_metrics"]:
        tune.report(progress["last_metrics"])  # finished before the interruption: report it again
        return

    # Where this process picked the run up, and what it was given: shown in trials.parquet.
    provenance = {"resumed_from_round": sim.completed, "started_at": started_at,
                  "gpus_assigned": float(len(ray.get_gpu_ids())), "device": str(sim.device),
                  "threads": float(torch.get_num_threads()), "config_hash": config_hash,
                  "data_from_driver": ref is not None}
    for result in sim.run():
        rows = pd.DataFrame([row | extra | {"round_seconds": result.seconds}
                             for row in round_rows(result, run_config, sim.model_name)])
        parquet_sink.write_round(Path(sweep_dir), config_hash, result.round, rows)
        metrics = round_metrics(rows, progress["mb_total"]) | provenance | {
            "done": result.round == run_config.rounds, "reported_at": time.time()}
        progress = {"mb_total": metrics["mb_total"], "last_metrics": metrics}
        if result.round % checkpoint_every == 0 or result.round == run_config.rounds:
            sim.save(saved, **progress)
        if result.round == run_config.rounds:
            parquet_sink.write_masks(Path(sweep_dir), config_hash, [c.mask for c in sim.clients])
        tune.report(metrics)
        if crash_at_round == result.round:
            _crash_once(Path(sweep_dir), config_hash, result.round)


def _crash_once(sweep_dir: Path, config_hash: str, rnd: int) -> None:
    """Test hook (`--inject-crash-at-round`): fail each trial once, right after this round."""
    marker = sweep_dir / "injected-crashes" / config_hash
    if not marker.exists():
        marker.parent.mkdir(parents=True, exist_ok=True)
        marker.touch()
        raise RuntimeError(f"injected crash after round {rnd} (test hook)")
