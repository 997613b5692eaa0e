"""How many trials to pack on one GPU: throughput and slowdown at 1, 2, 4, 8 trials per GPU.

A sweep given `--gpus-per-trial 1/N` lets Ray start N trials on one GPU; Ray only schedules them,
so the N trial processes then share the device as N processes do. This benchmark starts N
processes at once (spawned, one torch thread each, each a run of the engine on the device, as a
trial's is: its data put on the device once), lines them up at a barrier and times their rounds.
For each N it prints the fraction 1/N, each trial's median seconds per round (mean and slowest
over the N), the throughput (rounds per second summed over the trials) and the slowdown (a
trial's median round at N against the median round of one trial alone).

    .venv/bin/python -m benchmarks.gpu_packing                      # cuda, cnn2 on CIFAR-shaped data
    .venv/bin/python -m benchmarks.gpu_packing --model resnet18 --packs 1 2 4
    .venv/bin/python -m benchmarks.gpu_packing --device cpu --packs 1 2 --rounds 3   # the same path on the CPU
    .venv/bin/python -m benchmarks.gpu_packing --markdown > docs/results/performance/gpu_packing.md

The first round of every trial is a warm-up (CUDA context, cuDNN's kernels) and is not counted.
On a CPU, N processes share the cores: there the numbers say nothing about a GPU, only that the
code path runs.
"""
from __future__ import annotations

import argparse
import multiprocessing as mp
import statistics
import sys
import time

import torch

from benchmarks.fixtures import random_federated
from fl_core.config import RunConfig
from fl_core.simulation import Simulation

CIFAR_SHAPE = (3, 32, 32)


def trial(args: argparse.Namespace, index: int, barrier, out) -> None:
    """One trial process: a FedAvg run on the device; after the warm-up round it waits for the
    others, then times `args.rounds` rounds (each ends in scoring, which synchronises the device)."""
    torch.set_num_threads(1)
    # `args.shape`/`args.dataset`, when set (benchmarks/gpu_check.py: LeNet on digits-shaped inputs): other
    # inputs than CIFAR's; this command's own flags leave them unset
    shape, dataset = getattr(args, "shape", CIFAR_SHAPE), getattr(args, "dataset", "cifar10")
    config = RunConfig(algorithm="fedavg", dataset=dataset, model=args.model, num_clients=args.clients,
                       samples_per_client=args.samples, test_samples_per_client=args.samples, local_epochs=1,
                       rounds=args.rounds + 1, eval_every=1, seed=index, threads=1, device=args.device)
    data = random_federated(args.clients, shape, args.samples, args.samples, seed=index)
    sim = Simulation(config, data=data)
    sim.run_round()
    barrier.wait()
    seconds = []
    for _ in range(args.rounds):
        start = time.perf_counter()
        sim.run_round()
        if sim.device.type == "cuda":
            torch.cuda.synchronize(sim.device)
        seconds.append(time.perf_counter() - start)
    out.put((index, statistics.median(seconds), sim.device.type))


def pack(args: argparse.Namespace, n: int) -> tuple[list[float], str]:
    """The median round seconds of each of `n` trials run at once, and the device they ran on."""
    ctx = mp.get_context("spawn")  # CUDA cannot be used in a forked child
    barrier, out = ctx.Barrier(n), ctx.Queue()
    procs = [ctx.Process(target=trial, args=(args, i, barrier, out)) for i in range(n)]
    for p in procs:
        p.start()
    results = [out.get(timeout=args.timeout) for _ in procs]
    for p in procs:
        p.join()
    if any(p.exitcode for p in procs):
        raise SystemExit(f"a trial process of the {n}-trial pack failed (exit codes {[p.exitcode for p in procs]})")
    return [s for _, s, _ in sorted(results)], results[0][2]


def row(args: argparse.Namespace, n: int, alone: float | None = None) -> dict:
    """The row of `n` trials at once; `alone`: the mean round of one trial alone, the slowdown's base
    (None: this row is that base)."""
    seconds, device = pack(args, n)
    mean = statistics.mean(seconds)
    alone = mean if alone is None else alone
    return {"trials": n, "fraction": f"1/{n}" if n > 1 else "1", "device": device, "round_mean": mean,
            "round_max": max(seconds), "throughput": sum(1 / s for s in seconds), "slowdown": mean / alone}


def rows(args: argparse.Namespace) -> list[dict]:
    """One row per pack size (`args.packs` starts at 1: the trial alone is the slowdown's base)."""
    table = []
    for n in args.packs:
        table.append(row(args, n, table[0]["round_mean"] if table else None))
    return table


def render(table: list[dict], args: argparse.Namespace, markdown: bool) -> str:
    head = (f"{args.model}, FedAvg, {args.clients} clients x {args.samples} CIFAR-shaped images, 1 epoch, "
            f"batch 32, scored every round; median of {args.rounds} rounds per trial, one torch thread each")
    cols = ("trials per GPU", "GPU fraction", "device", "round (s), mean of trials", "round (s), slowest trial",
            "throughput (rounds/s)", "slowdown vs alone")
    lines = [head, "", "| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)] if markdown else [head]
    for r in table:
        cells = (str(r["trials"]), r["fraction"], r["device"], f"{r['round_mean']:.3f}", f"{r['round_max']:.3f}",
                 f"{r['throughput']:.2f}", f"{r['slowdown']:.2f}")
        if markdown:
            lines.append("| " + " | ".join(cells) + " |")
            continue
        trials = f"{r['trials']} trial" + ("s" if r["trials"] > 1 else "")
        lines.append(f"{trials:>9} (fraction {cells[1]:>3}) on {cells[2]}: round {cells[3]} s (slowest {cells[4]} s), "
                     f"throughput {cells[5]} rounds/s, slowdown {cells[6]}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.gpu_packing", description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--packs", type=int, nargs="+", default=[1, 2, 4, 8], help="trials per GPU (default 1 2 4 8)")
    parser.add_argument("--model", default="cnn2", help="cnn2, lenet, resnet18, ... (default cnn2)")
    parser.add_argument("--clients", type=int, default=10)
    parser.add_argument("--samples", type=int, default=100, help="training (and test) images per client")
    parser.add_argument("--rounds", type=int, default=5, help="timed rounds per trial, after one warm-up round")
    parser.add_argument("--timeout", type=float, default=1800, help="seconds to wait for a pack's trials")
    parser.add_argument("--markdown", action="store_true")
    args = parser.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: torch sees no CUDA device here; --device cpu runs the same path on the CPU")
    if sorted(args.packs) != args.packs or args.packs[0] != 1 or any(n < 1 for n in args.packs):
        parser.error(f"--packs {' '.join(map(str, args.packs))}: ascending, starting at 1 (the slowdown's base)")
    print(render(rows(args), args, args.markdown))
    return 0


if __name__ == "__main__":
    sys.exit(main())
