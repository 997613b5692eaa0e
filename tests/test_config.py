"""Knob declarations: each method's knobs beside it, the config hash, the data spec."""
import dataclasses
import inspect

import pytest

from fl_core.algorithms import ALGORITHMS, fedselect, get_algorithm, params_class
from fl_core.config import COMMON_KNOBS, DATA_KNOBS, NON_SEMANTIC, ConfigError, RunConfig
from fl_core.data import build_federated_data
from fl_core.knobs import knob


def test_a_config_carries_only_its_methods_knobs():
    fedavg = RunConfig(algorithm="fedavg")
    assert set(fedavg.to_dict()) == set(COMMON_KNOBS)
    fedselect = RunConfig(algorithm="fedselect", pers_rate=0.5)
    assert set(fedselect.to_dict()) == set(COMMON_KNOBS) | {f.name for f in dataclasses.fields(fedselect.method)}
    assert fedselect.pers_rate == 0.5 and fedselect.method.pers_rate == 0.5
    with pytest.raises(ConfigError, match="ditto_lambda is a knob of ditto, not of fedavg"):
        RunConfig(algorithm="fedavg", ditto_lambda=1.0)
    with pytest.raises(ConfigError, match="unknown config key") as err:
        RunConfig(algorithm="fedavg", no_such_knob=1)
    assert "did you mean" not in str(err.value)  # nothing close: no guess
    with pytest.raises(ConfigError, match=r"unknown config key\(s\) pers_rat \(did you mean pers_rate\?\)"):
        RunConfig(algorithm="fedselect", pers_rat=0.2)
    with pytest.raises(ConfigError, match=r"pers_rate=1.5 is outside the allowed range \[0, 1\]"):
        RunConfig(pers_rate=1.5)
    assert RunConfig.from_dict(fedselect.to_dict()) == fedselect
    assert fedselect.replace(algorithm="fedavg") == fedavg  # the old method's knobs are dropped


def test_adding_a_knob_to_one_method_leaves_other_methods_hashes_unchanged(monkeypatch):
    before = {a: RunConfig(algorithm=a).config_hash() for a in ALGORITHMS}
    assert len(set(before.values())) == len(ALGORITHMS)

    @dataclasses.dataclass(frozen=True)
    class Extended(fedselect.FedSelectParams):
        new_knob: float = knob(0.5, "a knob added later", low=0, high=1)

    monkeypatch.setattr(fedselect.FedSelect, "Params", Extended)
    after = {a: RunConfig(algorithm=a).config_hash() for a in ALGORITHMS}
    assert after["fedselect"] != before["fedselect"]
    assert {a: h for a, h in after.items() if a != "fedselect"} == {a: h for a, h in before.items() if a != "fedselect"}


def test_hash_ignores_where_a_run_happens_and_normalises_numbers():
    a = RunConfig(lr=1, threads=1, device="cpu", data_root="/x")
    b = RunConfig(lr=1.0)
    assert a.config_hash() == b.config_hash() and a.lr == 1.0 and isinstance(a.lr, float)
    assert not set(NON_SEMANTIC) & set(a.semantic_dict())


def test_the_data_spec_is_exactly_what_build_federated_data_takes():
    parameters = set(inspect.signature(build_federated_data).parameters)
    assert set(DATA_KNOBS) == parameters
    a, b = RunConfig(algorithm="fedavg", lr=0.5), RunConfig(algorithm="fedselect", rounds=3)
    assert a.data_key() == b.data_key()                       # same data, different runs
    assert RunConfig(val_fraction=0.2).data_key() != b.data_key()


def test_every_method_declares_its_knobs_its_display_name_and_a_paper_docstring():
    seen = set()
    for name in ALGORITHMS:
        cls = get_algorithm(name)
        assert cls.name == name and cls.display and cls.Params is params_class(name)
        assert not {f.name for f in dataclasses.fields(cls.Params)} & set(COMMON_KNOBS), name
        assert "Evaluated per client" in inspect.getmodule(cls).__doc__, name
        seen.add(cls.display)
    assert len(seen) == len(ALGORITHMS)
    assert RunConfig(fedselect_variant="layer", layer_block="B").label() == "FedSelect (layer B)"
    assert RunConfig(algorithm="fedavg_ft").label() == "FedAvg+FT"


def test_the_results_revision_is_part_of_every_hash(monkeypatch):
    import fl_core.config as config_module
    before = [RunConfig(algorithm=a).config_hash() for a in ("fedselect", "fedavg")]
    monkeypatch.setattr(config_module, "RESULTS_REVISION", config_module.RESULTS_REVISION + 1)
    after = [RunConfig(algorithm=a).config_hash() for a in ("fedselect", "fedavg")]
    assert all(b != a for b, a in zip(before, after))


def test_model_width_builds_a_wider_small_cnn_and_is_checked_before_work():
    import torch
    from fl_core.simulation import Simulation
    from conftest import tiny
    sim = Simulation(tiny(algorithm="fedavg", model="lenet", model_width=2.0, rounds=1))
    convs = [m for m in sim.trainer.model.modules() if isinstance(m, torch.nn.Conv2d)]
    assert [c.out_channels for c in convs] == [12, 32]  # LeNet's 6 and 16, doubled
    assert sim.trainer.model.head.in_features == 168
    assert RunConfig(algorithm="fedavg").config_hash() == RunConfig(algorithm="fedavg", model_width=1.0).config_hash()
    with pytest.raises(ConfigError,
                       match=r"model_width=2 needs a model with a width \(lenet, cnn2, cnn_bn, lenet_bn\)"):
        RunConfig(algorithm="fedavg", model="resnet18", model_width=2.0)
    with pytest.raises(ConfigError, match="model_width=5"):
        RunConfig(algorithm="fedavg", model="lenet", model_width=5.0)
