"""How close is one FedSelect round to the pure-compute limit, in time, memory and scaling?

Default mode, in one process: one FedSelect round (10 clients x 100 training samples, one local
epoch = a personal and a global pass, evaluation before and after the broadcast), against a tight
loop on one model doing the same forward/backward sample-steps (same batch sizes, plain SGD) and
the same evaluation forwards. The difference is the engine's overhead: state handling, masked
updates, GradSelect, masked averaging, broadcast. Target: ratio <= 1.15.

`--all` prints every target of issue 8 item 5 in one run (a few minutes on 2 cores):
  1. round time / pure-compute limit for ResNet-18 (ImageNet stem) and cnn2 on CIFAR-shaped
     random data (3x32x32; no download needed)                                   target <= 1.15
  2. peak RSS of 10 ResNet-18 clients (fresh subprocess per measurement, getrusage) under the
     allocator a sweep's trial workers run with (sweeps/allocator.py), also beside the modules a
     trial worker imports (Ray and Tune), and under glibc's malloc, tuned and untuned
                                                                                 target <= 1.5 GB
  3. bytes a FedSelect client holds between rounds / (model bytes + bit-packed masks) <= 1.2
  4. seconds per client per round for 10/100/1000 LeNet clients on digits-sized data; the
     1000-vs-100 ratio                                                            target <= 1.10
  5. `python -m fl_core` on digits: process start to the first "round   1" line   target <= 3 s

    .venv/bin/python -m benchmarks.round_overhead                 # MNIST/LeNet if ../shared/data has MNIST
    .venv/bin/python -m benchmarks.round_overhead --dataset digits
    .venv/bin/python -m benchmarks.round_overhead --model resnet18 --threads 2 --repeats 3
    .venv/bin/python -m benchmarks.round_overhead --all --threads 2
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


import torch
from torch.nn import functional as F

from benchmarks.fixtures import client_bytes, random_federated, write_report
from fl_core import kernels
from fl_core.config import RunConfig
from fl_core.data import FederatedData
from fl_core.models import build_model
from fl_core.simulation import Simulation
from sweeps.allocator import allocator_env

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared" / "data"
CIFAR_SHAPE, DIGITS_SHAPE = (3, 32, 32), (1, 8, 8)


def pure_compute(sim: Simulation | None, passes: int, eval_passes: int, *, model_name: str = "",
                 data: FederatedData | None = None, lr: float = 0.1, bs: int = 32) -> float:
    """The same sample-steps and evaluation forwards as one round, in one tight loop (on `sim`'s
    model and data, or on `model_name` and `data` without any simulation state)."""
    if sim is not None:
        model_name, data, lr, bs = sim.model_name, sim.data, sim.config.lr, sim.config.batch_size
    model = build_model(model_name, data.input_shape, data.num_classes)
    opt = torch.optim.SGD(model.parameters(), lr=lr, foreach=True)
    start = time.perf_counter()
    for d in data.clients:
        model.train()
        for _ in range(passes):
            order = torch.randperm(d.n_train)
            for i in range(0, d.n_train, bs):
                idx = order[i:i + bs]
                opt.zero_grad(set_to_none=True)
                F.cross_entropy(model(d.x_train[idx]), d.y_train[idx]).backward()
                opt.step()
        model.eval()
        with torch.no_grad():
            for _ in range(eval_passes):
                for i in range(0, d.n_test, 1024):
                    model(d.x_test[i:i + 1024]).argmax(1)
    return time.perf_counter() - start


def make_sim(model: str, clients: int, threads: int, dataset: str, samples: int = 100, test: int = 100,
             rounds: int = 100) -> Simulation:
    """A FedSelect run (p = 0.25, α = 0.8). `dataset` random-cifar / random-digits builds random
    tensors of that shape directly (2 classes per client); other names load the real source."""
    config = RunConfig(algorithm="fedselect", dataset="cifar10" if dataset == "random-cifar" else
                       "digits" if dataset == "random-digits" else dataset, model=model, num_clients=clients,
                       partition="shards", shards_per_client=2, samples_per_client=samples,
                       test_samples_per_client=test, local_epochs=1, rounds=rounds, pers_rate=0.25,
                       pers_limit=0.8, data_root=str(SHARED) if dataset == "mnist" else None, threads=threads)
    data = None
    if dataset.startswith("random-"):
        shape = CIFAR_SHAPE if dataset == "random-cifar" else DIGITS_SHAPE
        data = random_federated(clients, shape, samples, test)
    return Simulation(config, data=data)


def overhead(model: str, clients: int, threads: int, dataset: str, repeats: int) -> tuple[Simulation, dict]:
    """Seconds of a FedSelect round and of the pure-compute limit, alternating, after 2 warm-up
    rounds (after them a quarter of each tensor is personal, so both LocalAlt passes run): medians
    of wall time and of this process's CPU time (all threads; less disturbed by other processes)."""
    sim = make_sim(model, clients, threads, dataset, rounds=repeats + 2)
    sim.run_round()
    sim.run_round()
    pure_compute(sim, passes=1, eval_passes=1)  # warm-up: the first optimizer step starts threads
    times = {"ours": [], "limit": [], "ours_cpu": [], "limit_cpu": []}
    for _ in range(repeats):
        cpu = time.process_time()
        times["ours"].append(sim.run_round().seconds)
        times["ours_cpu"].append(time.process_time() - cpu)
        # LocalAlt = personal pass + global pass per epoch; evaluation before and after broadcast.
        cpu = time.process_time()
        times["limit"].append(pure_compute(sim, passes=2 * sim.config.local_epochs, eval_passes=2))
        times["limit_cpu"].append(time.process_time() - cpu)
    return sim, {k: statistics.median(v) for k, v in times.items()} | {k + "_min": min(v) for k, v in times.items()}


