"""What this CPU offers beyond float32 in torch's default memory format, for training and scoring.

Issue 43 asks to try channels-last memory format, bfloat16 autocast and `torch.compile`, keep what
measurably wins and report what does not. Each variant runs the same plain loop as the default on
its own copy of one model and the same data: training is SGD steps over 96 images in batches of
32 (a client's local epoch in the FedSelect benchmarks), scoring is the argmax over 512 images in
one batch under `torch.no_grad()` in eval mode. Variants and default take turns every repeat, and
the ratio default / variant of their median times is printed (above 1: the variant is faster).

- channels-last: the model's weights and the inputs in NHWC (`torch.channels_last`);
- bf16: the pass under `torch.autocast(cpu, bfloat16)`, weights kept in float32 (the engine's
  `--precision bf16`); emulated, so slow, on a CPU without bfloat16 arithmetic;
- compiled: `torch.compile(model)` (Inductor, default mode), timed after its first call; that call's
  extra seconds are the compile cost, paid cold (Inductor's on-disk cache pointed at an empty
  folder: a machine's first trial; later processes there compile faster from the cache), and the
  table says after how many passes it is paid back (`never` where the compiled pass is slower).

The last column says what the engine does with each. Every variant but the default changes the
rounding, so a kept variant would move every committed table: the reproducible mode stays on
the default unless a variant wins everywhere it is kept.

    .venv/bin/python -m benchmarks.formats                       # lenet, cnn2, resnet18, ~5 minutes
    .venv/bin/python -m benchmarks.formats --models cnn2 --repeats 3 --out report.md
"""
from __future__ import annotations

import argparse
import copy
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch
from torch import nn
from torch.nn import functional as F

from benchmarks.fixtures import machine_caption, write_report
from fl_core.models import build_model, resolve_model_name
from fl_core.training import precision_scope

SHAPES = {"lenet": (1, 28, 28), "cnn2": (3, 32, 32), "resnet18": (3, 32, 32)}
VARIANTS = ("channels-last", "bf16", "compiled")
ENGINE = {("channels-last", "scoring"): "kept: the trainer's scoring copy (`LocalTrainer.scoring_model`)",
          ("channels-last", "training"): "not used",
          ("bf16", "training"): "opt-in, `--precision bf16`", ("bf16", "scoring"): "opt-in, `--precision bf16`",
          ("compiled", "training"): "not used", ("compiled", "scoring"): "not used"}


class Side:
    """One model copy in one format, with its optimizer and its way of running a pass."""

    def __init__(self, model: nn.Module, variant: str) -> None:
        self.variant = variant
        self.model = model.to(memory_format=torch.channels_last) if variant == "channels-last" else model
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=0.01)
        self.run = torch.compile(self.model) if variant == "compiled" else self.model

    def inputs(self, x: torch.Tensor) -> torch.Tensor:
        return x.contiguous(memory_format=torch.channels_last) if self.variant == "channels-last" else x

    def scope(self):
        """The engine's own scope for the `precision` knob (bf16 autocast on the bf16 side)."""
        return precision_scope("bf16" if self.variant == "bf16" else "fp32", "cpu")

    def train(self, x: torch.Tensor, y: torch.Tensor) -> None:
        self.model.train()
        for start in range(0, x.shape[0], 32):
            self.optimizer.zero_grad(set_to_none=True)
            with self.scope():
                loss = F.cross_entropy(self.run(self.inputs(x[start:start + 32])), y[start:start + 32])
            loss.backward()
            self.optimizer.step()

    @torch.no_grad()
    def score(self, x: torch.Tensor, y: torch.Tensor) -> None:
        self.model.eval()
        with self.scope():
            self.run(self.inputs(x)).argmax(1)


def seconds(fn: Callable[[], None]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def measure(name: str, repeats: int) -> list[dict]:
    """Per variant and pass: median seconds of the default and of the variant, and the compile cost."""
    shape = SHAPES[name]
    torch.manual_seed(0)
    model = build_model(resolve_model_name(name, shape), shape, 10)
    sides = {v: Side(copy.deepcopy(model), v) for v in ("default", *VARIANTS)}
    data = {"training": (torch.randn(96, *shape), torch.randint(0, 10, (96,))),
            "scoring": (torch.randn(512, *shape), torch.randint(0, 10, (512,)))}
    rows = []
    for work, (x, y) in data.items():
        passes = {v: (lambda s=side: s.train(x, y)) if work == "training" else (lambda s=side: s.score(x, y))
                  for v, side in sides.items()}
        first = {v: seconds(run) for v, run in passes.items()}  # compiles the compiled side (train, then eval)
        times = {v: [] for v in passes}
        for _ in range(repeats):
            for v, run in passes.items():
                times[v].append(seconds(run))
        median = {v: statistics.median(t) for v, t in times.items()}
        for v in VARIANTS:
            rows.append({"model": name, "work": work, "variant": v, "default": median["default"],
                         "variant_s": median[v], "compile": first[v] - median[v] if v == "compiled" else 0.0})
        print(f"  {name} {work}: " + ", ".join(f"{v} {median[v]:.3f} s" for v in median), flush=True)
    return rows


def payback(row: dict) -> str:
    """Passes after which compiling has paid for itself (`never` if the compiled pass is slower)."""
    if row["variant"] != "compiled":
        return ""
    gain = row["default"] - row["variant_s"]
    return f"{row['compile']:.0f} s; " + (f"{row['compile'] / gain:.0f} passes" if gain > 0 else "never")


def table(rows: list[dict]) -> list[str]:
    lines = ["| model | pass | variant | default (s) | variant (s) | default / variant "
             "| compile cost; paid back after | in the engine |", "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['model']} | {r['work']} | {r['variant']} | {r['default']:.3f} | {r['variant_s']:.3f} | "
                     f"{r['default'] / r['variant_s']:.2f} | {payback(r)} | {ENGINE[r['variant'], r['work']]} |")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", choices=sorted(SHAPES), default=["lenet", "cnn2", "resnet18"])
    parser.add_argument("--repeats", type=int, default=5, help="timed passes per side (median reported)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", type=Path, default=None, help="also write the table (Markdown) here")
    args = parser.parse_args(argv)
    if args.repeats < 1:
        parser.error(f"--repeats {args.repeats}: at least 1")
    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as cache:  # cold compiles: nothing from an earlier run
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = cache
        rows = [row for name in args.models for row in measure(name, args.repeats)]
    lines = table(rows)
    print("\n".join(lines))
    write_report(args.out, lines, f"Medians of {args.repeats} passes per side, taking turns; training 96 images in "
                 f"batches of 32 (SGD), scoring 512 images in one batch; compiles cold; {machine_caption()}.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
