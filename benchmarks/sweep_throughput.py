"""Trials per hour of a real sweep at 1 and at 2 concurrent trials, and the efficiency of the second.

Runs a study (`python -m sweeps.run STUDY` with the arguments after `--`) twice from the command
line, as a user would, in a fresh results folder each time: once with `--max-concurrent 1`, once
with `--max-concurrent 2` (the cores of the development machine). For each it reports
  - trials per hour over the whole command (process start to exit: Ray start, data, every trial,
    the final tables and MLflow runs), what a user waits for;
  - trials per hour over the trial phase alone (first trial start to last trial report, from the
    `started_at` / `reported_at` columns of trials.parquet), which the fixed costs do not dilute;
  - the median wall time of a trial.
A trial's cold start (scheduled -> first round) is timed by `benchmarks/sweep_scaling.py`.
Efficiency = (trials per hour at 2 / trials per hour at 1) / 2; the target is >= 0.9.

    .venv/bin/python -m benchmarks.sweep_throughput fedselect_grid                       # the default sweep, 96 trials
    .venv/bin/python -m benchmarks.sweep_throughput fedselect_grid -- --seeds 0          # a third of it
    .venv/bin/python -m benchmarks.sweep_throughput baselines_pfl -- --data-root ../shared/data \\
        --algorithms fedavg fedavg_ft local scaffold --rounds 10
"""
from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pandas as pd

REPO = Path(__file__).resolve().parents[1]


def run_sweep(script: str, args: list[str], concurrent: int, results: Path) -> dict:
    """Run the sweep once; return its wall time and the trial phase read from trials.parquet."""
    name = f"throughput-c{concurrent}"
    command = [sys.executable, "-m", "sweeps.run", script, *args, "--name", name,
               "--results", str(results), "--max-concurrent", str(concurrent)]
    start = time.time()
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True)
    wall = time.time() - start
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(command)} exited {done.returncode}:\n{done.stderr[-2000:]}")
    trials = pd.read_parquet(results / name / "trials.parquet")
    finished = trials[trials["status"] == "COMPLETED"]
    if finished.empty:
        raise SystemExit(f"no trial of {name} completed; statuses: {trials['status'].value_counts().to_dict()}")
    phase = float(finished["reported_at"].max() - finished["started_at"].min())
    return {"concurrent": concurrent, "trials": len(finished), "wall": wall, "phase": phase,
            "per_hour": 3600 * len(finished) / wall, "phase_per_hour": 3600 * len(finished) / phase,
            "trial_seconds": float(finished["wall_seconds"].median())}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("script", help="a study in studies/, e.g. fedselect_grid or baselines_pfl")
    parser.add_argument("args", nargs="*", help="its arguments (after --)")
    parser.add_argument("--keep", type=Path, default=None,
                        help="keep the two sweeps' folders here (default: a temporary folder, removed)")
    opts = parser.parse_args()
    if not (REPO / "studies" / f"{opts.script}.toml").is_file():
        parser.error(f"no study studies/{opts.script}.toml")
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for concurrent in (1, 2):
            row = run_sweep(opts.script, opts.args, concurrent, (opts.keep or Path(tmp)) / f"c{concurrent}")
            rows.append(row)
            print(f"{concurrent} concurrent: {row['trials']} trials in {row['wall']:.0f} s "
                  f"({row['per_hour']:.0f} trials/hour); trial phase {row['phase']:.0f} s "
                  f"({row['phase_per_hour']:.0f} trials/hour); median trial {row['trial_seconds']:.1f} s", flush=True)
    one, two = rows
    print(f"\npython -m sweeps.run {opts.script} {' '.join(opts.args)}")
    print("| concurrent trials | trials | wall (s) | trials / hour | trial phase (s) | trials / hour, trial phase "
          "| median trial (s) |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['concurrent']} | {r['trials']} | {r['wall']:.0f} | {r['per_hour']:.0f} | {r['phase']:.0f} | "
              f"{r['phase_per_hour']:.0f} | {r['trial_seconds']:.1f} |")
    print(f"\nefficiency at 2 (speedup / 2): whole command {two['per_hour'] / one['per_hour'] / 2:.2f}, "
          f"trial phase {two['phase_per_hour'] / one['phase_per_hour'] / 2:.2f} (target >= 0.9)")


if __name__ == "__main__":
    main()
