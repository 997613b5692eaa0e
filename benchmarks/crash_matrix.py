"""Crash matrix: kill sweeps at random moments, resume them, and compare with uninterrupted runs.

For each study kind (a grid; a staged study, Optuna samples with ASHA per data setting; the
two-stage FedL2P study, killed during pretraining and during the second stage; the server-less
DisPFL study) the script runs the sweep once without interruption, then again under another name
while it SIGKILLs the driver's whole process group (the driver and the Ray it started) at seeded
random moments of the run's progress, and at the last moment a Ray worker running a trial instead; after each
kill it resumes the sweep (`--resume NAME`), until a run ends by itself. It then checks:
  - the round rows equal the uninterrupted run's, to the last bit (benchmarks/compare_sweeps.py's
    comparison: every result column, timing and placement columns aside), none duplicated;
  - the trials have the same statuses and rounds (trials.parquet);
  - MLflow: one run per trial, none left RUNNING, one sweep run.

    python -m benchmarks.crash_matrix                      # every kind, 3 kills each (about 15 min)
    python -m benchmarks.crash_matrix --kinds grid --kills 2 --seed 1

Progress is counted in (trial, round) rows written; a kill at fraction f of the run comes once that
share of the uninterrupted run's rows exists (or, when a resumed run starts past it, once it has
written a few more), after a further random pause of up to 0.2 s.
Each driver starts its own local Ray with its temp files in a folder of its own, so that what a
kill leaves running can be found and ended.
"""
from __future__ import annotations

import argparse
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from benchmarks.compare_sweeps import differences
from sweeps.damage import rounds_on_disk
from sweeps.parquet_sink import read_rounds

REPO = Path(__file__).resolve().parents[1]

TINY = ["--dataset", "synthetic", "--num-clients", "3", "--partition", "shards", "--shards-per-client", "3",
        "--batch-size", "16", "--local-epochs", "1", "--seeds", "0", "--verbose", "0"]
TWO_STAGE = """name = "two_stage"
seeds = [0]

[knobs]
dataset = "digits"
partition = "dirichlet"
num_clients = 4
model = "lenet_bn"
val_fraction = 0.2
rounds = 2
ft_epochs = 1

[pretraining]
algorithm = "fedavg"
rounds = 6

[[methods]]
algorithm = "ft"
bn_mode = ["C", "G"]

[[methods]]
algorithm = "fedl2p"
rounds = 3
meta_steps = 1
"""


@dataclass
class Kind:
    name: str
    command: list[str]          # the sweep command, without --results/--name
    experiment: str             # its MLflow experiment (the study's name)
    moments: list[tuple[float, float]] = field(default_factory=lambda: [(0.1, 0.9)])  # ranges of progress

    def resume(self, results: Path, name: str) -> list[str]:
        """The resume command: the script, or `-m sweeps.run STUDY`, with --resume only; the plan is the saved one."""
        head = self.command[:3] if self.command[0] == "-m" else self.command[:1]
        return [*head, "--resume", name, "--results", str(results), "--verbose", "0"]


def kinds(work: Path) -> dict[str, Kind]:
    study = work / "two_stage.toml"
    study.write_text(TWO_STAGE)
    grid = ["sweeps/fedselect_grid.py", *TINY, "--pers-rate", "0.1", "0.25", "0.5", "--pers-limit", "0.8",
            "--anchors", "fedavg", "--rounds", "20"]
    staged = ["sweeps/fedselect_grid.py", *TINY[:-4], "--partition", "shards", "iid", "--val-fraction", "0.2",
              "--seeds", "0", "1", "--anchors", "fedavg", "--search", "optuna", "--num-samples", "3",
              "--scheduler", "asha", "--max-concurrent", "1", "--rounds", "4", "--verbose", "0"]
    dispfl = ["-m", "sweeps.run", "dispfl", "--dataset", "synthetic", "--num-clients", "6", "--num-neighbours",
              "2", "--rounds", "6", "--local-epochs", "1", "--density", "0.5", "0.8", "--topology", "random",
              "--seeds", "0", "--verbose", "0"]
    return {
        "grid": Kind("grid", grid, "fedselect_grid"),
        "staged": Kind("staged", staged, "fedselect_grid"),
        # pretraining is the first 6 of the run's 6 + 2 x 2 + 3 (trial, round) rows: kills in each stage
        "two-stage": Kind("two-stage", ["-m", "sweeps.run", str(study), "--verbose", "0"], "two_stage",
                          [(0.05, 0.35), (0.55, 0.9)]),
        "dispfl": Kind("dispfl", dispfl, "dispfl"),
    }


