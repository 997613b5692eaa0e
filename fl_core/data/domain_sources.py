"""File loaders for the papers' datasets that cannot be downloaded here: one function per on-disk
layout, each taking a root folder and an ``image_size`` and returning a
:class:`~fl_core.data.sources.Dataset` (float32 ``(N, C, size, size)`` images normalised per channel,
int64 labels; multi-domain sources also carry domain names and a domain index per sample).

* :func:`cifar10c`  Hendrycks & Dietterich's release (zenodo record 2535967, ``CIFAR-10-C.tar``):
  ``<root>/CIFAR-10-C/<corruption>.npy``, uint8 ``(50000, 32, 32, 3)`` = the 10 000 CIFAR-10 test
  images at severities 1..5 stacked (severity s = rows (s-1)*10000 .. s*10000), and ``labels.npy``
  (the 10 000 labels repeated five times; a 10 000-long file is accepted too). One domain per chosen
  corruption, at one severity. ``protocol="fedl2p"`` is FedL2P's split: each corruption's images
  80 % train / 20 % test, stratified by label with the fixed seed :data:`SPLIT_SEED`. The indices
  are drawn once and shared by every corruption, so no underlying CIFAR-10 image is in train under
  one corruption and in test under another. FedL2P's further 20 % validation hold-out of the train
  part is *not* made here: it is the engine's per-client ``val_fraction``. CIFAR-10 statistics.
* :func:`cifar100`  torchvision's layout ``<root>/cifar-100-python/{train,test}`` (python pickles,
  ``b"data"`` and ``b"fine_labels"``), read with the CIFAR-10 reader of ``sources``; CIFAR-100's
  own statistics; 100 fine classes.
* :func:`mini_imagenet`  the pickled cache of Ravi & Larochelle's split used by learn2learn and
  most few-shot code: ``mini-imagenet-cache-{train,val,test}.pkl`` in ``<root>/mini-imagenet/``
  (or directly in ``<root>``), each a dict with ``image_data`` (uint8 ``(n, 84, 84, 3)``) and
  ``class_dict`` (class id -> row indices). Those three files hold disjoint classes (64/16/20), made
  for meta-learning; for federated classification all chosen files are pooled (100 classes,
  labelled by sorted class id) and split per class 80/20 with :data:`SPLIT_SEED`. The csv + JPEG
  layout is not supported. ImageNet statistics.
* :func:`office_caltech10`, :func:`officehome`, :func:`domainnet`  domain/class image folders, see
  :mod:`fl_core.data.domain_folders` (ImageNet statistics).

Any missing folder or file, and any truncated or corrupt one, is a :class:`DataError` naming it.
:data:`DOMAIN_LOADERS` maps the names to the loaders; :mod:`fl_core.data.catalog` makes them ``--dataset``
values (with ``image_size``, and cifar10c's ``corruptions`` and ``severity``).
"""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import Sequence

import numpy as np

from .domain_folders import (IMAGENET_MEAN, IMAGENET_STD, SPLIT_SEED, TEST_FRACTION, domainnet,
                             office_caltech10, officehome, stratified_split, to_tensor)
from .sources import CIFAR_MEAN, CIFAR_STD, Dataset, DataError, label_tensor, read_cifar_batch

CIFAR100_MEAN, CIFAR100_STD = (0.5071, 0.4865, 0.4409), (0.2673, 0.2564, 0.2762)

# The 15 benchmark corruptions, then the 4 extra ones, as named in the release's files.
CIFAR10C_CORRUPTIONS = (
    "gaussian_noise", "shot_noise", "impulse_noise", "defocus_blur", "glass_blur", "motion_blur",
    "zoom_blur", "snow", "frost", "fog", "brightness", "contrast", "elastic_transform", "pixelate",
    "jpeg_compression", "speckle_noise", "gaussian_blur", "spatter", "saturate")
# FedL2P's ten corruptions (used at severity 3).
FEDL2P_CORRUPTIONS = ("brightness", "frost", "jpeg_compression", "contrast", "snow", "motion_blur",
                      "pixelate", "speckle_noise", "fog", "saturate")
CIFAR10C_PROTOCOLS = ("fedl2p",)
SEVERITIES = 5


# ---------------------------------------------------------------- CIFAR-10-C (.npy files)

