"""Seconds to corrupt 60 000 MNIST-sized (28 x 28, uint8) images with each CIFAR-10-C corruption.

Uses the real MNIST training images when ../shared/data/MNIST/raw holds the IDX files (read
directly as uint8), otherwise random uint8 images of that shape. For the slowest few
corruptions it also times a per-image loop (corrupt() called on one image at a time) on a small
sample and reports the extrapolated ratio loop / batched.

    .venv/bin/python -m benchmarks.corruptions                  # severity 3, all 19
    .venv/bin/python -m benchmarks.corruptions --severity 5 --n 10000 --only fog snow
"""
from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np

from fl_core.data.corruptions import CORRUPTIONS, corrupt

REPO = Path(__file__).resolve().parents[1]

MNIST_IMAGES = REPO.parent / "shared" / "data" / "MNIST" / "raw" / "train-images-idx3-ubyte"


def load_images(n: int) -> tuple[np.ndarray, str]:
    if MNIST_IMAGES.exists():
        raw = np.frombuffer(MNIST_IMAGES.read_bytes(), np.uint8, offset=16)
        images = raw.reshape(-1, 28, 28)
        return np.resize(images, (n, 28, 28)), "real MNIST train images"
    rng = np.random.default_rng(0)
    return rng.integers(0, 256, (n, 28, 28), dtype=np.uint8), "random uint8 images"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=60_000)
    ap.add_argument("--severity", type=int, default=3)
    ap.add_argument("--only", nargs="*", default=list(CORRUPTIONS))
    ap.add_argument("--loop-sample", type=int, default=300,
                    help="images timed one by one for the slowest corruptions")
    ap.add_argument("--loop-top", type=int, default=4)
    args = ap.parse_args()
    images, what = load_images(args.n)
    print(f"{args.n} x 28 x 28 uint8 ({what}), severity {args.severity}")
    print(f"{'corruption':20s} {'seconds':>8s} {'us/image':>9s}")
    times = {}
    for name in args.only:
        start = time.perf_counter()
        corrupt(images, name, args.severity, seed=0)
        times[name] = time.perf_counter() - start
        print(f"{name:20s} {times[name]:8.2f} {1e6 * times[name] / args.n:9.1f}", flush=True)
    print(f"{'total':20s} {sum(times.values()):8.2f}")
    slowest = sorted(times, key=times.get, reverse=True)[:args.loop_top]
    if args.loop_sample <= 0 or not slowest:
        return
    print(f"\nper-image loop ({args.loop_sample} images, extrapolated to {args.n}):")
    print(f"{'corruption':20s} {'loop s':>8s} {'batch s':>8s} {'ratio':>6s}")
    sample = images[:args.loop_sample]
    for name in slowest:
        start = time.perf_counter()
        for i in range(len(sample)):
            corrupt(sample[i:i + 1], name, args.severity, seed=i)
        loop = (time.perf_counter() - start) * args.n / len(sample)
        print(f"{name:20s} {loop:8.1f} {times[name]:8.2f} {loop / times[name]:6.1f}")


if __name__ == "__main__":
    main()
