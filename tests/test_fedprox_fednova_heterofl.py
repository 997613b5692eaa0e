"""FedProx, FedNova and HeteroFL (PerFedMask's baselines): each reduces to FedAvg where its paper
says it should (μ = 0; equal local steps; every device at full width), and otherwise does what
defines it: the proximal pull, the normalised average with the momentum step weights a(τ), and
width slices whose dead channels stay zero and carry nothing through any registered model."""
import math

import pytest
import torch
from torch import nn

from fl_core.algorithms.fednova import momentum_steps_weight
from fl_core.algorithms.heterofl import width_slices
from fl_core.config import ConfigError
from fl_core.models import HEAD_PREFIX, build_model
from fl_core.simulation import Simulation
from fl_core.training import LocalTrainer, SGDSettings, read_state

from conftest import restore_mid_run, tiny


def global_copy(sim):
    return {n: t.clone() for n, t in sim.algorithm.global_state.items()}


def scores(result):
    return [(c.acc, c.acc_global, c.acc_local, c.bytes_up, c.bytes_down) for c in result.clients]


# ---------------------------------------------------------------------------- FedProx
def test_fedprox_at_mu_0_is_fedavg_bit_for_bit():
    fedavg, fedprox = Simulation(tiny(algorithm="fedavg")), Simulation(tiny(algorithm="fedprox", mu=0.0))
    for _ in range(3):
        ra, rb = fedavg.run_round(), fedprox.run_round()
        ga, gb = fedavg.algorithm.global_state, fedprox.algorithm.global_state
        assert all(torch.equal(ga[n], gb[n]) for n in ga)
        assert scores(ra) == scores(rb)  # acc is the un-tuned broadcast model: acc_global
    for a, b in zip(fedavg.clients, fedprox.clients):
        assert all(torch.equal(a.state[n], b.state[n]) for n in a.state)


def test_fedprox_pulls_the_local_model_towards_the_model_it_received():
    drift = {}
    for mu in (0.0, 1.0):
        sim = Simulation(tiny(algorithm="fedprox", mu=mu, local_epochs=3, lr=0.1))
        algo, start = sim.algorithm, global_copy(sim)
        client = sim.clients[0]
        algo.local_update(0, client, sim.data.clients[0], 1)
        drift[mu] = math.sqrt(sum(float((client.state[n] - start[n]).pow(2).sum()) for n in algo.param_names))
    assert 0 < drift[1.0] < drift[0.0]
    a, b = (Simulation(tiny(algorithm="fedprox", mu=mu, rounds=1)) for mu in (0.0, 0.5))
    a.run_round(), b.run_round()
    assert not torch.equal(a.algorithm.global_state["head.weight"], b.algorithm.global_state["head.weight"])


# ---------------------------------------------------------------------------- FedNova
def step_weight_by_summing(steps, rho):
    """a(τ) from its definition: the gradient of step s moves w by lr·Σ_{t≥s} ρ^(t−s)."""
    return sum(sum(rho ** j for j in range(steps - s + 1)) for s in range(1, steps + 1))


@pytest.mark.parametrize("rho", [0.0, 0.5, 0.9])
def test_the_momentum_step_weight_is_the_engines_displacement_under_a_constant_gradient(rho):
    model = nn.Linear(3, 1, bias=False)
    g = torch.tensor([[0.5, -1.0, 2.0]])
    trainer = LocalTrainer(model, SGDSettings(lr=0.1, batch_size=5, momentum=rho))
    n, epochs = 37, 2
    steps = math.ceil(n / 5)  # 8 steps per pass, the last on 2 samples
    x, y = torch.zeros(n, 3), torch.zeros(n, dtype=torch.long)
    start = read_state(model)
    state = start
    for epoch in range(epochs):  # the engine restarts the momentum buffer with every pass
        state, _, _ = trainer.train_pass(state, x, y, {"weight": None}, seed=epoch,
                                         loss_fn=lambda m, xb, yb: (m.weight * g).sum())
    moved = start["weight"] - state["weight"]
    a = epochs * momentum_steps_weight(steps, rho)
    assert a == pytest.approx(epochs * step_weight_by_summing(steps, rho))
    assert (rho == 0) == (a == epochs * steps)
    assert torch.allclose(moved, 0.1 * a * g, rtol=1e-5, atol=0)


