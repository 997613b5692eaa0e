"""MLflow results of a sweep, logged from the driver only.

One experiment per study (tagged as a model-development experiment, so that MLflow 3 opens it on
its runs table rather than the GenAI overview), a run per sweep (tag role=sweep: the sweep's flags)
and a run per trial (tags sweep=<name>, role=trial, parent_run=<the sweep's run id>). Trial runs are
top-level, not nested, so that the runs table and the charts show every trial without expanding
anything; filter one sweep with `tags.sweep = '<name>' and tags.role = 'trial'`. Each sweep also gets
a saved view of the runs page (`sweeps.mlflow_view`: that filter, the swept knobs and final metrics
as columns, best accuracy first, every trial in the charts). A trial's run:
  name     what tells the trial apart in a legend (`run_names`): the method, its knobs that vary in
           the sweep (FedSelect: always p and α), other varying knobs, the data setting, local
           epochs and seed, e.g. `FedSelect p=0.25 α=0.8 digits Dir(0.1) E1 s0`
  params   `config.semantic_dict()`: the common knobs and the trial's own method knobs only, a
           float of more than 4 significant digits rounded to 4 (`mlflow_view.param_text`)
  tags     sweep, role, parent_run, config_hash, seed, trial_id, method, setting, version, and
           `exact.<knob>` with the full value of a float knob its param rounds
  metrics  per round, the keys of `fl_core.results.summarize_round` (step = round), and the short,
           rounded display copies the view shows (`mlflow_view.display_metrics`: acc, acc_val,
           mb); values that were not measured (NaN, e.g. accuracies of rounds skipped by
           `eval_every`) are skipped
  artifacts at the end: final_client_accuracy.csv, label_histograms.json, fedselect_masks.npz
The sweep's run gets, once the launcher has written them, the study's tables (`log_sweep_tables`:
the .tex/.md files and summary.parquet of analysis.tables under artifacts `tables/`).
Everything is logged by a Tune callback in the driver process, so an embedded sqlite store never
sees two writers, and trials on remote nodes need no access to the tracking server.

Idempotent: a retried or resumed trial finds its child run by tags and logs only rounds it has not
logged yet (rounds reported while no driver listened are recomputed from the trial's Parquet rows
with `summarize_trial`). Fault tolerant: if the tracking store fails, the sweep goes on with one
warning and the Parquet results stay complete.
"""
from __future__ import annotations

import json
import math
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from ray import tune

from fl_core.config import DATA_KNOBS, NON_SEMANTIC, RunConfig
from fl_core.results import KNOB_SYMBOLS, config_columns, setting_label, summarize_trial

from .mlflow_view import ALWAYS_NAMED, display_metrics, param_text, save_sweep_view
from .parquet_sink import read_trial
from .plan import reached_last_round, run_config

FINAL_CLIENT_COLUMNS = ("client", "round", "participated", "acc", "acc_local", "acc_global", "acc_val", "n_train",
                        "n_val", "n_test", "personal_fraction")


# A summary key measured every round (unlike accuracies under `eval_every`): its last step is the
# last round logged to a run.
LOGGED_MARK = "mb_total"


