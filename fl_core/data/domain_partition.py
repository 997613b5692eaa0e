"""Partitions of a multi-domain source (feature shift): every client holds data of one domain.

* ``domain``            one client per domain (``num_clients`` must equal the number of
                        domains), holding the domain's whole train set (FedBN's and FedSelect's
                        OfficeHome setting: 4 domains, 4 clients).
* ``domain_dirichlet``  n = num_clients / #domains clients per domain; each domain's train set
                        is split among its n clients by the papers' ``dirichlet`` scheme (equal
                        client sizes, class mix ~ Dir(dir_alpha)), as FedL2P's CIFAR-10-C
                        (10 corruptions x 25 clients) and DomainNet (6 x 25) settings.

Both reuse `fl_core.data.partition.partition` inside each domain, with the domain's own
labels, so everything said there holds per domain: ``samples_per_client`` caps, and each
client's test set is drawn from **its own domain's** test pool and follows its train label
mix (one common test/train ratio within a domain). Clients are numbered domain by domain
(clients 0..n-1 hold domain 0, and so on); each domain's split has its own seed derived from
(seed, domain), so adding a domain never changes the others' clients.

``equalize_domains`` (FedL2P): before splitting, every domain's train set is cut to the size of
the smallest one (a seeded random subset, class proportions left to chance), so that no domain
weighs more in FedAvg's sample-weighted average. Test pools are left whole.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .partition import partition
from .sources import DataError

DOMAIN_PARTITIONS = ("domain", "domain_dirichlet")


@dataclass(frozen=True)
class DomainSplit:
    """Indices of one client into the whole source's train and test arrays, and its domain."""

    train: np.ndarray  # int64, sorted
    test: np.ndarray   # int64, sorted
    domain: int


def domain_seed(seed: int, domain: int) -> int:
    """An independent, reproducible seed for one domain's split."""
    return int(np.random.SeedSequence([seed, domain, 0xD0]).generate_state(1)[0])


def domain_partition(y_train: np.ndarray, y_test: np.ndarray, d_train: np.ndarray, d_test: np.ndarray, *,
                     scheme: str, num_clients: int, num_domains: int, seed: int, num_classes: int,
                     dir_alpha: float = 0.5, samples_per_client: int | None = None,
                     test_samples_per_client: int | None = None, min_samples: int = 10,
                     equalize_domains: bool = False) -> list[DomainSplit]:
    """Split a multi-domain source among ``num_clients`` clients (see the module docstring)."""
    if scheme not in DOMAIN_PARTITIONS:
        raise DataError(f"unknown domain partition {scheme!r}; allowed: {', '.join(DOMAIN_PARTITIONS)}")
    if num_domains < 1:
        raise DataError(f"partition={scheme!r} needs a source made of domains (e.g. mnist_c); this one has none")
    if scheme == "domain" and num_clients != num_domains:
        raise DataError(f"partition='domain' gives one client per domain: num_clients={num_clients} must equal the "
                        f"number of domains ({num_domains})")
    if scheme == "domain_dirichlet" and num_clients % num_domains:
        raise DataError(f"partition='domain_dirichlet' gives each of the {num_domains} domains the same number of "
                        f"clients: num_clients={num_clients} must be a multiple of {num_domains}")
    d_train, d_test = np.asarray(d_train), np.asarray(d_test)
    if d_train.shape != np.shape(y_train) or d_test.shape != np.shape(y_test):
        raise DataError("every train and test sample needs a domain index")
    per_domain = num_clients // num_domains
    pools = [np.flatnonzero(d_train == d) for d in range(num_domains)]
    tests = [np.flatnonzero(d_test == d) for d in range(num_domains)]
    empty = [d for d in range(num_domains) if len(pools[d]) == 0 or len(tests[d]) == 0]
    if empty:
        raise DataError(f"domain {empty[0]} has no train or no test samples")
    if equalize_domains:
        smallest = min(len(p) for p in pools)
        pools = [np.sort(np.random.default_rng(domain_seed(seed, d)).choice(p, smallest, replace=False))
                 if len(p) > smallest else p for d, p in enumerate(pools)]
    splits = []
    for d in range(num_domains):
        inner = "iid" if scheme == "domain" else "dirichlet"
        try:
            local = partition(y_train[pools[d]], y_test[tests[d]], scheme=inner, num_clients=per_domain,
                              seed=domain_seed(seed, d), num_classes=num_classes, dir_alpha=dir_alpha,
                              samples_per_client=samples_per_client, test_samples_per_client=test_samples_per_client,
                              min_samples=min_samples)
        except DataError as err:
            raise DataError(f"domain {d}: {err}") from None
        splits += [DomainSplit(pools[d][s.train], tests[d][s.test], d) for s in local]
    return splits
