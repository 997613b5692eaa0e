"""Partitioners: sizes, class structure, determinism, distributions, error messages."""

import hashlib

import numpy as np
import pytest

from pathlib import Path

from fl_core.data import PARTITIONS, DataError, partition
from fl_core.data.partition import apportion, apportion_rows, deal_classes, follow_counts

C = 10
MNIST_RAW = Path(__file__).resolve().parents[2] / "shared" / "data" / "MNIST" / "raw"
# MNIST's class sizes (train, test), for MNIST-shaped synthetic labels.
MNIST_TRAIN = [5923, 6742, 5958, 6131, 5842, 5421, 5918, 6265, 5851, 5949]
MNIST_TEST = [980, 1135, 1032, 1010, 982, 892, 958, 1028, 974, 1009]


def labels(n, seed, num_classes=C):
    """A label array with every class present in roughly equal numbers, shuffled."""
    y = np.arange(n) % num_classes
    np.random.default_rng(seed).shuffle(y)
    return y


Y_TRAIN = labels(6000, 1)
Y_TEST = labels(1000, 2)


def split(scheme, num_clients=10, seed=0, y_train=Y_TRAIN, y_test=Y_TEST, **kw):
    return partition(y_train, y_test, scheme=scheme, num_clients=num_clients, seed=seed,
                     num_classes=C, **kw)


def hist(y, idx):
    return np.bincount(y[idx], minlength=C)


def tv(p, q):
    """Total-variation distance between two count vectors (normalised first)."""
    return 0.5 * np.abs(p / p.sum() - q / q.sum()).sum()


def with_counts(counts, seed):
    """A shuffled label array holding ``counts[c]`` samples of class c."""
    y = np.repeat(np.arange(len(counts)), counts)
    np.random.default_rng(seed).shuffle(y)
    return y


