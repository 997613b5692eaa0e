"""Per-client tensors: load a source, partition it, slice out each client's data.

The result is built once per trial (on CPU) and moved to the trial's device with
:meth:`FederatedData.to`; training then indexes these tensors directly, without a
DataLoader per client per round.

Splits are not stored on disk: every load partitions afresh (milliseconds). The only disk cache
under the data (`$FL_CACHE_DIR`, default ~/.cache/fl_core) holds the digits source arrays
(fl_core/data/sources.py, keyed by scikit-learn version), which no partition change touches.
A cache of splits added later must put `partition.PARTITION_VERSION` in its key.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from .domain_partition import DOMAIN_PARTITIONS, DomainSplit, domain_partition
from .partition import partition as make_partition
from .catalog import load_source
from .sources import DataError


@dataclass
class ClientData:
    """One client's train, validation and test tensors (validation is empty unless the run
    holds out `val_fraction` of each client's training samples)."""

    x_train: torch.Tensor
    y_train: torch.Tensor
    x_test: torch.Tensor
    y_test: torch.Tensor
    x_val: torch.Tensor | None = None
    y_val: torch.Tensor | None = None

    def __post_init__(self) -> None:
        if self.x_val is None:
            self.x_val = self.x_train[:0]
            self.y_val = self.y_train[:0]

    @property
    def n_train(self) -> int:
        return int(self.y_train.shape[0])

    @property
    def n_val(self) -> int:
        return int(self.y_val.shape[0])

    @property
    def n_test(self) -> int:
        return int(self.y_test.shape[0])

    def to(self, device) -> "ClientData":
        """A copy with all tensors on ``device`` (to a GPU: once, from page-locked memory without
        waiting, so that a run's data then stay on the device and no batch is copied again)."""
        return ClientData(*(moved(t, device) for t in (self.x_train, self.y_train, self.x_test, self.y_test,
                                                        self.x_val, self.y_val)))


def moved(t: torch.Tensor, device) -> torch.Tensor:
    """`t` on `device`; a CPU tensor bound for a CUDA device goes through page-locked memory,
    asynchronously (the copy is ordered before any later work on the device's stream)."""
    device = torch.device(device)
    if device.type == "cuda" and t.device.type == "cpu":
        return t.pin_memory().to(device, non_blocking=True)
    return t.to(device)


@dataclass
class FederatedData:
    """All clients' data plus the realised per-client label histograms."""

    clients: list[ClientData]
    num_classes: int
    input_shape: tuple[int, int, int]
    train_hist: np.ndarray  # (num_clients, num_classes) int64 train label counts (validation excluded)
    test_hist: np.ndarray  # (num_clients, num_classes) int64 test label counts
    val_hist: np.ndarray | None = None  # (num_clients, num_classes) int64 validation label counts
    # A source made of domains: their names and each client's (domain, label) train counts,
    # (num_clients, num_domains, num_classes); None for a single-domain source.
    domains: tuple[str, ...] = ()
    domain_hist: np.ndarray | None = None
    # Clients held out of training (`unseen_clients`, `unseen_domains`), sorted; scored as newcomers.
    unseen: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if self.val_hist is None:
            self.val_hist = np.zeros_like(self.train_hist)

    def client_domain(self, k: int) -> str | None:
        """The domain client k trains on; None without domains or when its data mix several."""
        if self.domain_hist is None:
            return None
        held = np.flatnonzero(self.domain_hist[k].sum(axis=1))
        return self.domains[int(held[0])] if len(held) == 1 else None

    def pool(self, k: int) -> str:
        """`seen` (trains) or `unseen` (held out, scored after the last round)."""
        return "unseen" if k in self.unseen else "seen"

    def to(self, device) -> "FederatedData":
        """A copy with every client's tensors on ``device`` (histograms are shared)."""
        return FederatedData([c.to(device) for c in self.clients], self.num_classes,
                             self.input_shape, self.train_hist, self.test_hist, self.val_hist,
                             self.domains, self.domain_hist, self.unseen)


def load_data(config) -> FederatedData:
    """The data of a run: `config.data_spec()` (the data knobs of fl_core/config.py) decides it."""
    return build_federated_data(**config.data_spec())


