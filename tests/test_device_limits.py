"""The devices' limits for PerFedMask's full-model baselines (`weak_epochs`, the authors'
`--wk_factor`): a device below full width runs ⌈E·f⌉ of the E local epochs, counted in its local
passes and samples; and FedNova's normalisation as the authors apply it (`nova_form = "lr"`),
checked against a hand computation of their scaled learning rates and plain average."""
import math

import pytest
import torch

from fl_core.algorithms.fednova import momentum_steps_weight
from fl_core.config import ConfigError, RunConfig
from fl_core.devices import WeakDeviceParams
from fl_core.simulation import Simulation

from conftest import restore_mid_run, tiny

BASELINES = ("fedavg_ft", "fedbabu", "fedprox", "fednova")


def count_passes(sim):
    """Wrap the algorithm's `train_pass`: (client, purpose) -> passes made."""
    algo, passes = sim.algorithm, {}
    original = algo.train_pass

    def train_pass(k, client, data, rnd, epoch, update, purpose, stats, **options):
        passes[(k, purpose)] = passes.get((k, purpose), 0) + 1
        return original(k, client, data, rnd, epoch, update, purpose, stats, **options)

    algo.train_pass = train_pass
    return passes


@pytest.mark.parametrize("algorithm", BASELINES)
def test_a_weak_device_runs_the_ceiling_of_half_its_epochs(algorithm):
    # 4 devices at 8-1: clients 0 and 1 at width 1/8 (weak), 2 and 3 at full width; E = 3 -> ⌈1.5⌉ = 2
    sim = Simulation(tiny(algorithm=algorithm, local_epochs=3, weak_epochs=0.5, rounds=1))
    passes = count_passes(sim)
    result = sim.run_round()
    trained = {k: n for (k, purpose), n in passes.items() if purpose == "global"}
    assert trained == {0: 2, 1: 2, 2: 3, 3: 3}
    rows = {c.client: c.metrics for c in result.clients}
    assert [rows[k]["epochs_run"] for k in range(4)] == [2.0, 2.0, 3.0, 3.0]
    assert [rows[k]["ratio"] for k in range(4)] == [0.125, 0.125, 1.0, 1.0]
    if algorithm == "fednova":  # its τ_i counts the steps the device made
        steps = [math.ceil(d.n_train / 16) for d in sim.data.clients]
        assert [rows[k]["local_steps"] for k in range(4)] == [2 * steps[0], 2 * steps[1], 3 * steps[2], 3 * steps[3]]


@pytest.mark.parametrize("algorithm", BASELINES)
def test_without_the_limits_every_device_runs_every_epoch_and_the_rows_say_nothing_of_devices(algorithm):
    sim = Simulation(tiny(algorithm=algorithm, local_epochs=3, rounds=1))
    passes = count_passes(sim)
    result = sim.run_round()
    assert {k: n for (k, purpose), n in passes.items() if purpose == "global"} == {0: 3, 1: 3, 2: 3, 3: 3}
    assert all("epochs_run" not in c.metrics and "ratio" not in c.metrics for c in result.clients)


def test_the_limits_leave_earlier_hashes_alone_and_name_the_run():
    # hashes of these configurations before the device knobs existed (main at 46b131e)
    before = {"fedavg_ft": "b6b1dcd123b3", "fedbabu": "c47877bda074", "fedprox": "e3f8485a85e2",
              "fednova": "e006656f5a41", "perfedmask": "840d64c79b95"}
    for algorithm, digest in before.items():
        config = RunConfig(algorithm=algorithm, dataset="fmnist", model="lenet", num_clients=20, rounds=50)
        assert config.config_hash() == digest, algorithm
    plain = RunConfig(algorithm="fedbabu", dataset="fmnist", model="lenet", num_clients=20, rounds=50)
    limited = plain.replace(weak_epochs=0.5)
    assert limited.config_hash() != plain.config_hash()
    assert limited.replace(slim_ratios="8-4-2-1").config_hash() != limited.config_hash()
    assert limited.label() == "FedBABU (weak ×0.5)"
    assert limited.replace(slim_ratios="8-4-2-1").label() == "FedBABU (weak ×0.5, 8-4-2-1)"
    assert plain.label() == "FedBABU"


def test_epochs_round_up_and_a_full_width_device_is_never_limited():
    params = WeakDeviceParams(weak_epochs=0.5)
    assert [params.epochs(e, 0.125) for e in (1, 2, 3, 4, 5)] == [1, 1, 2, 2, 3]
    assert params.epochs(5, 1.0) == 5
    assert WeakDeviceParams().epochs(5, 0.125) == 5