def default_tracking_uri(results: Path) -> str:
    return f"sqlite:///{(results / 'mlflow.db').resolve()}"


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
        self._names: dict[str, str] = {}      # config hash -> run name
        self._finished: set[str] = set()      # trial ids that reported their last round

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
        # Tune marks trials it stopped on an interrupt TERMINATED too: count those that reported their last round
        finished = all(t.trial_id in self._finished for t in trials)
        self._save_view(trials)  # every trial is known now (a searcher adds them as it goes)
        if self.parent_id:
            self._guard("closing the parent run", self.client.set_terminated, self.parent_id,
                        "FINISHED" if finished else "KILLED")

    def _start_sweep(self, params: dict[str, Any]) -> None:
        experiment = self.client.get_experiment_by_name(self.study)
        if experiment is None:
            self.experiment_id = self.client.create_experiment(
                self.study, artifact_location=self.artifact_root.resolve().as_uri(), tags=EXPERIMENT_TAGS)
        else:
            self.experiment_id = experiment.experiment_id
            for key, value in EXPERIMENT_TAGS.items():
                self.client.set_experiment_tag(self.experiment_id, key, value)
        found = find_sweep_run(self.client, self.experiment_id, self.sweep)
        if found:
            self.parent_id = found
            self.client.update_run(self.parent_id, status="RUNNING")
        else:
            run = self.client.create_run(self.experiment_id, run_name=self.sweep,
                                         tags={"sweep": self.sweep, "role": "sweep"})
            self.parent_id = run.info.run_id
            from mlflow.entities import Param
            self.client.log_batch(self.parent_id, params=[Param(k, str(v)[:6000]) for k, v in params.items()])

    # ---------------------------------------------------------------- per trial
    def _child(self, trial, trials=()) -> str | None:
        run_id = self._runs.get(trial.trial_id)
        if run_id is None and self.parent_id:
            if trials and not self._names:  # every trial of the sweep is known: name them all at once
                self._names = run_names([run_config(t.config) for t in trials])
                self._save_view(trials)
            run_id = self._guard("opening a trial's run", self._find_or_create_child, trial)
            if run_id:
                self._runs[trial.trial_id] = run_id
        return run_id

    def _save_view(self, trials) -> None:
        """The sweep's saved view; a failure costs the view only, never the logging."""
        if not (self.enabled and self.experiment_id and trials):
            return
        try:
            save_sweep_view(self.client, self.experiment_id, self.sweep, [run_config(t.config) for t in trials])
        except Exception as err:  # noqa: BLE001
            print(f"WARNING: could not save the MLflow view of {self.sweep} ({type(err).__name__}: {str(err)[:200]})",
                  file=sys.stderr, flush=True)

    def _find_or_create_child(self, trial) -> str:
        config = run_config(trial.config)
        key = config.config_hash()
        found = self.client.search_runs(
            [self.experiment_id], f"tags.parent_run = '{self.parent_id}' and tags.config_hash = '{key}'")
        if found:
            run_id = found[0].info.run_id
            history = self.client.get_metric_history(run_id, LOGGED_MARK)
            self._logged[run_id] = max((m.step for m in history), default=0)
            self.client.update_run(run_id, status="RUNNING")
            return run_id
        columns = config_columns(config)
        # Not nested under the sweep's run (no mlflow.parentRunId): MLflow's runs table and charts show
        # top-level runs, so nested trials would be hidden behind a collapsed parent without metrics.
        tags = {"parent_run": self.parent_id, "sweep": self.sweep, "role": "trial",
                "config_hash": key, "seed": str(config.seed), "trial_id": trial.trial_id,
                "method": columns["method"], "setting": columns["setting"], "version": columns["version"]}
        semantic = config.semantic_dict()
        tags.update({f"exact.{k}": repr(v) for k, v in semantic.items() if param_text(v) != str(v)})
        name = self._names.get(key) or run_names([config])[key]
        run = self.client.create_run(self.experiment_id, run_name=name, tags=tags)
        from mlflow.entities import Param
        params = [Param(k, param_text(v)) for k, v in semantic.items()]
        self.client.log_batch(run.info.run_id, params=params)
        self._logged[run.info.run_id] = 0
        return run.info.run_id

    def on_trial_start(self, iteration, trials, trial, **info):
        self._child(trial, trials)

    def on_trial_result(self, iteration, trials, trial, result, **info):
        run_id = self._child(trial, trials)
        if reached_last_round(run_config(trial.config), result):  # not Tune's `done`: also set when stopped early
            self._finished.add(trial.trial_id)
        rnd = int(result.get("round", 0))
        logged = self._logged.get(run_id, 0)
        if not run_id or rnd <= logged:
            return  # already logged (a resumed trial repeating rounds after its last checkpoint)
        summaries = [result["summary"]]
        if rnd > logged + 1:  # rounds this driver never saw (e.g. reported just before an interruption)
            history = summarize_trial(read_trial(self.sweep_dir, result["config_hash"]))
            summaries = [s for s in history if logged < s["round"] < rnd] + summaries
        from mlflow.entities import Metric
        now = int(time.time() * 1000)
        metrics = [Metric(k, float(v), now, int(s["round"])) for s in summaries
                   for k, v in {**s, **display_metrics(s)}.items() if k != "round" and _measured(v)]
        for start in range(0, len(metrics), 1000):  # MLflow takes at most 1000 metrics per batch
            self._guard("logging metrics", self.client.log_batch, run_id, metrics=metrics[start:start + 1000])
        self._logged[run_id] = rnd

    def on_trial_complete(self, iteration, trials, trial, **info):
        run_id = self._child(trial, trials)
        if run_id:
            self._guard("logging artifacts", self._log_artifacts, run_id, trial)
            # a trial the scheduler stopped early did not finish: KILLED, tagged stopped_early
            finished = trial.trial_id in self._finished
            if not finished:
                self._guard("tagging an early-stopped run", self.client.set_tag, run_id, "stopped_early", "true")
            self._guard("closing a trial's run", self.client.set_terminated, run_id,
                        "FINISHED" if finished else "KILLED")

    def on_trial_error(self, iteration, trials, trial, **info):
        run_id = self._child(trial, trials)
        if run_id:
            self._guard("marking a failed run", self.client.set_terminated, run_id, "FAILED")

    def _log_artifacts(self, run_id: str, trial) -> None:
        key = run_config(trial.config).config_hash()
        with tempfile.TemporaryDirectory() as folder:
            out = Path(folder)
            rows = read_trial(self.sweep_dir, key)
            if not rows.empty:
                final = rows[rows["round"] == rows["round"].max()]
                keep = [c for c in FINAL_CLIENT_COLUMNS if c in final.columns]
                final[keep].to_csv(out / "final_client_accuracy.csv", index=False)
            clients = self.sweep_dir / "clients" / f"{key}.parquet"
            if clients.exists():
                hist = pd.read_parquet(clients)
                (out / "label_histograms.json").write_text(json.dumps(
                    {int(r.client): {"train": list(map(int, r.train_label_hist)),
                                     "test": list(map(int, r.test_label_hist))}
                     for r in hist.itertuples()}))
            masks = _final_masks(self.sweep_dir / "masks" / f"{key}.parquet")
            if masks:
                np.savez_compressed(out / "fedselect_masks.npz", **masks)
            self.client.log_artifacts(run_id, folder)


