"""One command for what a GPU changes: the default sweep, packed trials, clients trained together, determinism.

    .venv/bin/python -m benchmarks.gpu_check --out docs/results/performance/gpu.md    # on a GPU machine
    .venv/bin/python -m benchmarks.gpu_check --device cpu --packs 1 2 --models lenet --rounds 1 --skip-sweep

Four tables, written as Markdown with a provenance line (device, CPU, torch and CUDA versions,
date, the command):

1. the default sweep (`python sweeps/fedselect_grid.py`, results in a temporary folder) run twice
   as a subprocess, with `--gpus-per-trial auto` (trials packed on the GPU) and with
   `--gpus-per-trial 0` (the machine's CPUs only): its wall time and the sweep's own line on what
   each trial got (`--sweep-flags` adds flags to both, e.g. for a smaller grid; `--skip-sweep`
   leaves the section's rows out);
2. N trials at once on one device for N in `--packs` (benchmarks/gpu_packing.py), per model, with
   the GPU time-sliced between them and with NVIDIA's MPS (a daemon of this command's own,
   sweeps/gpu_sharing.py; rows say why MPS is not available where it cannot run);
3. one epoch of `--clients` clients one after the other against trained together
   (benchmarks/vectorized_round.py), per model; a model the batched pass refuses has its loop only;
4. two runs of the same small FedAvg configuration per model, which must give the same accuracy
   in every round and the same final state (a SHA-256 of its tensors).

Everything runs in the reproducible mode, the sweeps' default (fl_core/kernels.py): the pinned CPU
kernels and, on a GPU, deterministic algorithms without TF32. Sections run cheapest first
(determinism, one round, the sweep, packing); once `--budget-s` seconds have passed no further
row starts, and the rows left out say so and are listed at the end. On a CPU (`--device cpu`) the
same code paths run, and the numbers say nothing about a GPU.
"""
from __future__ import annotations

import argparse
import contextlib
import datetime
import hashlib
import os
import queue
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

from fl_core import kernels

if __name__ == "__main__":
    kernels.pin()  # before torch loads: the reproducible mode, which the spawned trials and the sweeps inherit

import torch  # noqa: E402

from benchmarks import gpu_packing, vectorized_round  # noqa: E402
from benchmarks.fixtures import random_federated  # noqa: E402
from fl_core.config import RunConfig  # noqa: E402
from fl_core.simulation import Simulation  # noqa: E402
from sweeps.errors import SweepError  # noqa: E402
from sweeps.gpu_sharing import CONTROL, PIPE_ENV, MpsDaemon, decide, running_daemon  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
# model -> (dataset it stands for, input shape of its random federated data, case of vectorized_round)
MODELS = {"lenet": ("digits", (1, 8, 8), "lenet-8x8"), "cnn2": ("cifar10", (3, 32, 32), "cnn2-32x32x3"),
          "resnet18": ("cifar10", (3, 32, 32), "resnet18-32x32x3")}
SWEEP = "sweeps/fedselect_grid.py"
SWEEP_RUNS = (("auto", "the GPU where there is one, trials packed"), ("0", "the machine's CPUs only"))
SHARINGS = ("time-slice", "MPS")
DETERMINISM_ROUNDS = 2
SKIPPED = "skipped: the time budget was spent"


class Budget:
    """Seconds from the start; `allows(what)` is False once they are spent, and notes `what`."""

    def __init__(self, seconds: float) -> None:
        self.seconds, self.start, self.skipped = seconds, time.monotonic(), []

    def used(self) -> float:
        return time.monotonic() - self.start

    def left(self) -> float:
        return self.seconds - self.used()

    def allows(self, what: str) -> bool:
        if self.left() > 0:
            return True
        self.skipped.append(what)
        return False


def md_table(cols: tuple[str, ...], rows: list[tuple]) -> list[str]:
    return ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)] + ["| " + " | ".join(map(str, r)) + " |"
                                                                        for r in rows]


