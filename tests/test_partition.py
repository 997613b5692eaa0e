"""Partitioners: sizes, class structure, determinism, distributions, error messages."""

import numpy as np
import pytest

from fl_core.data import PARTITIONS, DataError, partition
from fl_core.data.partition import apportion, deal_classes

C = 10


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


def test_dirichlet_min_size_respected():
    clients = split("dirichlet", num_clients=20, dir_alpha=0.1, min_samples=50)
    assert min(len(c.train) for c in clients) >= 50
    assert sum(len(c.train) for c in clients) == len(Y_TRAIN)


def test_dirichlet_large_alpha_is_near_iid():
    glob = np.bincount(Y_TRAIN, minlength=C)
    for c in split("dirichlet", num_clients=5, dir_alpha=1e4):
        assert tv(hist(Y_TRAIN, c.train), glob) < 0.15


def test_dirichlet_small_alpha_is_skewed():
    glob = np.bincount(Y_TRAIN, minlength=C)
    dists = [tv(hist(Y_TRAIN, c.train), glob)
             for c in split("dirichlet", num_clients=10, dir_alpha=0.05)]
    assert np.mean(dists) > 0.5
    # Most of each client's data comes from very few classes.
    top2 = [np.sort(hist(Y_TRAIN, c.train))[-2:].sum() / len(c.train)
            for c in split("dirichlet", num_clients=10, dir_alpha=0.05)]
    assert np.mean(top2) > 0.7


@pytest.mark.parametrize("scheme,kw", [("dirichlet", {"dir_alpha": 0.3}), ("iid", {}),
                                       ("shards", {"shards_per_client": 3})])
def test_test_distribution_follows_train(scheme, kw):
    clients = split(scheme, num_clients=8, **kw)
    for c in clients:
        assert tv(hist(Y_TRAIN, c.train), hist(Y_TEST, c.test)) < 0.1
    # Every test sample of a held class is used exactly once.
    assert sum(len(c.test) for c in clients) == len(Y_TEST)


@pytest.mark.parametrize("scheme", PARTITIONS)
def test_samples_per_client_caps_exactly(scheme):
    clients = split(scheme, num_clients=6, samples_per_client=123, dir_alpha=1.0)
    assert [len(c.train) for c in clients] == [123] * 6
    uncapped = split(scheme, num_clients=6, dir_alpha=1.0)
    for a, b in zip(clients, uncapped):
        assert set(a.train) <= set(b.train)  # a subsample of the same client's data
        # Class proportions kept: each class count within 1 of its exact share.
        exact = hist(Y_TRAIN, b.train) * 123 / len(b.train)
        assert np.all(np.abs(hist(Y_TRAIN, a.train) - exact) < 1)
        # The test set follows the capped train set.
        assert tv(hist(Y_TRAIN, a.train), hist(Y_TEST, a.test)) < 0.1


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
    ({"scheme": "dirichlet", "dir_alpha": 0.0}, "dir_alpha"),
    ({"scheme": "dirichlet", "dir_alpha": -1.5}, "-1.5"),
    ({"scheme": "dirichlet", "min_samples": 1000}, "min_samples=1000"),
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
    with pytest.raises(DataError, match="shards, dirichlet, iid"):
        split("domain")


def test_dirichlet_impossible_by_retries_names_parameters():
    # 200 samples, 10 clients, min 19: feasible on paper, hopeless with tiny alpha.
    y = labels(200, 0)
    with pytest.raises(DataError) as err:
        partition(y, y, scheme="dirichlet", num_clients=10, seed=0, num_classes=C,
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