def find_sweep_run(client, experiment_id: str, sweep: str) -> str | None:
    """The run id of the sweep's own run (tag role=sweep), or None."""
    found = client.search_runs([experiment_id], f"tags.sweep = '{sweep}' and tags.role = 'sweep'")
    return found[0].info.run_id if found else None


def log_sweep_tables(tracking_uri: str, study: str, sweep: str, tables: Path) -> bool:
    """Log the folder `tables` (analysis.tables' .tex/.md files and summary.parquet) as artifacts
    `tables/` of the sweep's run; True when logged. Fault tolerant like the sink: a failing store
    warns once and the files stay on disk."""
    if not Path(tables).is_dir():
        return False
    try:
        from mlflow import MlflowClient
        client = MlflowClient(tracking_uri=tracking_uri)
        experiment = client.get_experiment_by_name(study)
        run_id = find_sweep_run(client, experiment.experiment_id, sweep) if experiment is not None else None
        if run_id is None:
            return False
        client.log_artifacts(run_id, str(tables), artifact_path="tables")
        return True
    except Exception as err:  # noqa: BLE001 - the tables are on disk; MLflow is a copy
        print(f"WARNING: could not log the tables to MLflow at {tracking_uri} ({type(err).__name__}: "
              f"{str(err)[:200]}); they are in {tables}", file=sys.stderr, flush=True)
        return False


# MLflow 3 opens an experiment of this kind on its runs table (not the GenAI overview).
EXPERIMENT_TAGS = {"mlflow.experimentKind": "custom_model_development"}
# Shown in their own place in a name (setting, E, s), or never (where and how fast a run happens).
NAMED_APART = {*DATA_KNOBS, *NON_SEMANTIC, "algorithm", "local_epochs", "seed"}


def run_names(configs: list[RunConfig]) -> dict[str, str]:
    """Config hash -> a run name that tells the sweep's trials apart: the method label, the knobs
    that vary among the sweep's trials with that label (FedSelect: always p and α) as `k=v`, the
    data setting, `E<local epochs>` and `s<seed>`, e.g. `FedSelect p=0.25 α=0.8 digits Dir(0.1) E1 s0`.
    Two trials that would still share a name get their short config hash appended."""
    labelled = [(c.label(), c.semantic_dict()) for c in configs]
    names = {}
    for config in configs:
        own, label = config.semantic_dict(), config.label()
        peers = [d for peer, d in labelled if peer == label]  # what the label already says is not repeated
        varying = [k for k in own if k not in NAMED_APART and len({repr(d.get(k)) for d in peers}) > 1]
        shown = list(dict.fromkeys([*ALWAYS_NAMED.get(config.algorithm, ()), *varying]))
        knobs = " ".join(f"{KNOB_SYMBOLS.get(k, k)}={own[k]:g}" if isinstance(own[k], float)
                         else f"{KNOB_SYMBOLS.get(k, k)}={own[k]}" for k in shown)
        setting = setting_label(own).replace(", ", " ")
        names[config.config_hash()] = " ".join(p for p in (label, knobs, setting, f"E{config.local_epochs}",
                                                            f"s{config.seed}") if p)
    counts: dict[str, int] = {}
    for name in names.values():
        counts[name] = counts.get(name, 0) + 1
    return {h: f"{n} {h[:6]}" if counts[n] > 1 else n for h, n in names.items()}


def _measured(value: Any) -> bool:
    """A number that was measured (not NaN, not None, not a string or a flag)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


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
