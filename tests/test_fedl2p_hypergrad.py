"""FedL2P's IFT hypergradient on a problem with a closed form: ridge regression, whose inner
optimum θ*(λ) = (XᵀX/n + λI)⁻¹ Xᵀy/n is exact, so the hypergradient can be checked against finite
differences of L_V(θ*(λ)) and against the exact inverse-Hessian product."""
import pytest
import torch

from fl_core.fedl2p.hypergrad import ift_hypergradient

F64 = dict(dtype=torch.float64)


def ridge():
    g = torch.Generator().manual_seed(0)
    x, xv = torch.randn(40, 3, generator=g, **F64), torch.randn(30, 3, generator=g, **F64)
    w = torch.tensor([1.0, -2.0, 0.5], **F64)
    y, yv = x @ w + 0.3 * torch.randn(40, generator=g, **F64), xv @ w + 0.3 * torch.randn(30, generator=g, **F64)
    return x, y, xv, yv


def solve(lam: float, x, y):
    h = x.T @ x / len(x) + lam * torch.eye(x.shape[1], **F64)
    return torch.linalg.solve(h, x.T @ y / len(x))


def losses(lam_value: float):
    x, y, xv, yv = ridge()
    lam = torch.tensor(lam_value, requires_grad=True, **F64)
    theta = solve(lam_value, x, y).requires_grad_()
    train = ((x @ theta - y) ** 2).mean() / 2 + lam / 2 * (theta ** 2).sum()
    val = ((xv @ theta - yv) ** 2).mean() / 2
    return train, val, {"theta": theta}, lam


def val_at(lam_value: float) -> float:
    x, y, xv, yv = ridge()
    theta = solve(lam_value, x, y)
    return float(((xv @ theta - yv) ** 2).mean() / 2)


def test_with_enough_neumann_terms_the_hypergradient_is_the_finite_difference_and_the_closed_form():
    lam0, h = 0.3, 1e-5
    finite = (val_at(lam0 + h) - val_at(lam0 - h)) / (2 * h)
    train, val, params, lam = losses(lam0)
    (ours,) = ift_hypergradient(train, val, params, [lam], steps=400, psi=0.1, scale="exact", clip=None)
    # closed form: −∂_θ L_V · H⁻¹ · ∂²L_T/∂θ∂λ, where ∂²L_T/∂θ∂λ = θ*
    x, y, xv, yv = ridge()
    theta = solve(lam0, x, y)
    grad_v = xv.T @ (xv @ theta - yv) / len(xv)
    exact = -grad_v @ torch.linalg.solve(x.T @ x / len(x) + lam0 * torch.eye(3, **F64), theta)
    assert abs(finite) > 1e-3  # a real signal, not a flat spot
    assert float(ours) == pytest.approx(finite, rel=1e-4)
    assert float(ours) == pytest.approx(float(exact), rel=1e-6)


def test_the_papers_scale_is_one_over_psi_of_the_truncated_series():
    train, val, params, lam = losses(0.3)
    (exact3,) = ift_hypergradient(train, val, params, [lam], steps=3, psi=0.1, scale="exact", clip=None)
    (paper3,) = ift_hypergradient(train, val, params, [lam], steps=3, psi=0.1, scale="paper", clip=None)
    # L_V does not depend on λ directly here, so the whole hypergradient is the indirect term
    assert float(paper3) == pytest.approx(float(exact3) / 0.1, rel=1e-12)
    (converged,) = ift_hypergradient(train, val, params, [lam], steps=400, psi=0.1, scale="exact", clip=None)
    assert (float(exact3) > 0) == (float(converged) > 0)  # three terms already point the right way


def test_the_hypergradient_is_clipped_and_bad_arguments_are_refused():
    train, val, params, lam = losses(0.3)
    (big,) = ift_hypergradient(train, val, params, [lam], steps=3, psi=0.1, scale="paper", clip=None)
    train, val, params, lam = losses(0.3)
    (clipped,) = ift_hypergradient(train, val, params, [lam], steps=3, psi=0.1, scale="paper", clip=abs(float(big)) / 2)
    assert float(clipped) == pytest.approx(abs(float(big)) / 2 * (1 if float(big) > 0 else -1))
    with pytest.raises(ValueError, match="scale='lorraine' is not allowed"):
        ift_hypergradient(train, val, params, [lam], scale="lorraine")


def test_a_direct_dependence_of_the_validation_loss_on_lambda_is_added():
    train, val, params, lam = losses(0.3)
    (indirect,) = ift_hypergradient(train, val, params, [lam], steps=3, clip=None)
    train, val, params, lam = losses(0.3)
    (both,) = ift_hypergradient(train, val + 2.0 * lam, params, [lam], steps=3, clip=None)
    assert float(both) == pytest.approx(float(indirect) + 2.0, rel=1e-12)


def test_without_the_direct_term_a_meta_parameter_gets_the_implicit_term_alone():
    torch.manual_seed(3)
    theta = torch.randn(4, requires_grad=True)
    lam = torch.randn(4, requires_grad=True)
    mu = torch.randn(4, requires_grad=True)
    train = ((theta - lam) ** 2).sum() + 0.5 * (theta ** 2).sum()
    val = ((theta - 1.0) ** 2).sum() + (mu * theta).sum() + (lam ** 2).sum()
    full = ift_hypergradient(train, val, {"t": theta}, [lam, mu], steps=2, psi=0.1, clip=None)
    alone = ift_hypergradient(train, val, {"t": theta}, [lam, mu], steps=2, psi=0.1, clip=None, direct=[False, True])
    assert torch.allclose(alone[0], full[0] - 2 * lam.detach())   # ∂_λ L_V = 2λ left out
    assert torch.allclose(alone[1], full[1])                       # μ keeps its direct term
    with pytest.raises(ValueError, match="1 direct flags for 2 meta-parameters"):
        ift_hypergradient(train, val, {"t": theta}, [lam, mu], direct=[True])