# ------------------------------------------------------------------------------------------ 4. determinism
def state_hash(state: dict[str, torch.Tensor]) -> str:
    """SHA-256 (first 16 hex digits) of a state's names, dtypes, shapes and bytes."""
    digest = hashlib.sha256()
    for name in sorted(state):
        t = state[name].detach().cpu()
        digest.update(f"{name}:{t.dtype}:{tuple(t.shape)}".encode())
        digest.update(t.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return digest.hexdigest()[:16]


def one_run(model: str, args: argparse.Namespace) -> tuple[list[float], str]:
    """Per-round mean accuracies and the final state's hash of a small FedAvg run."""
    dataset, shape, _ = MODELS[model]
    config = RunConfig(algorithm="fedavg", dataset=dataset, model=model, num_clients=args.clients,
                       samples_per_client=args.samples, test_samples_per_client=args.samples, local_epochs=1,
                       rounds=DETERMINISM_ROUNDS, eval_every=1, seed=0, threads=1, device=args.device)
    sim = Simulation(config, data=random_federated(args.clients, shape, args.samples, args.samples, seed=0))
    accs = [r.mean("acc") for r in sim.run()]
    return accs, state_hash(sim.final_model())


def determinism(args: argparse.Namespace, budget: Budget) -> list[tuple]:
    rows = []
    for model in args.models:
        if not budget.allows(f"determinism, {model}"):
            rows.append((model, DETERMINISM_ROUNDS, SKIPPED, "", "", ""))
            continue
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            (acc1, hash1), (acc2, hash2) = one_run(model, args), one_run(model, args)
        warned = sorted({str(w.message).split("\n")[0][:80] for w in caught if "determinis" in str(w.message)})
        same = "identical" if acc1 == acc2 and hash1 == hash2 else (
            f"DIFFERENT: accuracies {', '.join(f'{a:.4f}' for a in acc2)}, state {hash2}")
        mode = kernels.describe() if args.device == "cpu" else kernels.settle_cuda(torch.device(args.device))
        rows.append((model, DETERMINISM_ROUNDS, ", ".join(f"{a:.4f}" for a in acc1), hash1, same,
                     mode + (f"; warned: {'; '.join(warned)}" if warned else "")))
    return rows


# ------------------------------------------------------------------------------- 3. loop against together
def one_round(args: argparse.Namespace, budget: Budget) -> list[tuple]:
    rows = []
    settings = argparse.Namespace(clients=args.clients, samples=args.samples, repeats=args.rounds,
                                  device=args.device)
    for model in args.models:
        case = MODELS[model][2]
        if not budget.allows(f"one round, {model}"):
            rows.append((model, case, args.clients, SKIPPED, "", "", ""))
            continue
        r = vectorized_round.measure(case, 1, settings)
        if r["refused"] is not None:
            why = r["refused"].split(" (")[0].split(" has ")[-1].split(" holds ")[-1]
            rows.append((model, case, args.clients, f"{r['loop']:.3f}", f"loop only: {why}", "", ""))
            continue
        rows.append((model, case, args.clients, f"{r['loop']:.3f}", f"{r['together']:.3f}",
                     f"{r['loop'] / r['together']:.2f}", f"{r['diff']:.0e}"))
    return rows


# ---------------------------------------------------------------------------------- 1. the default sweep
def sweep_detail(output: str) -> str:
    """The sweep's own lines on what each trial got and how a GPU was shared."""
    said = [line.removeprefix("[sweep] ") for line in output.splitlines()
            if line.startswith(("[sweep] each trial:", "[sweep] GPU sharing:"))]
    return "; ".join(said).replace("|", "/") or "(the sweep printed no resources line)"


def one_sweep(gpus: str, args: argparse.Namespace, budget: Budget) -> tuple[str, str, str]:
    """(wall seconds, outcome, the sweep's resources line) of the default sweep in a temporary folder."""
    with tempfile.TemporaryDirectory(prefix="gpu-check-sweep-") as tmp:
        cmd = [sys.executable, SWEEP, "--gpus-per-trial", gpus, "--results", tmp, "--name", f"gpu-check-{gpus}",
               *shlex.split(args.sweep_flags)]
        start = time.monotonic()
        try:
            done = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=max(1.0, budget.left()))
        except subprocess.TimeoutExpired as err:
            out = (err.stdout or b"").decode(errors="replace") if isinstance(err.stdout, bytes) else err.stdout or ""
            return f"> {time.monotonic() - start:.0f}", "stopped: the time budget was spent", sweep_detail(out)
        seconds = f"{time.monotonic() - start:.1f}"
        outcome = "completed" if done.returncode == 0 else (
            f"exit status {done.returncode}: {(done.stderr.strip().splitlines() or [''])[-1][:120]}")
        return seconds, outcome.replace("|", "/"), sweep_detail(done.stdout)


