"""Per-FedAvg — Fallah, Mokhtari, Ozdaglar, "Personalized Federated Learning with Theoretical
Guarantees: A Model-Agnostic Meta-Learning Approach", NeurIPS 2020. Both of its practical
variants: first-order (`perfedavg_fo`) and Hessian-free (`perfedavg_hf`).

Evaluated per client: the broadcast global model after `perfedavg_adapt_steps` (default 1) SGD
steps of size α on mini-batches of the client's own training data (`acc`), the paper's
evaluation: the meta-model is the starting point each user adapts with one gradient step.
`acc_global` is the broadcast model before that step, `acc_local` the client's copy after its
local meta-updates (before averaging). The adapted copy is only evaluated; training continues
from the un-adapted model.

Objective: min_w (1/N) Σ_k F_k(w − α∇F_k(w)), the loss after one local step. Each local step of
client k, at its model w, on three mini-batches D, D', D'' of its training data:
    w' = w − α ∇f(w; D)                                         (the adapted model)
    FO:  w ← w − β ∇f(w'; D')
    HF:  w ← w − β (I − α ∇²f(w; D'')) ∇f(w'; D')
The HF Hessian-vector product ∇²f(w; D'') v (v = ∇f(w'; D')) is the paper's central finite
difference [∇f(w + δv; D'') − ∇f(w − δv; D'')] / (2δ) with δ = `perfedavg_delta`; δ = 0 computes
it exactly by double backward (fl_core/functional.py `hvp`). The server averages w as FedAvg.

Batches: a local epoch makes ⌈n/B⌉ steps (B = batch_size); D' is the batch FedAvg's SGD would use
at that step (the seeded order of purpose "global"), D and D'' the same step's batches of two
other seeded orders (purposes "perfedavg_inner", "perfedavg_hessian"): each is drawn independently
of the others, as in the paper, and every sample serves once per epoch in each role. Hence with
α = 0 both variants are FedAvg's local SGD at step β, batch for batch (bit for bit on CPU).
BatchNorm running statistics are updated by the forward on D' (one update per step, as in SGD);
the forwards on D and D'' use batch statistics and leave them as they are. Evaluation's
adaptation batches come from the order of purpose "perfedavg_adapt" of (seed, round, client);
that step changes parameters only.

Knobs (HF adds δ to FO's): α = `perfedavg_alpha` = 0.001 and δ = `perfedavg_delta` = 0.001, the
small constant steps of the paper's experiments as we recall them (not re-checked against the
paper here); β = `perfedavg_beta`, by default the run's `lr` of the round (so lr schedules and the
studies' lr axes apply; the paper's β is of the order of 1e-3, far slower than the lr of this
platform's runs). At α = 0.001 one adaptation step barely moves the model and the method is close
to FedAvg; on digits with 2 classes per client α = 0.02 personalizes (tests/test_perfedavg.py).
Departures: the paper's users run τ steps on freshly sampled batches; here τ = local_epochs·⌈n/B⌉
on seeded permutations (deterministic, restorable runs). The run's momentum and weight decay act
on the outer (meta) update as the engine's SGD applies them to a gradient (buffer per epoch or
per round: `momentum_scope`); the inner and adaptation steps are plain steps of size α. With the
defaults (momentum 0, weight decay 0) this is the paper's update.

Cautions: the finite difference equals the exact product only where w ± δv cross no ReLU or
max-pool kink; on LeNet/digits at δ = 0.001 it can miss it by several times its norm (at 1e-4 it
agrees), so δ = 0 is the exact alternative at about the same cost. HF's step (I − α∇²f)v grows
when α times the curvature along v nears 1: on digits (5 local epochs, α = 0.01, exact product)
β = lr = 0.1 turned the model to NaN in round 4; β = 0.05 trains.

Traffic as FedAvg: every parameter up, the averaged parameters down; BN running statistics never
leave the client.
"""
from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import Tensor, nn

from ..client_state import ClientState
from ..data import ClientData
from ..functional import functional_cross_entropy, hvp
from ..knobs import MethodParams, knob
from ..training import State, batch_order, derive_seed
from .base import Algorithm, LocalStats, Scored


