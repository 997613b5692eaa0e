"""Clients trained one after the other against clients trained together (fl_core/vectorized.py).

One epoch of local SGD for K clients of unequal sizes (0.5x to 1.5x `--samples`, batch 32, lr
0.05, momentum 0.9): the loop is K calls of `LocalTrainer.train_pass`, as a round of FedAvg makes
them; together is one `train_pass_together`. Cases: LeNet on 8x8 digits-shaped inputs and on
28x28 MNIST-shaped inputs, cnn2 on 32x32x3 CIFAR-shaped inputs (random class prototypes plus
noise). For each case and thread count the two sides take turns `--repeats` times after one
warm-up call each (vmap's first call costs about a second), and the table gives the median
seconds of each, their ratio (above 1: together is faster), the largest elementwise difference
between the two sides' parameters and the clients whose every parameter agrees to
|a - b| <= 1e-6 + 1e-5 |b|. In float32 a client can end further apart, by up to ~1e-3 here: a
rounding difference puts a ReLU input on the other side of 0 in one side only and momentum carries
the changed step on. The loop differs from itself as much when run on 2 threads instead of 1 or on
channels-last inputs; in float64 the two sides agree to ~1e-16 (tests/test_vectorized.py).

    .venv/bin/python -m benchmarks.vectorized_round --repeats 3
    .venv/bin/python -m benchmarks.vectorized_round --threads 1 2 --clients 10 --out /tmp/vectorized.md
    .venv/bin/python -m benchmarks.vectorized_round --device cuda --clients 20

On a GPU the loop's small kernels leave the device waiting on their launches, which is what
training together saves; on a CPU the work is the same sum of arithmetic either way, so expect a
gain only where a step's kernels are tiny (LeNet on 8x8).
"""
from __future__ import annotations

import argparse
import datetime
import platform
import statistics
import sys
import time
from pathlib import Path

import torch

from benchmarks.fixtures import write_report
from fl_core import kernels
from fl_core.models import build_model
from fl_core.training import LocalTrainer, SGDSettings
from fl_core.vectorized import train_pass_together, vectorizable

CASES = {"lenet-8x8": ("lenet", (1, 8, 8)), "lenet-28x28": ("lenet", (1, 28, 28)),
         "cnn2-32x32x3": ("cnn2", (3, 32, 32))}
# Cases whose model `train_pass_together` refuses (`vectorizable`): `measure` times their loop only
# (benchmarks/gpu_check.py's row per model); not among the command's cases, whose table compares both sides.
LOOP_ONLY_CASES = {"resnet18-32x32x3": ("resnet18", (3, 32, 32))}
SGD = SGDSettings(lr=0.05, batch_size=32, momentum=0.9)


def table(rows: list[dict]) -> list[str]:
    """The Markdown table of measured rows (case, threads, clients, loop and together seconds,
    diff: the largest absolute parameter difference, within: the clients that agree to 1e-5)."""
    lines = ["| model, input | threads | clients | loop (s) | together (s) | loop / together | largest diff. "
             "| clients within 1e-5 |", "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['case']} | {r['threads']} | {r['clients']} | {r['loop']:.3f} | {r['together']:.3f} | "
                     f"{r['loop'] / r['together']:.2f} | {r['diff']:.0e} | {r['within']} / {r['clients']} |")
    return lines


def clients(case: str, count: int, samples: int, device: torch.device):
    """A model and `count` clients: states (the model's), samples of unequal sizes, full updates."""
    name, shape = CASES[case] if case in CASES else LOOP_ONLY_CASES[case]
    torch.manual_seed(0)
    model = build_model(name, shape, 10).to(device)
    protos = torch.randn(10, *shape)
    sizes = [round(samples * (0.5 + k / max(count - 1, 1))) for k in range(count)]
    ys = [torch.randint(0, 10, (n,)) for n in sizes]
    xs = [(protos[y] + 0.8 * torch.randn(n, *shape)).to(device) for y, n in zip(ys, sizes)]
    home = model.state_dict()
    states = [{n: t.clone() for n, t in home.items()} for _ in sizes]
    updates = [{n: None for n, _ in model.named_parameters()} for _ in sizes]
    return model, states, xs, [y.to(device) for y in ys], updates


