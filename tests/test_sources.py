"""Dataset sources (digits, synthetic, MNIST and Fashion-MNIST IDX files, CIFAR-10 pickles) and
build_federated_data."""

import gzip
import os
import pickle
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from fl_core.data import (SOURCES, DataError, build_federated_data, input_shape_of,
                          load_source)

SHARED_DATA = Path(__file__).resolve().parents[2] / "shared" / "data"
MNIST_RAW = SHARED_DATA / "MNIST" / "raw"
FMNIST_RAW = SHARED_DATA / "FashionMNIST" / "raw"


# ---------------------------------------------------------------- names, digits, synthetic

def test_input_shapes_without_loading():
    assert {n: input_shape_of(n) for n in SOURCES} == {
        "digits": (1, 8, 8), "mnist": (1, 28, 28), "fmnist": (1, 28, 28), "cifar10": (3, 32, 32),
        "synthetic": (1, 8, 8), "mnist_c": (1, 28, 28), "fmnist_c": (1, 28, 28), "digits_c": (1, 8, 8),
        "cifar10c": (3, 32, 32), "office_caltech10": (3, 32, 32),
        "officehome": (3, 32, 32), "domainnet": (3, 32, 32), "cifar100": (3, 32, 32), "mini_imagenet": (3, 84, 84)}
    assert input_shape_of("officehome", image_size=64) == (3, 64, 64)
    with pytest.raises(DataError, match="image_size=64 does not apply to dataset 'mnist'"):
        input_shape_of("mnist", image_size=64)


@pytest.mark.parametrize("call", [lambda: load_source("imagenet"),
                                  lambda: input_shape_of("imagenet")])
def test_unknown_source_lists_allowed(call):
    with pytest.raises(DataError, match="'imagenet'.*digits, mnist, fmnist, cifar10, synthetic, mnist_c, fmnist_c"):
        call()


def test_digits_shapes_dtypes_and_normalisation():
    d = load_source("digits")
    assert d.name == "digits" and d.num_classes == 10 and d.input_shape == (1, 8, 8)
    assert d.x_train.shape == (1257, 1, 8, 8) and d.x_test.shape == (540, 1, 8, 8)
    assert d.x_train.dtype == torch.float32 and d.y_train.dtype == torch.int64
    assert set(d.y_train.tolist()) == set(range(10)) == set(d.y_test.tolist())
    assert abs(d.x_train.mean().item()) < 1e-4 and abs(d.x_train.std().item() - 1) < 1e-3


def test_digits_split_is_stratified_and_fixed():
    a, b = load_source("digits"), load_source("digits")
    assert torch.equal(a.x_train, b.x_train) and torch.equal(a.y_test, b.y_test)
    n_tr = np.bincount(a.y_train.numpy(), minlength=10)
    n_te = np.bincount(a.y_test.numpy(), minlength=10)
    assert np.all(np.abs(n_te - 0.3 * (n_tr + n_te)) <= 1)


def test_synthetic_deterministic_balanced_and_learnable():
    a, b = load_source("synthetic"), load_source("synthetic")
    assert torch.equal(a.x_train, b.x_train) and torch.equal(a.y_train, b.y_train)
    assert torch.equal(a.x_test, b.x_test) and torch.equal(a.y_test, b.y_test)
    assert a.x_train.shape == (600, 1, 8, 8) and a.x_test.shape == (200, 1, 8, 8)
    assert np.bincount(a.y_train.numpy()).tolist() == [60] * 10
    # Nearest class mean classifies the test set well: the problem is learnable.
    xtr, xte = a.x_train.flatten(1), a.x_test.flatten(1)
    means = torch.stack([xtr[a.y_train == c].mean(0) for c in range(10)])
    pred = torch.cdist(xte, means).argmin(1)
    assert (pred == a.y_test).float().mean() > 0.9


# ---------------------------------------------------------------- MNIST

def write_idx(path: Path, array: np.ndarray, gz: bool = False, cut: int = 0) -> Path:
    """Write a uint8 IDX file (optionally gzip'd), dropping the last ``cut`` payload bytes."""
    array = np.asarray(array, dtype=np.uint8)
    header = bytes([0, 0, 8, array.ndim]) + b"".join(
        int(d).to_bytes(4, "big") for d in array.shape)
    raw = header + array.tobytes()
    raw = raw[:len(raw) - cut]
    path = path.with_name(path.name + ".gz") if gz else path
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(gzip.compress(raw) if gz else raw)
    return path