def split_validation(n: int, fraction: float, seed: int, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Positions (train, validation) of a client's n training samples: a seeded random
    ⌊fraction·n⌋ (at least 1 when fraction > 0 and n >= 2) become validation."""
    n_val = int(np.floor(fraction * n))
    if fraction > 0 and n >= 2:
        n_val = min(max(n_val, 1), n - 1)
    order = np.random.default_rng([seed, k, 0x7A1]).permutation(n)
    return np.sort(order[n_val:]), np.sort(order[:n_val])


def build_federated_data(*, dataset: str, num_clients: int, partition: str, seed: int,
                         shards_per_client: int = 2, dir_alpha: float = 0.5,
                         samples_per_client: int | None = None,
                         test_samples_per_client: int | None = None,
                         min_samples: int = 10, val_fraction: float = 0.0, data_root=None,
                         download: bool = False, equal_domains: bool = False, corruptions: str = "",
                         severity: int = 3, image_size: int | None = None,
                         domainnet_classes: str = "top10", unseen_clients: int = 0,
                         unseen_domains: str = "") -> FederatedData:
    """Load ``dataset``, split it with scheme ``partition`` and return per-client tensors.

    With ``val_fraction`` > 0 each client's training indices (after partition and caps) are split
    once more into train and validation (`split_validation`); with 0 nothing changes. A source
    made of domains takes the domain partitions (`domain_partition.py`: each client one domain)
    or any label partition of its pooled samples (clients then mix domains). The source options
    (`corruptions`, `severity`, `image_size`, `domainnet_classes`) are those of
    `fl_core.data.catalog`. `unseen_domains` holds out every client of those domains,
    `unseen_clients` a seeded sample of the other clients (`held_out`).
    """
    data = load_source(dataset, data_root=data_root, download=download, corruptions=corruptions,
                       severity=severity, image_size=image_size, domainnet_classes=domainnet_classes)
    y_train, y_test = data.y_train.numpy(), data.y_test.numpy()
    if partition in DOMAIN_PARTITIONS:
        if not data.domains:
            raise DataError(f"partition={partition!r} needs a source made of domains; {dataset!r} has none")
        splits = domain_partition(
            y_train, y_test, data.d_train.numpy(), data.d_test.numpy(), scheme=partition, num_clients=num_clients,
            num_domains=len(data.domains), seed=seed, num_classes=data.num_classes, dir_alpha=dir_alpha,
            samples_per_client=samples_per_client, test_samples_per_client=test_samples_per_client,
            min_samples=min_samples, equalize_domains=equal_domains)
    else:
        splits = make_partition(
            y_train, y_test, scheme=partition, num_clients=num_clients, seed=seed,
            num_classes=data.num_classes, shards_per_client=shards_per_client,
            dir_alpha=dir_alpha, samples_per_client=samples_per_client,
            test_samples_per_client=test_samples_per_client, min_samples=min_samples)

    clients, train_idx, val_idx = client_tensors(data, splits, val_fraction, seed)

    def hist(y, indices):
        return np.stack([np.bincount(y[i], minlength=data.num_classes) for i in indices]).astype(np.int64)

    domain_hist = None
    if data.domains:  # (domain, label) train counts per client
        joint = data.d_train.numpy() * data.num_classes + y_train
        size = len(data.domains) * data.num_classes
        domain_hist = np.stack([np.bincount(joint[i], minlength=size) for i in train_idx]).astype(np.int64)
        domain_hist = domain_hist.reshape(len(splits), len(data.domains), data.num_classes)
    client_domains = [data.domains[s.domain] if isinstance(s, DomainSplit) else None for s in splits]
    unseen = held_out(client_domains, unseen_clients, unseen_domains, seed)
    return FederatedData(clients, data.num_classes, data.input_shape, hist(y_train, train_idx),
                         hist(y_test, [s.test for s in splits]), hist(y_train, val_idx), data.domains, domain_hist,
                         unseen)


def client_tensors(data, splits, val_fraction: float, seed: int) -> tuple[list[ClientData], list, list]:
    """Each client's tensors (its validation split cut from its training indices when
    `val_fraction` > 0, `split_validation`), with the train and validation indices per client."""
    clients, train_idx, val_idx = [], [], []
    for k, split in enumerate(splits):
        train, val = split.train, split.train[:0]
        if val_fraction > 0:
            keep, held = split_validation(len(split.train), val_fraction, seed, k)
            train, val = split.train[keep], split.train[held]
        train_idx.append(train)
        val_idx.append(val)
        tr, va, te = torch.from_numpy(train), torch.from_numpy(val), torch.from_numpy(split.test)
        # Advanced indexing copies, so every client owns contiguous tensors.
        clients.append(ClientData(data.x_train[tr], data.y_train[tr], data.x_test[te], data.y_test[te],
                                  data.x_train[va], data.y_train[va]))
    return clients, train_idx, val_idx


def held_out(client_domains: list[str | None], unseen_clients: int, unseen_domains: str, seed: int) -> tuple[int, ...]:
    """The unseen clients: every client of a domain in `unseen_domains` (comma-separated), then a
    sample of `unseen_clients` of the others drawn with (seed, 0x5EE) (independent of training)."""
    names = {d.strip() for d in unseen_domains.split(",") if d.strip()}
    by_domain = [k for k, d in enumerate(client_domains) if d in names]
    rest = [k for k in range(len(client_domains)) if k not in by_domain]
    if unseen_clients > len(rest) - 1:
        raise DataError(f"unseen_clients={unseen_clients} leaves no client to train ({len(rest)} outside unseen "
                        f"domains)")
    sample = (np.random.default_rng([seed, 0x5EE]).choice(rest, size=unseen_clients, replace=False)
              if unseen_clients else [])
    return tuple(sorted({*by_domain, *(int(k) for k in sample)}))
