"""A client's fine-tuning policy and FedL2P's meta step on it (paper §3, Alg. 1 lines 6-12).

A `Policy` is how a client fine-tunes the pretrained model: β per BatchNorm layer (with where its
client statistics come from, `bn_mixing`) and a learning rate per parameter tensor (0 = frozen).
`fine_tune` runs it: `epochs` passes of plain SGD (no momentum, no weight decay: the authors'
learn2learn-style inner loop) over the client's training split with per-tensor rates, every
forward pass under the policy's BN mixing. `policy_predictor` is the fine-tuned model under the
same mixing, what the client is scored with. FT (BN C / G / I) are fixed policies; FedL2P's comes
from the meta-nets.

`MetaNets` holds λ = (BNNet, LRNet with its post-multiplier η̃), or one of them for the
ablations (the other output fixed), turns a client's statistics (`ClientInputs`) into its policy,
and `meta_step` makes one meta iteration on one client:
  1. fine-tune the pretrained θ_g for `epochs` under the current policy, untracked (θ_e);
  2. one more SGD step, tracked, on one seeded training batch (`batch_size` samples):
     θ' = θ_e − η(λ)·∇L_T(θ_e, β(λ)). It makes the training loss at θ' depend on the learning
     rates (Eqs. 9-10; the authors track their last inner step, here it is an extra step). The
     gradient is differentiated too (`lookahead = "exact"`, Eq. 10 as written: θ' depends on β
     also through ∇L_T); the authors' code takes it as a constant (learn2learn's first-order
     clone: θ' depends on λ through η only), `lookahead = "first_order"`. It matters for BNNet:
     its meta-gradient differs by 3 to 67 % between the two (benchmarks/parity/fedl2p.py);
  3. L_T = CE(f_{θ',β}(the next training batch)), L_V = CE(f_{θ',β}(the whole validation split))
     (the authors: a fresh training batch and a validation batch, both at θ');
  4. the meta-gradient d L_V / d λ, clipped to [−1, 1], then SGD on λ with the paper's rates
     ζ = (w_bn 1e-3, w_lr 1e-3, η̃ 1e-4). FOMAML+ (FedL2P's default here: the one that lowers the
     validation loss at this scale, fl_core/fedl2p/algorithm.py): the direct term ∂_λ L_V only,
     for every meta-net. IFT (the paper's; `hypergrad.ift_hypergradient`, Q = 3, ψ = 0.1) as the
     authors' code: the implicit term −p·∂²L_T/∂θ'∂λ for every meta-net, plus the direct term
     ∂_λ L_V for BNNet only (`ift_direct = "bnnet"`; "all" adds it for LRNet too, through the
     look-ahead step).
"""
from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, replace

import torch
from torch import Tensor, nn
from torch.func import functional_call
from torch.nn import functional as F

from ..functional import functional_sgd
from .bn_mixing import BNStats, bn_layers, bn_mixing, client_bn_stats
from .hypergrad import ift_hypergradient
from .metanets import (LRNet, MetaNet, bn_kl_features, bnnet, layer_input_stats, lrnet, lrnet_input,
                       parameter_layers, parameter_tensor_names)

META_GRADS = ("ift", "fomaml")
LOOKAHEADS = ("exact", "first_order")


@dataclass(frozen=True)
class ClientInputs:
    """What one forward pass of a client's training split through the pretrained model gives:
    its per-channel BN input statistics, BNNet's input ξ [B] and LRNet's input [2M]."""

    bn_stats: BNStats
    kl: Tensor
    lr_features: Tensor


def client_inputs(model: nn.Module, x: Tensor, batch_size: int = 1024) -> ClientInputs:
    """The meta-nets' inputs of a client; `model` holds the pretrained state (eval-mode pass)."""
    stats = client_bn_stats(model, x, batch_size)
    means, sds = layer_input_stats(model, x, batch_size)
    return ClientInputs(stats, bn_kl_features(model, x, client_stats=stats), lrnet_input(means, sds))