def timed(fn, device: torch.device) -> tuple[float, object]:
    """Seconds of `fn()` (the device synchronised before the clock stops) and what it returned."""
    start = time.perf_counter()
    out = fn()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter() - start, out


def measure(case: str, threads: int, args: argparse.Namespace) -> dict:
    """The row of `case` (a key of CASES, or of LOOP_ONLY_CASES: then together, diff and within are
    None and `refused` says why the model trains client by client)."""
    torch.set_num_threads(threads)
    device = torch.device(args.device)
    model, states, xs, ys, updates = clients(case, args.clients, args.samples, device)
    trainer = LocalTrainer(model, SGD)
    seeds = list(range(len(states)))
    refused = vectorizable(model)

    def loop():
        return [trainer.train_pass(s, x, y, u, seed)[0] for s, x, y, u, seed in zip(states, xs, ys, updates, seeds)]

    def together():
        return train_pass_together(model, states, xs, ys, updates, seeds, lr=SGD.lr, batch_size=SGD.batch_size,
                                   momentum=SGD.momentum)[0]

    sides = (("loop", loop),) if refused else (("loop", loop), ("together", together))
    outs = {side: timed(fn, device)[1] for side, fn in sides}  # the warm-up call of each side
    diff = within = None
    if not refused:
        new, ref = outs["together"], outs["loop"]
        diff = max(float((a[n] - b[n]).abs().max()) for a, b in zip(new, ref) for n in a)
        within = sum(all(torch.allclose(a[n], b[n], rtol=1e-5, atol=1e-6) for n in a) for a, b in zip(new, ref))
    times = {"loop": [], "together": []}
    for _ in range(args.repeats):
        for side, fn in sides:
            times[side].append(timed(fn, device)[0])
    return dict(case=case, threads=threads, clients=args.clients, diff=diff, within=within, refused=refused,
                **{side: statistics.median(t) if t else None for side, t in times.items()})


def cpu_name() -> str:
    """The CPU's model name (Linux's /proc/cpuinfo), else what `platform` knows."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def provenance(args: argparse.Namespace) -> str:
    gpu = f"; GPU: {torch.cuda.get_device_name()}" if args.device == "cuda" else ""
    return (f"One epoch of {args.clients} clients ({args.samples // 2} to {args.samples * 3 // 2} samples each, batch "
            f"{SGD.batch_size}, momentum {SGD.momentum}), median of {args.repeats} turns per side, on {args.device}; "
            f"CPU: {cpu_name()} ({kernels.machine_isa()}); kernels: {kernels.describe()}{gpu}; "
            f"torch {torch.__version__}; {datetime.date.today().isoformat()}.")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.vectorized_round", description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, nargs="+", default=[1], help="torch thread counts to measure")
    parser.add_argument("--clients", type=int, default=10, help="clients per round (K)")
    parser.add_argument("--samples", type=int, default=200, help="mean training samples per client")
    parser.add_argument("--repeats", type=int, default=5, help="turns of each side (median)")
    parser.add_argument("--cases", nargs="+", default=list(CASES), choices=list(CASES), metavar="CASE",
                        help=f"among: {', '.join(CASES)}")
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--out", type=Path, default=None, help="also write the table (Markdown) to this file")
    args = parser.parse_args(argv)
    for flag, value, low in (("--repeats", args.repeats, 1), ("--clients", args.clients, 1),
                             ("--samples", args.samples, 2), ("--threads", min(args.threads), 1)):
        if value < low:
            parser.error(f"{flag} {value}: give at least {low}")
    if args.device == "cuda":
        if not torch.cuda.is_available():
            parser.error("--device cuda: no CUDA device is visible")
        kernels.settle_cuda(torch.device("cuda"))
    rows = []
    for case in args.cases:
        for threads in args.threads:
            rows.append(measure(case, threads, args))
            print(table(rows[-1:])[-1], flush=True)
    lines, caption = table(rows), provenance(args)
    print("\n".join(lines) + "\n\n" + caption)
    write_report(args.out, lines, caption)
    return 0


if __name__ == "__main__":
    sys.exit(main())