def _read_npy(path: Path, layout: str, mmap: bool = False) -> np.ndarray:
    try:
        return np.load(path, mmap_mode="r" if mmap else None, allow_pickle=False)
    except FileNotFoundError:
        raise DataError(f"file not found: {path}; expected layout {layout}") from None
    except Exception as e:  # bad header, short payload, pickled object, ...
        raise DataError(f"{path}: truncated or corrupt .npy file ({type(e).__name__}: {e})") from None


def cifar10c(root, corruptions: Sequence[str] = FEDL2P_CORRUPTIONS, severity: int = 3,
             protocol: str = "fedl2p", image_size: int = 32) -> Dataset:
    """CIFAR-10-C, one domain per corruption at ``severity`` (see the module docstring)."""
    bad = [c for c in corruptions if c not in CIFAR10C_CORRUPTIONS]
    if bad or not corruptions or len(set(corruptions)) != len(corruptions):
        raise DataError(f"cifar10c: corruptions must be distinct names from "
                        f"{', '.join(CIFAR10C_CORRUPTIONS)}; got {list(corruptions)}")
    if not isinstance(severity, (int, np.integer)) or not 1 <= severity <= SEVERITIES:
        raise DataError(f"cifar10c: severity must be 1..{SEVERITIES}, got {severity!r}")
    if protocol not in CIFAR10C_PROTOCOLS:
        raise DataError(f"cifar10c: unknown protocol {protocol!r}; allowed: "
                        f"{', '.join(CIFAR10C_PROTOCOLS)}")
    folder = Path(root) / "CIFAR-10-C"
    layout = "<root>/CIFAR-10-C/<corruption>.npy (uint8, 5 severities stacked) and labels.npy"
    if not folder.is_dir():
        raise DataError(f"folder not found: {folder}; expected layout {layout}")
    labels_path = folder / "labels.npy"
    labels = _read_npy(labels_path, layout)
    if labels.ndim != 1 or labels.size == 0 or labels.min() < 0 or labels.max() > 9:
        raise DataError(f"{labels_path}: expected 1-d labels in 0..9, got shape {labels.shape}")
    images, per = [], None
    for name in corruptions:
        path = folder / f"{name}.npy"
        arr = _read_npy(path, layout, mmap=True)
        if arr.dtype != np.uint8 or arr.ndim != 4 or arr.shape[1:] != (32, 32, 3) \
                or arr.shape[0] % SEVERITIES or arr.shape[0] == 0:
            raise DataError(f"{path}: expected uint8 (5*n, 32, 32, 3), got {arr.dtype} {arr.shape}")
        n = arr.shape[0] // SEVERITIES
        if per is not None and n != per or len(labels) not in (n, SEVERITIES * n):
            raise DataError(f"{path}: {n} images per severity do not match {labels_path} "
                            f"({len(labels)} labels) or the other corruptions ({per})")
        per = n
        try:
            images.append(np.array(arr[(severity - 1) * n: severity * n]))
        except Exception as e:
            raise DataError(f"{path}: truncated .npy file ({type(e).__name__}: {e})") from None
    y = np.asarray(labels[(severity - 1) * per: severity * per] if len(labels) > per else labels)
    train, test = stratified_split(y, TEST_FRACTION, SPLIT_SEED)
    k = len(corruptions)
    parts = []
    for idx in (train, test):
        x = to_tensor(np.concatenate([im[idx] for im in images]), CIFAR_MEAN, CIFAR_STD,
                      image_size)
        parts += [x, label_tensor(np.tile(y[idx], k)), label_tensor(np.repeat(np.arange(k), len(idx)))]
    return Dataset("cifar10c", parts[0], parts[1], parts[3], parts[4], 10,
                   domains=tuple(corruptions), d_train=parts[2], d_test=parts[5])


# ---------------------------------------------------------------- CIFAR-100 (pickles)

def cifar100(root, image_size: int = 32) -> Dataset:
    """CIFAR-100's python pickles under ``<root>/cifar-100-python/`` (fine labels)."""
    folder = Path(root) / "cifar-100-python"
    out = []
    for split in ("train", "test"):
        if not (folder / split).is_file():
            raise DataError(f"CIFAR-100 file not found: {folder / split}; expected layout "
                            f"<root>/cifar-100-python/{{train,test}} (torchvision's)")
        x, y = read_cifar_batch(folder / split, label_key=b"fine_labels", num_classes=100)
        out += [to_tensor(x.transpose(0, 2, 3, 1), CIFAR100_MEAN, CIFAR100_STD, image_size),
                label_tensor(y)]
    return Dataset("cifar100", *out, num_classes=100)


