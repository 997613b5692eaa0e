"""APFL: the mixed model α·v + (1 − α)·w, its two ends (α = 0: FedAvg; α = 1: Local), the local
update rules and the adaptive α checked against an independent computation; save/restore,
learning on digits, traffic (FedAvg's: v and α are never sent) and knob validation.
"""
import pytest
import torch
from torch.func import functional_call
from torch.nn import functional as F

from fl_core.config import ConfigError, RunConfig
from fl_core.simulation import Simulation

from conftest import restore_mid_run, tiny


def digits(**overrides) -> RunConfig:
    base = dict(dataset="digits", partition="shards", shards_per_client=2, num_clients=10, threads=1, seed=0)
    return RunConfig(**(base | overrides))


def rows(result):
    return [(c.acc_local, c.acc_global, c.loss, c.bytes_up, c.bytes_down) for c in result.clients]


@pytest.mark.parametrize("model", ["lenet", "lenet_bn"])  # with BatchNorm, v̄'s buffers too
def test_apfl_with_alpha_zero_is_fedavg_exactly(model):
    apfl = Simulation(tiny(algorithm="apfl", apfl_alpha=0.0, rounds=3, model=model))
    # APFL keeps running statistics on the client: FedAvg does too under bn_stats = "local"
    fedavg = Simulation(tiny(algorithm="fedavg", rounds=3, model=model, bn_stats="local"))
    for ra, rf in zip(apfl.run(), fedavg.run()):
        assert rows(ra) == rows(rf)
        assert [c.acc for c in ra.clients] == [c.acc for c in rf.clients]  # v̄ = w: FedAvg's evaluated model
    for name, t in fedavg.algorithm.global_state.items():
        assert torch.equal(t, apfl.algorithm.global_state[name]), name
    for ca, cf in zip(apfl.clients, fedavg.clients):
        assert all(torch.equal(t, ca.state[n]) for n, t in cf.state.items())
        assert float(ca.extra.alpha) == 0.0


@pytest.mark.parametrize("model", ["lenet", "lenet_bn"])
def test_apfl_with_alpha_one_trains_exactly_the_local_models(model):
    apfl = Simulation(tiny(algorithm="apfl", apfl_alpha=1.0, rounds=3, model=model))
    local = Simulation(tiny(algorithm="local", rounds=3, model=model))
    for ra, rl in zip(apfl.run(), local.run()):
        assert [c.acc for c in ra.clients] == [c.acc for c in rl.clients]
    for ca, cl in zip(apfl.clients, local.clients):
        assert set(ca.extra.personal) == set(cl.state)
        for name, t in cl.state.items():
            assert torch.equal(ca.extra.personal[name], t), name
    # ... while w still communicates (the shared part is FedAvg's, not the personal model).
    names = apfl.algorithm.param_names
    assert any(not torch.equal(c.state[n], c.extra.personal[n]) for c in apfl.clients for n in names)


def test_apfl_local_step_moves_w_v_and_alpha_as_the_paper_writes():
    """One batch (batch_size ≥ samples), one epoch, adaptive α, from a round-2 state (v ≠ w):
    w' = w − η∇f(w), v' = v − ηα∇f(v̄), α' = clip(α − η_α⟨v − w, ∇f(v̄)⟩, 0, 1)."""
    lr, alpha_lr = 0.05, 0.3
    sim = Simulation(tiny(algorithm="apfl", apfl_alpha=0.5, apfl_adaptive=True, apfl_alpha_lr=alpha_lr, lr=lr,
                          batch_size=1000, rounds=2))
    sim.run_round()
    algo, model, names = sim.algorithm, sim.trainer.model, sim.algorithm.param_names
    moved = 0
    for k, (c, d) in enumerate(zip(sim.clients, sim.data.clients)):
        w = {n: c.state[n].clone().requires_grad_(True) for n in names}
        v = {n: c.extra.personal[n].clone() for n in names}
        a = float(c.extra.alpha)
        mixed = {n: (a * v[n] + (1 - a) * w[n].detach()).requires_grad_(True) for n in names}
        g_w = torch.autograd.grad(F.cross_entropy(functional_call(model, w, (d.x_train,)), d.y_train), list(w.values()))
        g_bar = torch.autograd.grad(F.cross_entropy(functional_call(model, mixed, (d.x_train,)), d.y_train),
                                    list(mixed.values()))
        slope = sum(float(((v[n] - w[n].detach()).double() * g.double()).sum()) for n, g in zip(names, g_bar))
        expected_alpha = min(1.0, max(0.0, a - alpha_lr * slope))
        algo.local_update(k, c, d, 2)
        assert float(c.extra.alpha) == pytest.approx(expected_alpha, abs=1e-6)
        moved += abs(expected_alpha - a) > 1e-4
        for n, gw, gb in zip(names, g_w, g_bar):
            torch.testing.assert_close(c.state[n], w[n].detach() - lr * gw, atol=1e-6, rtol=1e-5)
            torch.testing.assert_close(c.extra.personal[n], v[n] - lr * a * gb, atol=1e-6, rtol=1e-5)
    assert moved == len(sim.clients)