def test_fednova_with_equal_local_steps_is_fedavg_up_to_rounding():
    common = dict(samples_per_client=100, local_epochs=2, momentum=0.5)
    fedavg, fednova = Simulation(tiny(algorithm="fedavg", **common)), Simulation(tiny(algorithm="fednova", **common))
    assert {d.n_train for d in fednova.data.clients} == {100}  # shards capped: equal sizes, equal steps
    expected_a = 2 * momentum_steps_weight(7, 0.5)  # ⌈100/16⌉ = 7 steps per epoch
    for _ in range(3):
        ra, rb = fedavg.run_round(), fednova.run_round()
        # Not bitwise: x − τ_eff·Σ p_i (x − x_i)/a_i rounds differently from Σ p_i x_i. Each round
        # starts from FedAvg's state, so only one round's rounding is compared: over several rounds
        # training amplifies it (2.7e-4 after round 2 on an AMD EPYC), whatever the CPU.
        ga, gb = fedavg.algorithm.global_state, fednova.algorithm.global_state
        assert all(torch.allclose(ga[n], gb[n], rtol=0, atol=1e-6) for n in ga)
        fednova.algorithm.global_state = {n: t.clone() for n, t in ga.items()}
        for mine, theirs in zip(fednova.clients, fedavg.clients):
            mine.state = {n: t.clone() for n, t in theirs.state.items()}
        assert [c.metrics["local_steps"] for c in rb.clients] == [14.0] * 4
        assert [c.metrics["nova_a"] for c in rb.clients] == [expected_a] * 4
        assert [(c.bytes_up, c.bytes_down) for c in ra.clients] == [(c.bytes_up, c.bytes_down) for c in rb.clients]


def test_fednova_normalises_unequal_local_work_as_the_papers_update():
    sim = Simulation(tiny(algorithm="fednova", num_clients=3, local_epochs=3, local_epochs_min=1, momentum=0.5,
                          weighting="samples", rounds=3))
    algo, seen, clients = sim.algorithm, {}, range(3)
    original = algo.aggregate

    def aggregate(states, data, rnd):
        seen["trained"] = [{n: c.state[n].double() for n in algo.param_names} for c in states]
        return original(states, data, rnd)

    algo.aggregate = aggregate
    differs_from_fedavg = False
    for rnd in (1, 2, 3):
        before = {n: t.double() for n, t in algo.global_state.items()}
        result = sim.run_round()
        # by hand: a_i = Σ over its epochs of Σ_{j≤τ} (1 − ρ^j)/(1 − ρ), τ = ⌈n_i / 16⌉ steps per epoch
        epochs = [algo.epochs_of(k, rnd) for k in clients]
        taus = [math.ceil(d.n_train / 16) for d in sim.data.clients]
        a = [e * step_weight_by_summing(t, 0.5) for e, t in zip(epochs, taus)]
        assert [c.metrics["nova_a"] for c in result.clients] == pytest.approx(a)
        assert [c.metrics["local_steps"] for c in result.clients] == [e * t for e, t in zip(epochs, taus)]
        total = sum(d.n_train for d in sim.data.clients)
        p = [d.n_train / total for d in sim.data.clients]
        tau_eff = sum(p[i] * a[i] for i in clients)
        for n in algo.param_names:
            x, trained = before[n], [s[n] for s in seen["trained"]]
            expected = x - tau_eff * sum(p[i] * (x - trained[i]) / a[i] for i in clients)
            assert torch.allclose(algo.global_state[n].double(), expected, rtol=0, atol=1e-6), n
            fedavg = sum(p[i] * trained[i] for i in clients)
            if len(set(a)) > 1 and not torch.allclose(expected, fedavg, rtol=0, atol=1e-4):
                differs_from_fedavg = True
        for c in sim.clients:  # every participant holds the new global model
            assert all(torch.equal(c.state[n], algo.global_state[n]) for n in algo.param_names)
    assert differs_from_fedavg
    drawn = {algo.epochs_of(k, r) for k in clients for r in range(1, 30)}
    assert drawn == {1, 2, 3}


def test_fednova_restores_mid_run(tmp_path):
    restore_mid_run(tiny(algorithm="fednova", local_epochs=2, local_epochs_min=1, rounds=3), tmp_path)


# ---------------------------------------------------------------------------- HeteroFL
def zero_outside(state, masks):
    return all(not state[n][~m].any() for n, m in masks.items())


