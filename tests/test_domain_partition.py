"""Partitions of multi-domain sources (fl_core/data/domain_partition.py): each client one domain,
disjoint samples, per-domain Dirichlet mixes, test sets from the client's own domain following
its train mix, equal domain sizes on request, and one clear error per bad request."""
import numpy as np
import pytest

from fl_core.data.domain_partition import domain_partition
from fl_core.data.sources import DataError

C, D = 10, 3


def source(per_domain=(3000, 2000, 1500), test=600, seed=0):
    """Labels and domain indices of a D-domain source (domains of different sizes)."""
    rng = np.random.default_rng(seed)
    y_tr = np.concatenate([rng.integers(0, C, n) for n in per_domain])
    d_tr = np.concatenate([np.full(n, d) for d, n in enumerate(per_domain)])
    y_te = rng.integers(0, C, test * D)
    d_te = np.repeat(np.arange(D), test)
    return y_tr, y_te, d_tr, d_te


def split(scheme, num_clients, **kw):
    y_tr, y_te, d_tr, d_te = source()
    out = domain_partition(y_tr, y_te, d_tr, d_te, scheme=scheme, num_clients=num_clients, num_domains=D, seed=1,
                           num_classes=C, **kw)
    return out, (y_tr, y_te, d_tr, d_te)


@pytest.mark.parametrize("scheme,clients", [("domain", D), ("domain_dirichlet", 4 * D)])
def test_each_client_holds_one_domain_and_no_sample_twice(scheme, clients):
    splits, (y_tr, y_te, d_tr, d_te) = split(scheme, clients, dir_alpha=0.5)
    assert len(splits) == clients
    assert [s.domain for s in splits] == sorted(s.domain for s in splits)          # domain by domain
    for s in splits:
        assert set(d_tr[s.train]) == {s.domain} and set(d_te[s.test]) == {s.domain}
    train = np.concatenate([s.train for s in splits])
    test = np.concatenate([s.test for s in splits])
    assert len(np.unique(train)) == len(train) and len(np.unique(test)) == len(test)
    if scheme == "domain":  # one client per domain: the whole domain
        assert [len(s.train) for s in splits] == [3000, 2000, 1500]


def test_domain_dirichlet_equal_sizes_per_domain_and_uniform_mix_for_large_alpha():
    # under a cap well below the pools (no class runs short) every mix is the rounded Dir draw
    splits, (y_tr, _, _, _) = split("domain_dirichlet", 5 * D, dir_alpha=1000.0, samples_per_client=100)
    for d in range(D):
        mine = [s for s in splits if s.domain == d]
        assert len(mine) == 5 and len({len(s.train) for s in mine}) == 1          # the papers' equal sizes
        shares = np.array([np.bincount(y_tr[s.train], minlength=C) / len(s.train) for s in mine])
        assert np.abs(shares - 1 / C).max() < 0.05                                 # Dir(1000) ~ uniform