@dataclass(frozen=True)
class Policy:
    """β (one per BN layer, or one for all) with its statistics source, and per-tensor rates."""

    betas: Tensor | float
    lrs: Mapping[str, Tensor | float]
    source: str = "client"        # "client": the client's fixed statistics; "batch": the incoming batch's

    def detached(self) -> "Policy":
        det = lambda v: v.detach() if isinstance(v, Tensor) else v  # noqa: E731
        return Policy(det(self.betas), {n: det(v) for n, v in self.lrs.items()}, self.source)


def split_state(model: nn.Module, state: Mapping[str, Tensor]) -> tuple[dict[str, Tensor], dict[str, Tensor]]:
    names = set(parameter_tensor_names(model))
    return ({n: t for n, t in state.items() if n in names}, {n: t for n, t in state.items() if n not in names})


def fine_tune(model: nn.Module, state: Mapping[str, Tensor], x: Tensor, y: Tensor, policy: Policy,
              stats: BNStats | None, *, epochs: int, batch_size: int, seed: int) -> dict[str, Tensor]:
    """`state` after `epochs` of per-tensor-rate SGD under the policy's BN mixing (untracked; the
    running statistics are left as they are). A tensor at rate 0 comes back bit-identical."""
    if epochs == 0:
        return dict(state)
    params, buffers = split_state(model, state)
    policy = policy.detached()
    with bn_mixing(model, policy.betas, stats, policy.source):
        tuned, _ = functional_sgd(model, params, buffers, x, y, policy.lrs, batch_size=batch_size, seed=seed,
                                  epochs=epochs)
    return tuned | buffers


def fine_tune_tracking(model: nn.Module, state: Mapping[str, Tensor], x: Tensor, y: Tensor, lr: float, *,
                       epochs: int, batch_size: int, seed: int) -> dict[str, Tensor]:
    """FT (BN C) as the FedL2P authors' code runs it (github.com/royson/fedl2p, `KLDBatchNorm2d` at
    β = 1, read at fe1944e): every BatchNorm layer's running statistics restart at mean 0 and
    variance 1, then `epochs` of plain SGD at `lr` in training mode, each batch normalised with its
    own statistics while the running ones follow them (the layer's momentum, 0.1). Returns the
    state with those running estimates, which the model's ordinary evaluation then normalises
    with. Same batch order as `fine_tune`."""
    params, buffers = split_state(model, state)
    restarted = dict(buffers)
    for name, module in bn_layers(model):
        restarted[f"{name}.running_mean"] = torch.zeros_like(buffers[f"{name}.running_mean"])
        restarted[f"{name}.running_var"] = torch.ones_like(buffers[f"{name}.running_var"])
        if f"{name}.num_batches_tracked" in buffers:
            restarted[f"{name}.num_batches_tracked"] = torch.zeros_like(buffers[f"{name}.num_batches_tracked"])
    if epochs == 0:
        return dict(params) | restarted
    tuned, tracked = functional_sgd(model, params, restarted, x, y, {n: lr for n in params}, batch_size=batch_size,
                                    seed=seed, epochs=epochs)
    return tuned | tracked


def policy_predictor(model: nn.Module, state: Mapping[str, Tensor], policy: Policy, stats: BNStats | None):
    """x -> logits of `state` with every BN layer under the policy's mixing."""
    params, buffers = split_state(model, state)
    policy = policy.detached()

    def predict(x: Tensor) -> Tensor:
        with bn_mixing(model, policy.betas, stats, policy.source):
            return functional_call(model, (params, buffers), (x,))
    return predict