def sweep(args: argparse.Namespace, budget: Budget) -> list[tuple]:
    rows = []
    for gpus, what in SWEEP_RUNS:
        if args.skip_sweep:
            rows.append((gpus, what, "", "skipped: --skip-sweep", ""))
        elif not budget.allows(f"the default sweep, --gpus-per-trial {gpus}"):
            rows.append((gpus, what, "", SKIPPED, ""))
        else:
            seconds, outcome, detail = one_sweep(gpus, args, budget)
            rows.append((gpus, what, seconds, outcome, detail))
    return rows


# ------------------------------------------------------------------------------------------- 2. packing
def mps_unavailable(args: argparse.Namespace) -> str | None:
    """Why the MPS rows cannot run here (None: they can, with a daemon of our own or one running)."""
    if args.device != "cuda":
        return f"--device {args.device}"
    sharing = decide("auto", 0.5, has_gpus=True, own_ray=True, control=shutil.which(CONTROL),
                     running=running_daemon())
    return None if sharing.mode == "mps" else sharing.reason


@contextlib.contextmanager
def sharing_mode(mode: str, args: argparse.Namespace):
    """The environment the packed trials start in: MPS through this command's daemon (or the one
    already running), or time-slicing (a client pointed at an empty pipe folder finds no daemon)."""
    running = running_daemon() if args.device == "cuda" else None
    if mode == "MPS":
        with MpsDaemon("gpu-check") if running is None else contextlib.nullcontext():
            yield
    elif running is None:
        yield
    else:
        saved = os.environ.get(PIPE_ENV)
        with tempfile.TemporaryDirectory(prefix="gpu-check-nomps-") as empty:
            os.environ[PIPE_ENV] = empty
            try:
                yield
            finally:
                if saved is None:  # the running daemon is at the default pipe folder
                    os.environ.pop(PIPE_ENV, None)
                else:
                    os.environ[PIPE_ENV] = saved


def pack_rows(model: str, mode: str, args: argparse.Namespace, budget: Budget) -> list[tuple]:
    dataset, shape, _ = MODELS[model]
    settings = argparse.Namespace(model=model, dataset=dataset, shape=shape, clients=args.clients,
                                  samples=args.samples, rounds=args.rounds, device=args.device)
    rows, alone = [], None
    for n in args.packs:
        head = (model, mode, n)
        if not budget.allows(f"packing, {model}, {mode}, {n} trial(s)"):
            rows.append(head + (SKIPPED, "", "", ""))
            continue
        settings.timeout = max(60.0, budget.left() + 60)
        try:
            r = gpu_packing.row(settings, n, alone)
        except (Exception, SystemExit) as err:  # a pack that fails (out of memory, a trial's error) is a row
            reason = str(err) or type(err).__name__ + (" (no trial reported in time)" if isinstance(err, queue.Empty)
                                                       else "")
            rows.append(head + (f"failed: {reason}".replace("|", "/")[:160], "", "", ""))
            continue
        alone = r["round_mean"] if n == 1 else alone
        rows.append(head + (f"{r['round_mean']:.3f}", f"{r['round_max']:.3f}", f"{r['throughput']:.2f}",
                            f"{r['slowdown']:.2f}" if alone is not None else "n/a (no 1-trial row)"))
    return rows


def packing(args: argparse.Namespace, budget: Budget) -> list[tuple]:
    rows, why_not = [], mps_unavailable(args)
    for model in args.models:
        for mode in SHARINGS:
            if mode == "MPS" and why_not is not None:
                rows += [(model, mode, n, f"MPS not available: {why_not}", "", "", "") for n in args.packs]
                continue
            try:
                with sharing_mode(mode, args):
                    rows += pack_rows(model, mode, args, budget)
            except SweepError as err:  # our daemon did not start: the rows say why
                first = str(err).splitlines()[0].replace("|", "/")
                rows += [(model, mode, n, f"MPS not available: {first}", "", "", "") for n in args.packs]
    return rows


