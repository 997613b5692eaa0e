"""File loaders of the papers' datasets (fl_core.data.domain_sources / domain_folders), each run on
tiny files written in the dataset's real on-disk layout, plus one clear DataError per failure."""
from __future__ import annotations

import pickle
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from fl_core.data.domain_folders import DOMAINNET_TOP10, IMAGENET_MEAN, IMAGENET_STD
from fl_core.data.domain_sources import (CIFAR100_MEAN, CIFAR100_STD, DOMAIN_LOADERS, cifar10c,
                                         cifar100, domainnet, mini_imagenet, office_caltech10,
                                         officehome)
from fl_core.data.sources import DataError

CIFAR_MEAN, CIFAR_STD = (0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616)


def denorm(x: torch.Tensor, mean, std) -> np.ndarray:
    """Normalised (C, H, W) back to [0, 255] (H, W, C)."""
    m, s = torch.tensor(mean).view(-1, 1, 1), torch.tensor(std).view(-1, 1, 1)
    return ((x * s + m) * 255).permute(1, 2, 0).numpy()


def test_every_loader_is_exported():
    assert set(DOMAIN_LOADERS) == {"cifar10c", "office_caltech10", "officehome", "domainnet",
                                   "cifar100", "mini_imagenet"}


# ---------------------------------------------------------------- CIFAR-10-C

def fake_cifar10c(root: Path, names=("fog", "snow", "saturate"), per=50):
    """Every row's pixels encode (corruption, severity, image): value = 40*k + 8*(s-1) + i % 8, and
    labels.npy is the `per` labels repeated for the five stacked severities, as in the release."""
    folder = root / "CIFAR-10-C"
    folder.mkdir(parents=True)
    labels = np.arange(per) % 10
    np.save(folder / "labels.npy", np.tile(labels, 5).astype(np.uint8))
    for k, name in enumerate(names):
        arr = np.zeros((5 * per, 32, 32, 3), np.uint8)
        for s in range(5):
            for i in range(per):
                arr[s * per + i] = 40 * k + 8 * s + i % 8
        np.save(folder / f"{name}.npy", arr)
    return labels


def test_cifar10c_severity_slicing_domains_and_fedl2p_split(tmp_path):
    fake_cifar10c(tmp_path)
    d = cifar10c(tmp_path, corruptions=("snow", "fog"), severity=4)
    assert d.domains == ("snow", "fog") and d.num_classes == 10
    # 80/20 of each corruption's 50 images, stratified: 5 per class -> 40 train + 10 test.
    assert d.x_train.shape == (80, 3, 32, 32) and d.x_test.shape == (20, 3, 32, 32)
    assert d.d_train.tolist() == [0] * 40 + [1] * 40 and d.d_test.tolist() == [0] * 10 + [1] * 10
    assert d.x_train.dtype == torch.float32 and d.y_train.dtype == torch.int64
    assert d.d_train.dtype == torch.int64 and d.d_test.dtype == torch.int64
    assert sorted(d.y_test[:10].tolist()) == list(range(10))
    # Pixel value 40*k + 8*(s-1) + i % 8: snow is file k=1, fog k=0, severity 4 -> 8*3 = 24.
    snow = np.rint(np.stack([denorm(x, CIFAR_MEAN, CIFAR_STD)[0, 0] for x in d.x_train[:40]]))
    fog = np.rint(np.stack([denorm(x, CIFAR_MEAN, CIFAR_STD)[0, 0] for x in d.x_test[10:]]))
    assert ((snow >= 64) & (snow < 72)).all() and ((fog >= 24) & (fog < 32)).all()
    # The same underlying images (same label, same i % 8) in train under both corruptions.
    assert torch.equal(d.y_train[:40], d.y_train[40:])
    assert torch.allclose(d.x_train[:40] - d.x_train[40:], d.x_train[0] - d.x_train[40])
    # Fixed seed: loading again gives the same split.
    again = cifar10c(tmp_path, corruptions=("snow", "fog"), severity=4)
    assert torch.equal(again.y_test, d.y_test) and torch.equal(again.x_test, d.x_test)


def test_cifar10c_label_order_and_resize(tmp_path):
    labels = fake_cifar10c(tmp_path)
    d = cifar10c(tmp_path, corruptions=("saturate",), severity=1, image_size=16)
    assert d.x_train.shape == (40, 3, 16, 16) and d.x_test.shape == (10, 3, 16, 16)
    assert np.bincount(d.y_test.numpy(), minlength=10).tolist() == [1] * 10  # stratified
    # Constant images stay constant after resizing (value 40*2 + i % 8 for saturate at severity 1).
    img = denorm(d.x_train[3], CIFAR_MEAN, CIFAR_STD)
    assert np.allclose(img, img[0, 0], atol=1e-3) and 80 <= round(float(img[0, 0, 0])) < 88
    assert sorted(d.y_train.tolist() + d.y_test.tolist()) == sorted(labels.tolist())


