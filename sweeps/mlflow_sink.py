"""MLflow results of a sweep, logged from the driver only.

One experiment per study, a parent run per sweep, a child run per trial (flattened config as
params; tags sweep, config_hash, seed; per-round metrics; artifacts at the end). Everything is
logged by a Tune callback in the driver process, so an embedded sqlite store never sees two
writers, and trials on remote nodes need no access to the tracking server.

Idempotent: a retried or resumed trial finds its child run by tags and logs only rounds it has not
logged yet. Fault tolerant: if the tracking store fails, the sweep goes on with one warning and
the Parquet results stay complete.
"""
from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from ray import tune

from fl_core.config import NON_SEMANTIC, RunConfig

from . import metrics as round_summary
from .parquet_sink import round_files
from .trainable import trial_config



def default_tracking_uri(results: Path) -> str:
    return f"sqlite:///{(results / 'mlflow.db').resolve()}"


def fail_fast_on_servers() -> None:
    """An unreachable server should cost seconds, not MLflow's default minutes of retries."""
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", "10")


class MLflowSink(tune.Callback):
    def __init__(self, tracking_uri: str, study: str, sweep: str, sweep_dir: Path, artifact_root: Path,
                 sweep_params: dict[str, Any]) -> None:
        self.tracking_uri = tracking_uri
        self.sweep_params = sweep_params
        self.study = study
        self.sweep = sweep
        self.sweep_dir = Path(sweep_dir)
        self.artifact_root = Path(artifact_root)
        self.enabled = True
        self.parent_id: str | None = None
        self.experiment_id: str | None = None
        self._client = None
        self._runs: dict[str, str] = {}       # trial id -> child run id
        self._logged: dict[str, int] = {}     # child run id -> last logged round

    def __getstate__(self) -> dict[str, Any]:  # Tune pickles callbacks with the experiment
        state = self.__dict__.copy()
        state["_client"] = None
        return state

    @property
    def client(self):
        if self._client is None:
            from mlflow import MlflowClient
            self._client = MlflowClient(tracking_uri=self.tracking_uri)
        return self._client

    def _guard(self, what: str, fn, *args, **kwargs):
        """Run an MLflow call; on the first failure warn once and stop logging to MLflow."""
        if not self.enabled:
            return None
        try:
            return fn(*args, **kwargs)
        except Exception as err:  # noqa: BLE001 - any tracking failure must not stop the sweep
            self.enabled = False
            print(f"WARNING: MLflow at {self.tracking_uri} failed while {what} ({type(err).__name__}: "
                  f"{str(err)[:200]}); the sweep continues without MLflow, Parquet results stay complete.",
                  file=sys.stderr, flush=True)
            return None

    # ---------------------------------------------------------------- sweep level
    def setup(self, **info):
        """Called by Tune when the sweep starts, and again when it is resumed (`Tuner.restore`
        brings this callback back from the experiment state, with the same settings)."""
        self._guard("opening the sweep's parent run", self._start_sweep, self.sweep_params)

    def on_experiment_end(self, trials, **info):
        finished = all(t.status == "TERMINATED" for t in trials)
        if self.parent_id:
            self._guard("closing the parent run", self.client.set_terminated, self.parent_id,
                        "FINISHED" if finished else "KILLED")

    def _start_sweep(self, params: dict[str, Any]) -> None:
        experiment = self.client.get_experiment_by_name(self.study)
        if experiment is None:
            self.experiment_id = self.client.create_experiment(
                self.study, artifact_location=self.artifact_root.resolve().as_uri())
        else:
            self.experiment_id = experiment.experiment_id
        found = self.client.search_runs([self.experiment_id], f"tags.sweep = '{self.sweep}' and tags.role = 'sweep'")
        if found:
            self.parent_id = found[0].info.run_id
            self.client.update_run(self.parent_id, status="RUNNING")
        else:
            run = self.client.create_run(self.experiment_id, run_name=self.sweep,
                                         tags={"sweep": self.sweep, "role": "sweep"})
            self.parent_id = run.info.run_id
            from mlflow.entities import Param
            self.client.log_batch(self.parent_id, params=[Param(k, str(v)[:6000]) for k, v in params.items()])

    # ---------------------------------------------------------------- per trial
    def _child(self, trial) -> str | None:
        run_id = self._runs.get(trial.trial_id)
        if run_id is None and self.parent_id:
            run_id = self._guard("opening a trial's run", self._find_or_create_child, trial)
            if run_id:
                self._runs[trial.trial_id] = run_id
        return run_id

    def _find_or_create_child(self, trial) -> str:
        config = RunConfig.from_dict(trial_config(trial.config))
        key = config.config_hash()
        found = self.client.search_runs(
            [self.experiment_id], f"tags.parent_run = '{self.parent_id}' and tags.config_hash = '{key}'")
        if found:
            run_id = found[0].info.run_id
            history = self.client.get_metric_history(run_id, "acc_mean")
            self._logged[run_id] = max((m.step for m in history), default=0)
            self.client.update_run(run_id, status="RUNNING")
            return run_id
        tags = {"mlflow.parentRunId": self.parent_id, "parent_run": self.parent_id, "sweep": self.sweep,
                "config_hash": key, "seed": str(config.seed), "trial_id": trial.trial_id}
        run = self.client.create_run(self.experiment_id, run_name=f"{_method_label(config)}-{key}", tags=tags)
        from mlflow.entities import Param
        params = [Param(k, str(v)) for k, v in config.to_dict().items() if k not in NON_SEMANTIC]
        self.client.log_batch(run.info.run_id, params=params)
        self._logged[run.info.run_id] = 0
        return run.info.run_id

    def on_trial_start(self, iteration, trials, trial, **info):
        self._child(trial)

    def on_trial_result(self, iteration, trials, trial, result, **info):
        run_id = self._child(trial)
        rnd = int(result.get("round", 0))
        logged = self._logged.get(run_id, 0)
        if not run_id or rnd <= logged:
            return  # already logged (a resumed trial repeating rounds after its last checkpoint)
        rows = [result]
        if rnd > logged + 1:  # rounds this driver never saw (e.g. reported just before an interruption)
            files = round_files(self.sweep_dir, result["config_hash"])
            rows = [m for m in round_summary.history(files) if logged < m["round"] < rnd] + rows
        from mlflow.entities import Metric
        now = int(time.time() * 1000)
        metrics = [Metric(k, float(r[k]), now, int(r["round"])) for r in rows for k in round_summary.METRIC_KEYS]
        self._guard("logging metrics", self.client.log_batch, run_id, metrics=metrics)
        self._logged[run_id] = rnd

    def on_trial_complete(self, iteration, trials, trial, **info):
        run_id = self._child(trial)
        if run_id:
            self._guard("logging artifacts", self._log_artifacts, run_id, trial)
            self._guard("closing a trial's run", self.client.set_terminated, run_id, "FINISHED")

    def on_trial_error(self, iteration, trials, trial, **info):
        run_id = self._child(trial)
        if run_id:
            self._guard("marking a failed run", self.client.set_terminated, run_id, "FAILED")

    def _log_artifacts(self, run_id: str, trial) -> None:
        key = RunConfig.from_dict(trial_config(trial.config)).config_hash()
        with tempfile.TemporaryDirectory() as folder:
            out = Path(folder)
            rounds = round_files(self.sweep_dir, key)
            if rounds:
                final = pd.read_parquet(rounds[-1])
                final[["client", "round", "acc", "acc_local", "acc_global", "n_train", "n_test",
                       "personal_fraction"]].to_csv(out / "final_client_accuracy.csv", index=False)
            clients = self.sweep_dir / "clients" / f"{key}.parquet"
            if clients.exists():
                hist = pd.read_parquet(clients)
                (out / "label_histograms.json").write_text(json.dumps(
                    {int(r.client): {"train": list(map(int, r.train_label_hist)), "test": list(map(int, r.test_label_hist))}
                     for r in hist.itertuples()}))
            masks = _final_masks(self.sweep_dir / "masks" / f"{key}.parquet")
            if masks:
                np.savez_compressed(out / "fedselect_masks.npz", **masks)
            self.client.log_artifacts(run_id, folder)


def _method_label(config: RunConfig) -> str:
    """e.g. `fedavg`, `fedselect`, `fedselect-random`, `fedselect-layerB`."""
    if config.algorithm != "fedselect" or config.fedselect_variant == "gradselect":
        return config.algorithm
    block = config.layer_block if config.fedselect_variant == "layer" else ""
    return f"fedselect-{config.fedselect_variant}{block}"


def _final_masks(path: Path) -> dict[str, np.ndarray]:
    """Each client's final mask, bit-packed (np.unpackbits(x)[:numel] restores it), taken from
    the trial's masks Parquet file (written by the trial at its last round)."""
    if not path.exists():
        return {}
    packed = {}
    for row in pd.read_parquet(path).itertuples():
        packed[f"client{row.client}/{row.tensor}"] = np.frombuffer(row.bits, dtype=np.uint8)
        packed[f"client{row.client}/{row.tensor}.shape"] = np.array(row.shape)
    return packed