class MetaNets(nn.Module):
    """λ: BNNet and/or LRNet (with η̃) for one model; a disabled net's output is fixed
    (`fixed_beta` for every BN layer, or the base rate for every tensor)."""

    def __init__(self, model: nn.Module, base_lr: float, *, use_bnnet: bool = True, use_lrnet: bool = True,
                 fixed_beta: float = 1.0) -> None:
        super().__init__()
        self.bn_names = [n for n, _ in bn_layers(model)]
        self.tensor_names = parameter_tensor_names(model)
        self.base_lr, self.fixed_beta = float(base_lr), float(fixed_beta)
        self.bnnet: MetaNet | None = bnnet(len(self.bn_names)) if use_bnnet else None
        self.lrnet: LRNet | None = (lrnet(len(parameter_layers(model)), len(self.tensor_names), base_lr)
                                    if use_lrnet else None)

    def policy(self, inputs: ClientInputs) -> Policy:
        betas = self.bnnet(inputs.kl) if self.bnnet is not None else self.fixed_beta
        if self.lrnet is not None:
            eta = self.lrnet.learning_rates(inputs.lr_features)
            lrs = {n: eta[i] for i, n in enumerate(self.tensor_names)}
        else:
            lrs = {n: self.base_lr for n in self.tensor_names}
        return Policy(betas, lrs, "client")

    def param_groups(self, lr_bn: float, lr_lr: float, lr_post: float) -> list[tuple[list[Tensor], float]]:
        """(parameters, meta learning rate ζ) per group: w_bn, w_lr, η̃."""
        groups = []
        if self.bnnet is not None:
            groups.append((list(self.bnnet.parameters()), lr_bn))
        if self.lrnet is not None:
            groups.append((list(self.lrnet.net.parameters()), lr_lr))
            groups.append(([self.lrnet.post_multiplier], lr_post))
        return groups


@dataclass(frozen=True)
class MetaStepSettings:
    epochs: int
    batch_size: int
    meta_grad: str = "fomaml"      # "fomaml" (FedL2P's default here) | "ift" (the paper's)
    ift_direct: str = "bnnet"      # which meta-nets get IFT's direct term ∂_λ L_V: "bnnet" (the authors') | "all"
    lookahead: str = "exact"       # "exact" (the paper's Eq. 10) | "first_order" (the authors' code)
    neumann_steps: int = 3
    neumann_psi: float = 0.1
    clip: float = 1.0
    lr_bn: float = 1e-3
    lr_lr: float = 1e-3
    lr_post: float = 1e-4


def _loss(model: nn.Module, params: Mapping[str, Tensor], buffers: Mapping[str, Tensor], x: Tensor,
          y: Tensor) -> Tensor:
    return F.cross_entropy(functional_call(model, (dict(params), dict(buffers)), (x,)), y)


def _looked_ahead(model: nn.Module, policy: Policy, state: Mapping[str, Tensor], inputs: ClientInputs,
                  x_train: Tensor, y_train: Tensor, x_val: Tensor, y_val: Tensor, settings: MetaStepSettings,
                  seed: int) -> tuple[dict[str, Tensor], Tensor, Tensor]:
    """Steps 1-3 of a meta step under `policy`: fine-tune, the look-ahead step, L_T and L_V at θ'.
    Returns (θ' for the tensors with a rate, L_T, L_V), differentiable in the policy."""
    theta_e = fine_tune(model, state, x_train, y_train, policy, inputs.bn_stats, epochs=settings.epochs,
                        batch_size=settings.batch_size, seed=seed)
    params, buffers = split_state(model, theta_e)
    leaves = {n: p.detach().requires_grad_(True) for n, p in params.items()}
    order = torch.randperm(x_train.shape[0], generator=torch.Generator().manual_seed(seed + 1)).to(x_train.device)
    x_batch, y_batch = x_train[order[:settings.batch_size]], y_train[order[:settings.batch_size]]
    fresh = order[settings.batch_size:2 * settings.batch_size]  # L_T's batch: the next one (or the same if none)
    x_fresh, y_fresh = (x_train[fresh], y_train[fresh]) if fresh.numel() else (x_batch, y_batch)
    with bn_mixing(model, policy.betas, inputs.bn_stats, policy.source):
        first = _loss(model, leaves, buffers, x_batch, y_batch)
        names = list(policy.lrs)
        grads = torch.autograd.grad(first, [leaves[n] for n in names], create_graph=settings.lookahead == "exact")
        looked = dict(leaves) | {n: leaves[n] - policy.lrs[n] * g for n, g in zip(names, grads)}
        train_loss = _loss(model, looked, buffers, x_fresh, y_fresh)
        val_loss = _loss(model, looked, buffers, x_val, y_val)
    return {n: looked[n] for n in names}, train_loss, val_loss


