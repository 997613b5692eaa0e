"""``mnist_c``, ``fmnist_c`` and ``digits_c``: the project's offline feature-shift benchmark.

The real MNIST (Fashion-MNIST, or scikit-learn digits) images under K chosen corruptions of
:mod:`fl_core.data.corruptions`, at one severity, one **domain per corruption** (``clean`` names
the uncorrupted images as a domain of its own). Each underlying image belongs to exactly one
domain: every class's train images (and, separately, its test images) are shuffled with the fixed
seed :data:`CORRUPTION_SEED` and dealt round-robin to the K domains, so the domains hold disjoint
images with the same class balance, each about 1/K of the source (MNIST with 4 domains: 15 000
train and 2 500 test images per domain). Nothing is duplicated, so a run's memory stays that of
the clean source, and no test image is a corrupted copy of a train image.

Each domain's images are corrupted with a seed derived from (:data:`CORRUPTION_SEED`, corruption
name, split), never from the run seed: every run, seed and partition sees the same images. The
result is normalised with its own pooled train mean and std (one channel).

Cost: corrupting all 70 000 MNIST images takes a few seconds (benchmarks/corruptions.py); the
last few loads are kept in memory (:func:`load_corrupted` is cached), so a sweep's driver, which
loads one copy per data setting and seed, corrupts once per (source, corruptions, severity).
"""
from __future__ import annotations

import functools
import zlib
from pathlib import Path

import numpy as np
import torch

from .corruptions import CORRUPTIONS, corrupt
from .sources import Dataset, DataError, label_tensor

CLEAN = "clean"
CORRUPTED_SOURCES = ("mnist_c", "fmnist_c", "digits_c")
_BASE = {"mnist_c": "mnist", "fmnist_c": "fmnist", "digits_c": "digits"}
# Four corruptions of different families (noise, blur, weather, digital) that leave MNIST digits
# recognisable at severity 3 but change their pixel statistics differently.
DEFAULT_CORRUPTIONS = ("gaussian_noise", "motion_blur", "fog", "contrast")
DEFAULT_SEVERITY = 3
CORRUPTION_SEED = 0  # fixed: the benchmark's images never depend on the run seed


def check_corruptions(names: tuple[str, ...], source: str) -> None:
    allowed = (CLEAN, *CORRUPTIONS)
    bad = [n for n in names if n not in allowed]
    if bad or not names or len(set(names)) != len(names):
        raise DataError(f"{source}: corruptions must be distinct names from {', '.join(allowed)}; got "
                        f"{', '.join(names) or 'none'}" + (f" ({bad[0]!r} is unknown)" if bad else ""))


def deal_to_domains(labels: np.ndarray, k: int, seed: int) -> np.ndarray:
    """Each sample's domain in 0..k-1: per class, a seeded shuffle dealt round-robin."""
    rng = np.random.default_rng([seed, k])
    domain = np.empty(len(labels), dtype=np.int64)
    for c in np.unique(labels):
        idx = rng.permutation(np.flatnonzero(labels == c))
        domain[idx] = np.arange(len(idx)) % k
    return domain


def _name_seed(name: str, split: str) -> list[int]:
    return [CORRUPTION_SEED, zlib.crc32(name.encode()), zlib.crc32(split.encode())]


def _corrupt_split(images: np.ndarray, labels: np.ndarray, names: tuple[str, ...], severity: int,
                   split: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(corrupted uint8 images, labels, domain index) of one split, grouped by domain."""
    domain = deal_to_domains(labels, len(names), CORRUPTION_SEED)
    xs, ys, ds = [], [], []
    for d, name in enumerate(names):
        idx = np.flatnonzero(domain == d)
        part = images[idx]
        xs.append(part if name == CLEAN else corrupt(part, name, severity, seed=_name_seed(name, split)))
        ys.append(labels[idx])
        ds.append(np.full(len(idx), d, dtype=np.int64))
    return np.concatenate(xs), np.concatenate(ys), np.concatenate(ds)


@functools.lru_cache(maxsize=4)
def load_corrupted(source: str, names: tuple[str, ...], severity: int, data_root: str | None = None,
                   download: bool = False) -> Dataset:
    """``mnist_c``, ``fmnist_c`` or ``digits_c`` with one domain per name in ``names`` (see the module
    docstring)."""
    from .sources import digits_uint8, idx_uint8

    if source not in CORRUPTED_SOURCES:
        raise DataError(f"unknown corrupted source {source!r}; allowed: {', '.join(CORRUPTED_SOURCES)}")
    check_corruptions(names, source)
    if isinstance(severity, bool) or not isinstance(severity, (int, np.integer)) or not 1 <= severity <= 5:
        raise DataError(f"{source}: severity must be an integer in 1..5, got {severity!r}")
    if source != "digits_c":
        x_tr, y_tr, x_te, y_te = idx_uint8(_BASE[source], Path(data_root) if data_root else None, download)
    else:
        x_tr, y_tr, x_te, y_te = digits_uint8()
    x_tr, y_tr, d_tr = _corrupt_split(x_tr, y_tr, names, severity, "train")
    x_te, y_te, d_te = _corrupt_split(x_te, y_te, names, severity, "test")
    mean, std = float(x_tr.mean()) / 255.0, float(x_tr.std()) / 255.0

    def to_tensor(x: np.ndarray) -> torch.Tensor:
        t = torch.from_numpy(np.ascontiguousarray(x)).to(torch.float32).div_(255.0)
        return t.sub_(mean).div_(std).unsqueeze(1)

    return Dataset(source, to_tensor(x_tr), label_tensor(y_tr), to_tensor(x_te), label_tensor(y_te), 10,
                   domains=names, d_train=label_tensor(d_tr), d_test=label_tensor(d_te))
