"""Partitioners: labels + seed + parameters -> per-client train/test index arrays.

Pure numpy and deterministic given ``seed``. Train schemes:

* ``shards``           each client holds exactly ``shards_per_client`` distinct classes;
                       every class is held by as equal a number of clients as possible, and
                       its train samples are split evenly among them.
* ``dirichlet``        the papers' label skew (Hsu et al. 2019; the split used by FedL2P and
                       DisPFL): every client gets the same number n of train samples, and its
                       class mix is drawn per client, q_k ~ Dir(dir_alpha * 1). See below.
* ``dirichlet_class``  the per-class variant, in the style of Yurochkin et al. 2019 and
                       Wang et al. 2020 (FedMA's ``hetero-dir``, without its rule that skips
                       clients already above N/num_clients): for each class, shares over the
                       clients ~ Dir(dir_alpha * 1), so client sizes vary; the whole draw is
                       repeated until every client has at least ``min_samples`` train
                       samples. This was the meaning of ``dirichlet`` before issue 14.
* ``iid``              a random permutation split evenly.

``dirichlet`` in detail. n = floor(N_train / num_clients), lowered to
``samples_per_client`` when that is given (the cap is drawn directly, not cut from a larger
draw); n below ``min_samples`` is an error. Clients are filled one at a time, in a seeded
random order (so that no fixed client index gets the leftovers), from per-class pools
shuffled once. Client k draws q_k ~ Dir(dir_alpha * 1)
and asks for ``apportion(n, q_k)`` samples per class (largest-remainder rounding, so every
class count is within 1 of n * q_kc). If a class pool holds fewer samples than asked, the
client takes what is left of it, and the shortfall is apportioned again by q_k renormalised
over the classes that still have samples (by the remaining pool sizes should q_k put no
weight on any of them); this repeats until the client has exactly n samples, which is
always possible because num_clients * n <= N_train. Without shortage (e.g. under a cap
well below the pools, as MNIST with 100 per client) every client's mix is exactly the
rounded Dir draw; when n uses nearly all the data, the clients filled last take what the
others left, so their mixes follow the leftovers rather than a fresh Dir draw.

After the scheme, ``samples_per_client`` caps each train set that is still larger,
keeping its class proportions (largest remainder; ``dirichlet`` is never cut here).

Test sets follow each client's own train label mix. A client k with train label counts
h_k (n_k samples in all) gets a test set of m_k = min(test_samples_per_client,
floor(lambda * n_k)) samples (no cap when ``test_samples_per_client`` is None), one
common lambda for all clients, so test sizes are proportional to train sizes (equal when
train sizes are equal). Its test label counts are ``apportion(m_k, h_k)``. lambda is the
largest value a bisection finds for which, for every class, the clients' summed demand
fits the class's test pool (largest-remainder rounding is not monotone in the total, so a
slightly larger lambda could fit too; feasibility is what is guaranteed). Each pool is then
shuffled and cut into disjoint pieces. So test samples are drawn without replacement, the
scarcest class (relative to its demand) decides the test sizes, and the test samples left
over stay unused (with the whole train set in use and a stratified test set, only a
rounding remainder: 538 of digits' 540 for 5 clients of 2 shards). A class that some
client holds for training but that has no test sample at all is left out of the mixes the
test sets follow (it could never be matched).

Tolerance. With largest-remainder rounding every test class count is floor or ceil of its
exact quota m_k * h_kc / n_k, the quotas rounded up being those with the largest
fractional parts (all of them positive). The total variation distance between a client's
train and test label distributions is the sum of the upward roundings divided by m_k, and
also the sum of the downward ones divided by m_k; with H_k classes in the client's train
set (those with test samples) and s_k of them rounded up, it is below min(s_k, H_k - s_k) / m_k, hence

    TV(train_k, test_k) <= floor(H_k / 2) / m_k       (0 when every quota is whole).

Under the previous rule (each class's whole test pool divided among its holders in
proportion to their train counts) a rarely held class was over-represented in its
holders' test sets whenever training was capped (MNIST, Dir(0.1), 100 per client: mean TV
about 0.09, max up to 0.20).

A client left with an empty test set is an error.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .sources import DataError

PARTITIONS = ("shards", "dirichlet", "dirichlet_class", "iid")
# The meaning of the splits: raise it whenever some scheme gives other indices for the same
# inputs. Version 2 (issue 14): `dirichlet` became the papers' equal-size split (the old one is
# `dirichlet_class`) and test sets follow each client's own train mix. Anything that stores
# splits must key them on it.
PARTITION_VERSION = 2

_DIRICHLET_TRIES = 100  # dirichlet_class: redraws before a request is declared impossible
_SHARD_DEAL_TRIES = 20  # random class deals tried to avoid clients with identical classes
_SHARD_TIE_TRIES = 10  # random tie-breaks tried per client to find an unused class set
_BISECTION_STEPS = 60  # test sizes: bisection steps on the common ratio lambda


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
    if scheme in ("dirichlet", "dirichlet_class"):
        _check_alpha(dir_alpha)

    rng = np.random.default_rng(seed)
    if scheme == "shards":
        train = _shards(y_train, num_clients, num_classes, shards_per_client, rng)
    elif scheme == "dirichlet":
        train = _dirichlet(y_train, num_clients, num_classes, dir_alpha, min_samples,
                           samples_per_client, rng)
    elif scheme == "dirichlet_class":
        train = _dirichlet_class(y_train, num_clients, num_classes, dir_alpha, min_samples, rng)
    else:
        train = _iid(len(y_train), num_clients, rng)

    if samples_per_client is not None:
        train = [_cap(idx, y_train, num_classes, samples_per_client, rng) for idx in train]
    test = _follow_train(y_train, y_test, train, num_classes, test_samples_per_client, rng)
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


def apportion_rows(totals: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """`apportion` applied to every row: row k splits ``totals[k]`` by ``weights[k]``.

    Gives exactly what a loop over `apportion` would (same arithmetic, same tie rule).
    """
    totals = np.asarray(totals, dtype=np.int64)
    weights = np.asarray(weights, dtype=np.float64)
    sums = weights.sum(axis=1, keepdims=True)
    live = (totals > 0) & (sums[:, 0] > 0)
    quotas = np.where(live[:, None], totals[:, None] * weights / np.where(sums > 0, sums, 1), 0.0)
    counts = np.floor(quotas).astype(np.int64)
    short = np.where(live, totals - counts.sum(axis=1), 0)
    order = np.argsort(-(quotas - counts), axis=1, kind="stable")
    rank = np.empty_like(order)
    np.put_along_axis(rank, order, np.arange(weights.shape[1])[None, :], axis=1)
    return counts + (rank < short[:, None])


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


def _check_alpha(alpha) -> None:
    try:
        ok = 0 < float(alpha) < np.inf
    except (TypeError, ValueError):
        ok = False
    if not ok:
        raise DataError(f"dir_alpha must be a finite number > 0, got {alpha!r}")


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
               min_samples: int, samples_per_client: int | None,
               rng: np.random.Generator) -> list[np.ndarray]:
    """The papers' split: equal client sizes, per-client class mix ~ Dir(alpha) (module
    docstring, "dirichlet in detail")."""
    whole = len(y) // num_clients
    if whole < max(min_samples, 1):
        raise DataError(f"dirichlet partition: {len(y)} train samples give each of "
                        f"num_clients={num_clients} clients only {whole}, below "
                        f"min_samples={min_samples}; lower num_clients or min_samples")
    n = whole if samples_per_client is None else min(whole, samples_per_client)
    pools = [rng.permutation(np.flatnonzero(y == c)) for c in range(num_classes)]
    used = np.zeros(num_classes, dtype=np.int64)  # samples of each pool already given out
    room_total = np.array([len(p) for p in pools], dtype=np.int64)
    parts: list[np.ndarray] = [np.zeros(0, np.int64)] * num_clients
    for k in rng.permutation(num_clients):
        mix = rng.dirichlet(np.full(num_classes, float(alpha)))
        take = np.zeros(num_classes, dtype=np.int64)
        need = n
        while need > 0:
            room = room_total - used - take
            if room.sum() < need:  # cannot happen: num_clients * n <= len(y)
                raise AssertionError("dirichlet partition: class pools exhausted")
            weights = np.where(room > 0, mix, 0.0)
            if not weights.sum() > 0:  # the mix puts no weight on any class still available
                weights = room.astype(np.float64)
            add = np.minimum(apportion(need, weights), room)
            take += add
            need -= int(add.sum())
        parts[k] = np.concatenate([pools[c][used[c]:used[c] + take[c]]
                                   for c in range(num_classes) if take[c] > 0])
        used += take
    return parts


def _dirichlet_class(y: np.ndarray, num_clients: int, num_classes: int, alpha: float,
                     min_samples: int, rng: np.random.Generator) -> list[np.ndarray]:
    """Per class, client shares ~ Dir(alpha), in the style of Yurochkin et al. 2019 and
    Wang et al. 2020; redraw until every client has at least ``min_samples`` (and never fewer than 1) train
    samples. Client sizes vary with the draw."""
    def impossible(why: str) -> DataError:
        return DataError(
            f"dirichlet_class partition cannot give each of num_clients={num_clients} clients "
            f"at least min_samples={min_samples} train samples with dir_alpha={alpha} ({why}); "
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


def follow_counts(train_hist: np.ndarray, test_pool: np.ndarray,
                cap: int | None) -> np.ndarray:
    """Per-client test label counts (clients x classes) under the common rule of the module
    docstring: m_k = min(cap, floor(lambda * n_k)), counts ``apportion(m_k, h_k)``, lambda
    the largest value bisection finds for which every class's summed demand fits its pool.

    ``train_hist`` holds the clients' train label counts; classes with an empty test pool
    are dropped from the mixes first.
    """
    hist = np.where(test_pool[None, :] > 0, train_hist, 0).astype(np.int64)
    sizes = hist.sum(axis=1)

    def demand(lam: float) -> np.ndarray:
        m = np.floor(lam * sizes).astype(np.int64)
        if cap is not None:
            m = np.minimum(m, cap)
        return apportion_rows(m, hist)

    def fits(lam: float) -> bool:
        return bool(np.all(demand(lam).sum(axis=0) <= test_pool))

    if sizes.max(initial=0) == 0:
        return np.zeros_like(hist)
    # Beyond `high` every client asks for its cap, or for more than the whole test set.
    high = (cap if cap is not None else int(test_pool.sum()) + 1) / sizes[sizes > 0].min()
    if fits(high):
        return demand(high)
    low = 0.0
    for _ in range(_BISECTION_STEPS):
        mid = 0.5 * (low + high)
        low, high = (mid, high) if fits(mid) else (low, mid)
    return demand(low)


def _follow_train(y_train: np.ndarray, y_test: np.ndarray, train: list[np.ndarray],
                  num_classes: int, cap: int | None,
                  rng: np.random.Generator) -> list[np.ndarray]:
    """Each client's test set, its label counts following its own train mix (`follow_counts`),
    drawn disjointly without replacement from shuffled class pools."""
    hist = np.stack([np.bincount(y_train[idx], minlength=num_classes) for idx in train])
    pool = np.bincount(y_test, minlength=num_classes)
    counts = follow_counts(hist, pool, cap)
    parts: list[list[np.ndarray]] = [[] for _ in train]
    for c in range(num_classes):
        if counts[:, c].sum() == 0:
            continue  # nobody asks for class c: its test samples stay unused
        idx = rng.permutation(np.flatnonzero(y_test == c))
        ends = np.cumsum(counts[:, c])
        for k, piece in enumerate(np.split(idx[:ends[-1]], ends[:-1])):
            parts[k].append(piece)
    return [np.concatenate(p) if p else np.zeros(0, np.int64) for p in parts]