@pytest.mark.parametrize("kwargs,needle", [
    (dict(corruptions=("fog", "rain")), "'rain'"),
    (dict(severity=6), "severity"),
    (dict(severity=2.0), "severity"),
    (dict(protocol="iid"), "'iid'"),
])
def test_cifar10c_bad_request(tmp_path, kwargs, needle):
    fake_cifar10c(tmp_path)
    with pytest.raises(DataError, match=needle):
        cifar10c(tmp_path, **({"corruptions": ("fog",)} | kwargs))


def test_cifar10c_missing_and_corrupt_files(tmp_path):
    with pytest.raises(DataError, match=r"CIFAR-10-C.*expected layout"):
        cifar10c(tmp_path, corruptions=("fog",))
    fake_cifar10c(tmp_path)
    with pytest.raises(DataError, match=r"frost\.npy.*expected layout"):
        cifar10c(tmp_path, corruptions=("fog", "frost"))
    path = tmp_path / "CIFAR-10-C" / "fog.npy"
    path.write_bytes(path.read_bytes()[:5000])  # truncated payload
    with pytest.raises(DataError, match=r"fog\.npy.*truncated"):
        cifar10c(tmp_path, corruptions=("fog",))
    path.write_bytes(b"garbage, not numpy")
    with pytest.raises(DataError, match=r"fog\.npy.*corrupt"):
        cifar10c(tmp_path, corruptions=("fog",))
    np.save(path, np.zeros((7, 32, 32, 3), np.uint8))  # not 5 severities
    with pytest.raises(DataError, match=r"fog\.npy.*5\*n"):
        cifar10c(tmp_path, corruptions=("fog",))
    (tmp_path / "CIFAR-10-C" / "labels.npy").write_bytes(b"\x93NUMPY broken")
    with pytest.raises(DataError, match=r"labels\.npy"):
        cifar10c(tmp_path, corruptions=("snow",))


# ---------------------------------------------------------------- image folders

def write_image(path: Path, value: int, size=(12, 16), mode="RGB"):
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new(mode, size, value if mode == "L" else (value, value, value)).save(path)


def fake_folders(base: Path, domains, classes, per_class=5, suffix=".jpg"):
    """`per_class` images per (domain, class); grey value 10*domain + class."""
    for k, dom in enumerate(domains):
        for c, cls in enumerate(classes):
            for i in range(per_class):
                write_image(base / dom / cls / f"img_{i:03d}{suffix}", 10 * k + c)


def test_office_caltech10(tmp_path):
    classes = ("back_pack", "bike", "mug")
    fake_folders(tmp_path / "office_caltech_10", ("amazon", "caltech", "dslr", "webcam"), classes,
                 suffix=".png")
    d = office_caltech10(tmp_path, image_size=8)
    assert d.domains == ("amazon", "caltech", "dslr", "webcam") and d.num_classes == 3
    # 5 images per class and domain: 4 train + 1 test (80/20, stratified).
    assert d.x_train.shape == (48, 3, 8, 8) and d.x_test.shape == (12, 3, 8, 8)
    assert np.bincount(d.d_train.numpy()).tolist() == [12] * 4
    assert np.bincount(d.d_test.numpy()).tolist() == [3] * 4
    assert sorted(d.y_test[d.d_test == 2].tolist()) == [0, 1, 2]
    # Every image's colour is 10*domain + class: labels and domain indices are the right ones.
    for x, y, dom in zip(d.x_train, d.y_train, d.d_train):
        assert np.allclose(denorm(x, IMAGENET_MEAN, IMAGENET_STD), 10 * int(dom) + int(y), atol=0.01)
    sub = office_caltech10(tmp_path, image_size=8, domains=("dslr",))
    assert sub.domains == ("dslr",) and len(sub.y_train) == 12


def test_officehome_real_world_with_a_space_and_greyscale(tmp_path):
    base = tmp_path / "OfficeHomeDataset_10072016"
    fake_folders(base, ("Art", "Clipart", "Product", "Real World"), ("Alarm_Clock", "Bed"))
    write_image(base / "Art" / "Bed" / "grey.jpg", 77, mode="L")
    d = officehome(tmp_path, image_size=16)
    assert d.domains == ("Art", "Clipart", "Product", "Real_World") and d.num_classes == 2
    assert d.x_train.shape[1:] == (3, 16, 16)
    assert len(d.y_train) + len(d.y_test) == 4 * 2 * 5 + 1
    assert (d.d_test == 3).sum() == 2 and (d.d_train == 3).sum() == 8


