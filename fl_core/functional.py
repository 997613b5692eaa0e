"""Differentiable local updates (`torch.func.functional_call`), beside the fast in-place path.

`LocalTrainer.train_pass` (fl_core/training.py) updates parameters in place under `no_grad`: the
fast default. A method that needs gradients *through* training — FedL2P learns per-tensor
learning rates and BN mixing from the validation loss after fine-tuning — uses these functions
instead: parameters are plain tensors in a dict, each SGD step builds new tensors, and with
`create_graph=True` the result stays a differentiable function of the starting parameters and of
the learning rates (which may be outputs of a meta-net).

Helpers for implicit-function-theorem hypergradients: `hvp` (Hessian-vector product by double
backward) and `neumann_inverse_hvp` (H⁻¹v ≈ ψ Σ_{j=0..Q} (I − ψH)^j v, the Neumann series of
Lorraine et al. 2020 that FedL2P uses with ψ = 0.1, Q = 3).
"""
from __future__ import annotations

from collections.abc import Callable, Mapping

import torch
from torch import Tensor, nn
from torch.func import functional_call
from torch.nn import functional as F

from .training import batch_order

Params = dict[str, Tensor]
# loss(model, params, buffers, x, y) -> scalar; the default is cross-entropy of the model's logits.
FunctionalLoss = Callable[[nn.Module, Params, Params, Tensor, Tensor], Tensor]


def functional_cross_entropy(model: nn.Module, params: Params, buffers: Params, x: Tensor, y: Tensor) -> Tensor:
    return F.cross_entropy(functional_call(model, (params, buffers), (x,)), y)


def functional_sgd(model: nn.Module, params: Mapping[str, Tensor], buffers: Mapping[str, Tensor], x: Tensor,
                   y: Tensor, lrs: Mapping[str, Tensor | float], *, batch_size: int, seed: int, epochs: int = 1,
                   create_graph: bool = False, loss_fn: FunctionalLoss = functional_cross_entropy,
                   grad_term: Callable[[str, Tensor], Tensor] | None = None) -> tuple[Params, Params]:
    """Plain SGD on (x, y): per batch θ_n ← θ_n − η_n ∇_n L for every tensor n in `lrs` (others stay
    fixed). Returns (parameters, buffers) after `epochs` passes; buffers (BN running statistics)
    are updated on copies in train mode, never in place.

    The batch order is `LocalTrainer.train_pass`'s (a permutation seeded by `seed` per pass), so
    with constant learning rates this is the same update as the fast path, up to rounding.
    `create_graph=True` keeps the graph of every step, so the result can be differentiated with
    respect to the starting parameters and to the learning rates (tensors with requires_grad);
    else each step is detached and the result is plain tensors. `grad_term(name, θ_n)`, when given,
    is added to the loss's gradient of θ_n: the gradient of a simple extra term (pFedMe's
    proximal one) without building its graph over every parameter.
    """
    if not lrs:
        raise ValueError("functional_sgd needs at least one tensor to train (lrs is empty)")
    unknown = sorted(set(lrs) - set(params))
    if unknown:
        raise ValueError(f"learning rates for unknown parameter(s): {', '.join(unknown)}")
    names = list(lrs)
    params = dict(params)
    buffers = {n: b.clone() for n, b in buffers.items()}
    if not create_graph:
        params = {n: (p.detach().requires_grad_(True) if n in lrs else p.detach()) for n, p in params.items()}
    else:  # trained tensors must be on a graph; leaves that are not become differentiable leaves
        params = {n: (p.detach().requires_grad_(True) if n in lrs and not p.requires_grad else p)
                  for n, p in params.items()}
    was_training = model.training
    model.train()
    n = x.shape[0]
    try:
        for _ in range(epochs):
            order = batch_order(seed, n, x.device)
            for start in range(0, n, batch_size):
                idx = order[start:start + batch_size]
                loss = loss_fn(model, params, buffers, x[idx], y[idx])
                grads = torch.autograd.grad(loss, [params[m] for m in names], create_graph=create_graph)
                if grad_term is not None:
                    grads = [g + grad_term(m, params[m]) for m, g in zip(names, grads)]
                for m, g in zip(names, grads):
                    new = params[m] - lrs[m] * g
                    params[m] = new if create_graph else new.detach().requires_grad_(True)
    finally:
        model.train(was_training)
    if not create_graph:
        params = {m: p.detach() for m, p in params.items()}
    return params, buffers


def hvp(loss: Tensor, params: Mapping[str, Tensor], vector: Mapping[str, Tensor]) -> Params:
    """Hessian-vector product H v of a scalar `loss` w.r.t. `params` (which require grad; the
    loss must have been built from them with a graph): the gradient of ⟨∇loss, v⟩."""
    names = list(vector)
    grads = torch.autograd.grad(loss, [params[n] for n in names], create_graph=True)
    dot = sum((g * vector[n].detach()).sum() for g, n in zip(grads, names))
    return dict(zip(names, torch.autograd.grad(dot, [params[n] for n in names], retain_graph=True)))


def neumann_inverse_hvp(loss: Tensor, params: Mapping[str, Tensor], vector: Mapping[str, Tensor],
                        steps: int = 3, scale: float = 0.1) -> Params:
    """H⁻¹ v ≈ ψ Σ_{j=0..Q} (I − ψH)^j v (ψ = `scale`, Q = `steps`): converges when ψ‖H‖ < 1 and H
    is positive definite. One gradient of `loss` is reused for every Hessian-vector product."""
    names = list(vector)
    grads = torch.autograd.grad(loss, [params[n] for n in names], create_graph=True)
    term = {n: vector[n].detach().clone() for n in names}
    total = {n: t.clone() for n, t in term.items()}
    for _ in range(steps):
        dot = sum((g * term[n]).sum() for g, n in zip(grads, names))
        h_term = torch.autograd.grad(dot, [params[n] for n in names], retain_graph=True)
        term = {n: term[n] - scale * h for n, h in zip(names, h_term)}
        total = {n: total[n] + term[n] for n in names}
    return {n: scale * t for n, t in total.items()}