def fake_mnist(root: Path, n_train=12, n_test=5, gz=False, seed=0, folder="MNIST"):
    """A tiny MNIST (or, with folder="FashionMNIST", Fashion-MNIST) in torchvision's layout;
    returns the arrays written."""
    rng = np.random.default_rng(seed)
    raw = root / folder / "raw"
    arrays = {}
    for prefix, n in (("train", n_train), ("t10k", n_test)):
        images = rng.integers(0, 256, size=(n, 28, 28), dtype=np.uint8)
        labels = rng.integers(0, 10, size=n, dtype=np.uint8)
        write_idx(raw / f"{prefix}-images-idx3-ubyte", images, gz)
        write_idx(raw / f"{prefix}-labels-idx1-ubyte", labels, gz)
        arrays[prefix] = (images, labels)
    return arrays


@pytest.mark.parametrize("gz", [False, True])
def test_mnist_reader_on_small_files(tmp_path, gz):
    arrays = fake_mnist(tmp_path, gz=gz)
    d = load_source("mnist", tmp_path)
    assert d.x_train.shape == (12, 1, 28, 28) and d.x_test.shape == (5, 1, 28, 28)
    assert d.y_test.tolist() == arrays["t10k"][1].tolist()
    expected = (arrays["train"][0][3] / 255.0 - 0.1307) / 0.3081
    assert np.allclose(d.x_train[3, 0].numpy(), expected, atol=1e-5)


def test_fmnist_is_the_same_reader_on_its_own_folder_and_statistics(tmp_path):
    """Fashion-MNIST reads torchvision's FashionMNIST/raw layout through the one IDX reader,
    normalised with its own statistics; MNIST files beside it are not mistaken for it."""
    arrays = fake_mnist(tmp_path, n_train=9, gz=True, folder="FashionMNIST")
    d = load_source("fmnist", tmp_path)
    assert d.name == "fmnist" and d.x_train.shape == (9, 1, 28, 28) and d.num_classes == 10
    assert d.y_train.tolist() == arrays["train"][1].tolist()
    expected = (arrays["train"][0][4] / 255.0 - 0.2860) / 0.3530
    assert np.allclose(d.x_train[4, 0].numpy(), expected, atol=1e-5)
    with pytest.raises(DataError) as err:  # MNIST's folder is not Fashion-MNIST's
        load_source("mnist", tmp_path)
    assert "mnist file not found" in str(err.value) and "MNIST/raw" in str(err.value)
    with pytest.raises(DataError) as err:
        load_source("fmnist", tmp_path / "elsewhere")
    msg = str(err.value)
    assert str(tmp_path / "elsewhere" / "FashionMNIST" / "raw" / "train-images-idx3-ubyte") in msg
    assert "--download" in msg and "FashionMNIST/raw" in msg


def test_mnist_prefers_plain_over_gz(tmp_path):
    fake_mnist(tmp_path, n_train=12, gz=False, seed=0)
    fake_mnist(tmp_path, n_train=7, gz=True, seed=1)
    assert len(load_source("mnist", tmp_path).y_train) == 12


def test_mnist_default_root_from_env(tmp_path, monkeypatch):
    fake_mnist(tmp_path)
    monkeypatch.setenv("FL_DATA_ROOT", str(tmp_path))
    assert len(load_source("mnist").y_train) == 12


@pytest.mark.parametrize("gz", [False, True])
def test_mnist_truncated_payload(tmp_path, gz):
    fake_mnist(tmp_path, gz=gz)
    bad = write_idx(tmp_path / "MNIST/raw/t10k-images-idx3-ubyte",
                    np.zeros((5, 28, 28)), gz=gz, cut=100)
    with pytest.raises(DataError) as err:
        load_source("mnist", tmp_path)
    msg = str(err.value)
    assert "truncated: expected 3920 bytes, found 3820" in msg and bad.name in msg


def test_mnist_cut_gzip_stream(tmp_path):
    fake_mnist(tmp_path, gz=True)
    path = tmp_path / "MNIST/raw/train-labels-idx1-ubyte.gz"
    path.write_bytes(path.read_bytes()[:-12])
    with pytest.raises(DataError, match=r"train-labels-idx1-ubyte\.gz: truncated"):
        load_source("mnist", tmp_path)