def test_heterofl_with_every_device_at_full_width_is_fedavg_bit_for_bit():
    common = dict(model="lenet_bn", momentum=0.5)  # HeteroFL keeps BN statistics local; so does this FedAvg
    fedavg, heterofl = Simulation(tiny(algorithm="fedavg", bn_stats="local", **common)), \
        Simulation(tiny(algorithm="heterofl", slim_ratios="1", **common))
    for _ in range(3):
        ra, rb = fedavg.run_round(), heterofl.run_round()
        ga, gb = fedavg.algorithm.global_state, heterofl.algorithm.global_state
        assert all(torch.equal(ga[n], gb[n]) for n in ga)
        assert scores(ra) == scores(rb)
        assert [c.metrics["width"] for c in rb.clients] == [1.0] * 4
    assert all(heterofl.algorithm.contribution(c) is None for c in heterofl.clients)


def test_heterofl_keeps_every_entry_outside_a_clients_slice_at_zero():
    # weight decay and momentum on: a zero entry's decay is zero, and the step is masked after momentum
    sim = Simulation(tiny(algorithm="heterofl", model="lenet_bn", slim_ratios="8-1", weight_decay=0.01,
                          momentum=0.9, ft_epochs=1, rounds=2))
    algo = sim.algorithm
    assert algo.widths == [0.125, 0.125, 1.0, 1.0]
    slices = [algo.slices(w)[0] for w in algo.widths]
    assert not slices[2] and slices[0] and all(m.any() and not m.all() for m in slices[0].values())
    for client, masks in zip(sim.clients, slices):
        assert zero_outside(client.state, masks)  # from the start
    original = algo.local_update
    checked = []

    def local_update(k, client, data, rnd):
        before = {n: client.state[n].clone() for n in slices[k]}
        stats = original(k, client, data, rnd)
        assert zero_outside(client.state, slices[k])
        assert all(not torch.equal(before[n][m], client.state[n][m]) for n, m in slices[k].items()
                   if n.endswith("weight"))  # the slice itself trains
        checked.append(k)
        return stats

    algo.local_update = local_update
    for rnd in (1, 2):
        result = sim.run_round()
        assert [c.metrics["width"] for c in result.clients] == [0.125, 0.125, 1.0, 1.0]
        for k, client in enumerate(sim.clients):
            assert zero_outside(client.state, slices[k])
            tuned = algo.personalized_model(k, client, sim.data.clients[k], rnd)
            assert zero_outside(tuned, slices[k])
            for n, m in slices[k].items():  # inside the slice: the global values
                assert torch.equal(client.state[n][m], algo.global_state[n][m])
    assert sorted(checked) == [0, 0, 1, 1, 2, 2, 3, 3]


def test_heterofl_averages_by_slice_and_keeps_entries_no_participant_trained():
    sim = Simulation(tiny(algorithm="heterofl", slim_ratios="8-1"))
    algo, narrow = sim.algorithm, sim.algorithm.slices(0.125)[0]
    previous = global_copy(sim)
    for k in (0, 1):
        algo.local_update(k, sim.clients[k], sim.data.clients[k], 1)
    trained = [{n: t.clone() for n, t in sim.clients[k].state.items()} for k in (0, 1)]
    traffic = algo.aggregate([sim.clients[0], sim.clients[1]], sim.data.clients[:2], 1)
    new = algo.global_state
    for n in algo.param_names:
        inside = narrow.get(n, torch.ones_like(new[n], dtype=torch.bool))
        mean = (trained[0][n] + trained[1][n]) / 2
        assert torch.equal(new[n][~inside], previous[n][~inside]), n   # trained by no participant
        assert torch.allclose(new[n][inside], mean[inside], rtol=0, atol=1e-7), n
    entries = sum(int(narrow[n].sum()) if n in narrow else algo.numels[n] for n in algo.param_names)
    assert traffic.up == traffic.down == [4 * entries] * 2


def test_a_narrow_lenets_training_cost_is_that_of_the_narrow_network():
    sim = Simulation(tiny(algorithm="heterofl", model="lenet", slim_ratios="8-1", rounds=1))
    result = sim.run_round()
    narrow, full = result.clients[0].metrics, result.clients[3].metrics
    # LeNet on 8x8x1 at width 1/8: conv 1→1 (⌈6/8⌉), conv 1→2 (⌈16/8⌉), 2·2·2 flat → 15 (⌈120/8⌉) → 11 (⌈84/8⌉) → 10
    by_hand = (1 * 1 * 25 + 1) + (2 * 1 * 25 + 2) + (15 * 2 * 4 + 15) + (11 * 15 + 11) + (10 * 11 + 10)
    assert narrow["trainable_params"] == by_hand == 509
    assert full["trainable_params"] == sum(sim.algorithm.numels.values())
    assert narrow["fwd_mflops"] < full["fwd_mflops"] / 10 and narrow["bwd_mflops"] < full["bwd_mflops"] / 10
    assert [c.bytes_up for c in result.clients] == [4 * 509] * 2 + [4 * sum(sim.algorithm.numels.values())] * 2


