"""Does a sweep use the machine? Throughput of k concurrent 1-CPU trials against one trial alone,
and how long a trial takes to start.

All in one run on one machine, through the real trainable (`sweeps.trainable.run_trial`: data
from the object store, Parquet and state file per round):
  (1) one trial alone; (2) k trials at once (k = CPU cores, different seeds);
      efficiency = (k / wall of 2) / (1 / wall of 1) / k                        target >= 0.85
  (3) start-up, scheduled -> first round:
      cold  = first trials of a sweep: from Tuner.fit to the trial's first round (a new process:
              Tune set-up, importing torch and Ray Tune, data from the object store, model build);
      warm  = a sweep of 4k trials with actor reuse (as the study scripts run): the time a slot
              spends outside rounds per trial, (k x wall - sum of round time) / trials; an upper
              bound, as it includes the k cold starts of that sweep.                target <= 3 s

    .venv/bin/python -m benchmarks.sweep_scaling [--rounds 20] [--k 2]
"""
from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path


import ray
from ray import tune

from fl_core.config import RunConfig
from fl_core.data import load_data
from sweeps.plan import grid_space
from sweeps.resources import TrialResources
from sweeps.trainable import run_trial


class Timeline(tune.Callback):
    """Driver-side: when each trial's first round began, and its total round time."""

    def __init__(self) -> None:
        self.first_round: dict[str, float] = {}
        self.round_time: dict[str, float] = {}

    def on_trial_result(self, iteration, trials, trial, result, **info):
        seconds = result["summary"]["round_seconds"]
        if result["round"] == 1:
            self.first_round[trial.trial_id] = result["reported_at"] - seconds
        self.round_time[trial.trial_id] = self.round_time.get(trial.trial_id, 0.0) + seconds


def sweep(configs: list[RunConfig], refs: dict, folder: Path, reuse: bool = False) -> tuple[float, float, Timeline]:
    timeline = Timeline()
    trainable = tune.with_resources(
        tune.with_parameters(run_trial, data_refs=refs, sweep_dir=str(folder), sweep=folder.name,
                             resources=TrialResources(cpus=1, gpus=0)),
        {"cpu": 1})
    space, _ = grid_space([("grid", c) for c in configs], {})
    tuner = tune.Tuner(trainable, param_space=space, tune_config=tune.TuneConfig(reuse_actors=reuse),
                       run_config=tune.RunConfig(name="tune", storage_path=str(folder), verbose=0,
                                                 callbacks=[timeline]))
    start = time.time()
    tuner.fit()
    return start, time.time() - start, timeline


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--k", type=int, default=os.cpu_count(), help="concurrent trials (default: CPU cores)")
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--dataset", default="digits")
    args = parser.parse_args()
    k = args.k

    base = RunConfig(algorithm="fedselect", dataset=args.dataset, partition="shards", num_clients=10,
                     rounds=args.rounds, threads=1)
    configs = [base.replace(seed=s) for s in range(1 + k)]
    short = [base.replace(seed=s, rounds=3) for s in range(4 * k)]
    with tempfile.TemporaryDirectory() as tmp:
        ray.init(num_cpus=k, include_dashboard=False, logging_level="ERROR", _temp_dir=os.path.join(tmp, "ray"))
        refs = {c.data_key(): ray.put(load_data(c)) for c in configs + short}
        sweep(short[:1], refs, Path(tmp) / "warm-up")  # first-sweep costs in the driver, not measured
        start1, single, t1 = sweep(configs[:1], refs, Path(tmp) / "single")
        startk, many, tk = sweep(configs[1:], refs, Path(tmp) / "many")
        _, reuse_wall, tr = sweep(short, refs, Path(tmp) / "reuse", reuse=True)
        ray.shutdown()
    efficiency = (k / many) / (1 / single) / k
    cold = [t1.first_round[t] - start1 for t in t1.first_round] + [tk.first_round[t] - startk for t in tk.first_round]
    warm = (k * reuse_wall - sum(tr.round_time.values())) / len(short)
    print(f"{k} cores; FedSelect on {args.dataset}, 10 clients, {args.rounds} rounds per trial")
    print(f"1 trial alone        : {single:6.1f} s wall")
    print(f"{k} trials at once     : {many:6.1f} s wall")
    print(f"scaling efficiency   : {efficiency:6.3f}   (target >= 0.85)")
    print(f"cold start           : median {statistics.median(cold):.2f} s, max {max(cold):.2f} s "
          f"(Tuner.fit -> first round of a trial in a new process)")
    print(f"warm start           : {warm:6.2f} s per trial outside rounds, {len(short)} 3-round trials "
          f"with actor reuse (target <= 3 s)")


if __name__ == "__main__":
    main()
