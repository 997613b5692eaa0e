"""FedALA: with W fixed at 1 (η = 0) or no adaptive layer it is FedAvg bit for bit; after ALA the
lower layers are the global model exactly and W stays in [0, 1]; one W step equals the gradient
of the loss with respect to W by autograd; the first ALA trains to convergence and later ones one
epoch; save/restore, learning on digits, FedAvg's traffic and refused knob values."""
import pytest
import torch
from torch.func import functional_call
from torch.nn import functional as F

from fl_core.config import ConfigError, RunConfig
from fl_core.simulation import Simulation

from conftest import tiny


def ala(**overrides) -> RunConfig:
    return tiny(**({"algorithm": "fedala"} | overrides))


def scores(result):
    return [(c.acc_local, c.acc_global, c.bytes_up, c.bytes_down) for c in result.clients]


def after_round_one(**overrides):
    """A run after round 1: each client holds the broadcast θ_g and keeps its trained θ_k."""
    sim = Simulation(ala(**overrides))
    sim.run_round()
    client = sim.clients[0]
    glob = {n: t.clone() for n, t in client.state.items()}
    local, client.extra.fedala_local = client.extra.fedala_local, None
    return sim, client, glob, local


@pytest.mark.parametrize("knobs", [dict(fedala_eta=0.0), dict(fedala_layers=0), dict(fedala_eta=0.0, fedala_layers=5)])
def test_fedala_with_weights_fixed_at_one_or_no_adaptive_layer_is_fedavg_bit_for_bit(knobs):
    fedavg, fedala = Simulation(tiny(algorithm="fedavg")), Simulation(ala(**knobs))
    for ra, rb in zip(fedavg.run(), fedala.run()):
        assert scores(ra) == scores(rb)
    for a, b in zip(fedavg.clients, fedala.clients):
        assert all(torch.equal(t, b.state[n]) for n, t in a.state.items())
    ga, gb = fedavg.algorithm.global_state, fedala.algorithm.global_state
    assert all(torch.equal(t, gb[n]) for n, t in ga.items())


def test_fedala_with_learned_weights_differs_from_fedavg():
    fedavg, fedala = Simulation(tiny(algorithm="fedavg")), Simulation(ala())
    list(fedavg.run()), list(fedala.run())
    assert not torch.equal(fedavg.algorithm.global_state["head.weight"], fedala.algorithm.global_state["head.weight"])


def test_ala_keeps_the_lower_layers_global_and_the_weights_in_the_unit_interval():
    sim, client, glob, local = after_round_one(fedala_layers=2, fedala_eta=20.0)
    algo = sim.algorithm
    assert algo.adaptive_names == ["fc.2.weight", "fc.2.bias", "head.weight", "head.bias"]
    metrics = algo.adaptive_local_aggregation(0, client, sim.data.clients[0], 2, local)
    w = client.extra.fedala_w
    assert set(w) == set(algo.adaptive_names)
    for n in algo.param_names:
        if n not in w:
            assert torch.equal(client.state[n], glob[n]), n  # lower layers: θ_g exactly
    values = torch.cat([t.flatten() for t in w.values()])
    assert values.min() >= 0 and values.max() <= 1
    assert (values == 0).any() and ((values > 0) & (values < 1)).any()  # clipped, and learned
    for n, t in w.items():
        assert torch.allclose(client.state[n], local[n] + (glob[n] - local[n]) * t, atol=1e-6), n
    assert 10 < metrics["ala_epochs"] <= 100  # the first ALA: until the last 10 losses settle


def test_one_ala_step_equals_the_autograd_gradient_with_respect_to_w():
    """One batch (all training samples, s = 100 %) and one epoch: W₁ = clip(1 − η ∂L/∂W, 0, 1), with
    ∂L/∂W taken by autograd through θ(W) = θ_k + (θ_g − θ_k) ⊙ W."""
    eta = 0.7
    sim, client, glob, local = after_round_one(fedala_layers=2, fedala_eta=eta, batch_size=1000,
                                               fedala_rand_percent=100, fedala_max_epochs=1)
    algo, d = sim.algorithm, sim.data.clients[0]
    top = algo.adaptive_names
    algo.adaptive_local_aggregation(0, client, d, 2, local)

    w0 = {n: torch.ones_like(glob[n], requires_grad=True) for n in top}
    params = {n: glob[n] for n in algo.param_names} | {n: local[n] + (glob[n] - local[n]) * w0[n] for n in top}
    buffers = {n: t for n, t in glob.items() if n not in algo.param_names}
    model = sim.trainer.model.train()
    loss = F.cross_entropy(functional_call(model, (params, buffers), (d.x_train,)), d.y_train)
    grads = torch.autograd.grad(loss, [w0[n] for n in top])
    for n, g in zip(top, grads):
        expected = (1 - eta * g).clamp(0, 1)
        assert torch.allclose(client.extra.fedala_w[n], expected, atol=1e-6), n
        assert torch.allclose(client.state[n], local[n] + (glob[n] - local[n]) * expected, atol=1e-6), n
    assert not all(torch.equal(client.extra.fedala_w[n], torch.ones_like(glob[n])) for n in top)


def test_first_ala_trains_until_convergence_and_later_ones_one_epoch():
    sim = Simulation(ala(rounds=3))
    epochs = [[c.metrics["ala_epochs"] for c in r.clients] for r in sim.run()]
    assert epochs[0] == [0.0] * 4  # round 1: nothing received yet
    assert all(e > 10 for e in epochs[1]) and epochs[2] == [1.0] * 4


def test_fedala_traffic_is_fedavgs_one_model_each_way():
    sim = Simulation(ala(rounds=2))
    full = 4 * sum(p.numel() for p in sim.trainer.model.parameters())
    for result in sim.run():
        assert [(c.bytes_up, c.bytes_down) for c in result.clients] == [(full, full)] * 4


def test_fedala_learns_on_digits_and_beats_its_global_model():
    config = RunConfig(dataset="digits", partition="shards", shards_per_client=2, num_clients=10, threads=1, seed=0,
                       algorithm="fedala", rounds=5, local_epochs=5)
    last = list(Simulation(config).run())[-1]
    # Two classes per client: a constant classifier scores about 0.5 on a client's test set. Measured
    # (2026-11, AVX-512 CPU; the reproducible mode, the CPU's own kernels, ATen unvectorised with
    # oneDNN at SSE4.1): acc 0.974, 0.941, 0.959 after round 5 and 0.881, 0.902, 0.909 after round 4;
    # acc_global 0.427, 0.431, 0.363. 0.85 lies below even round 4's: it holds should other rounding
    # cost a whole round.
    assert last.mean("acc") > 0.85, last.mean("acc")
    assert last.mean("acc") > last.mean("acc_global") + 0.2, (last.mean("acc"), last.mean("acc_global"))


def test_fedala_refuses_bad_knob_values():
    with pytest.raises(ConfigError, match="fedala_rand_percent"):
        ala(fedala_rand_percent=0)
    with pytest.raises(ConfigError, match="fedala_eta"):
        ala(fedala_eta=-1.0)
    with pytest.raises(ConfigError, match="fedala_layers=9 .*lenet has 5 layers"):
        Simulation(ala(fedala_layers=9))