@dataclass(frozen=True)
class PerFedAvgParams(MethodParams):
    perfedavg_alpha: float = knob(0.001, "inner (personalization) step size α of the MAML objective, also the size of "
                                  "the adaptation step before evaluation (0: plain FedAvg training)", low=0)
    perfedavg_beta: float | None = knob(None, "outer (meta) step size β (none: the round's scheduled lr)",
                                        low=0, low_open=True)
    perfedavg_adapt_steps: int = knob(1, "SGD steps of size α on the client's training batches before it is "
                                      "evaluated (the paper: 1; 0 evaluates the broadcast model)", low=0)


@dataclass(frozen=True)
class PerFedAvgHFParams(PerFedAvgParams):
    perfedavg_delta: float = knob(0.001, "δ of the finite-difference Hessian-vector product "
                                  "(0: the exact product by double backward)", low=0)


class PerFedAvgFO(Algorithm):
    name = "perfedavg_fo"
    display = "Per-FedAvg (FO)"
    Params = PerFedAvgParams
    acc_from = Scored.CUSTOM
    evaluates = "global model after one local α-step (acc_global: before it)"
    hessian: ClassVar[bool] = False

    # ---------------------------------------------------------------- training
    def local_update(self, k: int, client: ClientState, data: ClientData, rnd: int) -> LocalStats:
        p, cfg = self.params, self.config
        beta = self.lr(rnd) if p.perfedavg_beta is None else p.perfedavg_beta
        weights = {n: client.state[n] for n in self.param_names}
        buffers = {n: t.clone() for n, t in client.state.items() if n not in weights}  # updated in place
        stats = LocalStats(torch.zeros((), device=data.x_train.device), 0)
        velocity: dict[str, Tensor] = {}
        for epoch in range(cfg.local_epochs):
            if cfg.momentum_scope == "epoch":
                velocity = {}
            for d, d_out, d_hess in self.step_batches(k, data, rnd, epoch):
                loss, meta = self.meta_gradient(weights, buffers, data, d, d_out, d_hess)
                weights = self.outer_step(weights, meta, beta, velocity)
                stats.loss_sum += loss.detach() * d_out.numel()
                stats.samples += int(d_out.numel())
        client.state = weights | buffers
        return stats

    def step_batches(self, k: int, data: ClientData, rnd: int,
                     epoch: int) -> Iterator[tuple[Tensor, Tensor, Tensor | None]]:
        """(D, D', D'') index batches of each step of one epoch (D'' None for FO)."""
        n, size, dev, seed = data.n_train, self.config.batch_size, data.x_train.device, self.config.seed
        inner = batch_order(derive_seed(seed, rnd, k, epoch, "perfedavg_inner"), n, dev)
        outer = batch_order(derive_seed(seed, rnd, k, epoch, "global"), n, dev)  # FedAvg's batches
        hess = batch_order(derive_seed(seed, rnd, k, epoch, "perfedavg_hessian"), n, dev) if self.hessian else None
        for start in range(0, n, size):
            cut = slice(start, start + size)
            yield inner[cut], outer[cut], None if hess is None else hess[cut]

    def loss_and_grad(self, weights: Mapping[str, Tensor], buffers: Mapping[str, Tensor], x: Tensor, y: Tensor,
                      ) -> tuple[Tensor, dict[str, Tensor]]:
        """Mean cross-entropy on (x, y) at `weights` in train mode, and its gradient. BN running
        statistics update `buffers` in place: pass a copy to leave them as they are."""
        leaves = {n: t.detach().requires_grad_(True) for n, t in weights.items()}
        with self.train_mode() as model:
            loss = functional_cross_entropy(model, leaves, dict(buffers), x, y)
            grads = torch.autograd.grad(loss, list(leaves.values()))
        return loss.detach(), dict(zip(leaves, grads))

    @contextmanager
    def train_mode(self) -> Iterator[nn.Module]:
        """The shared model in train mode (BN on batch statistics), its mode restored after."""
        model = self.trainer.model
        was_training = model.training
        model.train()
        try:
            yield model
        finally:
            model.train(was_training)

    def meta_gradient(self, w: State, buffers: State, data: ClientData, d: Tensor, d_out: Tensor,
                      d_hess: Tensor | None) -> tuple[Tensor, dict[str, Tensor]]:
        """(loss at w' on D', the step's meta-gradient at w):
        FO ∇f(w'; D'), HF (I − α∇²f(w; D''))∇f(w'; D')."""
        alpha = self.params.perfedavg_alpha
        x, y = data.x_train, data.y_train
        _, g_in = self.loss_and_grad(w, _copy(buffers), x[d], y[d])
        adapted = {n: w[n] - alpha * g_in[n] for n in w}
        loss, g_out = self.loss_and_grad(adapted, buffers, x[d_out], y[d_out])  # the step's BN update
        if d_hess is None:
            return loss, g_out
        h_v = self.hessian_vector(w, buffers, x[d_hess], y[d_hess], g_out)
        return loss, {n: g_out[n] - alpha * h_v[n] for n in w}

    def hessian_vector(self, w: State, buffers: State, x: Tensor, y: Tensor, v: dict[str, Tensor]) -> dict[str, Tensor]:
        """∇²f(w; (x, y)) v: the central difference with δ, or exact (δ = 0); BN statistics untouched."""
        delta = self.params.perfedavg_delta
        if delta == 0:
            leaves = {n: t.detach().requires_grad_(True) for n, t in w.items()}
            with self.train_mode() as model:
                loss = functional_cross_entropy(model, leaves, _copy(buffers), x, y)
                return {n: h.detach() for n, h in hvp(loss, leaves, v).items()}
        _, plus = self.loss_and_grad({n: w[n] + delta * v[n] for n in w}, _copy(buffers), x, y)
        _, minus = self.loss_and_grad({n: w[n] - delta * v[n] for n in w}, _copy(buffers), x, y)
        return {n: (plus[n] - minus[n]) / (2 * delta) for n in w}

    def outer_step(self, w: State, meta: dict[str, Tensor], beta: float, velocity: dict[str, Tensor]) -> State:
        """w − β·(meta-gradient), with the run's weight decay and momentum applied as the engine's SGD does."""
        cfg = self.config
        out = {}
        for n, t in w.items():
            g = meta[n].add(t, alpha=cfg.weight_decay) if cfg.weight_decay else meta[n]
            if cfg.momentum:
                g = velocity[n] = velocity[n].mul(cfg.momentum).add(g) if n in velocity else g.clone()
            out[n] = t.add(g, alpha=-beta)
        return out

    # ---------------------------------------------------------------- evaluation
    def personalized_model(self, k: int, client: ClientState, data: ClientData, rnd: int) -> State:
        """The received model after `perfedavg_adapt_steps` plain SGD steps of size α."""
        state = dict(client.state)
        alpha = self.params.perfedavg_alpha
        for idx in self.adapt_batches(k, data, rnd):
            grads = self.trainer.gradients(state, data.x_train[idx], data.y_train[idx], self.param_names)
            state = state | {n: state[n] - alpha * grads[n] for n in self.param_names}
        return state

    def adapt_batches(self, k: int, data: ClientData, rnd: int) -> list[Tensor]:
        """The adaptation steps' batches: consecutive batches of seeded orders (a new one per pass)."""
        n, size, steps = data.n_train, self.config.batch_size, self.params.perfedavg_adapt_steps
        batches: list[Tensor] = []
        passes = 0
        while len(batches) < steps and n:
            seed = derive_seed(self.config.seed, rnd, k, passes, "perfedavg_adapt")
            order = batch_order(seed, n, data.x_train.device)
            batches += [order[s:s + size] for s in range(0, n, size)]
            passes += 1
        return batches[:steps]


class PerFedAvgHF(PerFedAvgFO):
    name = "perfedavg_hf"
    display = "Per-FedAvg (HF)"
    Params = PerFedAvgHFParams
    hessian = True


def _copy(buffers: Mapping[str, Tensor]) -> State:
    return {n: t.clone() for n, t in buffers.items()}
