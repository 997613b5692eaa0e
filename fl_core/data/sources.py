"""Dataset sources: whole train/test tensors for one named dataset.

Every source returns a :class:`Dataset` whose images are float32 ``(N, C, H, W)``
tensors, normalised with a per-dataset mean/std, and whose labels are int64.

* ``digits``    scikit-learn's bundled 8x8 digits (offline). It has no test split, so it
                is split once, stratified 70/30, with a fixed seed independent of the run.
* ``mnist``     torchvision's on-disk layout ``<root>/MNIST/raw/*-ubyte[.gz]``, read by
                the small IDX reader below (:func:`idx_uint8`, one reader for the IDX family).
* ``fmnist``    Fashion-MNIST (Xiao et al. 2017) in torchvision's layout
                ``<root>/FashionMNIST/raw/*-ubyte[.gz]``, the same reader. No archive checksum is
                checked on files already there (Debian's ``dataset-fashion-mnist`` recompresses the
                archives; the IDX payloads are the originals); ``download`` goes through torchvision,
                which checks the upstream archives it fetches.
* ``cifar10``   torchvision's layout ``<root>/cifar-10-batches-py/``, python pickles.
* ``synthetic`` a tiny deterministic 10-class problem (class prototypes plus noise).

Downloads happen only when asked (``download=True``) and go through torchvision.

These are the base sources; the full list a run can name (the corrupted benchmark ``mnist_c`` /
``digits_c`` built on the first two, and the papers' datasets) and the one ``load_source`` that
takes them all with their options is :mod:`fl_core.data.catalog`.
"""

from __future__ import annotations

import gzip
import os
import pickle
import zlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

# The sources defined in this file; every name a run can ask for (the papers' datasets, the
# corrupted benchmark) is in `fl_core.data.catalog.SOURCES`, whose `load_source` takes them all.
BASE_SOURCES = ("digits", "mnist", "fmnist", "cifar10", "synthetic")

INPUT_SHAPES = {
    "digits": (1, 8, 8),
    "mnist": (1, 28, 28),
    "fmnist": (1, 28, 28),
    "cifar10": (3, 32, 32),
    "synthetic": (1, 8, 8),
}

# Standard channel statistics of the training sets (pixel values scaled to [0, 1]).
_MNIST_MEAN, _MNIST_STD = (0.1307,), (0.3081,)
_FMNIST_MEAN, _FMNIST_STD = (0.2860,), (0.3530,)
CIFAR_MEAN, CIFAR_STD = (0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616)

DIGITS_SPLIT_SEED = 0  # fixed: the digits train/test split never depends on the run seed
SYNTHETIC_SEED = 1234  # fixed: the synthetic dataset is the same in every run


class DataError(ValueError):
    """A bad data request or a missing/corrupt data file.

    The message names the offending value (or path) and what is allowed instead.
    """


@dataclass(frozen=True)
class Dataset:
    """Whole train and test split of one source, already normalised."""

    name: str
    x_train: torch.Tensor  # float32 (N, C, H, W)
    y_train: torch.Tensor  # int64 (N,)
    x_test: torch.Tensor
    y_test: torch.Tensor
    num_classes: int
    # A source made of named domains (feature shift: corruptions, OfficeHome's styles, ...): the
    # domain names, and each sample's domain index into them (int64, aligned with y_train /
    # y_test). A single-domain source has no names and None indices.
    domains: tuple[str, ...] = ()
    d_train: torch.Tensor | None = None
    d_test: torch.Tensor | None = None

    def __post_init__(self) -> None:
        if self.domains:
            for split, d, y in (("train", self.d_train, self.y_train), ("test", self.d_test, self.y_test)):
                if d is None or d.shape != y.shape:
                    raise DataError(f"{self.name}: every {split} sample needs a domain index (got "
                                    f"{None if d is None else tuple(d.shape)} for {tuple(y.shape)} labels)")

    @property
    def input_shape(self) -> tuple[int, int, int]:
        """Shape of one image, ``(C, H, W)``."""
        return tuple(int(d) for d in self.x_train.shape[1:])


def input_shape_of(name: str) -> tuple[int, int, int]:
    """``(C, H, W)`` of a source's images, without loading any data."""
    _check_name(name)
    return INPUT_SHAPES[name]


def default_data_root() -> Path:
    """``$FL_DATA_ROOT`` if set, else ``./data``."""
    return Path(os.environ.get("FL_DATA_ROOT") or "data")