def peak_rss_mode(kind: str, model: str, clients: int, threads: int) -> None:
    """Subprocess body: two FedSelect rounds, or (`pure`) the same compute on one model and the
    data alone; prints the peak RSS in bytes. `ours-worker` first imports what a sweep's trial
    worker imports beside the engine (Ray and Tune, through sweeps.trainable)."""
    if kind == "ours-worker":
        import sweeps.trainable  # noqa: F401  (its imports are the point)
    if kind in ("ours", "ours-worker"):
        sim = make_sim(model, clients, threads, "random-cifar", rounds=2)
        sim.run_round()
        sim.run_round()
    else:
        pure_compute(None, passes=2, eval_passes=2, model_name=model,
                     data=random_federated(clients, CIFAR_SHAPE, 100, 100))
    status = Path("/proc/self/status")
    hwm = [line for line in status.read_text().splitlines() if line.startswith("VmHWM")] if status.exists() else []
    print(json.dumps({"getrusage": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
                      "vmhwm": int(hwm[0].split()[1]) * 1024 if hwm else 0}))


def peak_rss(kind: str, model: str, clients: int, threads: int, env: dict[str, str] | None = None) -> dict[str, int]:
    argv = ["--rss", kind, "--model", model, "--clients", str(clients), "--threads", str(threads)]
    out = subprocess.run([sys.executable, "-m", "benchmarks.round_overhead", *argv], capture_output=True, text=True,
                         check=True, cwd=REPO, env=None if env is None else os.environ | env)
    return json.loads(out.stdout.strip().splitlines()[-1])


def cli_start_seconds() -> float:
    """Wall time from starting `python -m fl_core` on digits to its first "round   1" line."""
    with tempfile.TemporaryDirectory() as tmp:
        start = time.perf_counter()
        proc = subprocess.Popen([sys.executable, "-m", "fl_core", "--dataset", "digits", "--rounds", "2",
                                 "--results", tmp], stdout=subprocess.PIPE, text=True, cwd=REPO)
        for line in proc.stdout:
            if line.startswith("round   1"):
                elapsed = time.perf_counter() - start
                break
        else:
            raise RuntimeError("python -m fl_core printed no 'round   1' line")
        proc.wait()
    return elapsed


