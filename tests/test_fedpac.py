"""FedPAC: classifier-collaboration QP, prototypes, alignment loss, training phases, server step,
save/restore, and learning on digits."""
import itertools

import numpy as np
import pytest
import torch
from torch.nn import functional as F

from fl_core.algorithms.fedpac import (aggregate_prototypes, alignment_loss, class_statistics,
                                       collaboration_matrix, simplex_qp)
from fl_core.simulation import Simulation
from fl_core.training import derive_seed

from conftest import tiny


def fedpac(**overrides):
    return Simulation(tiny(algorithm="fedpac", **overrides))


def snapshot(state):
    return {n: t.clone() for n, t in state.items()}


def brute_force_qp(P):
    """min aᵀPa on the simplex by trying every support (tiny problems only)."""
    n, best = P.shape[0], None
    for size in range(1, n + 1):
        for support in itertools.combinations(range(n), size):
            s = list(support)
            x = np.linalg.solve(P[np.ix_(s, s)], np.ones(size))
            a = np.zeros(n)
            a[s] = x / x.sum()
            if a.min() >= -1e-12 and (best is None or a @ P @ a < best @ P @ best):
                best = a
    return best


# ---------------------------------------------------------------------------- statistics and QP
def test_statistics_match_a_hand_computation():
    # 1-d features; class 0: z = 1, 3; class 1: z = 2; class 2 absent. n = 3, p = (2/3, 1/3, 0).
    z = torch.tensor([[1.0], [2.0], [3.0]])
    y = torch.tensor([0, 1, 0])
    counts, means, h, v = class_statistics(z, y, 3)
    assert counts.tolist() == [2, 1, 0]
    assert means.flatten().tolist() == [2.0, 2.0, 0.0]
    assert torch.allclose(h.flatten(), torch.tensor([4 / 3, 2 / 3, 0.0], dtype=torch.float64))
    # V = (E||z||² − Σ_k p_k² ||μ_k||²) / n = (14/3 − 20/9) / 3 = 22/27
    assert float(v) == pytest.approx(22 / 27, rel=1e-12)


def test_qp_matrix_and_solver_match_hand_solutions():
    # Two clients with the same statistics h: only variance matters, α ∝ 1/V.
    h = torch.ones(2, 1, 1, dtype=torch.float64)
    P = collaboration_matrix(0, h, torch.tensor([1.0, 3.0], dtype=torch.float64))
    assert torch.equal(P, torch.diag(torch.tensor([1.0, 3.0], dtype=torch.float64)))
    assert np.allclose(simplex_qp(P), [0.75, 0.25], atol=1e-12)
    # Bias ||h_0 − h_1||² = 2 adds to client 1's diagonal for client 0: α_0 = (1 + 2) / (1 + 1 + 2).
    h = torch.tensor([[[0.0, 0.0]], [[1.0, 1.0]]], dtype=torch.float64)
    v = torch.tensor([1.0, 1.0], dtype=torch.float64)
    assert np.allclose(simplex_qp(collaboration_matrix(0, h, v)), [0.75, 0.25], atol=1e-12)
    assert np.allclose(simplex_qp(collaboration_matrix(1, h, v)), [0.25, 0.75], atol=1e-12)
    # Three clients, h = 0, 1, 2 (C = d = 1), V = (1, .5, .5): for client 0,
    # P = [[1, 0, 0], [0, 1.5, 2], [0, 2, 4.5]]; the equality-constrained optimum gives client 2 a
    # negative weight, so α_2 = 0 and on {0, 1} α ∝ (1, 1/1.5): α = (0.6, 0.4, 0).
    h = torch.tensor([0.0, 1.0, 2.0], dtype=torch.float64).reshape(3, 1, 1)
    P = collaboration_matrix(0, h, torch.tensor([1.0, 0.5, 0.5], dtype=torch.float64))
    assert torch.allclose(P, torch.tensor([[1, 0, 0], [0, 1.5, 2], [0, 2, 4.5]], dtype=torch.float64))
    assert np.allclose(simplex_qp(P), [0.6, 0.4, 0.0], atol=1e-12)
    # A client without variance and with unique statistics keeps its own head.
    v = torch.tensor([0.0, 0.5, 0.5], dtype=torch.float64)
    assert np.allclose(simplex_qp(collaboration_matrix(0, h, v)), [1.0, 0.0, 0.0], atol=1e-12)