def validation_loss(model: nn.Module, nets: MetaNets, state: Mapping[str, Tensor], inputs: ClientInputs,
                    x_train: Tensor, y_train: Tensor, x_val: Tensor, y_val: Tensor, settings: MetaStepSettings,
                    seed: int) -> float:
    """The L_V that `meta_step` with the same `seed` reports for the nets' current λ, without
    updating λ: two λ's scored with one seed see the same batches, so their difference is λ's
    alone (common random numbers; FedL2P's `keep = "paired"` and its evaluation use it)."""
    with torch.no_grad():
        policy = nets.policy(inputs).detached()
    plain = replace(settings, lookahead="first_order")  # the same values, no graph through the look-ahead
    return float(_looked_ahead(model, policy, state, inputs, x_train, y_train, x_val, y_val, plain, seed)[2].detach())


def meta_step(model: nn.Module, nets: MetaNets, state: Mapping[str, Tensor], inputs: ClientInputs,
              x_train: Tensor, y_train: Tensor, x_val: Tensor, y_val: Tensor, settings: MetaStepSettings,
              seed: int) -> dict[str, float]:
    """One meta iteration on one client (module docstring): updates `nets` in place and returns
    the validation loss L_V at θ' and the hypergradient's wall time in seconds."""
    if settings.lookahead not in LOOKAHEADS:
        raise ValueError(f"lookahead={settings.lookahead!r}; choose one of {', '.join(LOOKAHEADS)}")
    policy = nets.policy(inputs)
    looked, train_loss, val_loss = _looked_ahead(model, policy, state, inputs, x_train, y_train, x_val, y_val,
                                                 settings, seed)
    meta = [p for group, _ in nets.param_groups(0, 0, 0) for p in group]
    start = time.perf_counter()
    if settings.meta_grad == "ift":
        bn_params = set() if nets.bnnet is None else set(map(id, nets.bnnet.parameters()))
        direct = [settings.ift_direct == "all" or id(p) in bn_params for p in meta]
        hyper = ift_hypergradient(train_loss, val_loss, looked, meta,
                                  steps=settings.neumann_steps, psi=settings.neumann_psi, clip=settings.clip,
                                  direct=direct)
    else:  # FOMAML+: the direct term only (through β and the look-ahead step's rates)
        direct = torch.autograd.grad(val_loss, meta, allow_unused=True)
        hyper = [torch.zeros_like(p) if g is None else g.clamp(-settings.clip, settings.clip)
                 for g, p in zip(direct, meta)]
    seconds = time.perf_counter() - start
    with torch.no_grad():
        grads_of = dict(zip(map(id, meta), hyper))
        for group, lr in nets.param_groups(settings.lr_bn, settings.lr_lr, settings.lr_post):
            for p in group:
                p -= lr * grads_of[id(p)]
    return {"val_loss": float(val_loss.detach()), "hypergrad_seconds": seconds}


def policy_metrics(policy: Policy, bn_names: list[str], per_layer: bool = False) -> dict[str, float]:
    """The policy in numbers: mean β, mean η, sparsity (share of tensors at rate 0); with
    `per_layer`, also `beta:<BN layer>` and `eta:<tensor>` for the distribution figures."""
    lrs = {n: float(v) for n, v in policy.lrs.items()}
    betas = policy.betas
    beta_list = ([float(b) for b in betas.reshape(-1)] if isinstance(betas, Tensor) and betas.dim() > 0
                 else [float(betas)] * len(bn_names))
    out = {"beta_mean": sum(beta_list) / max(len(beta_list), 1), "eta_mean": sum(lrs.values()) / len(lrs),
           "sparsity": sum(v == 0.0 for v in lrs.values()) / len(lrs)}
    if per_layer:
        out |= {f"beta:{n}": b for n, b in zip(bn_names, beta_list)} | {f"eta:{n}": v for n, v in lrs.items()}
    return out
