"""FedFomo: the first-order weights and the update they make (worse models get 0, better ones
(ΔL / distance) normalised), M = 0 is Local bit for bit, ε-greedy picks by affinity, save/restore,
learning on digits, traffic (one model up, M down) and the refusal of a run without validation."""
import copy
import math

import pytest
import torch
from torch.nn import functional as F

from fl_core.config import ConfigError, RunConfig
from fl_core.simulation import Simulation

from conftest import restore_mid_run, tiny


def fomo(**overrides) -> RunConfig:
    return tiny(**({"algorithm": "fedfomo", "val_fraction": 0.2} | overrides))


def digits(**overrides) -> RunConfig:
    base = dict(dataset="digits", partition="shards", shards_per_client=2, num_clients=10, threads=1, seed=0,
                val_fraction=0.2, local_epochs=5)
    return RunConfig(**(base | overrides))


def model_bytes(sim) -> int:
    return 4 * sum(p.numel() for p in sim.trainer.model.parameters())


def independent_val_loss(sim, state, d) -> float:
    model = copy.deepcopy(sim.trainer.model)
    model.load_state_dict(state)
    model.eval()
    with torch.no_grad():
        return float(F.cross_entropy(model(d.x_val), d.y_val))


def hand_made_candidates(sim):
    """Client 0's own model and three candidates: trained further (better), halfway there (better),
    and the own model plus noise (worse)."""
    algo, own, d = sim.algorithm, sim.clients[0].state, sim.data.clients[0]
    better = own
    for epoch in range(3):
        better, _, _ = sim.trainer.train_pass(better, d.x_train, d.y_train, algo.full_update(), seed=epoch)
    generator = torch.Generator().manual_seed(1)
    halfway = own | {n: own[n] + 0.5 * (better[n] - own[n]) for n in algo.param_names}
    worse = own | {n: own[n] + 0.5 * torch.randn(own[n].shape, generator=generator) for n in algo.param_names}
    return {n: t.clone() for n, t in own.items()}, [better, worse, halfway]


def test_fomo_update_gives_worse_models_zero_and_better_ones_their_normalised_first_order_weight():
    sim = Simulation(fomo(rounds=1))
    algo, d = sim.algorithm, sim.data.clients[0]
    own, candidates = hand_made_candidates(sim)
    for j, state in zip((1, 2, 3), candidates):
        sim.clients[j].state = state
    own_loss = independent_val_loss(sim, own, d)
    losses = [independent_val_loss(sim, s, d) for s in candidates]
    assert losses[0] < own_loss and losses[2] < own_loss < losses[1], (own_loss, losses)  # the premise
    dist = [math.sqrt(sum(float((s[n] - own[n]).double().pow(2).sum()) for n in algo.param_names)) for s in candidates]
    raw = [(own_loss - loss) / dd for loss, dd in zip(losses, dist)]
    weights = [max(w, 0.0) / (raw[0] + raw[2]) for w in raw]
    assert weights[1] == 0 and 0 < weights[0] < 1 and 0 < weights[2] < 1

    traffic = algo.mix_neighbours(sim.clients, sim.data.clients, {0: [1, 2, 3]}, 1)

    for n in algo.param_names:
        expected = own[n] + sum(w * (s[n] - own[n]) for w, s in zip(weights, candidates))
        assert torch.allclose(sim.clients[0].state[n], expected, rtol=1e-4, atol=1e-6), n
    for n in set(own) - set(algo.param_names):  # buffers stay the client's
        assert torch.equal(sim.clients[0].state[n], own[n])
    for j, state in zip((1, 2, 3), candidates):  # the senders are unchanged
        assert all(torch.equal(sim.clients[j].state[n], t) for n, t in state.items())
    # The server adds the signed weights to the affinity row of client 0.
    assert algo.affinity[0, 1:].tolist() == pytest.approx(raw, rel=1e-4)
    assert algo.affinity[1:].abs().sum() == 0
    assert traffic.up == [model_bytes(sim)] * 4 and traffic.down == [3 * model_bytes(sim), 0, 0, 0]


def test_fomo_keeps_the_own_model_exactly_when_no_weight_is_positive():
    sim = Simulation(fomo(rounds=1))
    own, (_, worse, _) = hand_made_candidates(sim)
    sim.clients[1].state = worse
    sim.clients[2].state = dict(own)  # identical model: distance 0, weight 0
    sim.algorithm.mix_neighbours(sim.clients, sim.data.clients, {0: [1, 2]}, 1)
    assert all(torch.equal(sim.clients[0].state[n], t) for n, t in own.items())
    assert sim.algorithm.affinity[0, 1] < 0 and sim.algorithm.affinity[0, 2] == 0