def test_qp_solver_is_exact_on_random_problems():
    rng = np.random.default_rng(0)
    for _ in range(50):
        n = int(rng.integers(2, 6))
        h = torch.tensor(rng.normal(size=(n, 3, 2)) * rng.uniform(0.1, 3))
        v = torch.tensor(rng.uniform(0.01, 1, size=n) * rng.choice([1e-2, 1, 10]))
        P = collaboration_matrix(int(rng.integers(n)), h, v).numpy()
        a, best = simplex_qp(P), brute_force_qp(P)
        assert a.min() >= 0 and a.sum() == pytest.approx(1, abs=1e-12)
        assert a @ P @ a <= best @ P @ best + 1e-12
        assert np.allclose(a, best, atol=1e-7)


def test_combination_weights_of_every_client_are_on_the_simplex():
    sim = fedpac(rounds=2)
    list(sim.run())
    alpha = sim.algorithm.alpha
    assert alpha.shape == (4, 4)
    assert (alpha >= 0).all()
    assert torch.allclose(alpha.sum(1), torch.ones(4, dtype=alpha.dtype), atol=1e-12)
    assert (alpha.diagonal() > 0.5).all()  # clients with different label sets mostly keep their own head


# ---------------------------------------------------------------------------- prototypes
def test_global_prototypes_are_the_count_weighted_mean_of_local_ones():
    protos = torch.tensor([[[1.0, 1.0], [2.0, 0.0], [0.0, 0.0], [0.0, 0.0]],
                           [[4.0, 4.0], [0.0, 0.0], [5.0, 6.0], [0.0, 0.0]]])
    counts = torch.tensor([[1.0, 3.0, 0.0, 0.0], [3.0, 0.0, 2.0, 0.0]])
    previous = torch.full((4, 2), 9.0)
    known = torch.tensor([False, False, False, True])
    new, new_known = aggregate_prototypes(protos, counts, previous, known)
    assert torch.allclose(new, torch.tensor([[13 / 4, 13 / 4], [2.0, 0.0], [5.0, 6.0], [9.0, 9.0]]))
    assert new_known.tolist() == [True, True, True, True]
    _, unknown = aggregate_prototypes(protos, counts, previous, torch.zeros(4, dtype=torch.bool))
    assert unknown.tolist() == [True, True, True, False]


def test_run_prototypes_are_class_means_and_their_weighted_mean():
    sim = fedpac(rounds=1)
    algo = sim.algorithm
    trained = []
    aggregate = algo.aggregate

    def spy(clients, data, rnd):
        trained.extend(snapshot(c.state) for c in clients)
        return aggregate(clients, data, rnd)

    algo.aggregate = spy
    sim.run_round()
    num_sum, count_sum = 0, 0
    for client, state, d in zip(sim.clients, trained, sim.data.clients):
        model = sim.trainer.model
        model.load_state_dict(state)
        with torch.no_grad():
            feats = model.fc(model.features(d.x_train))  # lenet: the head's input
        for c in range(10):
            sel = d.y_train == c
            assert client.extra.proto_counts[c] == int(sel.sum())
            if sel.any():
                assert torch.allclose(client.extra.protos[c], feats[sel].mean(0), atol=1e-5)
        num_sum = num_sum + client.extra.protos * client.extra.proto_counts.unsqueeze(1)
        count_sum = count_sum + client.extra.proto_counts
    held = count_sum > 0
    assert torch.equal(algo.known, held)
    expected = (num_sum[held] / count_sum[held].unsqueeze(1)).float()
    assert torch.allclose(algo.global_protos[held], expected, atol=1e-6)


# ---------------------------------------------------------------------------- alignment loss
def test_alignment_loss_matches_a_hand_computation():
    z = torch.tensor([[1.0, 2.0], [3.0, 5.0]])
    y = torch.tensor([0, 1])
    protos = torch.tensor([[0.0, 0.0], [1.0, 1.0]])
    # ||(1, 2)||² + ||(2, 4)||² = 5 + 20, over B·d = 4 entries
    assert float(alignment_loss(z, y, protos, torch.tensor([True, True]))) == pytest.approx(25 / 4)
    assert float(alignment_loss(z, y, protos, torch.tensor([True, False]))) == pytest.approx(5 / 4)
    assert float(alignment_loss(z, y, protos, torch.tensor([False, False]))) == 0.0


def test_body_objective_is_cross_entropy_plus_lambda_alignment():
    sim = fedpac(fedpac_lambda=0.7)
    algo, model, d = sim.algorithm, sim.trainer.model, sim.data.clients[0]
    protos = torch.randn(10, algo.feature_dim, generator=torch.Generator().manual_seed(0))
    known = torch.arange(10) % 3 != 0
    x, y = d.x_train[:16], d.y_train[:16]
    loss = algo.alignment_objective(protos, known)(model, x, y)
    feats = model.fc(model.features(x))
    keep = known[y].float()
    hand = F.cross_entropy(model.head(feats), y) + 0.7 * (((feats - protos[y]) ** 2).sum(1) * keep).sum() / (16 * 84)
    assert torch.allclose(loss, hand, rtol=1e-6)


