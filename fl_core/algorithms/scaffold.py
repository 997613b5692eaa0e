"""SCAFFOLD — Karimireddy, Kale, Mohri, Reddi, Stich, Suresh, "SCAFFOLD: Stochastic Controlled
Averaging for Federated Learning", ICML 2020 (Algorithm 1, option II).

Evaluated per client: the broadcast global model (`acc_global`, as FedAvg); `acc_local` is the
client's model after its corrected local steps, before the server step.

The server keeps a control variate c and every client k its own c_k, one tensor per model
parameter, all starting at zero (c_k lives in `client.extra.scaffold_c`, None = still zero;
c in `state_dict`). Round t, participant k, starting from the global model x:
  - local steps on y (from x): every SGD step adds the correction c − c_k to the loss gradient,
        y ← y − η (g_k(y) − c_k + c),
    through the engine's `grad_shift` option of `train_pass` (added after gradient clipping,
    before weight decay and momentum);
  - option II: c_k⁺ = c_k − c + (x − y)/(a η), with η the round's learning rate and a the step
    count K (`local_epochs` × ⌈n_k / batch_size⌉, the SGD steps the client actually made);
  - sends Δy = y − x and Δc = c_k⁺ − c_k.
Server: x ← x + η_g Σ_k p_k Δy_k and c ← c + Σ_k q_k Δc_k, with p_k the run's aggregation
weights over the participants (`weighting`; uniform: the paper's mean over S) and q_k client k's
weight among all N (seen) clients (uniform: 1/N, so c ← c + (|S|/N)·mean(Δc) as in the paper; by
samples: n_k / Σ_N n, so that c stays the weighted mean of the c_k). At η_g = 1 the new x is the
average of the y_k itself, computed exactly as FedAvg does (so round 1, where c = c_k = 0, is
FedAvg bit for bit).

Momentum and weight decay (the paper analyses plain SGD). The correction enters the gradient
before both, so a momentum step accumulates corrected gradients and weight decay adds λy to
them; c_k⁺ then estimates the mean gradient of the regularised local objective, the one the
optimiser descends. With momentum ρ the displacement x − y of a gradient held constant over the
steps is η·a·g with a the ℓ1 norm of the step weights (FedNova's `momentum_steps_weight`): per
epoch a(τ) when the buffer restarts with every pass (`momentum_scope` = epoch), a(K) when it runs
through the round; a = K at ρ = 0. Option II divides by a η instead of K η so that its estimate
stays unbiased under momentum; without momentum it is exactly the paper's formula.

Communication per participant and direction: twice FedAvg's, model-sized each way (up: Δy and
Δc; down: x and c); a client that missed broadcasts downloads both too (`sent_bytes`). Buffers
(BatchNorm statistics) stay on the clients and have no control variate, as in FedAvg here.

Knob: `scaffold_global_lr` η_g (the paper's experiments use η_g = 1). Left out of the paper:
option I (control variates from an extra full-gradient pass at x) and its client sampling
details beyond the run's `participation`.
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from ..client_state import ClientExtras, ClientState
from ..data import ClientData
from ..knobs import MethodParams, knob
from ..masks import masked_average
from ..training import ShiftGradient, State
from .base import Algorithm, BYTES_PER_ENTRY, ClientInfo, LocalStats, Scored, Traffic
from .fednova import local_steps_weight



@dataclass(slots=True, eq=False)
class SCAFFOLDExtras(ClientExtras):
    scaffold_c: State | None = None        # c_k (name -> tensor); None while still zero
    scaffold_delta_c: State | None = None  # Δc_k of this round, sent up and dropped by `aggregate`


@dataclass(frozen=True)
class SCAFFOLDParams(MethodParams):
    scaffold_global_lr: float = knob(1.0, "server learning rate η_g: x ← x + η_g · mean(Δy) (paper: 1)",
                                     low=0, low_open=True)


class SCAFFOLD(Algorithm):
    name = "scaffold"
    display = "SCAFFOLD"
    Params = SCAFFOLDParams
    Extras = SCAFFOLDExtras
    acc_from = Scored.GLOBAL
    default_bn_stats = "global"  # one global model, as FedAvg

    def setup(self, init: State, clients: Sequence[ClientInfo]) -> list[ClientState]:
        self.control = {n: torch.zeros_like(init[n]) for n in self.param_names}  # c
        return super().setup(init, clients)

    def step_weight(self, n_train: int) -> tuple[int, float]:
        """(K, a): the SGD steps of one local update on `n_train` samples and the ℓ1 norm of
        their step weights under the run's momentum (a = K without momentum)."""
        cfg = self.config
        return local_steps_weight(cfg.local_epochs, math.ceil(n_train / cfg.batch_size), cfg.momentum,
                                  cfg.momentum_scope)

    def local_update(self, k: int, client: ClientState, data: ClientData, rnd: int) -> LocalStats:
        c, ck = self.control, client.extra.scaffold_c
        shift = c if ck is None else {n: c[n] - ck[n] for n in self.param_names}
        x = {n: client.state[n] for n in self.param_names}  # passes return new tensors: x stays as received
        stats = self.run_epochs(k, client, data, rnd, self.config.local_epochs, self.full_update(),
                                corrections=[ShiftGradient(shift)])
        steps, a = self.step_weight(data.x_train.shape[0])
        if a > 0:
            scale = 1.0 / (a * self.lr(rnd))
            new = {n: (x[n] - client.state[n]).mul_(scale).sub_(c[n]) for n in self.param_names}
            if ck is not None:
                for n in self.param_names:
                    new[n].add_(ck[n])
            client.extra.scaffold_delta_c = new if ck is None else {n: new[n] - ck[n] for n in self.param_names}
            client.extra.scaffold_c = new
        else:  # no training data: no step, nothing learnt about the client's gradient
            client.extra.scaffold_delta_c = {n: torch.zeros_like(c[n]) for n in self.param_names}
        stats.metrics = {"local_steps": float(steps)}
        return stats

    def aggregate(self, clients: Sequence[ClientState], data: Sequence[ClientData], rnd: int) -> Traffic:
        names, x = self.param_names, self.global_state
        mean = masked_average(x, [c.state for c in clients], [self.contribution(c) for c in clients],
                              self.aggregation_weights(data), names)
        eta_g = self.params.scaffold_global_lr
        x.update(mean if eta_g == 1.0 else {n: x[n] + eta_g * (mean[n] - x[n]) for n in names})
        seen = [info for info in self.clients_info if info.seen]
        total = sum(info.n_train for info in seen)
        for client, d in zip(clients, data):
            q = d.n_train / total if self.config.weighting == "samples" else 1.0 / len(seen)
            delta, client.extra.scaffold_delta_c = client.extra.scaffold_delta_c, None
            for n in names:
                self.control[n].add_(delta[n], alpha=q)
        sent = [self.sent_bytes(c) for c in clients]
        for client in clients:
            self.receive(client)
        return Traffic(up=sent, down=list(sent))

    def sent_bytes(self, client: ClientState) -> int:
        """The model and a control variate, each model-sized: 2× FedAvg's, in either direction."""
        return 2 * self.sent_entries(client) * BYTES_PER_ENTRY

    def state_dict(self) -> dict:
        return super().state_dict() | {"control": self.control}

    def load_state_dict(self, d: dict) -> None:
        super().load_state_dict(d)
        self.control = d["control"]