def test_mnist_bad_magic(tmp_path):
    fake_mnist(tmp_path)
    path = tmp_path / "MNIST/raw/train-labels-idx1-ubyte"
    raw = bytearray(path.read_bytes())
    raw[3] = 3  # claims 3 dims
    path.write_bytes(bytes(raw))
    with pytest.raises(DataError, match="train-labels-idx1-ubyte: bad magic number"):
        load_source("mnist", tmp_path)


def test_mnist_missing_files(tmp_path):
    with pytest.raises(DataError) as err:
        load_source("mnist", tmp_path)
    msg = str(err.value)
    assert str(tmp_path / "MNIST" / "raw" / "train-images-idx3-ubyte") in msg
    assert "--download" in msg and "--data-root" in msg


@pytest.mark.slow
@pytest.mark.skipif(not MNIST_RAW.is_dir(), reason=f"real MNIST files not found at {MNIST_RAW}")
def test_real_mnist_from_shared():
    d = load_source("mnist", SHARED_DATA)
    assert d.x_train.shape == (60000, 1, 28, 28) and d.x_test.shape == (10000, 1, 28, 28)
    assert d.y_train.unique().tolist() == list(range(10)) == d.y_test.unique().tolist()
    assert abs(d.x_train.mean().item()) < 0.01 and abs(d.x_train.std().item() - 1) < 0.01


@pytest.mark.skipif(not FMNIST_RAW.is_dir(), reason=f"real Fashion-MNIST files not found at {FMNIST_RAW}")
def test_real_fmnist_from_shared():
    """The shared Fashion-MNIST (Debian's recompressed archives: no archive checksum is checked):
    60 000 / 10 000 images of 28x28, 10 classes of exactly 6 000 / 1 000, the release's label order."""
    d = load_source("fmnist", SHARED_DATA)
    assert d.x_train.shape == (60000, 1, 28, 28) and d.x_test.shape == (10000, 1, 28, 28)
    assert d.num_classes == 10
    assert torch.bincount(d.y_train).tolist() == [6000] * 10
    assert torch.bincount(d.y_test).tolist() == [1000] * 10
    assert d.y_train[:10].tolist() == [9, 0, 0, 3, 0, 2, 7, 2, 5, 5]  # ankle boot, T-shirt, ...
    assert abs(d.x_train.mean().item()) < 0.01 and abs(d.x_train.std().item() - 1) < 0.01


@pytest.mark.skipif(not (MNIST_RAW / "t10k-labels-idx1-ubyte.gz").is_file(),
                    reason=f"real MNIST files not found at {MNIST_RAW}")
def test_real_mnist_file_cut(tmp_path):
    from fl_core.data.sources import read_idx

    for name in ("t10k-labels-idx1-ubyte", "t10k-labels-idx1-ubyte.gz"):
        cut = tmp_path / name
        cut.write_bytes((MNIST_RAW / name).read_bytes()[:-50])
        with pytest.raises(DataError, match=f"{name}: truncated"):
            read_idx(cut, ndim=1)
    assert len(read_idx(MNIST_RAW / "t10k-labels-idx1-ubyte.gz", ndim=1)) == 10000


# ---------------------------------------------------------------- CIFAR-10

def write_cifar_batch(path: Path, data, labels):
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as f:
        pickle.dump({b"data": data, b"labels": labels, b"batch_label": b"x"}, f)


def fake_cifar(root: Path, n=4, n_test=3):
    """Six tiny batches in CIFAR-10's own format; returns (train_data, train_labels)."""
    rng = np.random.default_rng(0)
    folder = root / "cifar-10-batches-py"
    datas, labels = [], []
    for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
        m = n_test if name == "test_batch" else n
        data = rng.integers(0, 256, size=(m, 3072), dtype=np.uint8)
        lab = rng.integers(0, 10, size=m).tolist()
        write_cifar_batch(folder / name, data, lab)
        if name != "test_batch":
            datas.append(data)
            labels += lab
    return np.concatenate(datas), labels


