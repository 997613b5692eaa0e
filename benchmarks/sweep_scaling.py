"""Does a sweep use the machine? Throughput of k concurrent 1-CPU trials against one trial alone.

In one run on one machine: (1) one trial alone, (2) k identical-sized trials at once (k = CPU
cores, different seeds), all through the real trainable (`sweeps.trainable.run_trial`: data from
the object store, Parquet per round, checkpoint per round). Prints

  efficiency = (k trials / wall time of the k-trial sweep) / (1 trial / wall time of the single sweep)
               / k                                                   target >= 0.85
  start-up   = per trial, from Tune starting it to the start of its first round   target <= 3 s

    .venv/bin/python benchmarks/sweep_scaling.py [--rounds 20] [--k 2]
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import ray  # noqa: E402
from ray import tune  # noqa: E402

from fl_core.config import RunConfig  # noqa: E402
from fl_core.simulation import load_data  # noqa: E402
from sweeps.resources import TrialResources  # noqa: E402
from sweeps.trainable import data_key, run_trial  # noqa: E402


class StartTimes(tune.Callback):
    """Driver-side: when Tune started each trial, and when its first round began."""

    def __init__(self) -> None:
        self.started: dict[str, float] = {}
        self.first_round: dict[str, float] = {}

    def on_trial_start(self, iteration, trials, trial, **info):
        self.started[trial.trial_id] = time.time()

    def on_trial_result(self, iteration, trials, trial, result, **info):
        if result["round"] == 1:
            self.first_round[trial.trial_id] = result["reported_at"] - result["round_seconds"]


def sweep(configs: list[RunConfig], refs: dict, folder: Path) -> tuple[float, list[float]]:
    times = StartTimes()
    trainable = tune.with_resources(
        tune.with_parameters(run_trial, data_refs=refs, sweep_dir=str(folder), sweep=folder.name,
                             resources=TrialResources(cpus=1, gpus=0)),
        {"cpu": 1})
    space = {"trial": tune.grid_search([{k: v for k, v in c.to_dict().items()
                                         if k not in ("device", "threads", "download")} for c in configs])}
    tuner = tune.Tuner(trainable, param_space=space,
                       run_config=tune.RunConfig(name="tune", storage_path=str(folder), verbose=0, callbacks=[times]))
    start = time.time()
    tuner.fit()
    wall = time.time() - start
    startup = [times.first_round[t] - times.started[t] for t in times.started]
    return wall, startup


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--k", type=int, default=os.cpu_count(), help="concurrent trials (default: CPU cores)")
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--dataset", default="digits")
    args = parser.parse_args()

    base = RunConfig(algorithm="fedselect", dataset=args.dataset, partition="shards", num_clients=10,
                     rounds=args.rounds, threads=1)
    configs = [base.replace(seed=s) for s in range(args.k + 1)]
    with tempfile.TemporaryDirectory() as tmp:
        ray.init(num_cpus=args.k, include_dashboard=False, logging_level="ERROR", _temp_dir=os.path.join(tmp, "ray"))
        refs = {data_key(c): ray.put(load_data(c)) for c in configs}
        single, single_startup = sweep(configs[:1], refs, Path(tmp) / "single")
        many, many_startup = sweep(configs[1:], refs, Path(tmp) / "many")
        ray.shutdown()
    efficiency = (args.k / many) / (1 / single) / args.k
    print(f"{args.k} cores; FedSelect on {args.dataset}, 10 clients, {args.rounds} rounds per trial")
    print(f"1 trial alone        : {single:6.1f} s wall")
    print(f"{args.k} trials at once     : {many:6.1f} s wall")
    print(f"scaling efficiency   : {efficiency:6.3f}   (target >= 0.85)")
    startups = single_startup + many_startup
    print(f"start-up per trial   : median {statistics.median(startups):.2f} s, max {max(startups):.2f} s "
          f"(target <= 3 s)")


if __name__ == "__main__":
    main()