@pytest.mark.parametrize("knobs,needle", [
    (dict(algorithm="fedbabu", slim_ratios="8-4-1"), "change nothing without weak_epochs"),
    (dict(algorithm="fedprox", full_share=0.5), "change nothing without weak_epochs"),
    (dict(algorithm="fedbabu", weak_epochs=0.0), "weak_epochs"),
    (dict(algorithm="fedbabu", weak_epochs=1.5), "weak_epochs"),
    (dict(algorithm="fednova", weak_epochs=0.5, local_epochs_min=1, local_epochs=2), "two sources of unequal"),
    (dict(algorithm="fedavg", weak_epochs=0.5), "is a knob of"),
    (dict(algorithm="perfedmask", weak_epochs=0.5), "is a knob of"),
    (dict(algorithm="fednova", nova_form="client"), "nova_form"),
])
def test_bad_device_limits_are_one_clear_error(knobs, needle):
    with pytest.raises(ConfigError, match=needle):
        tiny(**knobs)


def test_a_limited_run_restores_mid_run(tmp_path):
    restore_mid_run(tiny(algorithm="fedbabu", local_epochs=2, weak_epochs=0.5, rounds=3), tmp_path)


# ---------------------------------------------------------------------------- FedNova, the authors' form
def two_unequal_devices(**knobs):
    """2 devices of 32 images (2 steps of 16 per epoch), E = 2: device 0 at width 1/8 runs 1 epoch
    (τ = 2), device 1 runs 2 (τ = 4); one momentum buffer per round, as the authors' optimiser."""
    config = tiny(algorithm="fednova", num_clients=2, samples_per_client=32, local_epochs=2, weak_epochs=0.5,
                  momentum=0.9, momentum_scope="round", rounds=2, **knobs)
    sim = Simulation(config)
    assert [d.n_train for d in sim.data.clients] == [32, 32]
    return sim


def test_fednova_lr_form_scales_each_devices_lr_by_tau_eff_over_a_and_averages_plainly():
    sim = two_unequal_devices(nova_form="lr")
    algo, seen = sim.algorithm, {"lr": {}}
    run_epochs = algo.run_epochs

    def spy(k, client, data, rnd, epochs, update, purpose="global", **options):
        if purpose == "global":
            seen["lr"][k] = options["lr"]
        return run_epochs(k, client, data, rnd, epochs, update, purpose, **options)

    aggregate = algo.aggregate

    def capture(states, data, rnd):
        seen["trained"] = [{n: c.state[n].clone() for n in algo.param_names} for c in states]
        return aggregate(states, data, rnd)

    algo.run_epochs, algo.aggregate = spy, capture
    result = sim.run_round()
    # by hand, ρ = 0.9: a(2) = (0.1 + 0.19)/0.1 = 2.9, a(4) = (0.1 + 0.19 + 0.271 + 0.3439)/0.1 = 9.049,
    # τ_eff = (2.9 + 9.049)/2 = 5.9745: the devices' lr multipliers are 2.06017 and 0.66024
    assert [c.metrics["nova_a"] for c in sorted(result.clients, key=lambda c: c.client)] == pytest.approx([2.9, 9.049])
    lr = sim.config.lr
    assert seen["lr"][0] == pytest.approx(lr * 5.9745 / 2.9) and seen["lr"][0] / lr == pytest.approx(2.06017, abs=1e-5)
    assert (seen["lr"][1] == pytest.approx(lr * 5.9745 / 9.049)
            and seen["lr"][1] / lr == pytest.approx(0.66024, abs=1e-5))
    for n in algo.param_names:  # the server: the plain (uniform) average of what the devices trained
        expected = (seen["trained"][0][n] + seen["trained"][1][n]) / 2
        assert torch.allclose(algo.global_state[n], expected, rtol=0, atol=1e-7), n


def test_fednova_lr_form_and_the_papers_form_agree_to_first_order_in_the_learning_rate():
    share = {}  # |server form − lr form| / |server form's step|, one round
    for lr in (0.2, 0.01):
        states = {}
        for form in ("server", "lr"):
            sim = two_unequal_devices(nova_form=form, lr=lr)
            start = torch.cat([t.flatten().double() for t in sim.algorithm.global_state.values()])
            sim.run_round()
            states[form] = torch.cat([t.flatten().double() for t in sim.algorithm.global_state.values()])
        share[lr] = float((states["server"] - states["lr"]).norm() / (states["server"] - start).norm())
    # measured: 0.094 at lr 0.2, 0.016 at lr 0.01 (0.004 at 0.001, where float32 rounding is most of it)
    assert share[0.01] < 0.05 and share[0.01] < share[0.2] / 3


def test_the_round_scope_step_weight_spans_the_whole_round():
    sim = two_unequal_devices()
    result = sim.run_round()
    a = {c.client: c.metrics["nova_a"] for c in result.clients}
    assert a == pytest.approx({0: momentum_steps_weight(2, 0.9), 1: momentum_steps_weight(4, 0.9)})
    assert a[1] != pytest.approx(2 * momentum_steps_weight(2, 0.9))  # not two restarted epochs