# ---------------------------------------------------------------- Mini-ImageNet (pickled cache)

MINI_IMAGENET_SPLITS = ("train", "val", "test")


def _read_cache(path: Path) -> tuple[np.ndarray, dict]:
    try:
        with open(path, "rb") as f:
            blob = pickle.load(f, encoding="latin1")  # latin1: caches written by Python 2
    except Exception as e:
        raise DataError(f"{path}: not a readable Mini-ImageNet cache ({type(e).__name__}: {e})") \
            from None
    if isinstance(blob, dict):
        blob = {k.decode() if isinstance(k, bytes) else k: v for k, v in blob.items()}
    if not isinstance(blob, dict) or "image_data" not in blob or "class_dict" not in blob:
        keys = sorted(map(str, blob)) if isinstance(blob, dict) else type(blob).__name__
        raise DataError(f"{path}: expected a dict with keys 'image_data' and 'class_dict', got {keys}")
    data, classes = np.asarray(blob["image_data"]), blob["class_dict"]
    if data.dtype != np.uint8 or data.ndim != 4 or data.shape[3] != 3 or not isinstance(classes, dict):
        raise DataError(f"{path}: 'image_data' must be uint8 (n, H, W, 3) and 'class_dict' a dict, "
                        f"got {data.dtype} {data.shape} and {type(classes).__name__}")
    rows = [i for v in classes.values() for i in v]
    if rows and (min(rows) < 0 or max(rows) >= len(data)):
        raise DataError(f"{path}: 'class_dict' points at rows outside 0..{len(data) - 1}")
    return data, {k.decode() if isinstance(k, bytes) else str(k): np.asarray(v, dtype=np.int64)
                  for k, v in classes.items()}


def mini_imagenet(root, image_size: int = 84,
                  splits: Sequence[str] = MINI_IMAGENET_SPLITS) -> Dataset:
    """Mini-ImageNet's pickled cache files, pooled and re-split 80/20 per class (module docstring)."""
    root = Path(root)
    folder = root / "mini-imagenet" if (root / "mini-imagenet").is_dir() else root
    bad = [s for s in splits if s not in MINI_IMAGENET_SPLITS]
    if bad or not splits:
        raise DataError(f"mini_imagenet: splits must come from {MINI_IMAGENET_SPLITS}, got {splits}")
    images, class_ids = [], []
    for s in splits:
        path = folder / f"mini-imagenet-cache-{s}.pkl"
        if not path.is_file():
            raise DataError(f"Mini-ImageNet file not found: {path}; expected layout "
                            f"<root>/mini-imagenet/mini-imagenet-cache-{{train,val,test}}.pkl")
        data, classes = _read_cache(path)
        for cid, rows in classes.items():
            images.append(data[rows])
            class_ids += [cid] * len(rows)
    if len({im.shape[1:] for im in images}) > 1:
        raise DataError(f"{folder}: the cache files hold images of different sizes")
    names = sorted(set(class_ids))
    index = {c: i for i, c in enumerate(names)}
    y = np.array([index[c] for c in class_ids], dtype=np.int64)
    x = np.concatenate(images)
    train, test = stratified_split(y, TEST_FRACTION, SPLIT_SEED)
    return Dataset("mini_imagenet", to_tensor(x[train], IMAGENET_MEAN, IMAGENET_STD, image_size),
                   label_tensor(y[train]), to_tensor(x[test], IMAGENET_MEAN, IMAGENET_STD, image_size),
                   label_tensor(y[test]), num_classes=len(names))


DOMAIN_LOADERS = {
    "cifar10c": cifar10c,
    "office_caltech10": office_caltech10,
    "officehome": officehome,
    "domainnet": domainnet,
    "cifar100": cifar100,
    "mini_imagenet": mini_imagenet,
}

__all__ = ["DOMAIN_LOADERS", "cifar10c", "cifar100", "mini_imagenet", "office_caltech10",
           "officehome", "domainnet", "CIFAR10C_CORRUPTIONS", "FEDL2P_CORRUPTIONS",
           "IMAGENET_MEAN", "IMAGENET_STD", "CIFAR100_MEAN", "CIFAR100_STD", "SPLIT_SEED"]