# ------------------------------------------------------------------------------------------- the report
def provenance(args: argparse.Namespace, argv: list[str], budget: Budget) -> str:
    cpu = f"{vectorized_round.cpu_name()}, {os.cpu_count()} logical CPUs"
    device = (f"GPU: {torch.cuda.get_device_name()}; CPU: {cpu}" if args.device == "cuda" else f"CPU only: {cpu}")
    return (f"{device}; torch {torch.__version__}, CUDA {torch.version.cuda or 'none'}; kernels: {kernels.describe()}"
            f"; {datetime.date.today().isoformat()}; {budget.used():.0f} s of a {args.budget_s:g} s budget; "
            f"command: `{shlex.join(['python', '-m', 'benchmarks.gpu_check', *argv])}`")


def report(args: argparse.Namespace, argv: list[str], sections: dict[str, list[tuple]], budget: Budget) -> str:
    sizes = f"{args.clients} clients x {args.samples} samples"
    parts = [
        "**GPU check** (`benchmarks/gpu_check.py`)", "", provenance(args, argv, budget), "",
        f"**1. The default sweep** (`{shlex.join(['python', SWEEP, *shlex.split(args.sweep_flags)])}`, wall time "
        "of the whole command)", "",
        *md_table(("--gpus-per-trial", "runs on", "wall time (s)", "outcome", "the sweep's line"),
                  sections["sweep"]), "",
        f"**2. Trials packed on one {args.device} device** (FedAvg, {sizes}, 1 epoch, batch 32, scored every "
        f"round; median of {args.rounds} round(s) per trial after a warm-up, one torch thread each)", "",
        *md_table(("model", "sharing", "trials", "round (s), mean", "round (s), slowest", "throughput (rounds/s)",
                   "slowdown vs alone"), sections["packing"]), "",
        f"**3. One round: the loop against clients trained together** (one epoch, {args.clients} clients of 0.5x to "
        f"1.5x {args.samples} samples, batch 32, momentum 0.9; median of {args.rounds} turn(s) per side)", "",
        *md_table(("model", "case", "clients", "loop (s)", "together (s)", "loop / together", "largest diff."),
                  sections["round"]), "",
        f"**4. Determinism** (FedAvg, {sizes}, {DETERMINISM_ROUNDS} rounds, run twice in this process)", "",
        *md_table(("model", "rounds", "accuracy per round (run 1)", "final state SHA-256", "run 2", "mode"),
                  sections["determinism"]),
    ]
    if budget.skipped:
        parts += ["", f"Skipped for the time budget ({len(budget.skipped)} row(s)): {'; '.join(budget.skipped)}."]
    return "\n".join(parts) + "\n"


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.gpu_check", description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--out", type=Path, default=None, help="also write the Markdown to this file")
    parser.add_argument("--packs", type=int, nargs="+", default=[1, 2, 4, 8, 16], help="trials per device")
    parser.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS), metavar="MODEL",
                        help=f"among: {', '.join(MODELS)}")
    parser.add_argument("--rounds", type=int, default=3, help="timed rounds per packed trial; turns per side")
    parser.add_argument("--clients", type=int, default=10)
    parser.add_argument("--samples", type=int, default=100, help="training (and test) samples per client")
    parser.add_argument("--budget-s", type=float, default=480, help="no row starts after this many seconds")
    parser.add_argument("--skip-sweep", action="store_true", help="leave the default sweep's rows out")
    parser.add_argument("--sweep-flags", default="", help='flags added to both sweeps, e.g. "--rounds 1 --seeds 0"')
    args = parser.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: torch sees no CUDA device here; --device cpu runs the same paths on the CPU")
    if sorted(set(args.packs)) != args.packs or args.packs[0] != 1:
        parser.error(f"--packs {' '.join(map(str, args.packs))}: ascending, starting at 1 (the slowdown's base)")
    for flag, value, low in (("--rounds", args.rounds, 1), ("--clients", args.clients, 2),
                             ("--samples", args.samples, 2), ("--budget-s", args.budget_s, 0)):
        if value < low:
            parser.error(f"{flag} {value:g}: give at least {low}")
    return args


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = parse(argv)
    budget = Budget(args.budget_s)
    if args.device == "cuda":
        kernels.settle_cuda(torch.device("cuda"))
    sections = {}
    for name, section in (("determinism", determinism), ("round", one_round), ("sweep", sweep),
                          ("packing", packing)):
        sections[name] = section(args, budget)
        print(f"[gpu_check] {name}: done at {budget.used():.0f} s", file=sys.stderr, flush=True)
    text = report(args, argv, sections, budget)
    print(text, end="")
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
