"""PerFedMask's defining properties: the masks respect every device's budget; frozen groups and the
head are bit-identical through local training (the head until fine-tuning); each body entry is
averaged over the participants that trained it and kept where none did; with every device at full
budget it is FedBABU; and its device profiles, layer groups and cost counters."""
import numpy as np
import pytest
import torch

from fl_core.config import ConfigError
from fl_core.devices import device_ratios, parse_ratios
from fl_core.simulation import Simulation

from conftest import metrics, tiny

# 8 clients, half at width 1/8: on the synthetic 8x8 data lenet's body has 20536 parameters
# (groups 156, 2416, 7800, 10164) and a 1/8 device may train 2567 of them.
RUN = dict(algorithm="perfedmask", num_clients=8, rounds=2, slim_ratios="8-1", mask_solver="greedy")
FT = dict(ft_epochs=1, ft_lr=0.01, ft_momentum=0.9)


def copied(state):
    return {n: t.clone() for n, t in state.items()}


@pytest.mark.parametrize("solver", ["greedy", "sca", "exact"])
def test_masks_respect_every_budget(solver):
    sim = Simulation(tiny(**(RUN | dict(mask_solver=solver, rounds=1))))
    algo = sim.algorithm
    d_w = sum(algo.numels[n] for n in algo.body_names)
    assert d_w == 20536
    for k, trains in enumerate(algo.trains):
        assert sum(algo.numels[n] for n in trains) <= algo.ratios[k] * d_w
        assert set(trains) <= set(algo.body_names)
    assert algo.ratios == [0.125] * 4 + [1.0] * 4
    row = next(sim.run()).clients
    for k, client in enumerate(row):  # the Parquet columns say the same
        assert client.metrics["trainable_params"] == sum(algo.numels[n] for n in algo.trains[k])
        assert client.metrics["ratio"] == algo.ratios[k]


def test_greedy_masks_give_small_devices_a_group_and_full_devices_everything():
    algo = Simulation(tiny(**RUN)).algorithm
    for k in range(4):
        assert 0 < len(algo.trains[k]) < len(algo.body_names)
    for k in range(4, 8):
        assert sorted(algo.trains[k]) == sorted(algo.body_names)


def test_frozen_groups_and_the_head_are_bit_identical_through_local_training():
    sim = Simulation(tiny(**RUN))
    algo = sim.algorithm
    init = copied(algo.global_state)
    k = 0
    client, data = sim.clients[k], sim.data.clients[k]
    before = copied(client.state)
    algo.local_update(k, client, data, 1)
    frozen = [n for n in algo.param_names if n not in algo.trains[k]]
    assert any(n in algo.body_names for n in frozen) and "head.weight" in frozen
    for n in frozen:
        assert torch.equal(client.state[n], before[n]), n
    for n in algo.trains[k]:
        assert not torch.equal(client.state[n], before[n]), n
    for _ in sim.run():  # whole rounds: the head never moves on any client or the server
        for c in sim.clients:
            for n in algo.head_names:
                assert torch.equal(c.state[n], init[n]) and torch.equal(algo.global_state[n], init[n])


def test_fine_tuning_moves_the_head_and_acc_global_is_before_it():
    sim = Simulation(tiny(**(RUN | FT)))
    last = list(sim.run())[-1]
    tuned = sim.algorithm.personalized_model(0, sim.clients[0], sim.data.clients[0], 2)
    assert not torch.equal(tuned["head.weight"], sim.clients[0].state["head.weight"])
    assert any(c.acc != c.acc_global for c in last.clients)


def test_each_entry_is_averaged_over_the_participants_that_trained_it():
    sim = Simulation(tiny(**(RUN | dict(rounds=1))))
    algo = sim.algorithm
    previous = copied(algo.global_state)
    trained = {}
    original = algo.aggregate

    def aggregate(clients, data, rnd):
        trained.update({k: copied(c.state) for k, c in enumerate(clients)})
        return original(clients, data, rnd)

    algo.aggregate = aggregate
    row = sim.run_round().clients
    weights = np.array(algo.aggregation_weights(sim.data.clients))
    for n in algo.body_names:
        who = [k for k in range(8) if n in algo.trains[k]]
        if not who:
            assert torch.equal(algo.global_state[n], previous[n]), n
            continue
        w = weights[who] / weights[who].sum()
        expected = sum(float(wk) * trained[k][n] for wk, k in zip(w, who))
        torch.testing.assert_close(algo.global_state[n], expected, rtol=1e-5, atol=1e-6)
    # uploads count the trained groups only; every participant downloads the whole body
    body = sum(algo.numels[n] for n in algo.body_names) * 4
    for k, client in enumerate(row):
        assert client.bytes_up == sum(algo.numels[n] for n in algo.trains[k]) * 4
        assert client.bytes_down == body


def test_a_group_no_participant_trained_keeps_its_previous_value():
    # only the 1/8 devices take part in round 1 (participation 0.5 samples 4 of 8; find a seed where
    # the sample holds no full device), so the groups no small device trains must not move
    for seed in range(50):
        sim = Simulation(tiny(**(RUN | dict(participation=0.5, seed=seed))))
        if all(k < 4 for k in sim.algorithm.participants(1)):
            break
    else:
        pytest.skip("no seed among 50 samples only small devices")
    algo = sim.algorithm
    untouched = [n for n in algo.body_names if not any(n in algo.trains[k] for k in algo.participants(1))]
    assert untouched
    previous = copied(algo.global_state)
    sim.run_round()
    for n in untouched:
        assert torch.equal(algo.global_state[n], previous[n]), n