def test_lambda_zero_reduces_the_body_phase_to_cross_entropy():
    def second_round_body(lam):
        sim = fedpac(fedpac_lambda=lam)
        sim.run_round()  # round 1: global prototypes exist afterwards
        assert sim.algorithm.known.any()
        client, d = sim.clients[0], sim.data.clients[0]
        algo = sim.algorithm
        start = snapshot(client.state)
        algo.local_update(0, client, d, 2)
        # the same two phases by hand, plain cross-entropy in the body phase
        state = start
        state, _, _ = sim.trainer.train_pass(state, d.x_train, d.y_train, {n: None for n in algo.head_names},
                                             derive_seed(sim.config.seed, 2, 0, 0, "head"))
        state, _, _ = sim.trainer.train_pass(state, d.x_train, d.y_train, {n: None for n in algo.body_names},
                                             derive_seed(sim.config.seed, 2, 0, 0, "body"))
        return client.state, state

    algo_state, plain = second_round_body(0.0)
    assert all(torch.equal(algo_state[n], plain[n]) for n in plain)
    algo_state, plain = second_round_body(1.0)  # the alignment term matters when λ > 0
    assert not all(torch.equal(algo_state[n], plain[n]) for n in plain)


# ---------------------------------------------------------------------------- phases and server step
def test_head_phase_keeps_the_body_and_body_phase_keeps_the_head():
    sim = fedpac(rounds=2)
    algo = sim.algorithm
    calls = []
    run_epochs = algo.run_epochs

    def spy(k, client, data, rnd, epochs, update, purpose="global", **options):
        before = snapshot(client.state)
        stats = run_epochs(k, client, data, rnd, epochs, update, purpose, **options)
        calls.append((purpose, epochs, "loss_fn" in options, before, snapshot(client.state)))
        return stats

    algo.run_epochs = spy
    list(sim.run())
    assert [(p, e) for p, e, *_ in calls] == [("head", 1), ("body", sim.config.local_epochs)] * 8
    assert [a for p, _, a, *_ in calls if p == "body"] == [False] * 4 + [True] * 4  # alignment from round 2
    for purpose, _, _, before, after in calls:
        frozen, trained = ((algo.body_names, algo.head_names) if purpose == "head" else
                           (algo.head_names, algo.body_names))
        assert all(torch.equal(before[n], after[n]) for n in frozen)
        assert any(not torch.equal(before[n], after[n]) for n in trained)


def test_server_combines_heads_and_averages_the_body():
    sim = fedpac(rounds=2)
    algo = sim.algorithm
    sent = []
    aggregate = algo.aggregate

    def spy(clients, data, rnd):
        sent.append([snapshot(c.state) for c in clients])
        return aggregate(clients, data, rnd)

    algo.aggregate = spy
    results = list(sim.run())
    heads_up = sent[-1]
    alpha = algo.alpha.float()
    assert (alpha - torch.diag(alpha.diagonal())).max() > 1e-4  # some head is really shared
    for i, client in enumerate(sim.clients):
        for n in algo.head_names:
            expected = sum(alpha[i, j] * heads_up[j][n] for j in range(4))
            assert torch.allclose(client.state[n], expected, atol=1e-6)
        for n in algo.body_names:  # uniform weighting by default
            assert torch.allclose(client.state[n], sum(s[n] for s in heads_up) / 4, atol=1e-6)
    n_params = sum(t.numel() for t in sim.trainer.params.values())
    for c in results[-1].clients:
        # down: body, combined head, the 10 global prototypes; up also h_i (10·d), V_i and 10 class counts
        assert c.bytes_down == 4 * (n_params + 10 * algo.feature_dim)
        assert c.bytes_up == c.bytes_down + 4 * (10 * algo.feature_dim + 1 + 10)
        assert c.acc == c.acc_global


# ---------------------------------------------------------------------------- learning
@pytest.mark.slow
def test_fedpac_learns_on_digits_with_two_shards():
    from fl_core.config import RunConfig
    config = RunConfig(algorithm="fedpac", dataset="digits", partition="shards", shards_per_client=2,
                       num_clients=10, rounds=10, batch_size=16, seed=0, threads=1)
    final = list(Simulation(config).run())[-1]
    # chance is 0.1 over all classes and 0.5 within a client's two classes; this reaches ~0.89
    assert final.mean("acc") > 0.8, final.mean("acc")
    assert final.mean("acc_local") > 0.8, final.mean("acc_local")
