"""APFL — Deng, Kamani, Mahdavi, "Adaptive Personalized Federated Learning", arXiv:2003.13461,
2020 (Algorithm 1; authors' code in github.com/MLOPTPSU/FedTorch).

Evaluated per client: its mixed model v̄ = α v + (1 − α) w (`acc_from = "custom"`), with v its
personal model, α its mixing weight and w the model it holds at evaluation time (the broadcast
global model; a client that missed broadcasts catches up first); the BatchNorm statistics are
the personal ones (those of v̄'s training forwards). `acc_local` is the client's copy of the
global model after its local steps, `acc_global` the broadcast FedAvg model.

Every client holds the shared model w (`client.state`) and a personal model v
(`client.extra.personal`, a full state started at the initial model, never sent) with its
own α (`client.extra.alpha`, started at `apfl_alpha`, never sent). On every mini-batch ξ of
the local update (`local_epochs` passes, the batch order of every method's "global" pass), from
the values before the step:
    w ← w − η ∇f(w; ξ)                                   (plain SGD: FedAvg's client step)
    v ← v − η α ∇f(v̄; ξ),   v̄ = α v + (1 − α) w          (∇_v f(v̄) = α ∇f(v̄))
    α ← clip(α − η_α ⟨v − w, ∇f(v̄; ξ)⟩, 0, 1)            (only with `apfl_adaptive`)
η is the round's learning rate, η_α = `apfl_alpha_lr` (none: η, as in the paper). The server
averages w exactly as FedAvg (`weighting`, participants only) and broadcasts it.

How it runs on the engine: w's steps are the engine's own pass (`run_epochs`, cross-entropy,
the run's momentum and weight decay), so w, every broadcast and `acc_local`/`acc_global` are
FedAvg's bit for bit. v's (and α's) step is the pass's batch step (`personal_step`, a
`training.BatchStep`): on each batch, before w's step, with the w the pass holds then, v̄ runs
through `functional_cross_entropy` (a `functional_call`) with v's BatchNorm buffers, ∇f(v̄)
comes from `autograd.grad`, and v moves by an in-place SGD update (with the run's weight
decay). Hence α = 0 (fixed) gives v̄ = w: the evaluated model is FedAvg's, and α = 1 gives
v̄ = v trained by plain local SGD: the `local` algorithm's model.

Sent per client each round: w up, the global model down (FedAvg's traffic); v and α stay.

Knobs: `apfl_alpha` 0.25 (the paper reports fixed α ∈ {0.25, 0.5, 0.75} and an adaptive α),
`apfl_adaptive` false (true: the adaptive variant), `apfl_alpha_lr` none (the paper's step η).

Departures: the authors' code mixes the two models' outputs (α·logits_v + (1 − α)·logits_w)
where the paper, and this file, mix parameters; it updates α once per round (on the first
batch) with an extra 0.02·α term, where the paper and this file update α on every batch with
the plain gradient; and it steps w before computing v̄ (the paper, and this file, use the
values before the step). v's steps take no momentum (the run's momentum acts on w only).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn

from ..client_state import ClientState, PersonalModel
from ..data import ClientData
from ..functional import functional_cross_entropy
from ..knobs import MethodParams, Space, knob
from ..training import State
from .base import Algorithm, LocalStats, Scored


@dataclass(frozen=True)
class APFLParams(MethodParams):
    apfl_alpha: float = knob(0.25, "mixing weight α of the personal model in v̄ = α·v + (1-α)·w (fixed, or the "
                             "start of the adaptive α)", low=0, high=1,
                             search=Space(choices=(0.25, 0.5, 0.75), source="the paper's fixed α, {0.25, 0.5, 0.75}"))
    apfl_adaptive: bool = knob(False, "learn each client's α by gradient descent on its loss (clipped to [0, 1])")
    apfl_alpha_lr: float | None = knob(None, "step size of the adaptive α (none: the round's learning rate, as the "
                                       "paper)", low=0, low_open=True)


@dataclass(slots=True, eq=False)
class APFLExtras(PersonalModel):
    alpha: torch.Tensor | None = None  # the client's own mixing weight α (0-dim), never sent


class APFL(Algorithm):
    name = "apfl"
    display = "APFL"
    Params = APFLParams
    Extras = APFLExtras
    acc_from = Scored.CUSTOM
    evaluates = "mixed model α·v + (1-α)·w (personal v, broadcast w)"

    def init_client(self, k: int, init: State) -> ClientState:
        client = super().init_client(k, init)
        client.extra.personal = {n: t.clone() for n, t in init.items()}  # v^0 = w^0
        device = next(iter(init.values())).device
        client.extra.alpha = torch.tensor(self.params.apfl_alpha, dtype=torch.float32, device=device)
        return client

    def local_update(self, k: int, client: ClientState, data: ClientData, rnd: int) -> LocalStats:
        lr, weight_decay = self.lr(rnd), self.config.weight_decay
        adaptive = self.params.apfl_adaptive
        alpha_lr = lr if self.params.apfl_alpha_lr is None else self.params.apfl_alpha_lr
        names = self.param_names
        personal = client.extra.personal
        v = {n: personal[n].clone() for n in names}  # stepped in place below
        v_list = [v[n] for n in names]
        buffers = {n: t.clone() for n, t in personal.items() if n not in self.trainer.params}  # v̄'s BN statistics
        alpha = client.extra.alpha.clone()
        mixed_loss = torch.zeros((), device=data.x_train.device)

        def personal_step(model: nn.Module, x: Tensor, y: Tensor) -> None:
            """v's SGD step on the batch (and α's, adaptive), at w before this batch's step."""
            nonlocal alpha, mixed_loss
            w = {n: p.detach() for n, p in model.named_parameters()}  # before this batch's step
            mixed = {n: (alpha * v[n] + (1 - alpha) * w[n]).requires_grad_(True) for n in names}
            loss = functional_cross_entropy(model, mixed, buffers, x, y)  # v's BN buffers, updated in place
            grads = torch.autograd.grad(loss, [mixed[n] for n in names])
            with torch.no_grad():
                mixed_loss += loss.detach() * x.shape[0]
                if adaptive:
                    slope = sum(((v[n] - w[n]) * g).sum() for n, g in zip(names, grads))
                    new_alpha = (alpha - alpha_lr * slope).clamp(0.0, 1.0)
                step = [g * alpha for g in grads]
                if weight_decay:
                    torch._foreach_add_(step, v_list, alpha=weight_decay)
                torch._foreach_add_(v_list, step, alpha=-lr)
                if adaptive:
                    alpha = new_alpha

        # w's own steps are FedAvg's (the pass's plain loss); v's come first on each batch
        stats = self.run_epochs(k, client, data, rnd, self.config.local_epochs, self.full_update(),
                                batch_steps=[personal_step])
        client.extra.personal = v | buffers
        client.extra.alpha = alpha
        # `loss` stays w's (FedAvg's); the mixed model's training loss and α are the method's metrics.
        stats.metrics = {"mixing_alpha": float(alpha),
                         "loss_mixed": float(mixed_loss) / stats.samples if stats.samples else float("nan")}
        return stats

    def personalized_model(self, k: int, client: ClientState, data: ClientData, rnd: int) -> State:
        alpha, v = client.extra.alpha, client.extra.personal
        return {n: alpha * v[n] + (1 - alpha) * client.state[n] if n in self.trainer.params else v[n]
                for n in client.state}

    def evaluation_metrics(self, k: int, client: ClientState, data: ClientData) -> dict[str, float]:
        return {"mixing_alpha": float(client.extra.alpha)}

    def personal_fraction(self, client: ClientState) -> float:
        """The personal model v (and α) never leave the client; w is FedAvg's traffic."""
        return 1.0