def memory_report(threads: int, out: Path | None = None) -> list[str]:
    """Peak RSS of 10 ResNet-18 FedSelect clients over two rounds, each in a fresh process: as a
    sweep's trial runs (its workers' allocator, sweeps/allocator.py), under glibc's malloc tuned and
    untuned, and the pure compute's own peak; printed as lines, written as a Markdown table to `out`.
    Run it while this process is small: Linux carries a parent's RSS at fork into the child's
    getrusage peak, so a child started later would report at least this process's size."""
    workers, preload = allocator_env()
    cases = {f"ours, the engine as a sweep's trial runs it ({workers})": ("ours", preload, "<= 1.5"),
             f"the same, beside a trial worker's own imports (Ray and Tune; {workers})":
                 ("ours-worker", preload, ""),
             "ours, glibc's malloc as `tune_malloc` sets it": ("ours", {}, ""),
             "ours, glibc's malloc untuned": ("ours", {"FL_CORE_MALLOC_TUNING": "0"}, ""),
             f"the pure compute, alone ({workers})": ("pure", preload, "")}
    rows = {what: peak_rss(kind, "resnet18", 10, threads, env) for what, (kind, env, _) in cases.items()}
    lines = [f"peak RSS, 10 ResNet-18 clients, two rounds, {what}: {r['getrusage'] / 1e9:.2f} GB "
             f"(VmHWM {r['vmhwm'] / 1e9:.2f} GB)" + (f" (target {target} GB)" if target else "")
             for (what, r), (_, _, target) in zip(rows.items(), cases.values())]
    table = ["| 10 ResNet-18 FedSelect clients, two rounds | peak RSS (GB) | target |", "|---|---|---|"]
    table += [f"| {what} | {r['getrusage'] / 1e9:.2f} | {target} |"
              for (what, r), (_, _, target) in zip(rows.items(), cases.values())]
    write_report(out, table, f"Each row a fresh process (getrusage's peak); {threads} torch thread(s); "
                 f"CPU: {kernels.machine_isa()}. The pure compute is one model's training and scoring passes "
                 f"on the same data, the floor the engine's ten client states add to.")
    return lines


