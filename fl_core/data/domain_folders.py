"""Image-folder datasets made of named domains: Office-Caltech-10, OfficeHome, DomainNet.

Each loader reads ``<root>/<dataset dir>/<domain>/<class>/<image>`` (jpg/jpeg/png/bmp, any case),
decodes every image with Pillow (greyscale and palette images are converted to RGB), resizes it to
``image_size`` x ``image_size`` (bilinear, aspect ratio not kept, as FedBN's ``Resize([s, s])``) and
normalises with the ImageNet channel statistics, since these are photo datasets fed to
ImageNet-pretrained models. The result is a :class:`~fl_core.data.sources.Dataset` with one domain
per folder and, for every sample, its domain index.

* ``office_caltech10``  ``office_caltech_10/{amazon,caltech,dslr,webcam}/<class>/`` (FedBN's folder
  names; its 10 classes are back_pack, bike, calculator, headphones, keyboard, laptop_computer,
  monitor, mouse, mug, projector). No official split exists, so each domain is split per class,
  80/20, with the fixed seed :data:`SPLIT_SEED` (independent of the run seed).
* ``officehome``  ``OfficeHome/`` or the official archive's ``OfficeHomeDataset_10072016/``, with
  domains Art, Clipart, Product and Real_World (the official archive spells the last one
  ``Real World`` with a space; both spellings are found). Split as Office-Caltech-10.
* ``domainnet``  ``DomainNet/<domain>/<class>/`` plus the official split lists
  ``DomainNet/<domain>_train.txt`` / ``<domain>_test.txt`` (lines ``clipart/bird/x.jpg 23``, paths
  relative to ``DomainNet/``), which decide the split. ``top_classes=10`` keeps FedBN's ten classes
  (:data:`DOMAINNET_TOP10`, the subset FedL2P also uses), labelled 0..9 in that order;
  ``top_classes=None`` keeps all 345 classes with the lists' own label numbers.

Class labels of the folder datasets are the sorted class-folder names (union over the domains).
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

import numpy as np
import torch

from .sources import Dataset, DataError, label_tensor, normalise_images

IMAGENET_MEAN, IMAGENET_STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
SPLIT_SEED = 0  # fixed: a stratified split made here never depends on the run seed
TEST_FRACTION = 0.2
IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".bmp")

OFFICE_CALTECH_DOMAINS = ("amazon", "caltech", "dslr", "webcam")
OFFICEHOME_DOMAINS = ("Art", "Clipart", "Product", "Real_World")
DOMAINNET_DOMAINS = ("clipart", "infograph", "painting", "quickdraw", "real", "sketch")
# FedBN's DomainNet subset (med-air/FedBN, utils/data_utils.py: DomainNetDataset's label_dict).
DOMAINNET_TOP10 = ("bird", "feather", "headphones", "ice_cream", "teapot", "tiger", "whale",
                   "windmill", "wine_glass", "zebra")


# ---------------------------------------------------------------- shared helpers

def stratified_split(labels: np.ndarray, test_fraction: float = TEST_FRACTION,
                     seed: int = SPLIT_SEED) -> tuple[np.ndarray, np.ndarray]:
    """Sorted (train, test) indices: round(test_fraction * n_c) of each class c go to test."""
    rng = np.random.default_rng(seed)
    test = []
    for c in np.unique(labels):
        idx = np.flatnonzero(labels == c)
        test.append(rng.permutation(idx)[:int(round(test_fraction * len(idx)))])
    is_test = np.zeros(len(labels), dtype=bool)
    is_test[np.concatenate(test) if test else []] = True
    return np.flatnonzero(~is_test), np.flatnonzero(is_test)


def to_tensor(images: np.ndarray, mean, std, size: int | None = None,
              chunk: int = 4096) -> torch.Tensor:
    """uint8 ``(N, H, W, C)`` -> normalised float32 ``(N, C, size, size)``, chunk by chunk
    (so 60k 84x84 images never exist all at once as float32 at their full size)."""
    parts = []
    for start in range(0, len(images), chunk):
        t = normalise_images(np.transpose(images[start:start + chunk], (0, 3, 1, 2)), mean, std)
        if size is not None and tuple(t.shape[2:]) != (size, size):
            t = torch.nn.functional.interpolate(t, size=(size, size), mode="bilinear",
                                                align_corners=False, antialias=True)
        parts.append(t)
    if not parts:
        return torch.zeros((0, images.shape[3] if images.ndim == 4 else 3, size or 1, size or 1))
    return torch.cat(parts)


def decode_image(path: Path, size: int) -> np.ndarray:
    """One image file -> uint8 RGB ``(size, size, 3)``; an unreadable file is a DataError."""
    from PIL import Image

    try:
        with Image.open(path) as img:
            img.draft("RGB", (size, size))  # JPEG: decode at a reduced scale when that suffices
            rgb = img.convert("RGB").resize((size, size), Image.Resampling.BILINEAR)
            return np.asarray(rgb, dtype=np.uint8)
    except FileNotFoundError:
        raise DataError(f"{path}: file not found") from None
    except Exception as e:  # Pillow raises UnidentifiedImageError, OSError, SyntaxError, ...
        raise DataError(f"{path}: not a decodable image ({type(e).__name__}: {e})") from None


def domain_dataset(name: str, domains: Sequence[str], parts: dict, num_classes: int,
                   size: int) -> Dataset:
    """``parts[split]`` = list of (path, label, domain index) -> a multi-domain Dataset."""
    out = []
    for split in ("train", "test"):
        items = parts[split]
        pixels = np.stack([decode_image(p, size) for p, _, _ in items]) if items else \
            np.zeros((0, size, size, 3), np.uint8)
        out += [to_tensor(pixels, IMAGENET_MEAN, IMAGENET_STD), label_tensor([y for _, y, _ in items]),
                label_tensor([d for _, _, d in items])]
    return Dataset(name, out[0], out[1], out[3], out[4], num_classes, domains=tuple(domains),
                   d_train=out[2], d_test=out[5])


def _find_dir(base: Path, names: Sequence[str], layout: str) -> Path:
    for n in names:
        if (base / n).is_dir():
            return base / n
    alt = f" (or {', '.join(str(base / n) for n in names[1:])})" if len(names) > 1 else ""
    raise DataError(f"folder not found: {base / names[0]}{alt}; expected layout {layout}")


def _images_in(class_dir: Path) -> list[Path]:
    return sorted(p for p in class_dir.iterdir()
                  if p.is_file() and p.suffix.lower() in IMAGE_SUFFIXES)


def _pick(domains: Sequence[str] | None, known: Sequence[str], name: str) -> tuple[str, ...]:
    chosen = tuple(known if domains is None else domains)
    bad = [d for d in chosen if d not in known]
    if bad or not chosen:
        raise DataError(f"{name}: unknown domain(s) {bad or '(none chosen)'}; allowed: {', '.join(known)}")
    return chosen


# ---------------------------------------------------------------- class-folder datasets

def _folder_domains(name: str, root, dir_names: Sequence[str], domains: tuple[str, ...],
                    aliases: dict[str, Sequence[str]], size: int) -> Dataset:
    layout = f"<root>/{dir_names[0]}/<domain>/<class>/<image>, domains {', '.join(domains)}"
    base = _find_dir(Path(root), dir_names, layout)
    per_domain = [_find_dir(base, aliases.get(d, (d,)), layout) for d in domains]
    files = []
    for ddir in per_domain:
        found = [(p, c.name) for c in sorted(q for q in ddir.iterdir() if q.is_dir())
                 for p in _images_in(c)]
        if not found:
            raise DataError(f"{ddir}: no images; expected layout {layout}")
        files.append(found)
    classes = sorted({c for found in files for _, c in found})
    index = {c: i for i, c in enumerate(classes)}
    parts = {"train": [], "test": []}
    for k, found in enumerate(files):
        y = np.array([index[c] for _, c in found])
        for split, idx in zip(("train", "test"), stratified_split(y, seed=SPLIT_SEED + k)):
            parts[split] += [(found[i][0], int(y[i]), k) for i in idx]
    return domain_dataset(name, domains, parts, len(classes), size)


def office_caltech10(root, image_size: int = 32, domains: Sequence[str] | None = None) -> Dataset:
    """Office-Caltech-10 under ``<root>/office_caltech_10/`` (see the module docstring)."""
    chosen = _pick(domains, OFFICE_CALTECH_DOMAINS, "office_caltech10")
    return _folder_domains("office_caltech10", root, ("office_caltech_10", "OfficeCaltech10"),
                           chosen, {}, image_size)


def officehome(root, image_size: int = 32, domains: Sequence[str] | None = None) -> Dataset:
    """OfficeHome under ``<root>/OfficeHome/`` or ``<root>/OfficeHomeDataset_10072016/``."""
    chosen = _pick(domains, OFFICEHOME_DOMAINS, "officehome")
    return _folder_domains("officehome", root, ("OfficeHome", "OfficeHomeDataset_10072016"),
                           chosen, {"Real_World": ("Real_World", "Real World")}, image_size)


def _read_split_list(path: Path, layout: str) -> list[tuple[str, int]]:
    """A DomainNet split list -> [(relative image path, label)], checked line by line."""
    try:
        lines = path.read_text().splitlines()
    except FileNotFoundError:
        raise DataError(f"split list not found: {path}; expected layout {layout}") from None
    except (OSError, UnicodeDecodeError) as e:
        raise DataError(f"{path}: unreadable split list ({type(e).__name__}: {e})") from None
    rows = []
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        fields = line.split()
        if len(fields) != 2 or not fields[1].isdigit() or len(Path(fields[0]).parts) < 3:
            raise DataError(f"{path}, line {n}: expected '<domain>/<class>/<image> <label>', "
                            f"got {line!r}")
        rows.append((fields[0], int(fields[1])))
    return rows


def domainnet(root, image_size: int = 32, top_classes: int | None = 10,
              domains: Sequence[str] | None = None) -> Dataset:
    """DomainNet under ``<root>/DomainNet/``, split by the official lists (module docstring)."""
    if top_classes not in (10, None):
        raise DataError(f"domainnet: top_classes must be 10 (FedBN's subset) or None (all "
                        f"classes), got {top_classes!r}")
    chosen = _pick(domains, DOMAINNET_DOMAINS, "domainnet")
    layout = ("<root>/DomainNet/<domain>/<class>/<image> with <root>/DomainNet/<domain>_train.txt "
              "and <domain>_test.txt")
    base = _find_dir(Path(root), ("DomainNet", "domainnet"), layout)
    keep = {c: i for i, c in enumerate(DOMAINNET_TOP10)} if top_classes else None
    parts, top_label = {"train": [], "test": []}, -1
    for k, dom in enumerate(chosen):
        for split in ("train", "test"):
            for rel, label in _read_split_list(base / f"{dom}_{split}.txt", layout):
                cls = Path(rel).parts[-2]
                if keep is not None and cls not in keep:
                    continue
                y = keep[cls] if keep is not None else label
                top_label = max(top_label, y)
                parts[split].append((base / rel, y, k))
    if not parts["train"]:
        raise DataError(f"domainnet: no training image of the chosen classes in {base}")
    num_classes = 10 if keep is not None else max(345, top_label + 1)
    return domain_dataset("domainnet", chosen, parts, num_classes, image_size)
