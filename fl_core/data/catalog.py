"""Every dataset a run can name (`--dataset`), the options each takes, and the one `load_source`.

    name              domains                          options                  files (under --data-root)
    digits            -                                -                        bundled (scikit-learn)
    synthetic         -                                -                        none
    mnist             -                                -                        MNIST/raw/*-ubyte[.gz]
    fmnist            -                                -                        FashionMNIST/raw/*-ubyte[.gz]
    cifar10           -                                -                        cifar-10-batches-py/
    mnist_c           one per corruption (+ clean)     corruptions, severity    MNIST/raw (offline benchmark)
    fmnist_c          one per corruption (+ clean)     corruptions, severity    FashionMNIST/raw
    digits_c          one per corruption (+ clean)     corruptions, severity    bundled
    cifar10c          one per corruption               corruptions, severity,   CIFAR-10-C/*.npy
                                                       image_size
    office_caltech10  amazon, caltech, dslr, webcam    image_size               office_caltech_10/
    officehome        Art, Clipart, Product, Real_World image_size              OfficeHome/
    domainnet         the 6 DomainNet domains          image_size,              DomainNet/
                                                       domainnet_classes
    cifar100          -                                image_size               cifar-100-python/
    mini_imagenet     -                                image_size               mini-imagenet/*.pkl

Options left at their defaults mean the source's own default (corruptions: mnist_c/fmnist_c/digits_c
`DEFAULT_CORRUPTIONS`, cifar10c FedL2P's ten; severity 3; image_size 32, Mini-ImageNet 84;
DomainNet FedBN's ten classes). An option given to a source that does not take it is an error,
as is a corruption name the source does not have (`check_options`), and so are clients that do
not fit the source's domains (`check_clients`); `RunConfig` calls both before any data is read. The
readers: fl_core/data/sources.py (the first five), corrupted_sources.py, domain_sources.py and
domain_folders.py.
"""
from __future__ import annotations

import os
from typing import Any

from .corrupted_sources import CORRUPTED_SOURCES, DEFAULT_CORRUPTIONS, DEFAULT_SEVERITY, check_corruptions, \
    load_corrupted
from .domain_partition import DOMAIN_PARTITIONS
from .domain_folders import DOMAINNET_DOMAINS, OFFICE_CALTECH_DOMAINS, OFFICEHOME_DOMAINS
from .domain_sources import CIFAR10C_CORRUPTIONS, DOMAIN_LOADERS, FEDL2P_CORRUPTIONS
from .sources import BASE_SOURCES, Dataset, DataError, INPUT_SHAPES
from .sources import load_source as load_base

SOURCES = (*BASE_SOURCES, *CORRUPTED_SOURCES, *DOMAIN_LOADERS)
DOMAINNET_CLASSES = ("top10", "all")

_CORRUPTED = (*CORRUPTED_SOURCES, "cifar10c")
# option -> (the sources that take it, its default)
OPTIONS: dict[str, tuple[tuple[str, ...], Any]] = {
    "corruptions": (_CORRUPTED, ""),
    "severity": (_CORRUPTED, DEFAULT_SEVERITY),
    "image_size": (tuple(DOMAIN_LOADERS), None),
    "domainnet_classes": (("domainnet",), "top10"),
}
_FIXED_DOMAINS = {"office_caltech10": OFFICE_CALTECH_DOMAINS, "officehome": OFFICEHOME_DOMAINS,
                  "domainnet": DOMAINNET_DOMAINS}
_DEFAULT_SIZE = {"mini_imagenet": 84}


def parse_corruptions(source: str, text: str) -> tuple[str, ...]:
    """The corruption names of `text` ("a,b,c"; empty = the source's default set)."""
    if not text.strip():
        return FEDL2P_CORRUPTIONS if source == "cifar10c" else DEFAULT_CORRUPTIONS
    names = tuple(part.strip() for part in text.split(","))
    if source == "cifar10c":
        bad = [n for n in names if n not in CIFAR10C_CORRUPTIONS]
        if bad or len(set(names)) != len(names):
            raise DataError(f"cifar10c: corruptions must be distinct names of the release's files "
                            f"({', '.join(CIFAR10C_CORRUPTIONS)}); got {text!r}")
    else:
        check_corruptions(names, source)
    return names


def check_options(name: str, **options: Any) -> None:
    """A DataError naming the first option that `name` does not take, or a bad value."""
    if name not in SOURCES:
        raise DataError(f"unknown dataset {name!r}; allowed: {', '.join(SOURCES)}")
    for option, value in options.items():
        users, default = OPTIONS[option]
        if value != default and name not in users:
            raise DataError(f"{option}={value!r} does not apply to dataset {name!r}; it applies to "
                            f"{', '.join(users)} (leave it at {default!r})")
    if name in _CORRUPTED:
        parse_corruptions(name, options.get("corruptions", ""))
    if options.get("domainnet_classes", "top10") not in DOMAINNET_CLASSES:
        raise DataError(f"domainnet_classes={options['domainnet_classes']!r}; allowed: {', '.join(DOMAINNET_CLASSES)}")


