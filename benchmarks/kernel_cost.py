"""What the reproducible mode (fl_core/kernels.py) costs, per model: seconds of the same training
steps and evaluation forwards with the pinned kernels over the CPU's own kernels.

Each measurement is a fresh process (the kernels are chosen when torch loads), 1 torch thread;
the two modes alternate, `--repeats` times each, and the ratio of the medians is printed. On a CPU
whose best instruction set is AVX2 the two modes run the same ATen and oneDNN code (only MKL's
branch differs); on an AVX-512 CPU the mode gives up AVX-512's speed for AVX2's bits. A third
column runs ATen and oneDNN at AVX2 with MKL's own branch: what a CPU whose best is AVX2 runs
without the mode, so its ratio is the mode's cost there (MKL's pinned branch only).

    .venv/bin/python -m benchmarks.kernel_cost                 # lenet (digits, 28x28), cnn2, resnet18
    .venv/bin/python -m benchmarks.kernel_cost --models cnn2 --repeats 5
    .venv/bin/python -m benchmarks.kernel_cost --out docs/results/kernels/cost.md   # the docs' table
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
from pathlib import Path

from fl_core import kernels  # no torch: this process only starts the measurements

REPO = Path(__file__).resolve().parents[1]

# model name -> (input shape, training steps of batch 32; a third as many forwards of batch 256)
CASES = {"lenet-digits": ("lenet", (1, 8, 8), 150), "lenet": ("lenet", (1, 28, 28), 60),
         "cnn2": ("cnn2", (3, 32, 32), 30), "resnet18": ("resnet18", (3, 32, 32), 6)}

CHILD = """
import time
import torch
from torch.nn import functional as F
from fl_core.models import build_model

torch.set_num_threads(1)
torch.manual_seed(0)
model = build_model({model!r}, {shape!r}, 10)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
x, y = torch.randn(32, *{shape!r}), torch.randint(0, 10, (32,))
xe = torch.randn(256, *{shape!r})
def work(steps):
    model.train()
    for _ in range(steps):
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        opt.step()
    model.eval()
    with torch.no_grad():
        for _ in range(max(1, steps // 3)):
            model(xe)
work(2)
start = time.perf_counter()
work({steps})
print(time.perf_counter() - start)
"""


AVX2_OWN = {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2"}  # an AVX2 CPU's own, but MKL's


def measure(case: str, mode: str) -> float:
    """Seconds of the case in a fresh process; mode: own, avx2 (AVX2_OWN) or reproducible."""
    model, shape, steps = CASES[case]
    env = dict(os.environ)
    for name in kernels.PINS:  # the CPU's own kernels, unless the mode pins them
        env.pop(name, None)
    if mode == "reproducible":
        kernels.pin(env)
    elif mode == "avx2":
        env.update(AVX2_OWN)
    code = CHILD.format(model=model, shape=shape, steps=steps)
    out = subprocess.run([sys.executable, "-c", code], env=env, cwd=REPO, capture_output=True, text=True, check=True)
    return float(out.stdout.split()[0])


def own_kernels() -> str:
    """ATen's capability without the pins (what this CPU's own kernels are)."""
    env = {k: v for k, v in os.environ.items() if k not in kernels.PINS}
    code = "import torch; print(torch.backends.cpu.get_cpu_capability())"
    return "ATen " + subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                                    check=True).stdout.strip()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", nargs="+", choices=list(CASES), default=list(CASES))
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", type=Path, default=None, help="also write the table (Markdown) to this file")
    args = parser.parse_args(argv)
    if (reason := kernels.unavailable()) is not None:
        print(f"the reproducible mode is unavailable here: {reason}", file=sys.stderr)
        return 2
    lines = ["| model | input | training steps | own kernels (s) | AVX2, MKL's own (s) | reproducible (s) "
             "| reproducible / own | reproducible / AVX2 |", "|---|---|---|---|---|---|---|---|"]
    print("\n".join(lines), flush=True)
    for case in args.models:
        seconds = {"own": [], "avx2": [], "reproducible": []}
        for _ in range(args.repeats):
            for mode, store in seconds.items():
                store.append(measure(case, mode))
        own, avx2, pinned = (statistics.median(v) for v in seconds.values())
        model, shape, steps = CASES[case]
        lines.append(f"| {model} | {'x'.join(map(str, shape))} | {steps} | {own:.3f} | {avx2:.3f} | {pinned:.3f} | "
                     f"{pinned / own:.2f} | {pinned / avx2:.2f} |")
        print(lines[-1], flush=True)
    caption = (f"Seconds for the training steps (batch 32) and a third as many evaluation forwards (batch 256), "
               f"median of {args.repeats} fresh processes "
               f"per mode, the modes taking turns, 1 torch thread; CPU: {kernels.machine_isa()}; own kernels: "
               f"{own_kernels()}.")
    print(caption)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text("\n".join(lines) + "\n\n" + caption + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
