"""FedRoD: the balanced-softmax loss (by hand; cross-entropy under a uniform prior), one local step
moves body and G-head by the generic loss only and the P-head by the personalized loss only, the
P-head is never averaged, with the P-head held at zero the personalized prediction is the
generic model's, save/restore, learning on digits, traffic (body + G-head), bad knobs."""
import math

import pytest
import torch
from torch.nn import functional as F

from fl_core.algorithms.base import BYTES_PER_ENTRY
from fl_core.algorithms.fedrod import FedRoD, balanced_softmax_loss
from fl_core.config import ConfigError, RunConfig
from fl_core.models import build_model, head_module
from fl_core.simulation import Simulation

from conftest import restore_mid_run, tiny

P_NAMES = ("personal_head.weight", "personal_head.bias")


def test_balanced_softmax_equals_a_hand_computation_and_cross_entropy_under_a_uniform_prior():
    logits = torch.tensor([[1.0, -0.5, 2.0, 0.3], [0.2, 0.1, -1.0, 3.0], [-2.0, 0.7, 0.4, 1.1]])
    y = torch.tensor([0, 2, 1])
    prior = [0.5, 0.3, 0.2, 0.0]  # class 3 absent from the client's training data
    by_hand = 0.0
    for row, label in zip(logits.tolist(), y.tolist()):
        weights = [p * math.exp(v) for p, v in zip(prior, row)]
        by_hand -= math.log(weights[label] / sum(weights)) / len(y)
    log_prior = torch.tensor(prior).log()
    assert float(balanced_softmax_loss(logits, y, log_prior)) == pytest.approx(by_hand, rel=1e-6)
    uniform = torch.full((4,), 0.25).log()
    assert torch.allclose(balanced_softmax_loss(logits, y, uniform), F.cross_entropy(logits, y), atol=1e-7)
    # The prior a client uses is its training label histogram.
    sim = Simulation(tiny(algorithm="fedrod"))
    for d in sim.data.clients:
        counts = torch.bincount(d.y_train, minlength=10).float()
        assert torch.equal(sim.algorithm.log_prior(d), (counts / d.n_train).log())
    assert Simulation(tiny(algorithm="fedrod", fedrod_loss="ce")).algorithm.log_prior(sim.data.clients[0]) is None


@pytest.mark.parametrize("loss", ["bsm", "ce"])
def test_one_local_step_moves_body_and_g_head_by_the_generic_loss_and_the_p_head_by_the_personal_loss(loss):
    """A whole-batch step computed here on a plain lenet: the body and G-head by ∇ of BSM(g(z)) (or
    CE), the P-head by ∇ of CE(g(z) + p(z)) with g and z fixed."""
    lr = 0.1
    sim = Simulation(tiny(algorithm="fedrod", fedrod_loss=loss, batch_size=10_000, lr=lr))
    algo, k = sim.algorithm, 1
    client, d = sim.clients[k], sim.data.clients[k]
    gen = torch.Generator().manual_seed(1)
    for n in P_NAMES:  # a non-zero P-head, so that its gradient depends on its value
        client.state[n] = 0.1 * torch.randn(client.state[n].shape, generator=gen)
    before = {n: t.clone() for n, t in client.state.items()}
    algo.local_update(k, client, d, 1)

    plain = build_model("lenet", sim.data.input_shape, 10)
    plain.load_state_dict({n: t for n, t in before.items() if n in algo.generic_names})
    features = {}
    head_module(plain, "lenet").register_forward_pre_hook(lambda m, a: features.update(z=a[0]))
    g = plain(d.x_train)
    counts = torch.bincount(d.y_train, minlength=10).float()
    generic = F.cross_entropy(g + (counts / counts.sum()).log(), d.y_train) if loss == "bsm" \
        else F.cross_entropy(g, d.y_train)
    grads = dict(zip(algo.generic_names, torch.autograd.grad(generic, list(plain.parameters()))))
    w, b = (before[n].clone().requires_grad_(True) for n in P_NAMES)
    personal = F.cross_entropy(g.detach() + features["z"].detach() @ w.T + b, d.y_train)
    grads.update(zip(P_NAMES, torch.autograd.grad(personal, [w, b])))
    for n, grad in grads.items():
        assert torch.allclose(client.state[n], before[n] - lr * grad, atol=1e-6), n