# ---------------------------------------------------------------------------- processes
class Driver:
    """A sweep command in its own process group, with its own Ray temp folder."""

    def __init__(self, argv: list[str], ray_tmp: Path, log: Path) -> None:
        self.ray_tmp = ray_tmp
        env = os.environ | {"RAY_TMPDIR": str(ray_tmp), "PYTHONUNBUFFERED": "1"}
        self.log = open(log, "a")
        self.proc = subprocess.Popen([sys.executable, *argv], cwd=REPO, env=env, stdout=self.log,
                                     stderr=subprocess.STDOUT, start_new_session=True)

    def running(self) -> bool:
        return self.proc.poll() is None

    def kill_group(self) -> None:
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait()
        self.sweep_up()

    def sweep_up(self) -> None:
        """End whatever of this driver's Ray outlived it (processes with its temp folder in their environment)."""
        for pid in ray_processes(self.ray_tmp):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.log.close()


def ray_processes(ray_tmp: Path, title: str = "") -> list[int]:
    """Pids of processes started with RAY_TMPDIR=`ray_tmp` (and `title` in their command line)."""
    found = []
    marker = f"RAY_TMPDIR={ray_tmp}".encode()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            if marker in (entry / "environ").read_bytes().split(b"\0") and \
                    title.encode() in (entry / "cmdline").read_bytes():
                found.append(int(entry.name))
        except OSError:
            continue
    return found


def rows_written(folder: Path, rounds_of: dict[str, int]) -> int:
    """(trial, round) rows on disk (`sweeps.damage.rounds_on_disk`; a compacted trial has all of
    its `rounds_of` rounds)."""
    return sum(rounds_of.get(key, 0) if have == -1 else have for key, have in rounds_on_disk(folder).items())


# ---------------------------------------------------------------------------- one kind
def run_kind(kind: Kind, kills: int, rng: random.Random, work: Path) -> dict:
    results = work / kind.name
    shutil.rmtree(results, ignore_errors=True)
    ray_tmp = Path(tempfile.mkdtemp(prefix="cm-", dir="/tmp"))
    log = work / f"{kind.name}.log"
    reference = Driver([*kind.command, "--results", str(results / "ref"), "--name", "ref"], ray_tmp, log)
    code = reference.proc.wait()
    reference.sweep_up()
    if code != 0:
        raise SystemExit(f"{kind.name}: the uninterrupted run failed (exit {code}); see {log}")
    ref_trials = pd.read_parquet(results / "ref" / "ref" / "trials.parquet")
    rounds_of = dict(zip(ref_trials.config_hash, ref_trials.rounds_done.astype(int)))
    total = sum(rounds_of.values())

    lows = sorted(rng.uniform(*kind.moments[i % len(kind.moments)]) for i in range(kills))
    worker_kill = kills - 1  # the last kill ends a trial's Ray worker instead (the sweep may then finish by itself)
    folder, argv = results / "crash" / "crash", [*kind.command, "--results", str(results / "crash"), "--name", "crash"]
    again = kind.resume(results / "crash", "crash")
    done, starts, killed, events = False, 0, 0, []
    for index, fraction in enumerate(lows):
        # at the moment's share of the rows, or (already past it) a few more rows into this start
        target = min(max(fraction * total, rows_written(folder, rounds_of) + rng.randint(1, 3)), total - 1)
        driver = Driver(argv if starts == 0 else again, ray_tmp, log)
        starts += 1
        while driver.running() and rows_written(folder, rounds_of) < target:
            time.sleep(0.02)
        time.sleep(rng.uniform(0, 0.2))
        if not driver.running():  # it finished (or failed) before the moment came
            done = driver.proc.returncode == 0
            driver.sweep_up()
            events.append(f"ended before {fraction:.2f}")
            if done:
                break
            continue
        at = rows_written(folder, rounds_of) / total
        if index == worker_kill and (workers := ray_processes(ray_tmp, "ray::")):
            workers = [p for p in workers if b"ImplicitFunc" in Path(f"/proc/{p}/cmdline").read_bytes()] or workers
            os.kill(workers[0], signal.SIGKILL)
            events.append(f"worker killed at {at:.2f}")
            killed += 1
            code = driver.proc.wait()
            driver.sweep_up()
            done = code == 0
            if done:
                break
        else:
            driver.kill_group()
            events.append(f"driver group killed at {at:.2f}")
            killed += 1
    for _ in range(3):  # resume until a run ends by itself
        if done:
            break
        driver = Driver(again, ray_tmp, log)
        starts += 1
        done = driver.proc.wait() == 0
        driver.sweep_up()
    shutil.rmtree(ray_tmp, ignore_errors=True)
    return {"kind": kind.name, "kills": killed, "starts": starts, "events": "; ".join(events),
            "finished": done, **compare(results / "ref" / "ref", folder, results, kind.experiment)}