def write_domainnet(root: Path, domains=("clipart", "sketch")):
    """Images under DomainNet/<domain>/<class>/ and the official split lists beside them."""
    base = root / "DomainNet"
    classes = ("aircraft_carrier", "bird", "zebra", "teapot")  # labels 0, 1, 344, 300 officially
    official = {"aircraft_carrier": 0, "bird": 1, "zebra": 344, "teapot": 300}
    for k, dom in enumerate(domains):
        lines = {"train": [], "test": []}
        for c, cls in enumerate(classes):
            for i in range(4):
                rel = f"{dom}/{cls}/{dom}_{c:03d}_{i:06d}.jpg"
                write_image(base / rel, 10 * k + c)
                lines["train" if i < 3 else "test"].append(f"{rel} {official[cls]}")
        for split, rows in lines.items():
            (base / f"{dom}_{split}.txt").write_text("\n".join(rows) + "\n")
    return base


def test_domainnet_top10_and_official_split(tmp_path):
    write_domainnet(tmp_path)
    d = domainnet(tmp_path, image_size=8, domains=("clipart", "sketch"))
    assert d.domains == ("clipart", "sketch") and d.num_classes == 10
    # aircraft_carrier is not one of FedBN's ten: bird, teapot, zebra remain, 3 train + 1 test each.
    assert len(d.y_train) == 2 * 3 * 3 and len(d.y_test) == 2 * 3
    top = {DOMAINNET_TOP10.index(c) for c in ("bird", "teapot", "zebra")}
    assert set(d.y_train.tolist()) == top == {0, 4, 9}
    assert d.d_test.tolist() == [0, 0, 0, 1, 1, 1]
    everything = domainnet(tmp_path, image_size=8, top_classes=None, domains=("clipart", "sketch"))
    assert everything.num_classes == 345 and set(everything.y_test.tolist()) == {0, 1, 300, 344}
    with pytest.raises(DataError, match="top_classes"):
        domainnet(tmp_path, top_classes=5)


def test_domainnet_missing_split_list_and_bad_line(tmp_path):
    base = write_domainnet(tmp_path)
    with pytest.raises(DataError, match=r"infograph_train\.txt.*expected layout"):
        domainnet(tmp_path)  # all six domains asked, only two written
    (base / "clipart" / "bird" / "clipart_001_000000.jpg").unlink()  # listed, but gone
    with pytest.raises(DataError, match=r"clipart_001_000000\.jpg: file not found"):
        domainnet(tmp_path, domains=("clipart",))
    (base / "sketch_test.txt").write_text("sketch/bird/x.jpg\n")
    with pytest.raises(DataError, match=r"sketch_test\.txt, line 1"):
        domainnet(tmp_path, domains=("sketch",))


@pytest.mark.parametrize("loader,dirname,domain", [
    (office_caltech10, "office_caltech_10", "amazon"),
    (officehome, "OfficeHome", "Art"),
])
def test_image_folder_failures(tmp_path, loader, dirname, domain):
    with pytest.raises(DataError, match=rf"{dirname}.*expected layout"):
        loader(tmp_path)
    (tmp_path / dirname / domain / "c").mkdir(parents=True)
    with pytest.raises(DataError, match=rf"{domain}: no images"):
        loader(tmp_path, domains=(domain,))
    write_image(tmp_path / dirname / domain / "c" / "ok.jpg", 3)
    broken = tmp_path / dirname / domain / "c" / "broken.jpg"
    good = tmp_path / dirname / domain / "c" / "ok.jpg"
    broken.write_bytes(good.read_bytes()[:60])  # a truncated JPEG
    with pytest.raises(DataError, match=r"broken\.jpg.*not a decodable image"):
        loader(tmp_path, domains=(domain,))
    broken.write_bytes(b"not an image")
    with pytest.raises(DataError, match=r"broken\.jpg.*not a decodable image"):
        loader(tmp_path, domains=(domain,))
    with pytest.raises(DataError, match="unknown domain"):
        loader(tmp_path, domains=("nowhere",))


# ---------------------------------------------------------------- CIFAR-100

