"""pFedMe: the Moreau-envelope personalization and the β-mixing server, checked against independent
computations; save/restore, learning on digits, traffic and knob validation.

λ = 0 frees the personalized model θ (plain local SGD, K steps per batch) and freezes w exactly;
a larger λ keeps θ̃ closer to w; one outer step is w ← w − ηλ(w − θ̃) with θ̃ the K-step solution
of f + λ/2·||θ − w||²; the server's model is (1 − β)·previous + β·average (β = 1: the average).
"""
import math

import pytest
import torch
from torch.func import functional_call
from torch.nn import functional as F

from fl_core.algorithms.base import BYTES_PER_ENTRY
from fl_core.config import RunConfig
from fl_core.masks import masked_average
from fl_core.simulation import Simulation
from fl_core.training import derive_seed

from conftest import restore_mid_run, tiny


def digits(**overrides) -> RunConfig:
    base = dict(dataset="digits", partition="shards", shards_per_client=2, num_clients=10, threads=1, seed=0)
    return RunConfig(**(base | overrides))


def distance(a, b, names):
    return math.sqrt(sum(float((a[n] - b[n]).double().pow(2).sum()) for n in names))


def gd_step(model, theta, x, y, lr, lam=0.0, anchor=None):
    """One full-batch gradient step on CE(θ) + λ/2·||θ − anchor||², written out here (float32)."""
    leaves = {n: t.detach().requires_grad_(True) for n, t in theta.items()}
    loss = F.cross_entropy(functional_call(model, leaves, (x,)), y)
    if lam:
        loss = loss + 0.5 * lam * sum(((leaves[n] - anchor[n]) ** 2).sum() for n in leaves)
    grads = torch.autograd.grad(loss, list(leaves.values()))
    return {n: (leaves[n] - lr * g).detach() for n, g in zip(leaves, grads)}


def test_pfedme_with_lambda_zero_never_moves_w_and_theta_is_plain_local_sgd():
    epochs, K, plr = 1, 3, 0.05
    sim = Simulation(tiny(algorithm="pfedme", pfedme_lambda=0.0, pfedme_k=K, pfedme_personal_lr=plr,
                          rounds=2, local_epochs=epochs))
    algo, names = sim.algorithm, sim.algorithm.param_names
    init = {n: algo.global_state[n].clone() for n in names}
    list(sim.run())
    # w ← w − η·0: every local model and the server model are the initial weights, bit for bit.
    for n in names:
        assert torch.equal(algo.global_state[n], init[n]), n
        for c in sim.clients:
            assert torch.equal(c.state[n], init[n]), n
    # θ̃ of the last round: from w = init, K plain SGD steps on each batch of the round, in order.
    model, bs = sim.trainer.model, sim.config.batch_size
    for k, (c, d) in enumerate(zip(sim.clients, sim.data.clients)):
        theta = {n: init[n].clone() for n in names}
        for epoch in range(epochs):
            seed = derive_seed(sim.config.seed, 2, k, epoch, "global")
            order = torch.randperm(d.n_train, generator=torch.Generator().manual_seed(seed))
            for start in range(0, d.n_train, bs):
                idx = order[start:start + bs]
                for _ in range(K):
                    theta = gd_step(model, theta, d.x_train[idx], d.y_train[idx], plr)
        assert distance(theta, init, names) > 0.1  # θ really trained
        for n in names:
            torch.testing.assert_close(c.extra.personal[n], theta[n], atol=2e-5, rtol=1e-4)


def test_pfedme_one_outer_step_is_the_moreau_update():
    """One batch (batch_size ≥ samples), one epoch: θ̃ = K steps on f + λ/2||θ − w||² from w, then
    w ← w − ηλ(w − θ̃)."""
    lam, K, plr, lr = 2.0, 3, 0.05, 0.1
    sim = Simulation(tiny(algorithm="pfedme", pfedme_lambda=lam, pfedme_k=K, pfedme_personal_lr=plr, lr=lr,
                          batch_size=1000, rounds=2))
    sim.run_round()  # a trained, averaged w
    algo, names, model = sim.algorithm, sim.algorithm.param_names, sim.trainer.model
    for k, (c, d) in enumerate(zip(sim.clients, sim.data.clients)):
        w = {n: c.state[n].clone() for n in names}
        theta = dict(w)
        for _ in range(K):
            theta = gd_step(model, theta, d.x_train, d.y_train, plr, lam=lam, anchor=w)
        stats = algo.local_update(k, c, d, 2)
        for n in names:
            torch.testing.assert_close(c.extra.personal[n], theta[n], atol=1e-5, rtol=1e-4)
            torch.testing.assert_close(c.state[n], w[n] - lr * lam * (w[n] - theta[n]), atol=1e-5, rtol=1e-4)
        assert stats.metrics["personal_gap"] == pytest.approx(distance(c.extra.personal, c.state, names), rel=1e-5)