def compare(ref: Path, crash: Path, results: Path, experiment: str) -> dict:
    a, b = read_rounds(ref), read_rounds(crash)
    count, columns, problems = differences(a, b)
    duplicated = int(b.duplicated(["config_hash", "round", "client"]).sum())
    keys = ["config_hash", "status", "rounds_done"]
    ta = pd.read_parquet(ref / "trials.parquet")[keys].sort_values("config_hash", ignore_index=True)
    tb = pd.read_parquet(crash / "trials.parquet")[keys].sort_values("config_hash", ignore_index=True)
    trials_same = ta.equals(tb)
    runs = mlflow_runs(results / "crash", experiment)
    return {"rows": count, "columns": len(columns), "differences": len(problems) + duplicated + (not trials_same),
            "detail": "; ".join(problems + ([f"{duplicated} duplicated rows"] if duplicated else [])
                                + ([] if trials_same else ["trials differ"]))[:300],
            "trials": len(tb), **runs}


def mlflow_runs(results: Path, experiment: str) -> dict:
    import mlflow

    client = mlflow.MlflowClient(f"sqlite:///{results / 'mlflow.db'}")
    found = client.get_experiment_by_name(experiment)
    runs = client.search_runs([found.experiment_id]) if found else []
    trials = [r for r in runs if r.data.tags.get("role") == "trial"]
    hashes = [r.data.tags.get("config_hash") for r in trials]
    return {"mlflow_trial_runs": len(trials), "mlflow_duplicates": len(hashes) - len(set(hashes)),
            "mlflow_running": sum(r.info.status == "RUNNING" for r in runs),
            "mlflow_sweep_runs": sum(r.data.tags.get("role") == "sweep" for r in runs)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kinds", nargs="+", default=["grid", "staged", "two-stage", "dispfl"])
    parser.add_argument("--kills", type=int, default=3, help="kills per kind (default 3)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--work", type=Path, default=None, help="folder for the sweeps (default: a temp folder)")
    args = parser.parse_args(argv)
    work = args.work or Path(tempfile.mkdtemp(prefix="crash-matrix-"))
    work.mkdir(parents=True, exist_ok=True)
    available = kinds(work)
    unknown = [k for k in args.kinds if k not in available]
    if unknown:
        parser.error(f"unknown kind {unknown[0]!r}; choose from {', '.join(available)}")
    rng = random.Random(args.seed)
    rows = []
    for name in args.kinds:
        start = time.time()
        row = run_kind(available[name], args.kills, rng, work)
        row["seconds"] = round(time.time() - start)
        rows.append(row)
        print(f"[{name}] {row}", flush=True)
    table = pd.DataFrame(rows)
    shown = ["kind", "kills", "starts", "rows", "columns", "trials", "differences", "mlflow_trial_runs",
             "mlflow_duplicates", "mlflow_running", "seconds"]
    print("| " + " | ".join(shown) + " |\n|" + "---|" * len(shown))
    for row in table[shown].itertuples(index=False):
        print("| " + " | ".join(str(v) for v in row) + " |")
    for row in rows:
        print(f"{row['kind']}: {row['events']}" + (f"; {row['detail']}" if row["detail"] else ""))
    green = all(r["finished"] and r["differences"] == 0 and r["mlflow_duplicates"] == 0 and r["mlflow_running"] == 0
                and r["mlflow_trial_runs"] == r["trials"] for r in rows)
    print(f"all green: {green} (work folder {work})")
    return 0 if green else 1


if __name__ == "__main__":
    sys.exit(main())
