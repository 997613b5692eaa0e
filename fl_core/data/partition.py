"""Partitioners: labels + seed + parameters -> per-client train/test index arrays.

Pure numpy and deterministic given ``seed``. Schemes:

* ``shards``     each client holds exactly ``shards_per_client`` distinct classes; every
                 class is held by as equal a number of clients as possible, and its train
                 samples are split evenly among them.
* ``dirichlet``  per class, proportions over clients ~ Dir(dir_alpha * 1) (Hsu et al. 2019),
                 redrawn until every client has at least ``min_samples`` train samples.
* ``iid``        a random permutation split evenly.

After the scheme, ``samples_per_client`` optionally caps each train set (keeping its class
proportions). Each client's test set then follows its train label distribution: the test
samples of class c are divided disjointly among the clients holding c, in proportion to
their train counts of c, and optionally capped by ``test_samples_per_client``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .sources import DataError

PARTITIONS = ("shards", "dirichlet", "iid")

_DIRICHLET_TRIES = 100  # redraws before a dirichlet request is declared impossible
_SHARD_DEAL_TRIES = 20  # random class deals tried to avoid clients with identical classes
_SHARD_TIE_TRIES = 10  # random tie-breaks tried per client to find an unused class set


@dataclass(frozen=True)
class ClientSplit:
    """One client's sorted int64 indices into the train and the test set."""

    train: np.ndarray
    test: np.ndarray


def partition(y_train: np.ndarray, y_test: np.ndarray, *, scheme: str, num_clients: int,
              seed: int, num_classes: int, shards_per_client: int = 2,
              dir_alpha: float = 0.5, samples_per_client: int | None = None,
              test_samples_per_client: int | None = None,
              min_samples: int = 10) -> list[ClientSplit]:
    """Split train and test labels among ``num_clients`` clients (see module docstring)."""
    y_train = _check_labels(y_train, num_classes, "y_train")
    y_test = _check_labels(y_test, num_classes, "y_test")
    if scheme not in PARTITIONS:
        raise DataError(f"unknown partition scheme {scheme!r}; allowed: {', '.join(PARTITIONS)}")
    if num_clients < 1:
        raise DataError(f"num_clients must be >= 1, got {num_clients}")
    for name, cap in (("samples_per_client", samples_per_client),
                      ("test_samples_per_client", test_samples_per_client)):
        if cap is not None and cap < 1:
            raise DataError(f"{name} must be >= 1 (or None for no cap), got {cap}")

    rng = np.random.default_rng(seed)
    if scheme == "shards":
        train = _shards(y_train, num_clients, num_classes, shards_per_client, rng)
    elif scheme == "dirichlet":
        train = _dirichlet(y_train, num_clients, num_classes, dir_alpha, min_samples, rng)
    else:
        train = _iid(len(y_train), num_clients, rng)

    if samples_per_client is not None:
        train = [_cap(idx, y_train, num_classes, samples_per_client, rng) for idx in train]
    test = _follow_train(y_train, y_test, train, num_classes, rng)
    if test_samples_per_client is not None:
        test = [_cap(idx, y_test, num_classes, test_samples_per_client, rng) for idx in test]
    for k, idx in enumerate(test):
        if len(idx) == 0:
            raise DataError(f"client {k} of num_clients={num_clients} would get an empty test "
                            f"set ({len(train[k])} train samples, {len(y_test)} test samples "
                            f"in all); use fewer clients or a larger test set")
    return [ClientSplit(np.sort(tr).astype(np.int64), np.sort(te).astype(np.int64))
            for tr, te in zip(train, test)]


def apportion(total: int, weights: np.ndarray) -> np.ndarray:
    """Split integer ``total`` in proportion to ``weights`` by largest-remainder rounding.

    The result sums to ``total`` exactly; ties in the remainders go to the lower index.
    """
    weights = np.asarray(weights, dtype=np.float64)
    if total <= 0 or weights.sum() <= 0:
        return np.zeros(len(weights), dtype=np.int64)
    quotas = total * weights / weights.sum()
    counts = np.floor(quotas).astype(np.int64)
    short = total - int(counts.sum())
    order = np.argsort(-(quotas - counts), kind="stable")
    counts[order[:short]] += 1
    return counts


def _check_labels(y, num_classes: int, name: str) -> np.ndarray:
    y = np.asarray(y)
    if y.ndim != 1 or not np.issubdtype(y.dtype, np.integer):
        raise DataError(f"{name} must be a 1-D integer label array, got {y.dtype} {y.shape}")
    if num_classes < 1:
        raise DataError(f"num_classes must be >= 1, got {num_classes}")
    if y.size and (y.min() < 0 or y.max() >= num_classes):
        raise DataError(f"{name} holds labels {y.min()}..{y.max()}, outside "
                        f"0..{num_classes - 1} for num_classes={num_classes}")
    return y.astype(np.int64)


# ---------------------------------------------------------------- schemes

def _iid(n: int, num_clients: int, rng: np.random.Generator) -> list[np.ndarray]:
    if n < num_clients:
        raise DataError(f"iid partition: {n} train samples cannot give each of "
                        f"num_clients={num_clients} clients a sample")
    return np.array_split(rng.permutation(n), num_clients)