def test_pfedme_larger_lambda_keeps_the_personal_model_closer_to_w():
    mean_gap = {}
    for lam in (0.5, 5.0, 50.0):
        sim = Simulation(tiny(algorithm="pfedme", pfedme_lambda=lam, pfedme_personal_lr=0.01, lr=0.005, rounds=1))
        names, gaps = sim.algorithm.param_names, []
        for k, (c, d) in enumerate(zip(sim.clients, sim.data.clients)):
            sim.algorithm.local_update(k, c, d, 1)
            gaps.append(distance(c.extra.personal, c.state, names))
        mean_gap[lam] = sum(gaps) / len(gaps)
    assert mean_gap[50.0] < mean_gap[5.0] < mean_gap[0.5], mean_gap
    assert mean_gap[50.0] < 0.2 * mean_gap[0.5], mean_gap


@pytest.mark.parametrize("beta", [1.0, 0.5, 2.0])
def test_pfedme_server_mixes_the_average_with_its_previous_model(beta):
    sim = Simulation(tiny(algorithm="pfedme", pfedme_beta=beta, rounds=2))
    sim.run_round()
    algo, names = sim.algorithm, sim.algorithm.param_names
    previous = {n: algo.global_state[n].clone() for n in names}
    for k, (c, d) in enumerate(zip(sim.clients, sim.data.clients)):
        algo.local_update(k, c, d, 2)
    local = [{n: c.state[n].clone() for n in names} for c in sim.clients]
    traffic = algo.aggregate(sim.clients, sim.data.clients, 2)
    average = {n: sum(s[n].double() for s in local) / len(local) for n in names}  # uniform weighting
    for n in names:
        expected = (1 - beta) * previous[n].double() + beta * average[n]
        torch.testing.assert_close(algo.global_state[n].double(), expected, atol=1e-6, rtol=1e-6)
        for c in sim.clients:
            assert torch.equal(c.state[n], algo.global_state[n])  # the mix is what clients receive
    plain = masked_average(previous, local, [None] * len(local), [1 / len(local)] * len(local), names)
    if beta == 1.0:  # FedAvg's average exactly
        assert all(torch.equal(algo.global_state[n], plain[n]) for n in names)
    else:
        assert all(not torch.allclose(algo.global_state[n], plain[n]) for n in names)
    model_bytes = BYTES_PER_ENTRY * sum(algo.numels.values())
    assert traffic.up == traffic.down == [model_bytes] * len(local)


def test_pfedme_sends_the_model_each_way_like_fedavg_and_scores_the_personal_model():
    pfedme = Simulation(tiny(algorithm="pfedme", rounds=2, participation=0.75))
    fedavg = Simulation(tiny(algorithm="fedavg", rounds=2, participation=0.75))
    model_bytes = 4 * sum(p.numel() for p in pfedme.trainer.model.parameters())
    for rp, rf in zip(pfedme.run(), fedavg.run()):
        for cp, cf in zip(rp.clients, rf.clients):
            assert (cp.bytes_up, cp.bytes_down) == (cf.bytes_up, cf.bytes_down)
            # a participant sends its w once and receives the broadcast (once more if it had missed one)
            assert cp.bytes_up == (model_bytes if cp.participated else 0)
            assert cp.bytes_down in ((model_bytes, 2 * model_bytes) if cp.participated else (0,))
            assert cp.personal_fraction == 1.0
    for k, (c, d, cr) in enumerate(zip(pfedme.clients, pfedme.data.clients, rp.clients)):
        assert cr.acc == pfedme.trainer.evaluate(c.extra.personal, d.x_test, d.y_test) / d.n_test


def test_pfedme_restore_mid_run_continues_bit_identically(tmp_path):
    config = tiny(algorithm="pfedme", rounds=3, pfedme_beta=1.5, momentum=0.5, participation=0.75)
    straight, resumed, _ = restore_mid_run(config, tmp_path)
    for a, b in zip(straight.clients, resumed.clients):
        assert all(torch.equal(t, b.extra.personal[n]) for n, t in a.extra.personal.items())


@pytest.mark.slow
def test_pfedme_learns_on_digits_and_its_personal_model_beats_the_global_one():
    # λ = 1 (the paper's 15 ties θ̃ to w, which learns no faster than FedAvg in 4 short rounds).
    results = list(Simulation(digits(algorithm="pfedme", rounds=4, local_epochs=2, lr=0.3,
                                     pfedme_lambda=1.0)).run())
    last = results[-1]
    # Two classes per client: a constant classifier scores about 0.5 on a client's test set.
    assert last.mean("acc") > 0.8, [r.mean("acc") for r in results]
    assert last.mean("acc") > last.mean("acc_global") + 0.3, (last.mean("acc"), last.mean("acc_global"))
