"""How close is one FedSelect round to the pure-compute limit?

In one process: one FedSelect round (10 clients x 100 training samples, the default CNN, one local
epoch = a personal and a global pass, evaluation before and after the broadcast), against a
tight loop on one model doing the same forward/backward sample-steps (same batches, plain SGD)
and the same evaluation forwards. The difference is the engine's overhead: state loading and
reading, masked updates, GradSelect, masked averaging, broadcast. Target: ratio <= 1.15.

    .venv/bin/python benchmarks/round_overhead.py            # MNIST from ../shared/data if present
    .venv/bin/python benchmarks/round_overhead.py --dataset digits
"""
from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import torch
from torch.nn import functional as F

from fl_core.config import RunConfig
from fl_core.models import build_model
from fl_core.simulation import Simulation

SHARED = Path(__file__).resolve().parents[2] / "shared" / "data"


def pure_compute(sim: Simulation, passes: int, eval_passes: int) -> float:
    """The same sample-steps and evaluation forwards as one round, in one tight loop."""
    model = build_model(sim.model_name, sim.data.input_shape, sim.data.num_classes).to(sim.device)
    opt = torch.optim.SGD(model.parameters(), lr=sim.config.lr, foreach=True)
    bs = sim.config.batch_size
    start = time.perf_counter()
    for d in sim.data.clients:
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dataset", default="mnist" if (SHARED / "MNIST").exists() else "digits")
    parser.add_argument("--repeats", type=int, default=7, help="timed rounds (median reported)")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    config = RunConfig(algorithm="fedselect", dataset=args.dataset, num_clients=10, partition="shards",
                       shards_per_client=2, samples_per_client=100, test_samples_per_client=100,
                       local_epochs=1, rounds=args.repeats + 2, pers_rate=0.25, pers_limit=0.8,
                       data_root=str(SHARED) if args.dataset == "mnist" else None, threads=args.threads)
    sim = Simulation(config)
    sim.run_round()  # warm-up; after it a quarter of each tensor is personal, so both passes run
    sim.run_round()
    ours, limit = [], []
    for _ in range(args.repeats):
        ours.append(sim.run_round().seconds)
        # LocalAlt = personal pass + global pass per epoch; evaluation before and after broadcast.
        limit.append(pure_compute(sim, passes=2 * config.local_epochs, eval_passes=2))
    ours_s, limit_s = statistics.median(ours), statistics.median(limit)
    print(f"dataset {args.dataset}, model {sim.model_name}, 10 clients x 100 train / 100 test samples, "
          f"batch {config.batch_size}, {args.threads} thread(s), median of {args.repeats}")
    print(f"FedSelect round      : {ours_s * 1000:8.1f} ms")
    print(f"pure-compute limit   : {limit_s * 1000:8.1f} ms")
    print(f"ratio (target <=1.15): {ours_s / limit_s:8.3f}")


if __name__ == "__main__":
    main()