@pytest.mark.parametrize("model_name", list(HEAD_PREFIX))
def test_every_models_dead_channels_carry_nothing(model_name):
    """At width 1/2: each layer's outputs are all-or-nothing per channel (a live channel keeps the
    same inputs, its bias and BN entries; a dead one keeps nothing), and random values in the
    entries outside the slice of live channels (the inputs that dead channels feed) leave the
    logits unchanged."""
    shape = (3, 32, 32) if model_name in ("resnet18_cifar", "resnet18", "preresnet18", "mobilenet_cifar") \
        else (1, 8, 8)
    torch.manual_seed(0)
    model = build_model(model_name, shape, 10).train()  # batch statistics: deep nets keep their signal
    masks = width_slices(model, model_name, 0.5)
    params = dict(model.named_parameters())
    assert masks and not any(HEAD_PREFIX[model_name] + "bias" == n for n in masks)  # every class kept
    for n, m in masks.items():
        rows = m.reshape(m.shape[0], -1)
        live = rows.any(1)
        assert live.any() and torch.equal(live, torch.arange(len(live)) < int(live.sum())), n  # a prefix
        assert all(torch.equal(rows[i], rows[0]) for i in range(int(live.sum()))), n  # same inputs
        bias = n[:-len("weight")] + "bias"
        if n.endswith("weight") and bias in params:
            assert torch.equal(masks.get(bias, torch.ones_like(live)), live), n
    x = torch.randn(4, *shape)
    with torch.no_grad():
        full = model(x)
        for n, m in masks.items():
            params[n].masked_fill_(~m, 0)
        sliced = model(x)
        for n, m in masks.items():
            if m.dim() > 1:
                live = m.reshape(m.shape[0], -1).any(1).view(-1, *[1] * (m.dim() - 1))
                feeds = ~m & live  # inputs of live channels that dead channels would feed
                params[n].copy_(torch.where(feeds, torch.randn_like(params[n]), params[n]))
        perturbed = model(x)
    assert not torch.allclose(full, sliced)
    assert torch.allclose(sliced, perturbed, rtol=0, atol=1e-5)


def test_heterofl_restores_mid_run(tmp_path):
    restore_mid_run(tiny(algorithm="heterofl", model="lenet_bn", rounds=3), tmp_path)


# ---------------------------------------------------------------------------- all three
@pytest.mark.parametrize("algorithm", ["fedprox", "fednova", "heterofl"])
def test_accuracy_is_the_untuned_model_unless_a_study_fine_tunes(algorithm):
    plain = Simulation(tiny(algorithm=algorithm, rounds=1)).run_round()
    assert [c.acc for c in plain.clients] == [c.acc_global for c in plain.clients]
    tuned = Simulation(tiny(algorithm=algorithm, rounds=1, ft_epochs=3, ft_lr=0.2, ft_momentum=0.9)).run_round()
    assert [c.acc_global for c in tuned.clients] == [c.acc_global for c in plain.clients]
    assert [c.acc for c in tuned.clients] != [c.acc for c in plain.clients]
    assert all(c.metrics["trainable_params"] > 0 for c in tuned.clients)


@pytest.mark.parametrize("knobs, needle", [
    (dict(algorithm="fedprox", mu=-1), "mu=-1"),
    (dict(algorithm="heterofl", slim_ratios="x"), "slim_ratios='x'"),
    (dict(algorithm="fednova", local_epochs_min=0), "local_epochs_min=0"),
])
def test_bad_knobs_are_refused_naming_the_value(knobs, needle):
    with pytest.raises(ConfigError, match=needle):
        tiny(**knobs)


def test_fednova_refuses_a_minimum_above_local_epochs():
    with pytest.raises(ConfigError, match="local_epochs_min=3 is more than local_epochs=2"):
        Simulation(tiny(algorithm="fednova", local_epochs=2, local_epochs_min=3))
    assert Simulation(tiny(algorithm="fednova", local_epochs=2, local_epochs_min=2)).algorithm.epochs_of(0, 1) == 2