def test_fedfomo_with_m_zero_is_local_bit_for_bit():
    fedfomo, local = Simulation(fomo(fedfomo_m=0)), Simulation(tiny(algorithm="local", val_fraction=0.2))
    for ra, rb in zip(fedfomo.run(), local.run()):
        assert [(c.acc, c.acc_local, c.acc_global, c.acc_val) for c in ra.clients] == \
               [(c.acc, c.acc_local, c.acc_global, c.acc_val) for c in rb.clients]
        assert [c.bytes_down for c in ra.clients] == [0] * 4
    for a, b in zip(fedfomo.clients, local.clients):
        assert all(torch.equal(t, b.state[n]) for n, t in a.state.items())


def test_epsilon_greedy_takes_the_highest_affinities_at_epsilon_zero_and_decays_epsilon():
    sim = Simulation(fomo(fedfomo_m=2, fedfomo_epsilon=0.0))
    algo = sim.algorithm
    algo.affinity[0] = torch.tensor([0.0, -1.0, 2.0, 0.5], dtype=torch.float64)
    algo.affinity[3] = torch.tensor([0.3, 0.2, 0.1, 0.0], dtype=torch.float64)
    graph = algo.neighbours(1, [0, 1, 2, 3])
    assert sorted(graph[0]) == [2, 3] and sorted(graph[3]) == [0, 1]
    assert all(k not in others and len(set(others)) == 2 for k, others in graph.items())
    assert sorted(algo.neighbours(1, [0, 1])[0]) == [1]  # fewer candidates than M
    explore = Simulation(fomo(fedfomo_m=2, fedfomo_epsilon=1.0)).algorithm
    assert explore.neighbours(3, [0, 1, 2, 3]) == explore.neighbours(3, [0, 1, 2, 3])  # seeded
    eps = Simulation(fomo()).algorithm.epsilon
    assert [eps(t) for t in (1, 2, 4, 6, 9)] == pytest.approx([0.25, 0.2, 0.1, 0.0, 0.0])


def test_fedfomo_save_restore_mid_run_is_identical(tmp_path):
    config = fomo(partition="iid", rounds=4, fedfomo_m=2)
    straight, resumed, _ = restore_mid_run(config, tmp_path)
    assert torch.equal(straight.algorithm.affinity, resumed.algorithm.affinity)
    assert (straight.algorithm.affinity > 0).any()  # some update took place


def test_fedfomo_traffic_is_one_model_up_and_the_downloaded_models_down():
    sim = Simulation(fomo(fedfomo_m=2, rounds=2))
    full = model_bytes(sim)
    for result in sim.run():
        assert [(c.bytes_up, c.bytes_down) for c in result.clients] == [(full, 2 * full)] * 4
    sim = Simulation(fomo(fedfomo_m=5, rounds=1, participation=0.5))  # 2 participants: 1 model each way
    result = sim.run_round()
    assert [(c.bytes_up, c.bytes_down) for c in result.clients if c.participated] == [(full, full)] * 2
    assert [(c.bytes_up, c.bytes_down) for c in result.clients if not c.participated] == [(0, 0)] * 2


def test_fedfomo_learns_on_digits():
    results = list(Simulation(digits(algorithm="fedfomo", rounds=5)).run())
    # Two classes per client: a constant classifier scores about 0.5 on a client's test set.
    assert results[-1].mean("acc") > 0.9, [r.mean("acc") for r in results]


def test_fedfomo_update_helps_where_clients_share_a_distribution():
    """IID clients: downloaded models often beat the own one, and the combined model (acc_global)
    scores better than the model after local training."""
    sim = Simulation(digits(algorithm="fedfomo", partition="iid", rounds=5))
    last = list(sim.run())[-1]
    assert (sim.algorithm.affinity > 0).sum() >= 10
    assert last.mean("acc_global") > last.mean("acc_local") + 0.05, (last.mean("acc_global"), last.mean("acc_local"))


def test_fedfomo_refuses_a_run_without_validation_split_and_bad_knobs():
    with pytest.raises(ConfigError, match="val_fraction"):
        Simulation(tiny(algorithm="fedfomo"))
    with pytest.raises(ConfigError, match="fedfomo_m"):
        fomo(fedfomo_m=-1)
    with pytest.raises(ConfigError, match="fedfomo_epsilon"):
        fomo(fedfomo_epsilon=1.5)
