"""The Tune trainable: one full federated run per trial.

It rebuilds the `RunConfig` from the trial's config, takes its data from the object store (loaded
once per sweep on the driver), resumes from `tune.get_checkpoint()` if there is one, and then
per round: writes the round's Parquet rows, reports summary metrics, and checkpoints the
simulation state (every `checkpoint_every` rounds and at the last round). Batch orders depend
only on (seed, round, client), so a resumed trial ends with exactly the metrics of an
uninterrupted one.
"""
from __future__ import annotations

import logging
import tempfile
import time
from pathlib import Path
from typing import Any

import ray
import torch
from ray import tune

from fl_core.config import RunConfig
from fl_core.data import FederatedData
from fl_core.results import client_rows, round_rows
from fl_core.simulation import RoundResult, Simulation, load_data

from . import parquet_sink
from .resources import TrialResources

STATE_FILE = "simulation.pt"
MB = 1e6


def trial_config(config: dict[str, Any]) -> dict[str, Any]:
    """Flatten a Tune config: grid sweeps nest each trial's knobs under "trial"."""
    flat = {k: v for k, v in config.items() if k != "trial"}
    flat.update(config.get("trial", {}))
    return flat


def data_key(config: RunConfig) -> str:
    """What determines a trial's data: trials with equal keys share one loaded copy."""
    return "|".join(str(getattr(config, k)) for k in (
        "dataset", "num_clients", "partition", "shards_per_client", "dir_alpha", "samples_per_client",
        "test_samples_per_client", "min_samples", "seed", "data_root"))


def summarize(result: RoundResult, sent_so_far: float) -> dict[str, float]:
    """The per-round metrics reported to Tune (and from there to MLflow)."""
    sent = sum(c.bytes_up + c.bytes_down for c in result.clients) / MB
    return {
        "round": result.round,
        "acc_mean": result.mean("acc"),
        "acc_std": result.std("acc"),
        "acc_weighted": result.weighted_acc(),
        "acc_local_mean": result.mean("acc_local"),
        "acc_global_mean": result.mean("acc_global"),
        "loss_mean": result.mean("loss"),
        "personal_fraction_mean": result.mean("personal_fraction"),
        "personal_fraction_std": result.std("personal_fraction"),
        "mb_round": sent,
        "mb_total": sent_so_far + sent,
        "round_seconds": result.seconds,
    }


def run_trial(config: dict[str, Any], *, data_refs: dict[str, Any], sweep_dir: str, sweep: str,
              resources: TrialResources, checkpoint_every: int = 1, crash_at_round: int | None = None) -> None:
    """Tune function trainable (wrapped with `tune.with_parameters` by the study)."""
    logging.getLogger("ray").setLevel(logging.WARNING)  # no "checkpoint created" line per round
    use_cuda = resources.gpus > 0 and torch.cuda.is_available()
    run_config = RunConfig.from_dict(trial_config(config)).replace(
        device="cuda" if use_cuda else "cpu", threads=resources.threads)
    ref = data_refs.get(data_key(run_config))
    data: FederatedData = ray.get(ref) if ref is not None else load_data(run_config)
    sim = Simulation(run_config, data)
    sweep_path = Path(sweep_dir)
    config_hash = run_config.config_hash()
    extra = {"sweep": sweep, "trial_id": tune.get_context().get_trial_id()}

    sent = 0.0
    started_at = time.time()
    checkpoint = tune.get_checkpoint()
    if checkpoint:
        with checkpoint.as_directory() as folder:
            sim.restore(Path(folder) / STATE_FILE)
            sent = torch.load(Path(folder) / "progress.pt", weights_only=True)["mb_total"]
    else:
        parquet_sink.write_clients(sweep_path, config_hash, [row | extra for row in client_rows(sim.data, run_config)])

    # Where this process picked the run up, and what it was given: shown in trials.parquet.
    provenance = {"resumed_from_round": sim.completed, "started_at": started_at,
                  "gpus_assigned": float(len(ray.get_gpu_ids())), "device": str(sim.device),
                  "threads": float(torch.get_num_threads())}
    for result in sim.run():
        rows = [row | extra for row in round_rows(result, run_config, sim.model_name)]
        parquet_sink.write_round(sweep_path, config_hash, result.round, rows)
        metrics = summarize(result, sent) | provenance | {"config_hash": config_hash, "done": result.round == run_config.rounds,
                                                         "reported_at": time.time()}
        sent = metrics["mb_total"]
        if result.round % checkpoint_every == 0 or result.round == run_config.rounds:
            with tempfile.TemporaryDirectory() as folder:
                sim.save(Path(folder) / STATE_FILE)
                torch.save({"mb_total": sent}, Path(folder) / "progress.pt")
                tune.report(metrics, checkpoint=tune.Checkpoint.from_directory(folder))
        else:
            tune.report(metrics)
        if crash_at_round == result.round:
            _crash_once(sweep_path, config_hash, result.round)


def _crash_once(sweep_dir: Path, config_hash: str, rnd: int) -> None:
    """Test hook (`--inject-crash-at-round`): fail each trial once, right after this round."""
    marker = sweep_dir / "injected-crashes" / config_hash
    if not marker.exists():
        marker.parent.mkdir(parents=True, exist_ok=True)
        marker.touch()
        raise RuntimeError(f"injected crash after round {rnd} (test hook)")