def write_cifar100(root: Path, n_train=6, n_test=4):
    rng = np.random.default_rng(0)
    folder = root / "cifar-100-python"
    folder.mkdir(parents=True)
    out = {}
    for split, n in (("train", n_train), ("test", n_test)):
        data = rng.integers(0, 256, size=(n, 3072), dtype=np.uint8)
        fine = [int(v) for v in rng.integers(0, 100, size=n)]
        fine[0] = 99
        with open(folder / split, "wb") as f:
            pickle.dump({b"data": data, b"fine_labels": fine, b"coarse_labels": [0] * n,
                         b"filenames": [b"x.png"] * n, b"batch_label": b"x"}, f)
        out[split] = (data, fine)
    return out


def test_cifar100(tmp_path):
    written = write_cifar100(tmp_path)
    d = cifar100(tmp_path)
    assert d.num_classes == 100 and d.domains == () and d.d_train is None
    assert d.x_train.shape == (6, 3, 32, 32) and d.x_test.shape == (4, 3, 32, 32)
    assert d.y_train.tolist() == written["train"][1] and d.y_test.tolist() == written["test"][1]
    red = (written["train"][0][2, :1024].reshape(32, 32) / 255.0 - CIFAR100_MEAN[0]) / CIFAR100_STD[0]
    assert np.allclose(d.x_train[2, 0].numpy(), red, atol=1e-5)
    assert cifar100(tmp_path, image_size=16).x_test.shape == (4, 3, 16, 16)


def test_cifar100_failures(tmp_path):
    with pytest.raises(DataError, match=r"cifar-100-python.train.*expected layout"):
        cifar100(tmp_path)
    write_cifar100(tmp_path)
    path = tmp_path / "cifar-100-python" / "test"
    path.write_bytes(path.read_bytes()[:100])
    with pytest.raises(DataError, match=r"test: not a readable CIFAR-100 batch"):
        cifar100(tmp_path)
    path.write_bytes(pickle.dumps({b"data": np.zeros((2, 3072), np.uint8), b"labels": [0, 1]}))
    with pytest.raises(DataError, match=r"test: expected a dict with keys b'data' and b'fine_labels'"):
        cifar100(tmp_path)


# ---------------------------------------------------------------- Mini-ImageNet

def write_mini_imagenet(root: Path, per_class=5, size=84, bytes_keys=False):
    """Disjoint classes per split file (as the real 64/16/20); grey value = class number."""
    folder = root / "mini-imagenet"
    folder.mkdir(parents=True)
    wnids = {"train": ["n01532829", "n01558993"], "val": ["n01855672"], "test": ["n01930112"]}
    for split, ids in wnids.items():
        data, class_dict = [], {}
        for cid in ids:
            value = sorted(sum(wnids.values(), [])).index(cid)
            class_dict[cid] = list(range(len(data), len(data) + per_class))
            data += [np.full((size, size, 3), value * 20, np.uint8)] * per_class
        blob = {"image_data": np.stack(data), "class_dict": class_dict}
        if bytes_keys:
            blob = {k.encode(): v for k, v in blob.items()}
        with open(folder / f"mini-imagenet-cache-{split}.pkl", "wb") as f:
            pickle.dump(blob, f)


def test_mini_imagenet_pools_the_three_files_and_splits_per_class(tmp_path):
    write_mini_imagenet(tmp_path, bytes_keys=True)
    d = mini_imagenet(tmp_path, image_size=32)
    assert d.num_classes == 4 and d.x_train.shape == (16, 3, 32, 32) and d.x_test.shape == (4, 3, 32, 32)
    assert sorted(d.y_test.tolist()) == [0, 1, 2, 3]
    for x, y in zip(d.x_train, d.y_train):
        assert np.allclose(denorm(x, IMAGENET_MEAN, IMAGENET_STD), 20 * int(y), atol=0.01)
    only_train = mini_imagenet(tmp_path, splits=("train",))
    assert only_train.num_classes == 2 and only_train.x_train.shape[1:] == (3, 84, 84)


def test_mini_imagenet_failures(tmp_path):
    with pytest.raises(DataError, match=r"mini-imagenet-cache-train\.pkl.*expected layout"):
        mini_imagenet(tmp_path)
    write_mini_imagenet(tmp_path, size=8)
    path = tmp_path / "mini-imagenet" / "mini-imagenet-cache-val.pkl"
    path.write_bytes(path.read_bytes()[:50])
    with pytest.raises(DataError, match=r"cache-val\.pkl: not a readable Mini-ImageNet cache"):
        mini_imagenet(tmp_path)
    path.write_bytes(pickle.dumps({"images": np.zeros((1, 8, 8, 3), np.uint8)}))
    with pytest.raises(DataError, match=r"cache-val\.pkl: expected a dict with keys 'image_data'"):
        mini_imagenet(tmp_path)
