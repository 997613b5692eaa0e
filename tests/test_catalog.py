"""The dataset catalogue: mnist_c / digits_c (the offline feature-shift benchmark), the papers'
datasets as `--dataset` values, and the source options checked before any data is read."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from fl_core.config import ConfigError, RunConfig
from fl_core.data import build_federated_data, load_source, source_domains
from fl_core.data.corrupted_sources import DEFAULT_CORRUPTIONS, deal_to_domains, load_corrupted
from fl_core.data.corruptions import corrupt
from fl_core.data.sources import digits_uint8
from sweeps.spec import parse_spec
from sweeps.stages import data_settings

from test_domain_loaders import fake_folders

MNIST_ROOT = Path(__file__).resolve().parents[2] / "shared" / "data"
NAMES = "clean,gaussian_noise,motion_blur"


def test_digits_c_domains_are_disjoint_balanced_and_deterministic():
    d = load_source("digits_c", corruptions=NAMES, severity=4)
    x_tr, y_tr, x_te, y_te = digits_uint8()
    assert d.domains == ("clean", "gaussian_noise", "motion_blur") and d.num_classes == 10
    # every underlying image in exactly one domain: the sizes add up to the source's
    assert len(d.y_train) == len(y_tr) and len(d.y_test) == len(y_te)
    counts = np.bincount(d.d_train.numpy())
    assert counts.max() - counts.min() <= 10  # dealt round-robin per class: at most one per class apart
    for k in range(3):  # every domain has every class in the source's proportions (± 1 per class)
        per_class = np.bincount(d.y_train[d.d_train == k].numpy(), minlength=10)
        assert np.all(np.abs(per_class - np.bincount(y_tr, minlength=10) / 3) <= 1)
    # the clean domain holds the source's images unchanged (up to the affine normalisation)
    domain = deal_to_domains(y_tr, 3, 0)
    clean = d.x_train[d.d_train == 0][:, 0].numpy().reshape(-1)
    source = x_tr[domain == 0].reshape(-1).astype(np.float64)
    assert np.corrcoef(clean, source)[0, 1] > 0.999999
    # the noise domain is the corruption of its images with the name's fixed seed, not the run's
    noisy = d.x_train[d.d_train == 1][:, 0].numpy().reshape(-1)
    assert np.corrcoef(noisy, x_tr[domain == 1].reshape(-1))[0, 1] < 0.99
    again = load_corrupted.__wrapped__("digits_c", ("clean", "gaussian_noise", "motion_blur"), 4)
    assert np.array_equal(again.x_train.numpy(), d.x_train.numpy())
    other = load_source("digits_c", corruptions=NAMES, severity=1)
    assert not np.array_equal(other.x_train[other.d_train == 1].numpy(), d.x_train[d.d_train == 1].numpy())


def test_digits_c_corruption_is_the_corrupt_function_of_its_domain():
    d = load_source("digits_c", corruptions="fog", severity=2)
    x_tr, *_ = digits_uint8()
    from fl_core.data.corrupted_sources import _name_seed
    expected = corrupt(x_tr, "fog", 2, seed=_name_seed("fog", "train")).astype(np.float64)
    got = d.x_train[:, 0].double().numpy()
    assert np.corrcoef(got.reshape(-1), expected.reshape(-1))[0, 1] > 0.999999
    assert np.allclose((got - got.mean()) / got.std(), (expected - expected.mean()) / expected.std(), atol=1e-4)


@pytest.mark.skipif(not (MNIST_ROOT / "MNIST" / "raw").is_dir(), reason="real MNIST not here")
def test_mnist_c_is_real_mnist_in_four_domains():
    d = load_source("mnist_c", MNIST_ROOT)
    assert d.domains == DEFAULT_CORRUPTIONS and d.x_train.shape == (60000, 1, 28, 28)
    assert np.bincount(d.d_train.numpy()).tolist() == [15005, 15002, 14998, 14995]
    assert abs(float(d.x_train.mean())) < 1e-4 and abs(float(d.x_train.std()) - 1) < 1e-4


@pytest.mark.skipif(not (MNIST_ROOT / "FashionMNIST" / "raw").is_dir(), reason="real Fashion-MNIST not here")
def test_fmnist_c_is_real_fashion_mnist_in_corruption_domains():
    """fmnist_c: the shared Fashion-MNIST dealt to one domain per corruption, every class in every
    domain in equal shares, and its clean domain the uncorrupted images (same pixels as fmnist)."""
    d = load_source("fmnist_c", MNIST_ROOT)
    assert d.domains == DEFAULT_CORRUPTIONS and d.x_train.shape == (60000, 1, 28, 28)
    assert d.x_test.shape == (10000, 1, 28, 28) and d.num_classes == 10
    assert np.bincount(d.d_train.numpy()).tolist() == [15000] * 4  # 6 000 per class: 1 500 each
    assert np.bincount(d.d_test.numpy()).tolist() == [2500] * 4
    for k in range(4):
        assert np.bincount(d.y_train[d.d_train == k].numpy(), minlength=10).tolist() == [1500] * 10
    assert abs(float(d.x_train.mean())) < 1e-4 and abs(float(d.x_train.std()) - 1) < 1e-4
    both = load_source("fmnist_c", MNIST_ROOT, corruptions="clean,fog")
    plain = load_source("fmnist", MNIST_ROOT)
    clean = both.x_train[both.d_train == 0]
    # clean images are Fashion-MNIST's own, up to the (per-source) normalisation: rank-equal pixels
    first = clean[0].flatten()
    match = (plain.y_train == both.y_train[both.d_train == 0][0]).nonzero().flatten()
    assert any(np.corrcoef(first.numpy(), plain.x_train[i].flatten().numpy())[0, 1] > 0.999999 for i in match)


@pytest.mark.parametrize("knobs, needle", [
    (dict(dataset="mnist", severity=2), "severity=2 does not apply to dataset 'mnist'"),
    (dict(dataset="digits_c", corruptions="fog,rain"), "'rain' is unknown"),
    (dict(dataset="digits_c", corruptions="fog,fog"), "distinct names"),
    (dict(dataset="cifar10c", corruptions="clean"), "cifar10c: corruptions must be distinct names"),
    (dict(dataset="digits", image_size=64), "image_size=64 does not apply"),
    (dict(dataset="digits_c", partition="domain"), "num_clients=10 must be 4 (gaussian_noise"),
    (dict(dataset="digits_c", partition="domain_dirichlet", num_clients=6), "must be a multiple of 4"),
    (dict(dataset="digits", partition="domain"), "needs a dataset made of domains"),
])
def test_bad_source_options_fail_before_any_data_is_read(knobs, needle):
    with pytest.raises(ConfigError, match=needle.replace("(", r"\(").replace(")", r"\)")):
        RunConfig(**knobs)


def test_source_domains_without_loading():
    assert source_domains("digits") == ()
    assert source_domains("officehome") == ("Art", "Clipart", "Product", "Real_World")
    assert source_domains("mnist_c", "clean, fog") == ("clean", "fog")
    assert len(source_domains("cifar10c")) == 10


def test_added_source_knobs_leave_old_hashes_alone():
    assert RunConfig(algorithm="fedavg").config_hash() == "0a25d3dd1866"
    assert RunConfig(dataset="digits_c").config_hash() != RunConfig(dataset="digits_c", severity=4).config_hash()


def test_study_settings_apply_options_where_they_apply():
    spec = parse_spec({"name": "s", "knobs": {"dataset": ["digits", "digits_c"], "severity": [2, 4],
                                              "partition": "iid", "num_clients": 8},
                       "methods": [{"algorithm": "fedavg"}]}, "test")
    # severity only varies for digits_c (digits keeps the default: one setting, not two)
    assert sorted((s["dataset"], s["severity"]) for s in data_settings(spec)) == [
        ("digits", 3), ("digits_c", 2), ("digits_c", 4)]
    spec = parse_spec({"name": "s", "knobs": {"dataset": "digits_c", "corruptions": "clean,fog",
                                              "partition": ["domain", "domain_dirichlet"], "num_clients": 8},
                       "methods": [{"algorithm": "fedavg"}]}, "test")
    # one client per domain under `domain`; num_clients as given elsewhere
    assert [(s["partition"], s["num_clients"]) for s in data_settings(spec)] == [
        ("domain", 2), ("domain_dirichlet", 8)]


def test_a_folder_dataset_runs_through_the_catalogue(tmp_path):
    fake_folders(tmp_path / "OfficeHome", ("Art", "Clipart", "Product", "Real_World"), ("Bed", "Desk"),
                 per_class=5)
    data = build_federated_data(dataset="officehome", num_clients=4, partition="domain", seed=0,
                                data_root=tmp_path, image_size=8)
    assert data.input_shape == (3, 8, 8) and data.domains == ("Art", "Clipart", "Product", "Real_World")
    assert [data.client_domain(k) for k in range(4)] == list(data.domains)
    assert [c.n_train for c in data.clients] == [8] * 4


def test_one_spelling_per_corruption_set_and_labels_that_tell_options_apart():
    from fl_core.results import setting_label
    default = RunConfig(dataset="mnist_c")
    spelled = RunConfig(dataset="mnist_c", corruptions="gaussian_noise, motion_blur,fog,contrast")
    assert spelled.corruptions == "" and spelled.config_hash() == default.config_hash()
    assert RunConfig(dataset="mnist_c", corruptions="fog,clean").corruptions == "fog,clean"  # order = domain order
    labels = {setting_label(RunConfig(dataset="mnist_c", **knobs).to_dict()) for knobs in
              (dict(), dict(severity=5), dict(corruptions="clean,fog"), dict(unseen_clients=2))}
    assert labels == {"mnist_c, 2 shards", "mnist_c (severity 5), 2 shards", "mnist_c (clean,fog), 2 shards",
                      "mnist_c, 2 shards, 2 unseen clients"}
