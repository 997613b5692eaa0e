"""Our scoring against the plain batched-inference loop in the default memory format.

Scoring (the test accuracy of a client's model) is the larger part of a small model's round. The
floor it is measured against is what a research script writes: the model in eval mode under
`torch.no_grad()`, `model(x[i:i + B]).argmax(1)` over the client's test images in batches of B
(1024), tensors in torch's default (contiguous) format. Ours is `LocalTrainer.evaluate` on a
client state, as the engine calls it every evaluated round. Both take turns on the same clients
and states in one process; the ratio floor / ours above 1 means ours scores below today's floor
(issue 43's target: at least 1, and as far above as the CPU allows). Ours scores a channels-last
copy of the model, whose logits may differ in the last bits: the table counts the test images whose
predicted class then differs from the plain loop's.

    .venv/bin/python -m benchmarks.scoring --data-root ../shared/data        # lenet and cnn2, Fashion-MNIST
    .venv/bin/python -m benchmarks.scoring --data-root ../shared/data --models lenet --repeats 9
"""
from __future__ import annotations

import argparse
import copy
import statistics
import sys
import time
from pathlib import Path

import torch

from benchmarks.fixtures import machine_caption, write_report
from fl_core.config import RunConfig
from fl_core.simulation import Simulation


def plain_loop(model: torch.nn.Module, state, clients, batch: int = 1024) -> int:
    """The floor: load the state, eval mode, no_grad, batched argmax in the default format."""
    model.load_state_dict(state)
    model.eval()
    correct = 0
    with torch.no_grad():
        for d in clients:
            for i in range(0, d.n_test, batch):
                correct += int((model(d.x_test[i:i + batch]).argmax(1) == d.y_test[i:i + batch]).sum())
    return correct


def measure(model_name: str, args: argparse.Namespace) -> dict[str, float]:
    sim = Simulation(RunConfig(algorithm="fedavg", dataset="fmnist", model=model_name, num_clients=10,
                               samples_per_client=200, partition="dirichlet", dir_alpha=0.3, rounds=1, threads=1,
                               data_root=args.data_root))
    sim.run_round()  # a trained global state, not the initial one
    state, clients = sim.algorithm.global_state, sim.data.clients
    floor_model = copy.deepcopy(sim.trainer.model)
    times = {"ours": [], "floor": []}
    images = sum(d.n_test for d in clients)
    for _ in range(args.repeats):
        start = time.perf_counter()
        ours = sum(sim.trainer.evaluate(state, d.x_test, d.y_test) for d in clients)
        times["ours"].append(time.perf_counter() - start)
        start = time.perf_counter()
        floor = plain_loop(floor_model, state, clients)
        times["floor"].append(time.perf_counter() - start)
    median = {k: statistics.median(v) for k, v in times.items()}
    return {"ours_us": 1e6 * median["ours"] / images, "floor_us": 1e6 * median["floor"] / images,
            "ratio": median["floor"] / median["ours"], "images": images, "correct": f"{ours} / {floor}",
            "flips": flipped(sim.trainer, floor_model, state, clients)}


def flipped(trainer, floor_model: torch.nn.Module, state, clients) -> int:
    """Test images whose predicted class differs between ours and the plain loop: the memory format
    changes the logits' last bits, and this counts what that changes."""
    floor_model.load_state_dict(state)
    floor_model.eval()
    with torch.no_grad():
        return sum(int((trainer.predictions(state, d.x_test) != floor_model(d.x_test).argmax(1)).sum())
                   for d in clients)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.scoring", description=__doc__.splitlines()[0])
    parser.add_argument("--data-root", required=True, help="folder with torchvision's FashionMNIST/raw")
    parser.add_argument("--models", nargs="+", default=["lenet", "cnn2"])
    parser.add_argument("--repeats", type=int, default=7, help="turns of each side (median)")
    parser.add_argument("--out", type=Path, default=None, help="also write the table (Markdown) to this file")
    args = parser.parse_args(argv)
    if args.repeats < 1:
        parser.error(f"--repeats {args.repeats}: give at least 1")
    torch.set_num_threads(1)
    lines = ["| model | test images | plain loop (µs / image) | ours (µs / image) | plain / ours (target >= 1) | "
             "correct, ours / plain | predictions flipped |", "|---|---|---|---|---|---|---|"]
    print("\n".join(lines), flush=True)
    for name in args.models:
        r = measure(name, args)
        lines.append(f"| {name} | {r['images']} | {r['floor_us']:.1f} | {r['ours_us']:.1f} | {r['ratio']:.2f} | "
                     f"{r['correct']} | {r['flips']} |")
        print(lines[-1], flush=True)
    caption = (f"Scoring every client's test images once per turn, median of {args.repeats} turns per side, the "
               f"sides taking turns; {machine_caption()}.")
    print(caption)
    write_report(args.out, lines, caption)
    return 0


if __name__ == "__main__":
    sys.exit(main())
