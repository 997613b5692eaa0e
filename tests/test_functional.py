"""The differentiable local update (fl_core/functional.py): same update as the fast path, gradients
with respect to per-tensor learning rates, and the Hessian helpers for IFT hypergradients."""
import pytest
import torch
from torch import nn

from fl_core.functional import functional_sgd, hvp, neumann_inverse_hvp
from fl_core.simulation import Simulation
from fl_core.training import derive_seed

from conftest import tiny


def split(model):
    return dict(model.named_parameters()), dict(model.named_buffers())


def test_functional_sgd_matches_the_in_place_trainer():
    sim = Simulation(tiny(algorithm="fedavg", rounds=1))
    trainer, d = sim.trainer, sim.data.clients[0]
    state = sim.clients[0].state
    seed = derive_seed(0, 1, 0, 0, "global")
    fast, _, _ = trainer.train_pass(state, d.x_train, d.y_train, {n: None for n in trainer.params}, seed)
    trainer.model.load_state_dict(state)
    params, buffers = split(trainer.model)
    lrs = {n: sim.config.lr for n in params}
    slow, _ = functional_sgd(trainer.model, params, buffers, d.x_train, d.y_train, lrs,
                             batch_size=sim.config.batch_size, seed=seed)
    for n in params:
        assert torch.allclose(slow[n], fast[n], atol=1e-6), n
    assert all(not t.requires_grad for t in slow.values())
    assert torch.equal(sim.clients[0].state[next(iter(params))], state[next(iter(params))])  # input untouched


def test_a_grad_term_is_the_autograd_gradient_of_its_proximal_term_bit_for_bit():
    """pFedMe's inner steps: λ(θ − w) added to the cross-entropy's gradient equals autograd's
    gradient of ce + λ/2·||θ − w||², to the last bit (float32(λ/2)·2x is float32(λ)·x exactly)."""
    sim = Simulation(tiny(algorithm="fedavg", rounds=1))
    model, d = sim.trainer.model, sim.data.clients[0]
    params, buffers = split(model)
    anchor = {n: p.detach() + 0.01 * torch.randn_like(p) for n, p in params.items()}
    lrs = {n: 0.09 for n in params}
    lam = 15.0

    def with_term(m, p, b, x, y):
        ce = nn.functional.cross_entropy(torch.func.functional_call(m, (p, b), (x,)), y)
        return ce + 0.5 * lam * sum(((p[n] - anchor[n]) ** 2).sum() for n in p)

    common = dict(batch_size=16, seed=3, epochs=3)
    by_autograd, _ = functional_sgd(model, params, buffers, d.x_train, d.y_train, lrs, loss_fn=with_term, **common)
    added, _ = functional_sgd(model, params, buffers, d.x_train, d.y_train, lrs, **common,
                              grad_term=lambda n, theta: (theta.detach() - anchor[n]) * lam)
    assert all(torch.equal(by_autograd[n], added[n]) for n in params)
    moved = functional_sgd(model, params, buffers, d.x_train, d.y_train, lrs, **common)[0]
    assert not all(torch.equal(moved[n], added[n]) for n in params)  # the term does something


def test_gradient_through_training_with_respect_to_per_tensor_learning_rates():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(5, 4), nn.Tanh(), nn.Linear(4, 3)).double()
    x, y = torch.randn(24, 5, dtype=torch.float64), torch.randint(0, 3, (24,))
    xv, yv = torch.randn(16, 5, dtype=torch.float64), torch.randint(0, 3, (16,))
    params, buffers = split(model)
    params = {n: p.detach() for n, p in params.items()}
    names = list(params)

    def val_loss(lr_values):
        lrs = dict(zip(names, lr_values))
        trained, _ = functional_sgd(model, params, buffers, x, y, lrs, batch_size=8, seed=3, epochs=2,
                                    create_graph=True)
        return nn.functional.cross_entropy(torch.func.functional_call(model, (trained, buffers), (xv,)), yv)

    lr = torch.tensor([0.3, 0.0, 0.5, 0.2], dtype=torch.float64, requires_grad=True)
    loss = val_loss(list(lr))
    (grad,) = torch.autograd.grad(loss, lr)
    eps = 1e-6
    for i in range(4):
        bump = torch.zeros(4, dtype=torch.float64)
        bump[i] = eps
        numeric = (val_loss(list(lr.detach() + bump)) - val_loss(list(lr.detach() - bump))) / (2 * eps)
        assert grad[i].item() == pytest.approx(numeric.item(), rel=1e-5, abs=1e-9), i
    # a zero learning rate freezes its tensor, yet its gradient is informative
    frozen, _ = functional_sgd(model, params, buffers, x, y, {names[1]: 0.0, names[0]: 0.1}, batch_size=8, seed=3)
    assert torch.equal(frozen[names[1]], params[names[1]]) and not torch.equal(frozen[names[0]], params[names[0]])
    with pytest.raises(ValueError, match="unknown parameter"):
        functional_sgd(model, params, buffers, x, y, {"nope": 0.1}, batch_size=8, seed=3)


def test_hessian_vector_products_and_the_neumann_inverse_on_a_quadratic():
    torch.manual_seed(1)
    m = torch.randn(4, 4, dtype=torch.float64)
    a = m @ m.T / 4 + torch.eye(4, dtype=torch.float64)          # positive definite
    a = a / torch.linalg.eigvalsh(a).max() * 5                   # largest eigenvalue 5: ψ = 0.1 converges
    w = torch.randn(4, dtype=torch.float64, requires_grad=True)
    loss = 0.5 * w @ a @ w
    v = {"w": torch.randn(4, dtype=torch.float64)}
    assert torch.allclose(hvp(loss, {"w": w}, v)["w"], a @ v["w"])
    exact = torch.linalg.solve(a, v["w"])
    three = neumann_inverse_hvp(loss, {"w": w}, v, steps=3, scale=0.1)["w"]
    many = neumann_inverse_hvp(loss, {"w": w}, v, steps=2000, scale=0.1)["w"]
    assert torch.allclose(many, exact, atol=1e-8)
    series = sum(torch.linalg.matrix_power(torch.eye(4, dtype=torch.float64) - 0.1 * a, j) @ v["w"] for j in range(4))
    assert torch.allclose(three, 0.1 * series)