def test_small_alpha_skews_each_client_and_test_follows_train_within_the_domain():
    splits, (y_tr, y_te, _, _) = split("domain_dirichlet", 4 * D, dir_alpha=0.1, samples_per_client=100)
    top = [np.bincount(y_tr[s.train], minlength=C).max() / len(s.train) for s in splits]
    assert np.mean(top) > 0.5                                                      # skewed mixes
    for s in splits:
        train = np.bincount(y_tr[s.train], minlength=C) / len(s.train)
        test = np.bincount(y_te[s.test], minlength=C) / len(s.test)
        held = (train > 0).sum()
        assert 0.5 * np.abs(train - test).sum() <= (held // 2) / len(s.test) + 1e-9   # partition.py's bound


def test_equalize_domains_cuts_every_domain_to_the_smallest():
    splits, _ = split("domain", D, equalize_domains=True)
    assert [len(s.train) for s in splits] == [1500] * D
    again, _ = split("domain", D, equalize_domains=True)
    assert all(np.array_equal(a.train, b.train) for a, b in zip(splits, again))    # seeded


def test_a_domains_clients_do_not_depend_on_the_other_domains():
    y_tr, y_te, d_tr, d_te = source()
    two = domain_partition(y_tr, y_te, d_tr, d_te, scheme="domain_dirichlet", num_clients=2 * D, num_domains=D,
                           seed=3, num_classes=C)
    keep_tr, keep_te = d_tr < 2, d_te < 2            # drop the last domain
    fewer = domain_partition(y_tr[keep_tr], y_te[keep_te], d_tr[keep_tr], d_te[keep_te], scheme="domain_dirichlet",
                             num_clients=4, num_domains=2, seed=3, num_classes=C)
    assert all(np.array_equal(a.train, b.train) for a, b in zip(two[:4], fewer))


@pytest.mark.parametrize("scheme,clients,needle", [
    ("domain", 4, "num_clients=4 must equal the number of domains (3)"),
    ("domain_dirichlet", 7, "num_clients=7 must be a multiple of 3"),
    ("shards", 3, "unknown domain partition 'shards'"),
])
def test_bad_requests_name_the_value(scheme, clients, needle):
    with pytest.raises(DataError, match=".*".join(map(__import__("re").escape, needle.split(".*")))):
        split(scheme, clients)


def test_a_source_without_domains_is_refused():
    y = np.zeros(10, dtype=int)
    with pytest.raises(DataError, match="needs a source made of domains"):
        domain_partition(y, y, y, y, scheme="domain", num_clients=1, num_domains=0, seed=0, num_classes=C)


def test_build_federated_data_gives_each_client_its_domain_and_records_the_domain_label_counts(monkeypatch):
    """A three-domain source (the synthetic images shifted by +0, +1, +2) through the data path."""
    import torch

    from fl_core.data import federated
    from fl_core.data.sources import Dataset, load_source

    base = load_source("synthetic")
    def three(x, y):
        return torch.cat([x + d for d in range(D)]), torch.cat([y] * D), torch.arange(D).repeat_interleave(len(y))
    x_tr, y_tr, d_tr = three(base.x_train, base.y_train)
    x_te, y_te, d_te = three(base.x_test, base.y_test)
    shifted = Dataset("shifted", x_tr, y_tr, x_te, y_te, base.num_classes, ("a", "b", "c"), d_tr, d_te)
    monkeypatch.setattr(federated, "load_source", lambda *a, **k: shifted)
    data = federated.build_federated_data(dataset="shifted", num_clients=2 * D, partition="domain_dirichlet", seed=0,
                                          dir_alpha=1.0, val_fraction=0.2)
    assert [data.client_domain(k) for k in range(2 * D)] == ["a", "a", "b", "b", "c", "c"]
    for k, client in enumerate(data.clients):
        shift = "abc".index(data.client_domain(k))
        for x in (client.x_train, client.x_val, client.x_test):   # train, validation and test: its own domain
            assert torch.allclose(x.mean(), base.x_train.mean() + shift, atol=0.5)
        assert data.domain_hist[k].sum() == client.n_train and data.domain_hist[k, shift].sum() == client.n_train
    np.testing.assert_array_equal(data.domain_hist.sum(axis=1), data.train_hist)
    pooled = federated.build_federated_data(dataset="shifted", num_clients=4, partition="iid", seed=0)
    assert {pooled.client_domain(k) for k in range(4)} == {None}                 # label partitions mix domains
    with pytest.raises(DataError, match="needs a source made of domains; 'synthetic' has none"):
        monkeypatch.setattr(federated, "load_source", lambda *a, **k: base)
        federated.build_federated_data(dataset="synthetic", num_clients=2, partition="domain", seed=0)


def test_domain_settings_have_their_own_labels():
    from fl_core.results import setting_label
    assert setting_label({"dataset": "mnist_c", "partition": "domain", "dir_alpha": 0.5}) == \
        "mnist_c, a client per domain"
    assert setting_label({"dataset": "mnist_c", "partition": "domain_dirichlet", "dir_alpha": 0.1}) == \
        "mnist_c, Dir(0.1) per domain"


def test_equal_domains_is_a_data_knob_that_moves_no_earlier_hash():
    from fl_core.config import DATA_KNOBS, DIRICHLET_PARTITIONS, RunConfig
    assert "equal_domains" in DATA_KNOBS and "domain_dirichlet" in DIRICHLET_PARTITIONS
    plain = RunConfig(algorithm="fedavg")
    assert plain.config_hash() == "0a25d3dd1866"          # FedAvg's default hash before the knob existed
    assert RunConfig(algorithm="fedavg", equal_domains=True).config_hash() != plain.config_hash()
    assert RunConfig(algorithm="fedavg", equal_domains=True).data_key() != plain.data_key()
