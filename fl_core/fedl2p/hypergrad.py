"""FedL2P's hypergradient: d L_V / d λ at the fine-tuned parameters θ*, by the implicit function
theorem with a Neumann-series inverse Hessian (Lorraine et al. 2020; FedL2P Eqs. 6-7, Alg. 2).

With θ*(λ) a stationary point of the training loss L_T(θ, λ),

    d L_V/dλ = ∂_λ L_V − ∂_θ L_V · (∂²_θ L_T)⁻¹ · ∂²_{θλ} L_T.

The inverse-Hessian-vector product p ≈ H⁻¹ v (v = ∂_θ L_V) is a truncated Neumann series of Q
terms with step ψ (`fl_core.functional.neumann_inverse_hvp`: ψ Σ_{j=0..Q} (I − ψH)^j v). The
paper's Alg. 2 (as Lorraine et al.'s) accumulates p = Σ_j (I − ψH)^j v without the leading ψ,
i.e. 1/ψ times the series' estimate of H⁻¹ v; `scale="paper"` (the default, FedL2P's ψ = 0.1,
Q = 3) follows it, `scale="exact"` keeps the factor ψ, so that with enough terms the result is
the true hypergradient (the tests check it against finite differences and the closed form).
The mixed term p · ∂²_{θλ} L_T is one vector-Jacobian product: the gradient of ⟨∂_θ L_T, p⟩
with respect to λ. The result is clipped element-wise to [−clip, clip] (the paper: 1).
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch
from torch import Tensor

from ..functional import neumann_inverse_hvp

SCALES = ("paper", "exact")


def _grads(loss: Tensor, inputs: Sequence[Tensor], **kwargs) -> list[Tensor]:
    """∂ loss / ∂ inputs, zeros where an input does not enter the loss."""
    grads = torch.autograd.grad(loss, list(inputs), allow_unused=True, **kwargs)
    return [torch.zeros_like(x) if g is None else g for g, x in zip(grads, inputs)]


def ift_hypergradient(train_loss: Tensor, val_loss: Tensor, params: Mapping[str, Tensor], meta: Sequence[Tensor],
                      steps: int = 3, psi: float = 0.1, scale: str = "paper", clip: float | None = 1.0,
                      direct: Sequence[bool] | None = None) -> list[Tensor]:
    """The hypergradient of `val_loss` w.r.t. the meta-parameters `meta` (see the module docstring).

    `params` are the fine-tuned parameters θ* as tensors that require grad, from which both losses
    were built (with graphs); `train_loss` must also depend on `meta` (e.g. through β in the
    forward pass or the learning rates of a last differentiable step). Returns one tensor per
    meta-parameter, clipped to [−clip, clip] (None: no clipping). `direct` (one flag per
    meta-parameter, default all True) says which get the direct term ∂_λ L_V: FedL2P's authors add
    it for BNNet only, so LRNet learns from the implicit term alone.
    """
    if scale not in SCALES:
        raise ValueError(f"scale={scale!r} is not allowed; choose one of {', '.join(SCALES)}")
    if steps < 0 or psi <= 0:
        raise ValueError(f"steps={steps} must be >= 0 and psi={psi} > 0")
    names = list(params)
    tensors = [params[n] for n in names]
    v = dict(zip(names, _grads(val_loss, tensors, retain_graph=True)))
    p = neumann_inverse_hvp(train_loss, params, v, steps=steps, scale=psi)
    if scale == "paper":
        p = {n: t / psi for n, t in p.items()}
    train_grads = torch.autograd.grad(train_loss, tensors, create_graph=True)
    dot = sum((g * p[n].detach()).sum() for g, n in zip(train_grads, names))
    mixed = _grads(dot, meta, retain_graph=True)
    flags = [True] * len(meta) if direct is None else list(direct)
    if len(flags) != len(meta):
        raise ValueError(f"{len(flags)} direct flags for {len(meta)} meta-parameters")
    with_direct = [m for m, f in zip(meta, flags) if f]
    grads = iter(_grads(val_loss, with_direct, retain_graph=True) if with_direct else [])
    out = [(next(grads) - m) if f else -m for f, m in zip(flags, mixed)]
    return [g.clamp(-clip, clip) for g in out] if clip is not None else out