def report_all(args: argparse.Namespace) -> None:
    print(f"[all] {args.threads} thread(s); the machine may be shared with other processes, so times are noisy")
    # First, while this process is small: Linux carries a parent's RSS at fork into the child's
    # getrusage peak, so a child started later would report at least this process's size.
    for line in memory_report(args.threads):
        print(f"[2] {line}")
    for model, repeats in (("resnet18", args.resnet_repeats), ("cnn2", args.repeats)):
        sim, t = overhead(model, 10, args.threads, "random-cifar", repeats)
        print(f"[1] {model:8s} 10 clients x 100 CIFAR-shaped samples, 1 epoch, batch 32, median of {repeats}: "
              f"round {t['ours']:7.3f} s  limit {t['limit']:7.3f} s  ratio {t['ours'] / t['limit']:6.3f}  "
              f"(target <= 1.15); ratio of the fastest {t['ours_min'] / t['limit_min']:6.3f}; "
              f"CPU time ratio {t['ours_cpu'] / t['limit_cpu']:6.3f}")
        if model == "resnet18":
            held, model_bytes, packed = client_bytes(sim.clients[0], sim.trainer.model, sim.algorithm.selectable)
            print(f"[3] resnet18 per-client state: {held / 2**20:7.2f} MiB held; model {model_bytes / 2**20:7.2f} MiB "
                  f"+ bit-packed masks {packed / 2**20:5.2f} MiB; ratio {held / (model_bytes + packed):6.3f} "
                  f"(target <= 1.2)")
        del sim
    # All three sizes built first, then timed in turns, so that a burst of load from other
    # processes hits every size alike; the fastest of the timed rounds per size counts.
    sims = {n: make_sim("lenet", n, args.threads, "random-digits", samples=args.lenet_samples, test=20,
                        rounds=2 + args.lenet_repeats) for n in (10, 100, 1000)}
    for sim in sims.values():
        sim.run_round()
        sim.run_round()
    rounds = {n: [] for n in sims}
    for _ in range(args.lenet_repeats):
        for n, sim in sims.items():
            rounds[n].append(sim.run_round().seconds)
    per_client = {n: min(r) / n for n, r in rounds.items()}
    for n, r in rounds.items():
        print(f"[4] lenet {n:5d} clients x {args.lenet_samples} digits-sized samples: round {min(r):7.3f} s "
              f"(fastest of {len(r)}; median {statistics.median(r):7.3f} s), {per_client[n] * 1000:6.2f} ms per client")
    del sims
    print(f"[4] per-client time, 1000 vs 100 clients: ratio {per_client[1000] / per_client[100]:6.3f} (target <= 1.10)")
    cli = min(cli_start_seconds() for _ in range(2))
    print(f"[5] python -m fl_core --dataset digits: start to first round line {cli:5.2f} s (best of 2; target <= 3 s)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dataset", default=None, help="mnist, digits, synthetic, random-cifar (3x32x32), "
                        "random-digits (1x8x8); default: mnist if ../shared/data has it, else digits; "
                        "random-cifar for cnn2 and resnet18")
    parser.add_argument("--model", default="auto", choices=["auto", "lenet", "cnn2", "resnet18", "resnet18_cifar"])
    parser.add_argument("--clients", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=7, help="timed rounds (median reported)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--all", action="store_true", help="print every target's ratio in one run")
    parser.add_argument("--resnet-repeats", type=int, default=3, help="--all: timed ResNet-18 rounds")
    parser.add_argument("--lenet-samples", type=int, default=50, help="--all: training samples per LeNet client")
    parser.add_argument("--lenet-repeats", type=int, default=3, help="--all: timed LeNet rounds per client count")
    parser.add_argument("--memory", action="store_true", help="only the peak RSS rows of --all")
    parser.add_argument("--out", type=Path, default=None, help="--memory: also write its table (Markdown) here")
    parser.add_argument("--rss", choices=["ours", "ours-worker", "pure"], help=argparse.SUPPRESS)  # subprocess of --all
    args = parser.parse_args()
    sys.stdout.reconfigure(line_buffering=True)  # progress shows when the output is piped
    torch.set_num_threads(args.threads)
    if args.rss:
        return peak_rss_mode(args.rss, args.model, args.clients, args.threads)
    if args.memory:
        print("\n".join(memory_report(args.threads, args.out)))
        return None
    if args.all:
        return report_all(args)
    dataset = args.dataset or ("random-cifar" if args.model in ("cnn2", "resnet18", "resnet18_cifar") else
                               "mnist" if (SHARED / "MNIST").exists() else "digits")
    sim, t = overhead(args.model, args.clients, args.threads, dataset, args.repeats)
    print(f"dataset {dataset}, model {sim.model_name}, {args.clients} clients x 100 train / 100 test samples, "
          f"batch {sim.config.batch_size}, {args.threads} thread(s), median of {args.repeats}")
    print(f"FedSelect round      : {t['ours'] * 1000:8.1f} ms   (CPU time {t['ours_cpu'] * 1000:8.1f} ms)")
    print(f"pure-compute limit   : {t['limit'] * 1000:8.1f} ms   (CPU time {t['limit_cpu'] * 1000:8.1f} ms)")
    print(f"ratio (target <=1.15): {t['ours'] / t['limit']:8.3f}   (CPU time {t['ours_cpu'] / t['limit_cpu']:8.3f}; "
          f"fastest rounds {t['ours_min'] / t['limit_min']:8.3f})")


if __name__ == "__main__":
    main()