def test_with_every_device_at_full_budget_perfedmask_is_fedbabu():
    common = dict(num_clients=4, rounds=3, **FT)
    mask = Simulation(tiny(algorithm="perfedmask", slim_ratios="1", **common))
    babu = Simulation(tiny(algorithm="fedbabu", **common))
    strip = lambda rows: [[{k: v for k, v in c.items() if k != "metrics"} for c in r] for r in rows]  # noqa: E731
    assert strip(metrics(mask.run())) == strip(metrics(babu.run()))
    for n, t in babu.algorithm.global_state.items():
        assert torch.equal(mask.algorithm.global_state[n], t), n


def test_backward_flops_drop_with_frozen_groups_and_forward_flops_do_not():
    sim = Simulation(tiny(**(RUN | dict(rounds=1))))
    rows = next(sim.run()).clients
    small, full = rows[0].metrics, rows[7].metrics
    assert small["fwd_mflops"] == full["fwd_mflops"] > 0  # frozen layers still run forward
    assert 0 < small["bwd_mflops"] < full["bwd_mflops"]
    assert small["trainable_params"] < full["trainable_params"] == 20536  # the head is not trainable


def test_device_ratios_follow_the_authors_schedule_and_nu():
    assert parse_ratios("8-4-2-1") == [0.125, 0.25, 0.5, 1.0]
    assert device_ratios("8-1", 20) == [0.125] * 10 + [1.0] * 10
    assert device_ratios("8-4-2-1", 8) == [0.125, 0.125, 0.25, 0.25, 0.5, 0.5, 1.0, 1.0]
    assert device_ratios("8-1", 10, full_share=0.2) == [0.125] * 8 + [1.0] * 2
    assert device_ratios("8-4-1", 10, full_share=0.6) == [0.125, 0.125, 0.25, 0.25] + [1.0] * 6
    assert device_ratios("8-1", 10, full_share=1.0) == [1.0] * 10
    assert device_ratios("2", 3, full_share=0.2) == [0.5] * 3


def test_an_explicit_profile_overrides_the_schedule():
    profiles = [{"ratio": 1.0}] * 7 + [{}]
    sim = Simulation(tiny(**RUN), profiles=profiles)
    assert sim.algorithm.ratios == [1.0] * 7 + [1.0]
    with pytest.raises(ConfigError, match=r"ratio=1\.5 is outside \(0, 1\]"):
        Simulation(tiny(**RUN), profiles=[{"ratio": 1.5}] * 8)


def test_an_exact_solve_too_large_is_one_clear_error_before_training():
    with pytest.raises(ConfigError, match=r"mask_solver='exact': .*too large for the exact solver.*solve_sca"):
        Simulation(tiny(**(RUN | dict(mask_solver="exact", num_clients=80, partition="iid"))))


@pytest.mark.parametrize("bad, message", [
    (dict(slim_ratios="0-1"), "slim_ratios='0-1' is not allowed"),
    (dict(slim_ratios="eight"), "slim_ratios='eight' is not allowed"),
    (dict(full_share=1.5), r"full_share=1\.5 is outside"),
    (dict(mask_solver="mosek"), "mask_solver='mosek' is not allowed; choose one of sca, exact, greedy"),
])
def test_bad_device_knobs_are_one_clear_error(bad, message):
    with pytest.raises(ConfigError, match=message):
        tiny(**(RUN | bad))


MODEL_SHAPES = {"lenet": (1, 28, 28), "cnn2": (1, 28, 28), "cnn_bn": (1, 28, 28), "lenet_bn": (1, 28, 28),
                "resnet18_cifar": (3, 32, 32), "resnet18": (3, 32, 32), "preresnet18": (3, 32, 32),
                "mobilenet_cifar": (3, 32, 32)}


@pytest.mark.parametrize("model", sorted(MODEL_SHAPES))
def test_every_registered_model_has_layer_groups_covering_its_body(model):
    from fl_core.models import HEAD_PREFIX, build_model, is_head, layer_groups

    assert set(MODEL_SHAPES) == set(HEAD_PREFIX)  # a new model needs its groups (and a line here)
    names = [n for n, _ in build_model(model, MODEL_SHAPES[model], 10).named_parameters()]
    groups = layer_groups(model, names)
    members = [p for _, ps in groups for p in ps]
    assert sorted(members) == sorted(n for n in names if not is_head(model, n)) and len(members) == len(set(members))
    assert all(ps for _, ps in groups)  # no empty group
    # the authors' groupings: PreResNet-18 10 (stem, 8 blocks, final BN), MobileNet 14
    assert len(groups) == {"preresnet18": 10, "mobilenet_cifar": 14}.get(model, len(groups))


def test_the_flop_counter_matches_a_hand_count_and_knows_frozen_layers():
    from torch import nn

    from fl_core.flops import training_flops

    # Linear(4, 3) -> ReLU -> Linear(3, 2), per sample, 1 multiply-add = 2 FLOPs:
    # forward 2·4·3 + 2·3·2 = 36; backward: layer 2's weight gradient (12) and input gradient (12),
    # layer 1's weight gradient (24) and no input gradient (the data needs none) = 48
    net = nn.Sequential(nn.Linear(4, 3), nn.ReLU(), nn.Linear(3, 2))
    assert training_flops(net, (4,)) == (36, 48)
    assert training_flops(net, (4,), ["2.weight", "2.bias"]) == (36, 12)  # nothing before layer 2 trains
    assert training_flops(net, (4,), ["0.weight"]) == (36, 12 + 24)       # layer 2 frozen: input gradient only
    assert training_flops(net, (4,), []) == (36, 0)
    assert training_flops(net, (4,), densities={"0": 0.5}) == (12 + 12, 12 + 12 + 12)  # half of layer 1
    assert all(p.requires_grad for p in net.parameters())  # flags restored