def load_source(name: str, data_root: str | os.PathLike | None = None,
                download: bool = False) -> Dataset:
    """Load dataset ``name`` (one of :data:`BASE_SOURCES`).

    ``data_root`` is only used by the file-based sources (mnist, fmnist, cifar10); ``download``
    lets torchvision fetch missing files into it.
    """
    _check_name(name)
    if name == "digits":
        return _load_digits()
    if name == "synthetic":
        return _load_synthetic()
    root = Path(data_root) if data_root is not None else default_data_root()
    if name in IDX_FOLDERS:
        return _load_idx(name, root, download)
    return _load_cifar10(root, download)


def _check_name(name: str) -> None:
    if name not in BASE_SOURCES:
        raise DataError(f"unknown dataset {name!r}; allowed: {', '.join(BASE_SOURCES)}")


def normalise_images(x: np.ndarray, mean, std) -> torch.Tensor:
    """uint8/float images ``(N, C, H, W)`` in [0, 255] -> float32, per-channel normalised."""
    x = np.require(x, requirements=["C", "W"])  # torch wants a writable buffer
    t = torch.from_numpy(x).to(torch.float32).div_(255.0)
    mean_t = torch.tensor(mean, dtype=torch.float32).view(1, -1, 1, 1)
    std_t = torch.tensor(std, dtype=torch.float32).view(1, -1, 1, 1)
    return t.sub_(mean_t).div_(std_t)


def label_tensor(y: np.ndarray) -> torch.Tensor:
    """Class labels as an int64 tensor that owns its memory."""
    return torch.from_numpy(np.asarray(y, dtype=np.int64).copy())


# ---------------------------------------------------------------- digits / synthetic

def _from_float(name: str, x_tr, y_tr, x_te, y_te, num_classes: int) -> Dataset:
    """Build a Dataset from float arrays, normalising with the train mean/std."""
    mean, std = float(x_tr.mean()), float(x_tr.std())
    shape = (-1, *INPUT_SHAPES[name])

    def to_t(a):
        return torch.from_numpy(((a - mean) / std).astype(np.float32).reshape(shape))

    return Dataset(name, to_t(x_tr), label_tensor(y_tr), to_t(x_te), label_tensor(y_te), num_classes)


def _load_digits() -> Dataset:
    return _from_float("digits", *_digits_split(), 10)


def digits_uint8() -> tuple[np.ndarray, ...]:
    """The digits split as uint8 images (N, 8, 8) in 0..255 and labels (for `digits_c`)."""
    x_tr, y_tr, x_te, y_te = _digits_split()

    def to_u8(x):
        return np.rint(x * 255.0).astype(np.uint8).reshape(-1, 8, 8)

    return to_u8(x_tr), y_tr, to_u8(x_te), y_te


def _digits_split() -> list[np.ndarray]:
    """(x_tr, y_tr, x_te, y_te), pixels in [0, 1]. The split is scikit-learn's stratified
    `train_test_split`; importing scikit-learn takes 1-2.5 s (scipy), more than the rest of a
    small run's start, so the split arrays are cached per scikit-learn version
    (`digits_cache_path`) and later runs read them without it."""
    cache = digits_cache_path()
    try:
        with np.load(cache) as saved:
            return [saved[k] for k in ("x_tr", "y_tr", "x_te", "y_te")]
    except (OSError, KeyError, ValueError):
        arrays = _split_digits()
        _write_cache(cache, dict(zip(("x_tr", "y_tr", "x_te", "y_te"), arrays)))
        return arrays


def _split_digits() -> list[np.ndarray]:
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    bunch = load_digits()
    x = bunch.data.astype(np.float64) / 16.0
    y = bunch.target.astype(np.int64)
    x_tr, x_te, y_tr, y_te = train_test_split(
        x, y, test_size=0.3, stratify=y, random_state=DIGITS_SPLIT_SEED)
    return [x_tr, y_tr, x_te, y_te]


def digits_cache_path() -> Path:
    """`$FL_CACHE_DIR` (default ~/.cache/fl_core) / digits-split-<scikit-learn version>.npz."""
    from importlib.metadata import version

    folder = Path(os.environ.get("FL_CACHE_DIR") or Path.home() / ".cache" / "fl_core")
    return folder / f"digits-split-{version('scikit-learn')}-seed{DIGITS_SPLIT_SEED}.npz"