def test_the_p_head_is_never_averaged_and_the_body_and_g_head_are_the_servers():
    sim = Simulation(tiny(algorithm="fedrod", rounds=2))
    list(sim.run())
    algo, g = sim.algorithm, sim.algorithm.global_state
    assert set(algo.shared_names()) == set(algo.param_names) - set(P_NAMES)
    for c in sim.clients:
        assert all(torch.equal(c.state[n], g[n]) for n in algo.shared_names())
        assert all(c.state[n].abs().sum() > 0 for n in P_NAMES)  # trained from zero
        assert float(c.state["personal"]) == 0.0  # the held state predicts generically
    for i in range(4):
        for j in range(i + 1, 4):
            assert not torch.equal(sim.clients[i].state["personal_head.weight"],
                                   sim.clients[j].state["personal_head.weight"])
    assert all(not g[n].any() for n in P_NAMES)  # the server's copy is still the zero initialisation


def test_with_the_p_head_held_at_zero_the_personalized_prediction_is_the_generic_models():
    """No P-head training: acc equals acc_global, and body and G-head train bit for bit as with it
    (the personal loss never reaches them)."""
    frozen, trained = Simulation(tiny(algorithm="fedrod", rounds=3)), Simulation(tiny(algorithm="fedrod", rounds=3))
    algo = frozen.algorithm
    algo.trained_entries = lambda k: {n: None for n in algo.generic_names}
    for rf, rt in zip(frozen.run(), trained.run()):
        assert all(c.acc == c.acc_global for c in rf.clients)
        assert [c.acc_global for c in rf.clients] == [c.acc_global for c in rt.clients]
    assert any(c.acc != c.acc_global for c in rt.clients)
    for a, b in zip(frozen.clients, trained.clients):
        assert all(not a.state[n].any() for n in P_NAMES)
        assert all(torch.equal(a.state[n], b.state[n]) for n in algo.generic_names)
    client, d = frozen.clients[0], frozen.data.clients[0]
    personal = algo.personalized_model(0, client, d, 3)
    with frozen.trainer.bound(personal) as model:
        p_logits = model(d.x_test)
    with frozen.trainer.bound(client.state) as model:
        g_logits = model(d.x_test)
    assert float(personal["personal"]) == 1.0 and torch.equal(p_logits, g_logits)


# the default loss resumes in the contract test (tests/test_method_contract.py)
@pytest.mark.parametrize("overrides", [{"participation": 0.5, "fedrod_loss": "ce"}])
def test_restore_mid_run_continues_bit_identically(tmp_path, overrides):
    straight, resumed, _ = restore_mid_run(tiny(algorithm="fedrod", rounds=4, **overrides), tmp_path)
    for a, b in zip(straight.clients, resumed.clients):
        assert all(torch.equal(a.state[n], b.state[n]) for n in P_NAMES)


@pytest.mark.slow
def test_fedrod_learns_on_digits_and_its_personalized_prediction_beats_the_generic_model():
    config = RunConfig(algorithm="fedrod", dataset="digits", partition="shards", shards_per_client=2, num_clients=10,
                       threads=1, seed=0, rounds=5, local_epochs=5)
    results = list(Simulation(config).run())
    last = results[-1]
    # Two classes per client: a constant classifier scores about 0.5 on a client's test set.
    assert last.mean("acc") > 0.85, [r.mean("acc") for r in results]
    assert last.mean("acc") > last.mean("acc_global") + 0.3, (last.mean("acc"), last.mean("acc_global"))


def test_traffic_is_body_and_g_head_each_way():
    sim = Simulation(tiny(algorithm="fedrod", rounds=2))
    plain = build_model("lenet", sim.data.input_shape, 10)  # the registered model: body + G-head
    expected = BYTES_PER_ENTRY * sum(p.numel() for p in plain.parameters())
    for result in sim.run():
        assert all((c.bytes_up, c.bytes_down) == (expected, expected) for c in result.clients)
    p_head = sum(sim.trainer.params[n].numel() for n in P_NAMES)
    assert result.clients[0].personal_fraction == pytest.approx(p_head / (p_head + expected / BYTES_PER_ENTRY))


def test_bad_knob_values_are_refused_by_name():
    with pytest.raises(ConfigError, match="fedrod_loss='focal'.*bsm, ce"):
        RunConfig(algorithm="fedrod", fedrod_loss="focal")
    with pytest.raises(ConfigError, match="init_weights"):
        FedRoD.build_model(RunConfig(algorithm="fedrod", init_weights="/tmp/w.pt"), "lenet", (1, 8, 8), 10)