def test_apfl_adaptive_alpha_moves_and_stays_in_the_unit_interval():
    start = 0.5
    sim = Simulation(tiny(algorithm="apfl", apfl_alpha=start, apfl_adaptive=True, rounds=3))
    for result in sim.run():
        alphas = [c.metrics["mixing_alpha"] for c in result.clients]
        assert all(0.0 < a < 1.0 and a != start for a in alphas), alphas
    assert [float(c.extra.alpha) for c in sim.clients] == alphas
    # A large step drives α onto the boundary: it is clipped there, never beyond.
    big = Simulation(tiny(algorithm="apfl", apfl_alpha=start, apfl_adaptive=True, apfl_alpha_lr=5.0, rounds=2))
    alphas = [c.metrics["mixing_alpha"] for r in big.run() for c in r.clients]
    assert all(0.0 <= a <= 1.0 for a in alphas) and any(a in (0.0, 1.0) for a in alphas), alphas
    # Fixed α never moves.
    fixed = Simulation(tiny(algorithm="apfl", apfl_alpha=start, rounds=2))
    list(fixed.run())
    assert all(float(c.extra.alpha) == start for c in fixed.clients)


def test_apfl_scores_the_mixed_model_and_sends_only_w():
    apfl = Simulation(tiny(algorithm="apfl", apfl_alpha=0.4, apfl_adaptive=True, rounds=2, participation=0.75))
    fedavg = Simulation(tiny(algorithm="fedavg", rounds=2, participation=0.75))
    model_bytes = 4 * sum(p.numel() for p in apfl.trainer.model.parameters())
    for ra, rf in zip(apfl.run(), fedavg.run()):
        for ca, cf in zip(ra.clients, rf.clients):
            assert (ca.bytes_up, ca.bytes_down) == (cf.bytes_up, cf.bytes_down)
            assert ca.bytes_up == (model_bytes if ca.participated else 0)
            assert ca.bytes_down in ((model_bytes, 2 * model_bytes) if ca.participated else (0,))
    # acc is α·v + (1 − α)·w with w the model the client holds after the broadcast (caught up).
    algo = apfl.algorithm
    for k, (c, d, cr) in enumerate(zip(apfl.clients, apfl.data.clients, ra.clients)):
        w = c.state if cr.participated else algo.global_state
        a, v = float(c.extra.alpha), c.extra.personal
        mixed = {n: a * v[n] + (1 - a) * w[n] if n in algo.param_names else v[n] for n in c.state}
        torch.testing.assert_close(cr.acc, apfl.trainer.evaluate(mixed, d.x_test, d.y_test) / d.n_test)
        assert cr.personal_fraction == 1.0


def test_apfl_restore_mid_run_continues_bit_identically(tmp_path):
    config = tiny(algorithm="apfl", rounds=3, apfl_adaptive=True, momentum=0.5, weight_decay=1e-3, participation=0.75)
    straight, resumed, _ = restore_mid_run(config, tmp_path)
    for a, b in zip(straight.clients, resumed.clients):
        assert torch.equal(a.extra.alpha, b.extra.alpha)
        assert all(torch.equal(t, b.extra.personal[n]) for n, t in a.extra.personal.items())


@pytest.mark.slow
def test_apfl_learns_on_digits_and_its_mixed_model_beats_the_global_one():
    results = list(Simulation(digits(algorithm="apfl", apfl_alpha=0.75, rounds=6, local_epochs=3)).run())
    last = results[-1]
    # Two classes per client: a constant classifier scores about 0.5 on a client's test set.
    assert last.mean("acc") > 0.8, [r.mean("acc") for r in results]
    assert last.mean("acc") > last.mean("acc_global") + 0.2, (last.mean("acc"), last.mean("acc_global"))


@pytest.mark.parametrize("knob, value, needle", [
    ("apfl_alpha", 1.5, r"apfl_alpha=1.5 is outside the allowed range \[0, 1\]"),
    ("apfl_alpha", -0.1, r"apfl_alpha=-0.1 is outside the allowed range \[0, 1\]"),
    ("apfl_alpha_lr", 0.0, r"apfl_alpha_lr=0.0 is outside the allowed range \(0, inf\)"),
    ("apfl_adaptive", "yes", "apfl_adaptive='yes' must be true or false"),
])
def test_apfl_refuses_bad_knob_values(knob, value, needle):
    with pytest.raises(ConfigError, match=needle):
        tiny(algorithm="apfl", **{knob: value})