def _write_cache(path: Path, arrays: dict[str, np.ndarray]) -> None:
    """Atomically (temp file, then rename); a cache that cannot be written is only slower."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp.npz")
        np.savez(tmp, **arrays)
        os.replace(tmp, path)
    except OSError:
        pass


def _load_synthetic(n_train: int = 600, n_test: int = 200, num_classes: int = 10,
                    noise: float = 0.8) -> Dataset:
    """Each class is a fixed random 8x8 prototype; samples add Gaussian noise."""
    rng = np.random.default_rng(SYNTHETIC_SEED)
    protos = rng.normal(0.0, 1.0, size=(num_classes, 64))

    def draw(n):
        y = np.arange(n) % num_classes
        rng.shuffle(y)
        return protos[y] + rng.normal(0.0, noise, size=(n, 64)), y

    x_tr, y_tr = draw(n_train)
    x_te, y_te = draw(n_test)
    return _from_float("synthetic", x_tr, y_tr, x_te, y_te, num_classes)


# ---------------------------------------------------------------- MNIST, Fashion-MNIST (IDX files)

_IDX_MAGIC = {3: 0x00000803, 1: 0x00000801}  # ndim -> magic number of uint8 IDX files


def read_idx(path: str | os.PathLike, ndim: int) -> np.ndarray:
    """Read a uint8 IDX file (plain or ``.gz``) with ``ndim`` dimensions.

    Checks the magic number and that the payload holds exactly prod(dims) bytes.
    """
    path = Path(path)
    try:
        opener = gzip.open if path.suffix == ".gz" else open
        with opener(path, "rb") as f:
            raw = f.read()
    except FileNotFoundError:
        raise DataError(f"{path}: file not found") from None
    except (EOFError, gzip.BadGzipFile, zlib.error, OSError) as e:
        raise DataError(f"{path}: truncated or corrupt gzip stream ({e})") from None
    header = 4 + 4 * ndim
    if len(raw) < header:
        raise DataError(f"{path}: truncated: expected a {header}-byte IDX header, "
                        f"found {len(raw)} bytes")
    magic = int.from_bytes(raw[:4], "big")
    if magic != _IDX_MAGIC[ndim]:
        raise DataError(f"{path}: bad magic number 0x{magic:08x}; expected "
                        f"0x{_IDX_MAGIC[ndim]:08x} (uint8 IDX with {ndim} dims)")
    dims = [int.from_bytes(raw[4 + 4 * i: 8 + 4 * i], "big") for i in range(ndim)]
    expected, found = int(np.prod(dims)), len(raw) - header
    if found < expected:
        raise DataError(f"{path}: truncated: expected {expected} bytes, found {found}")
    if found > expected:
        raise DataError(f"{path}: corrupt: expected {expected} bytes after the header "
                        f"for dims {dims}, found {found}")
    return np.frombuffer(raw, dtype=np.uint8, offset=header).reshape(dims)


_IDX_FILES = {
    "train": ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"),
    "test": ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"),
}
# The IDX family: source name -> torchvision's folder under the data root (also its dataset class,
# which `download` uses), and -> the training set's channel mean and std.
IDX_FOLDERS = {"mnist": "MNIST", "fmnist": "FashionMNIST"}
_IDX_STATS = {"mnist": (_MNIST_MEAN, _MNIST_STD), "fmnist": (_FMNIST_MEAN, _FMNIST_STD)}


def _find_idx(raw_dir: Path, stem: str) -> Path | None:
    """The plain file if present, else the ``.gz`` one, else None."""
    for candidate in (raw_dir / stem, raw_dir / f"{stem}.gz"):
        if candidate.is_file():
            return candidate
    return None


def _idx_paths(raw_dir: Path) -> dict[str, Path] | Path:
    """All four file paths, or the first missing path (without suffix)."""
    found = {}
    for stems in _IDX_FILES.values():
        for stem in stems:
            path = _find_idx(raw_dir, stem)
            if path is None:
                return raw_dir / stem
            found[stem] = path
    return found


def idx_uint8(name: str, root: Path | None, download: bool = False) -> tuple[np.ndarray, ...]:
    """(train images uint8 (N, 28, 28), train labels, test images, test labels) of an IDX-family
    source (``mnist`` or ``fmnist``: :data:`IDX_FOLDERS`) under ``<root>/<folder>/raw``, checked:
    magic numbers, payload sizes, images and labels of equal count, labels in 0..9."""
    if name not in IDX_FOLDERS:
        raise DataError(f"{name!r} is not an IDX dataset; allowed: {', '.join(IDX_FOLDERS)}")
    folder = IDX_FOLDERS[name]
    root = root if root is not None else default_data_root()
    paths = _idx_paths(root / folder / "raw")
    if isinstance(paths, Path) and download:
        _torchvision_fetch(folder, root)
        paths = _idx_paths(root / folder / "raw")
    if isinstance(paths, Path):
        raise DataError(f"{name} file not found: {paths} (or {paths}.gz); pass --download "
                        f"to fetch it, or --data-root pointing at a folder holding {folder}/raw")
    out = []
    for img_stem, lbl_stem in _IDX_FILES.values():
        images = read_idx(paths[img_stem], ndim=3)
        labels = read_idx(paths[lbl_stem], ndim=1)
        if len(images) != len(labels):
            raise DataError(f"{paths[img_stem]} has {len(images)} images but "
                            f"{paths[lbl_stem]} has {len(labels)} labels")
        if labels.size and labels.max() > 9:
            raise DataError(f"{paths[lbl_stem]}: label {labels.max()} outside 0..9")
        out += [images, labels]
    return tuple(out)


def _load_idx(name: str, root: Path, download: bool) -> Dataset:
    x_tr, y_tr, x_te, y_te = idx_uint8(name, root, download)
    mean, std = _IDX_STATS[name]
    return Dataset(name, normalise_images(x_tr[:, None], mean, std), label_tensor(y_tr),
                   normalise_images(x_te[:, None], mean, std), label_tensor(y_te), num_classes=10)


# ---------------------------------------------------------------- CIFAR-10 (pickles)

_CIFAR_DIR = "cifar-10-batches-py"
_CIFAR_TRAIN = tuple(f"data_batch_{i}" for i in range(1, 6))
_CIFAR_TEST = ("test_batch",)


def read_cifar_batch(path: str | os.PathLike, label_key: bytes = b"labels",
                     num_classes: int = 10) -> tuple[np.ndarray, np.ndarray]:
    """One CIFAR python batch -> (uint8 images (n, 3, 32, 32), int64 labels (n,)).

    CIFAR-10 batches keep their labels under ``b"labels"``; CIFAR-100's ``train``/``test``
    files are read with ``label_key=b"fine_labels", num_classes=100``.
    """
    path = Path(path)
    kind = f"CIFAR-{num_classes}"
    try:
        with open(path, "rb") as f:
            batch = pickle.load(f, encoding="bytes")
    except FileNotFoundError:
        raise DataError(f"{path}: file not found") from None
    except Exception as e:  # unpickling garbage can raise almost anything
        raise DataError(f"{path}: not a readable {kind} batch ({type(e).__name__}: {e})") from None
    if not isinstance(batch, dict) or b"data" not in batch or label_key not in batch:
        keys = sorted(batch) if isinstance(batch, dict) else type(batch).__name__
        raise DataError(f"{path}: expected a dict with keys b'data' and {label_key!r}, got {keys}")
    data = np.asarray(batch[b"data"])
    labels = np.asarray(batch[label_key])
    if data.dtype != np.uint8 or data.ndim != 2 or data.shape[1] != 3 * 32 * 32:
        raise DataError(f"{path}: b'data' must be uint8 of shape (n, 3072), "
                        f"got {data.dtype} {data.shape}")
    if labels.ndim != 1 or len(labels) != len(data):
        raise DataError(f"{path}: {len(data)} images but labels of shape {labels.shape}")
    if labels.size and (labels.min() < 0 or labels.max() >= num_classes):
        raise DataError(f"{path}: labels must lie in 0..{num_classes - 1}, "
                        f"found {labels.min()}..{labels.max()}")
    # Rows are channel-major: 1024 red, then 1024 green, then 1024 blue values.
    return data.reshape(-1, 3, 32, 32), labels.astype(np.int64)


def _load_cifar10(root: Path, download: bool) -> Dataset:
    folder = root / _CIFAR_DIR
    names = _CIFAR_TRAIN + _CIFAR_TEST
    missing = [n for n in names if not (folder / n).is_file()]
    if missing and download:
        _torchvision_fetch("CIFAR10", root)
        missing = [n for n in names if not (folder / n).is_file()]
    if missing:
        raise DataError(f"CIFAR-10 file not found: {folder / missing[0]}; pass --download "
                        f"to fetch it, or --data-root pointing at a folder holding {_CIFAR_DIR}")

    def read(batch_names):
        parts = [read_cifar_batch(folder / n) for n in batch_names]
        x = np.concatenate([p[0] for p in parts])
        y = np.concatenate([p[1] for p in parts])
        return normalise_images(x, CIFAR_MEAN, CIFAR_STD), label_tensor(y)

    return Dataset("cifar10", *read(_CIFAR_TRAIN), *read(_CIFAR_TEST), num_classes=10)


def _torchvision_fetch(cls_name: str, root: Path) -> None:
    """Let torchvision download (and verify) both splits of a dataset into ``root``."""
    try:
        import torchvision.datasets as tvd

        for train in (True, False):
            getattr(tvd, cls_name)(root=str(root), train=train, download=True)
    except Exception as e:
        raise DataError(f"downloading {cls_name} into {root} failed: "
                        f"{type(e).__name__}: {e}") from e