def tv_bound(train_hist, test_size):
    """The tolerance partition.py guarantees: floor(H/2) / m for H train classes, m test samples."""
    return (np.count_nonzero(train_hist) // 2) / test_size


def same(a, b):
    return all(np.array_equal(x.train, y.train) and np.array_equal(x.test, y.test)
               for x, y in zip(a, b))


@pytest.mark.parametrize("scheme", PARTITIONS)
def test_indices_disjoint_sorted_in_range(scheme):
    clients = split(scheme, num_clients=7)
    assert len(clients) == 7
    for side, n in (("train", len(Y_TRAIN)), ("test", len(Y_TEST))):
        arrays = [getattr(c, side) for c in clients]
        for a in arrays:
            assert a.dtype == np.int64 and len(a) > 0
            assert np.all(np.diff(a) > 0)  # sorted, no duplicates
            assert a.min() >= 0 and a.max() < n
        allidx = np.concatenate(arrays)
        assert len(np.unique(allidx)) == len(allidx)  # disjoint across clients


def test_iid_uses_everything_evenly():
    clients = split("iid", num_clients=7)
    sizes = [len(c.train) for c in clients]
    assert sum(sizes) == len(Y_TRAIN) and max(sizes) - min(sizes) <= 1


@pytest.mark.parametrize("num_clients,s", [(10, 2), (7, 3), (25, 2), (4, 10), (3, 1)])
def test_shards_class_structure(num_clients, s):
    clients = split("shards", num_clients=num_clients, shards_per_client=s)
    usage = np.zeros(C, dtype=int)
    for c in clients:
        train_classes = np.flatnonzero(hist(Y_TRAIN, c.train))
        assert len(train_classes) == s
        assert np.array_equal(np.flatnonzero(hist(Y_TEST, c.test)), train_classes)
        usage[train_classes] += 1
    used = usage[usage > 0] if num_clients * s < C else usage
    assert used.max() - used.min() <= 1  # classes dealt as evenly as possible
    # Each class's train samples are divided evenly (and fully) among its holders.
    for k in range(C):
        sizes = [hist(Y_TRAIN, c.train)[k] for c in clients if hist(Y_TRAIN, c.train)[k]]
        if sizes:
            assert sum(sizes) == np.sum(Y_TRAIN == k) and max(sizes) - min(sizes) <= 1


@pytest.mark.parametrize("seed", range(3))
def test_shards_avoid_identical_class_sets(seed):
    # 30 clients x 2 classes: each class held 6 times, 45 pairs exist, so no repeat needed.
    clients = split("shards", num_clients=30, shards_per_client=2, seed=seed)
    sets = {tuple(np.flatnonzero(hist(Y_TRAIN, c.train))) for c in clients}
    assert len(sets) == 30


def test_deal_classes_balanced_and_distinct():
    deal = deal_classes(13, 10, 4, np.random.default_rng(5))
    usage = np.bincount(np.concatenate(deal), minlength=10)
    assert usage.sum() == 52 and usage.max() - usage.min() <= 1
    assert all(len(set(d)) == 4 for d in deal)


@pytest.mark.parametrize("scheme", PARTITIONS)
def test_deterministic_given_seed(scheme):
    assert same(split(scheme, seed=3), split(scheme, seed=3))
    assert not same(split(scheme, seed=3), split(scheme, seed=4))


def test_dirichlet_class_min_size_respected():
    clients = split("dirichlet_class", num_clients=20, dir_alpha=0.1, min_samples=50)
    assert min(len(c.train) for c in clients) >= 50
    assert sum(len(c.train) for c in clients) == len(Y_TRAIN)


def test_dirichlet_class_is_the_old_dirichlet():
    # Pinned from `dirichlet` before issue 14 (same seed, same labels): dirichlet_class keeps
    # its train split exactly, sizes varying with the draw.
    clients = split("dirichlet_class", num_clients=10, dir_alpha=0.1)
    assert [len(c.train) for c in clients] == [477, 41, 1871, 1134, 156, 696, 722, 139, 403, 361]
    digest = hashlib.sha256(np.concatenate([c.train for c in clients]).tobytes()).hexdigest()
    assert digest[:16] == "af09a2fec37225cf"


@pytest.mark.parametrize("scheme", ["dirichlet", "dirichlet_class"])
def test_dirichlet_large_alpha_is_near_iid(scheme):
    glob = np.bincount(Y_TRAIN, minlength=C)
    for c in split(scheme, num_clients=5, dir_alpha=1e4):
        assert tv(hist(Y_TRAIN, c.train), glob) < 0.15


@pytest.mark.parametrize("scheme", ["dirichlet", "dirichlet_class"])
def test_dirichlet_small_alpha_is_skewed(scheme):
    glob = np.bincount(Y_TRAIN, minlength=C)
    clients = split(scheme, num_clients=10, dir_alpha=0.05)
    assert np.mean([tv(hist(Y_TRAIN, c.train), glob) for c in clients]) > 0.5
    # Most of each client's data comes from very few classes.
    top2 = [np.sort(hist(Y_TRAIN, c.train))[-2:].sum() / len(c.train) for c in clients]
    assert np.mean(top2) > 0.7


def check_papers_dirichlet(clients, n):
    """The papers' split: every client has exactly n train samples, drawn without replacement."""
    assert [len(c.train) for c in clients] == [n] * len(clients)
    allidx = np.concatenate([c.train for c in clients])
    assert len(np.unique(allidx)) == len(allidx)


@pytest.mark.parametrize("num_clients,alpha,cap", [(10, 0.1, None), (7, 0.05, None), (33, 1.0, None),
                                                   (10, 0.1, 100), (100, 0.01, None), (3, 10.0, 250)])
def test_dirichlet_equal_client_sizes(num_clients, alpha, cap):
    # n = min(cap, floor(N / num_clients)): the uncapped cases use (nearly) all the data, so the
    # class pools run short for the clients filled last and the refill rule has to keep n exact.
    n = len(Y_TRAIN) // num_clients if cap is None else min(cap, len(Y_TRAIN) // num_clients)
    clients = split("dirichlet", num_clients=num_clients, dir_alpha=alpha, samples_per_client=cap)
    check_papers_dirichlet(clients, n)
    # The same holds on digits-sized data with unequal class pools (1257 train samples).
    y = with_counts([125, 129, 124, 128, 127, 127, 127, 125, 122, 123], 3)
    clients = partition(y, Y_TEST, scheme="dirichlet", num_clients=num_clients, seed=1,
                        num_classes=C, dir_alpha=alpha, samples_per_client=cap, min_samples=1)
    check_papers_dirichlet(clients, min(cap or len(y), len(y) // num_clients))


def test_dirichlet_class_fails_the_equal_size_check():
    # The per-class scheme gives varied sizes (pinned above: 41..1871), so the check that the
    # papers' split passes must reject it.
    clients = split("dirichlet_class", num_clients=10, dir_alpha=0.1)
    with pytest.raises(AssertionError):
        check_papers_dirichlet(clients, len(Y_TRAIN) // 10)


@pytest.mark.parametrize("alpha,rel_tol", [(0.1, 0.15), (1.0, 0.10)])
def test_dirichlet_mixes_follow_dir_alpha(alpha, rel_tol):
    """Per-client class shares q_kc ~ Beta(alpha, (C-1) alpha), the marginal of Dir(alpha * 1):
    mean 1/C, variance (1/C)(1-1/C)/(C alpha + 1). 1000 clients of 100 samples drawn from pools
    of 20000 per class, so no pool runs short and every mix is a fresh Dir draw (rounded to
    1/100, which adds < 0.1 % to the variance).

    Tolerances: a class's mean share has standard error sqrt(var / 1000) (0.0067 at alpha 0.1);
    we allow 4 of them. The variance estimate, averaged over the 10 classes, has relative
    standard error at most about 0.03 (alpha 0.1: excess kurtosis of Beta(0.1, 0.9) 5.6, so
    sqrt(7.6 / 1000) per class, less after averaging; over 30 seeds the observed spread was
    0.016 for both alphas); rel_tol is five of those bounds or more. The two alphas' variances
    (0.045 and 0.0082) lie far outside each other's band."""
    y = with_counts([20000] * C, 7)
    clients = partition(y, labels(10000, 8), scheme="dirichlet", num_clients=1000, seed=5,
                        num_classes=C, dir_alpha=alpha, samples_per_client=100)
    check_papers_dirichlet(clients, 100)
    shares = np.stack([hist(y, c.train) for c in clients]) / 100.0
    expected_var = (1 / C) * (1 - 1 / C) / (C * alpha + 1)
    se_mean = np.sqrt(expected_var / len(clients))
    assert np.all(np.abs(shares.mean(axis=0) - 1 / C) < 4 * se_mean)
    var = shares.var(axis=0, ddof=1).mean()
    assert abs(var / expected_var - 1) < rel_tol, (var, expected_var)


def test_apportion_rows_matches_apportion():
    rng = np.random.default_rng(0)
    for trial in range(300):
        k, c = rng.integers(1, 12), rng.integers(1, 12)
        w = rng.integers(0, 5, size=(k, c)) * (rng.random((k, c)) < 0.7)
        w = rng.dirichlet(np.full(c, 0.1), size=k) if trial % 3 == 0 else w
        totals = rng.integers(0, 60, size=k)
        expected = np.stack([apportion(int(t), row) for t, row in zip(totals, w)])
        assert np.array_equal(apportion_rows(totals, w), expected)


@pytest.mark.parametrize("scheme,kw", [("dirichlet", {"dir_alpha": 0.3}), ("iid", {}),
                                       ("dirichlet_class", {"dir_alpha": 0.3}),
                                       ("shards", {"shards_per_client": 3})])
def test_test_distribution_follows_train(scheme, kw):
    clients = split(scheme, num_clients=8, **kw)
    for c in clients:
        h = hist(Y_TRAIN, c.train)
        assert tv(h, hist(Y_TEST, c.test)) <= tv_bound(h, len(c.test)) + 1e-12
    # Test sizes follow train sizes with one common ratio (up to rounding down).
    ratio = max(len(c.test) / len(c.train) for c in clients)
    assert all(len(c.test) >= np.floor(ratio * len(c.train)) - 1 for c in clients)
    # The old rule used every test sample of a held class exactly once; the new one stops
    # where the scarcest class runs out, which with the whole train set in use (test pool a
    # fixed sixth of the train pool for every class here) leaves only rounding unused.
    assert sum(len(c.test) for c in clients) >= 0.97 * len(Y_TEST)


@pytest.mark.parametrize("scheme", PARTITIONS)
def test_samples_per_client_caps_exactly(scheme):
    clients = split(scheme, num_clients=6, samples_per_client=123, dir_alpha=1.0)
    assert [len(c.train) for c in clients] == [123] * 6
    uncapped = split(scheme, num_clients=6, dir_alpha=1.0)
    for a, b in zip(clients, uncapped):
        if scheme != "dirichlet":
            # The other schemes cut the cap from the uncapped client (dirichlet draws its 123
            # directly from the pools, so its capped clients are fresh draws, not subsets).
            assert set(a.train) <= set(b.train)  # a subsample of the same client's data
            # Class proportions kept: each class count within 1 of its exact share.
            exact = hist(Y_TRAIN, b.train) * 123 / len(b.train)
            assert np.all(np.abs(hist(Y_TRAIN, a.train) - exact) < 1)
        # The test set follows the capped train set.
        h = hist(Y_TRAIN, a.train)
        assert tv(h, hist(Y_TEST, a.test)) <= tv_bound(h, len(a.test)) + 1e-12


def test_cap_larger_than_client_keeps_everything():
    assert same(split("iid", num_clients=4, samples_per_client=10**6), split("iid", num_clients=4))


def test_test_samples_per_client_caps():
    clients = split("shards", num_clients=5, test_samples_per_client=40)
    assert [len(c.test) for c in clients] == [40] * 5
    for c in clients:
        assert np.array_equal(np.flatnonzero(hist(Y_TEST, c.test)),
                              np.flatnonzero(hist(Y_TRAIN, c.train)))


def test_apportion_largest_remainder():
    assert apportion(10, np.array([1, 1, 1])).tolist() == [4, 3, 3]
    assert apportion(7, np.array([0, 5, 2])).tolist() == [0, 5, 2]
    assert apportion(5, np.array([3, 3, 4])).sum() == 5
    assert apportion(3, np.array([0, 0])).tolist() == [0, 0]


@pytest.mark.parametrize("kw,needle", [
    ({"scheme": "shards", "shards_per_client": 11}, "11"),
    ({"scheme": "shards", "shards_per_client": 0}, "0"),
    ({"scheme": "dirichlet", "dir_alpha": 0.0}, "dir_alpha must be a finite number > 0, got 0.0"),
    ({"scheme": "dirichlet", "dir_alpha": -1.5}, "got -1.5"),
    ({"scheme": "dirichlet", "dir_alpha": float("nan")}, "got nan"),
    ({"scheme": "dirichlet", "dir_alpha": float("inf")}, "got inf"),
    ({"scheme": "dirichlet_class", "dir_alpha": 0.0}, "dir_alpha must be a finite number > 0, got 0.0"),
    ({"scheme": "dirichlet_class", "dir_alpha": -2}, "got -2"),
    ({"scheme": "dirichlet", "min_samples": 1000}, "min_samples=1000"),
    ({"scheme": "dirichlet_class", "min_samples": 1000}, "min_samples=1000"),
    ({"scheme": "bogus"}, "bogus"),
    ({"scheme": "iid", "num_clients": 0}, "num_clients"),
    ({"scheme": "iid", "samples_per_client": 0}, "samples_per_client"),
])
def test_impossible_requests_raise(kw, needle):
    kw = {"num_clients": 10, **kw}
    with pytest.raises(DataError) as err:
        split(**kw)
    assert needle in str(err.value)


def test_unknown_scheme_lists_allowed():
    with pytest.raises(DataError, match="shards, dirichlet, dirichlet_class, iid"):
        split("domain")


def test_dirichlet_class_impossible_by_retries_names_parameters():
    # 200 samples, 10 clients, min 19: feasible on paper, hopeless with tiny alpha.
    y = labels(200, 0)
    with pytest.raises(DataError) as err:
        partition(y, y, scheme="dirichlet_class", num_clients=10, seed=0, num_classes=C,
                  dir_alpha=0.01, min_samples=19)
    msg = str(err.value)
    assert "num_clients=10" in msg and "min_samples=19" in msg and "dir_alpha=0.01" in msg


def test_class_smaller_than_its_holders_raises():
    y = labels(1000, 0)
    y[y == 3] = 4
    y[:2] = 3  # class 3 now has only 2 samples
    with pytest.raises(DataError) as err:
        partition(y, Y_TEST, scheme="shards", num_clients=10, seed=0, num_classes=C,
                  shards_per_client=5)
    assert "class 3 has only 2 train samples" in str(err.value)


def test_labels_out_of_range_raise():
    with pytest.raises(DataError, match="num_classes=10"):
        partition(np.array([0, 1, 12]), Y_TEST, scheme="iid", num_clients=1, seed=0,
                  num_classes=C)


# ---------------------------------------------------------------- test sets under a training cap

def old_rule_counts(train_hist, test_pool):
    """The test label counts of the rule before issue 14: each class's whole test pool divided
    among its holders in proportion to their train counts of it."""
    return np.stack([apportion(int(test_pool[c]), train_hist[:, c])
                     for c in range(train_hist.shape[1])], axis=1)


def mixes_distance(y_train, y_test, clients):
    return [tv(hist(y_train, c.train), hist(y_test, c.test)) for c in clients]


@pytest.mark.parametrize("scheme", ["shards", "dirichlet", "dirichlet_class"])
@pytest.mark.parametrize("seed", range(3))
def test_capped_test_sets_follow_train_mix(scheme, seed):
    """MNIST-sized labels, 10 clients, Dir(0.1) / 2 shards, 100 train samples per client: every
    client's test label distribution is within floor(H/2)/m (total variation) of its train one."""
    y_train, y_test = with_counts(MNIST_TRAIN, 11), with_counts(MNIST_TEST, 12)
    clients = partition(y_train, y_test, scheme=scheme, num_clients=10, seed=seed, num_classes=C,
                        dir_alpha=0.1, samples_per_client=100)
    assert [len(c.train) for c in clients] == [100] * 10
    sizes = {len(c.test) for c in clients}
    assert len(sizes) == 1 and min(sizes) >= 100  # equal train sizes, equal test sizes
    for c in clients:
        h = hist(y_train, c.train)
        assert tv(h, hist(y_test, c.test)) <= tv_bound(h, len(c.test)) + 1e-12
        if scheme == "shards":  # exactly the client's classes
            assert np.array_equal(np.flatnonzero(hist(y_test, c.test)), np.flatnonzero(h))
    assert max(mixes_distance(y_train, y_test, clients)) < 0.01
    # The old rule on the same train split breaks the bound for every scheme: seed 0 gives a
    # mean / max TV of 0.009 / 0.022 for shards (class test pools differ in size), 0.099 / 0.453
    # for dirichlet and 0.098 / 0.166 for dirichlet_class (the old `dirichlet`; real MNIST
    # gives the same numbers, as only class sizes matter here). The new rule: <= 0.0024.
    train_hist = np.stack([hist(y_train, c.train) for c in clients])
    old = old_rule_counts(train_hist, np.bincount(y_test, minlength=C))
    old_tv = [tv(h, o) for h, o in zip(train_hist, old)]
    assert any(d > tv_bound(h, o.sum()) for d, h, o in zip(old_tv, train_hist, old))
    if scheme != "shards":
        assert max(old_tv) > 0.1


def test_follow_counts_rule():
    # Unequal train sizes: test sizes proportional to them, one ratio, capped.
    train_hist = np.array([[30, 10, 0], [0, 20, 20], [5, 0, 0]])
    pool = np.array([40, 40, 40])
    counts = follow_counts(train_hist, pool, None)
    assert np.all(counts.sum(axis=0) <= pool)
    # Class 0 binds: clients 0 and 2 ask for 0.75 m_0 + m_2 of its 40 test samples, i.e. about
    # 35 lambda, so lambda is about 40/35; rounding leaves room up to lambda just below 1.2
    # (m = 47, 47, 5; class 0: 35 + 5 = 40). The tie in client 1 (23.5 each) goes to class 1.
    assert counts.tolist() == [[35, 12, 0], [0, 24, 23], [5, 0, 0]]
    # Capped at 8: every client reaches the cap (client 2's 8 at lambda 1.6 still fit).
    capped = follow_counts(train_hist, pool, 8)
    assert capped.tolist() == [[6, 2, 0], [0, 4, 4], [8, 0, 0]]
    # A class with no test samples is left out of the mixes the test sets follow: client 1
    # follows its class 2 only, and class 0 binds alone (m_0 + m_2 = 35 + 5 <= 40).
    counts = follow_counts(train_hist, np.array([40, 0, 40]), None)
    assert counts.tolist() == [[35, 0, 0], [0, 0, 23], [5, 0, 0]]


def test_empty_test_set_raises():
    # Client classes with no test samples at all: the test set cannot follow the train mix.
    y_test = labels(1000, 2)
    y_test[y_test < 2] = 5
    with pytest.raises(DataError, match="empty test set"):
        partition(Y_TRAIN, y_test, scheme="shards", num_clients=10, seed=0, num_classes=C,
                  shards_per_client=1)  # the clients of classes 0 and 1 have nothing to test on


@pytest.mark.skipif(not (MNIST_RAW / "train-labels-idx1-ubyte.gz").is_file(),
                    reason=f"real MNIST files not found at {MNIST_RAW}")
@pytest.mark.parametrize("scheme", ["dirichlet", "dirichlet_class"])
def test_real_mnist_capped_test_sets_follow_train_mix(scheme):
    from fl_core.data.sources import read_idx

    y_train = read_idx(MNIST_RAW / "train-labels-idx1-ubyte.gz", ndim=1).astype(np.int64)
    y_test = read_idx(MNIST_RAW / "t10k-labels-idx1-ubyte.gz", ndim=1).astype(np.int64)
    clients = partition(y_train, y_test, scheme=scheme, num_clients=10, seed=0, num_classes=C,
                        dir_alpha=0.1, samples_per_client=100)
    for c in clients:
        h = hist(y_train, c.train)
        assert tv(h, hist(y_test, c.test)) <= tv_bound(h, len(c.test)) + 1e-12
    # Before issue 14 (old dirichlet = dirichlet_class train split, old test rule, seed 0):
    # mean TV 0.098, max 0.166. Now: dirichlet 0.0008 / 0.0014, dirichlet_class 0.0008 / 0.0019.
    distances = mixes_distance(y_train, y_test, clients)
    assert np.mean(distances) < 0.002 and max(distances) < 0.005