def deal_classes(num_clients: int, num_classes: int, per_client: int,
                 rng: np.random.Generator) -> list[np.ndarray]:
    """Give each client ``per_client`` distinct classes, class usage balanced within 1.

    Greedy: every client takes the least-used classes, ties broken at random (which
    keeps usage counts within 1 of each other); a few tie-breaks are tried per client to
    find a class set no earlier client has. Several whole deals are tried; the first
    without repeated class sets wins (else the one with the fewest repeats).
    """
    best, best_repeats = None, None
    for _ in range(_SHARD_DEAL_TRIES):
        usage = np.zeros(num_classes, dtype=np.int64)
        deal, seen = [], set()
        for _k in range(num_clients):
            for _tie in range(_SHARD_TIE_TRIES):
                # Sort by usage, random tie-break: lexsort's last key is the primary one.
                order = np.lexsort((rng.random(num_classes), usage))
                chosen = np.sort(order[:per_client])
                if tuple(chosen) not in seen:
                    break
            usage[chosen] += 1
            deal.append(chosen)
            seen.add(tuple(chosen))
        repeats = num_clients - len(seen)
        if best is None or repeats < best_repeats:
            best, best_repeats = deal, repeats
        if repeats == 0:
            break
    return best


def _shards(y: np.ndarray, num_clients: int, num_classes: int, per_client: int,
            rng: np.random.Generator) -> list[np.ndarray]:
    if not 1 <= per_client <= num_classes:
        raise DataError(f"shards_per_client must lie in 1..num_classes={num_classes}, "
                        f"got {per_client}")
    deal = deal_classes(num_clients, num_classes, per_client, rng)
    parts: list[list[np.ndarray]] = [[] for _ in range(num_clients)]
    for c in range(num_classes):
        holders = [k for k, classes in enumerate(deal) if c in classes]
        if not holders:
            continue
        idx = rng.permutation(np.flatnonzero(y == c))
        if len(idx) < len(holders):
            raise DataError(f"class {c} has only {len(idx)} train samples but "
                            f"{len(holders)} clients hold it (num_clients={num_clients}, "
                            f"shards_per_client={per_client}); use fewer clients or shards")
        for k, piece in zip(holders, np.array_split(idx, len(holders))):
            parts[k].append(piece)
    return [np.concatenate(p) for p in parts]


def _dirichlet(y: np.ndarray, num_clients: int, num_classes: int, alpha: float,
               min_samples: int, rng: np.random.Generator) -> list[np.ndarray]:
    """Hsu et al. 2019: per class, client proportions ~ Dir(alpha); redraw until every
    client has at least ``min_samples`` (and never fewer than 1) train samples."""
    if not alpha > 0:
        raise DataError(f"dir_alpha must be > 0, got {alpha}")

    def impossible(why: str) -> DataError:
        return DataError(
            f"dirichlet partition cannot give each of num_clients={num_clients} clients at "
            f"least min_samples={min_samples} train samples with dir_alpha={alpha} ({why}); "
            f"lower num_clients or min_samples, or raise dir_alpha")

    if num_clients * max(min_samples, 1) > len(y):
        raise impossible(f"only {len(y)} train samples in all")
    by_class = [np.flatnonzero(y == c) for c in range(num_classes)]
    for _ in range(_DIRICHLET_TRIES):
        parts: list[list[np.ndarray]] = [[] for _ in range(num_clients)]
        for idx in by_class:
            idx = rng.permutation(idx)
            props = rng.dirichlet(np.full(num_clients, alpha))
            cuts = (np.cumsum(props)[:-1] * len(idx)).astype(np.int64)
            for k, piece in enumerate(np.split(idx, cuts)):
                parts[k].append(piece)
        sizes = [sum(len(p) for p in ps) for ps in parts]
        if min(sizes) >= max(min_samples, 1):
            return [np.concatenate(ps) for ps in parts]
    raise impossible(f"no draw out of {_DIRICHLET_TRIES} did")


# ---------------------------------------------------------------- caps and test sets

def _cap(idx: np.ndarray, y: np.ndarray, num_classes: int, cap: int,
         rng: np.random.Generator) -> np.ndarray:
    """At most ``cap`` of ``idx``, keeping the class proportions (largest remainder)."""
    if len(idx) <= cap:
        return idx
    labels = y[idx]
    quota = apportion(cap, np.bincount(labels, minlength=num_classes))
    kept = [rng.choice(idx[labels == c], size=q, replace=False)
            for c, q in enumerate(quota) if q > 0]
    return np.concatenate(kept)


def _follow_train(y_train: np.ndarray, y_test: np.ndarray, train: list[np.ndarray],
                  num_classes: int, rng: np.random.Generator) -> list[np.ndarray]:
    """Divide each class's test samples among its holders, in proportion to train counts."""
    hist = np.stack([np.bincount(y_train[idx], minlength=num_classes) for idx in train])
    parts: list[list[np.ndarray]] = [[] for _ in train]
    for c in range(num_classes):
        if hist[:, c].sum() == 0:
            continue  # nobody holds class c: its test samples stay unused
        idx = rng.permutation(np.flatnonzero(y_test == c))
        counts = apportion(len(idx), hist[:, c])
        for k, piece in enumerate(np.split(idx, np.cumsum(counts)[:-1])):
            parts[k].append(piece)
    return [np.concatenate(p) if p else np.zeros(0, np.int64) for p in parts]