def test_cifar10_reader(tmp_path):
    data, labels = fake_cifar(tmp_path)
    d = load_source("cifar10", tmp_path)
    assert d.x_train.shape == (20, 3, 32, 32) and d.x_test.shape == (3, 3, 32, 32)
    assert d.input_shape == (3, 32, 32) and d.x_train.dtype == torch.float32
    assert d.y_train.tolist() == labels
    # Channel-major rows: data[i, 0:1024] is the red plane, 1024:2048 the green one.
    red = (data[7, :1024].reshape(32, 32) / 255.0 - 0.4914) / 0.2470
    green = (data[7, 1024:2048].reshape(32, 32) / 255.0 - 0.4822) / 0.2435
    assert np.allclose(d.x_train[7, 0].numpy(), red, atol=1e-5)
    assert np.allclose(d.x_train[7, 1].numpy(), green, atol=1e-5)


@pytest.mark.parametrize("payload,needle", [
    ({b"data": np.zeros((4, 3000), np.uint8), b"labels": [0] * 4}, "(n, 3072)"),
    ({b"data": np.zeros((4, 3072), np.uint8), b"labels": [0] * 3}, "labels"),
    ({b"pixels": np.zeros((4, 3072), np.uint8)}, "b'data'"),
    (b"not a pickle at all", "not a readable CIFAR-10 batch"),
])
def test_cifar10_malformed_batch(tmp_path, payload, needle):
    fake_cifar(tmp_path)
    path = tmp_path / "cifar-10-batches-py" / "data_batch_3"
    if isinstance(payload, bytes):
        path.write_bytes(payload)
    else:
        path.write_bytes(pickle.dumps(payload))
    with pytest.raises(DataError) as err:
        load_source("cifar10", tmp_path)
    assert "data_batch_3" in str(err.value) and needle in str(err.value)


def test_cifar10_missing(tmp_path):
    with pytest.raises(DataError, match="cifar-10-batches-py.*--download"):
        load_source("cifar10", tmp_path)


# ---------------------------------------------------------------- build_federated_data

def test_build_federated_digits_shards():
    kw = dict(dataset="digits", num_clients=5, partition="shards", seed=0,
              shards_per_client=2)
    fed = build_federated_data(**kw)
    assert len(fed.clients) == 5 and fed.num_classes == 10 and fed.input_shape == (1, 8, 8)
    assert fed.train_hist.shape == (5, 10) and fed.train_hist.dtype == np.int64
    for k, c in enumerate(fed.clients):
        assert fed.train_hist[k].sum() == c.n_train == len(c.x_train)
        assert fed.test_hist[k].sum() == c.n_test == len(c.x_test)
        assert np.array_equal(np.bincount(c.y_train.numpy(), minlength=10), fed.train_hist[k])
        assert (fed.train_hist[k] > 0).sum() == 2
        assert np.array_equal(fed.train_hist[k] > 0, fed.test_hist[k] > 0)
        assert c.x_train.is_contiguous() and c.x_train.dtype == torch.float32
    # Test sets follow each client's train mix with one common test/train ratio (issue 14), so the
    # scarcest class decides it and 2 of the 540 test samples stay unused (before: all 540).
    assert fed.train_hist.sum() == 1257 and fed.test_hist.sum() == 538

    again = build_federated_data(**kw)
    assert np.array_equal(fed.train_hist, again.train_hist)
    assert all(torch.equal(a.x_train, b.x_train) and torch.equal(a.y_test, b.y_test)
               for a, b in zip(fed.clients, again.clients))

    moved = fed.to("cpu")
    assert moved is not fed and torch.equal(moved.clients[0].x_test, fed.clients[0].x_test)


def test_build_federated_bad_partition_raises():
    with pytest.raises(DataError, match="dir_alpha"):
        build_federated_data(dataset="synthetic", num_clients=3, partition="dirichlet",
                             seed=0, dir_alpha=0)


def test_digits_split_cache_is_the_same_split_without_importing_sklearn(tmp_path, monkeypatch):
    from fl_core.data import sources

    monkeypatch.setenv("FL_CACHE_DIR", str(tmp_path))
    fresh = sources.load_source("digits")                 # computes the split, writes the cache
    assert sources.digits_cache_path().exists()
    cached = sources.load_source("digits")
    for field in ("x_train", "y_train", "x_test", "y_test"):
        assert torch.equal(getattr(fresh, field), getattr(cached, field)), field
    code = ("import sys; from fl_core.data.sources import load_source; load_source('digits'); "
            "print('sklearn' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={**os.environ, "FL_CACHE_DIR": str(tmp_path)}).stdout
    assert out.strip() == "False"