def check_clients(name: str, corruptions: str, partition: str, num_clients: int, unseen_clients: int = 0,
                  unseen_domains: str = "") -> None:
    """A DataError if the clients asked for do not fit the source's domains: a domain partition
    on a source without domains, `domain` with num_clients != #domains, `domain_dirichlet` with
    a number of clients that the domains cannot share equally, unseen domains it does not have or
    hold-outs that leave no client to train."""
    domains = source_domains(name, corruptions)
    if partition in DOMAIN_PARTITIONS:
        if not domains:
            raise DataError(f"partition={partition!r} needs a dataset made of domains (one of "
                            f"{', '.join(d for d in SOURCES if source_domains(d))}); {name!r} has none")
        if partition == "domain" and num_clients != len(domains):
            raise DataError(f"partition='domain' gives one client per domain: num_clients={num_clients} "
                            f"must be {len(domains)} ({', '.join(domains)})")
        if partition == "domain_dirichlet" and num_clients % len(domains):
            raise DataError(f"partition='domain_dirichlet' gives each of the {len(domains)} domains of {name} the "
                            f"same number of clients: num_clients={num_clients} must be a multiple of {len(domains)}")
    held = [d.strip() for d in unseen_domains.split(",") if d.strip()]
    left = num_clients
    if held:
        if partition not in DOMAIN_PARTITIONS:
            raise DataError(f"unseen_domains={unseen_domains!r} needs a domain partition "
                            f"({', '.join(DOMAIN_PARTITIONS)}), not partition={partition!r}")
        if any(d not in domains for d in held) or len(set(held)) != len(held):
            raise DataError(f"unseen_domains={unseen_domains!r}: distinct names of {name}'s domains "
                            f"({', '.join(domains)}) expected")
        if len(held) == len(domains):
            raise DataError(f"unseen_domains={unseen_domains!r} holds out every domain; no client is left to train")
        left -= num_clients // len(domains) * len(held)
    if unseen_clients >= left:
        raise DataError(f"unseen_clients={unseen_clients} leaves no client to train (num_clients={num_clients}"
                        + (f", of which {num_clients - left} in unseen domains)" if held else ")"))


def source_domains(name: str, corruptions: str = "") -> tuple[str, ...]:
    """The domain names of a source, without reading any data (() for a single-domain source)."""
    if name in _CORRUPTED:
        return parse_corruptions(name, corruptions)
    return tuple(_FIXED_DOMAINS.get(name, ()))


def input_shape_of(name: str, image_size: int | None = None) -> tuple[int, int, int]:
    """``(C, H, W)`` of a source's images, without loading any data."""
    check_options(name, image_size=image_size)
    if name in INPUT_SHAPES:
        return INPUT_SHAPES[name]
    if name in CORRUPTED_SOURCES:
        return INPUT_SHAPES[name.removesuffix("_c")]
    size = image_size or _DEFAULT_SIZE.get(name, 32)
    return 3, size, size


def load_source(name: str, data_root: str | os.PathLike | None = None, download: bool = False, *,
                corruptions: str = "", severity: int = DEFAULT_SEVERITY, image_size: int | None = None,
                domainnet_classes: str = "top10") -> Dataset:
    """Load dataset ``name`` (one of :data:`SOURCES`) with its options (module docstring).

    ``data_root`` is used by the file-based sources (default ``$FL_DATA_ROOT`` or ``./data``);
    ``download`` lets torchvision fetch mnist/fmnist/cifar10 (and mnist_c's MNIST, fmnist_c's
    Fashion-MNIST) into it.
    """
    check_options(name, corruptions=corruptions, severity=severity, image_size=image_size,
                  domainnet_classes=domainnet_classes)
    if name in BASE_SOURCES:
        return load_base(name, data_root, download)
    if name in CORRUPTED_SOURCES:
        root = None if data_root is None else str(data_root)
        return load_corrupted(name, parse_corruptions(name, corruptions), severity, root, download)
    from .sources import default_data_root

    root = data_root if data_root is not None else default_data_root()
    size = {"image_size": image_size} if image_size is not None else {}
    if name == "cifar10c":
        return DOMAIN_LOADERS[name](root, corruptions=parse_corruptions(name, corruptions), severity=severity, **size)
    if name == "domainnet":
        return DOMAIN_LOADERS[name](root, top_classes=10 if domainnet_classes == "top10" else None, **size)
    return DOMAIN_LOADERS[name](root, **size)
