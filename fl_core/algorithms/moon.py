"""MOON — Li, He, Song, "Model-Contrastive Federated Learning", CVPR 2021 (official code:
github.com/QinbinLi/MOON).

Evaluated per client: the broadcast global model (`acc_global`, as FedAvg and as the paper
reports); `acc_local` is the client's model after its local training.

A round is FedAvg's, except for the local loss. Client k, starting from the received global
model w^t, descends at every SGD step

    ℓ = CE(w; x, y) + μ · ℓ_con,
    ℓ_con = −log( e^{sim(z, z_glob)/τ} / (e^{sim(z, z_glob)/τ} + e^{sim(z, z_prev)/τ}) ),

averaged over the mini-batch, with sim the cosine similarity and z, z_glob, z_prev the
representations of the batch under the model being trained, under w^t, and under the client's
own model at the end of its previous round (`client.extra.moon_prev`, a full state kept on
the client). The term pulls the local representation towards the global model's and pushes it
away from the previous local one. z_glob and z_prev are computed without gradient, with
`torch.func.functional_call` on the shared module (the trainer is not re-entrant), in eval mode
as in the authors' code (BatchNorm running statistics, no dropout); z in train mode. With μ = 0
the loss is plain cross-entropy and the method is FedAvg bit for bit.

Knobs and paper defaults: `moon_mu` μ = 1 (the paper's best for CIFAR-100 and Tiny-ImageNet;
it found μ = 5 best for CIFAR-10) and `moon_tau` τ = 0.5.

Departures from the paper:
  - Representation: the input of the model's classifier head (`models.head_module`), i.e. the
    penultimate features of our models; the paper adds a two-layer projection head (output
    dimension 256) between the base encoder and the classifier and contrasts its output. Adding
    one would change the network every other method runs and its traffic, so we do without.
  - Round 1: no previous local model exists yet. We take the model the client starts from (the
    global model), so z_prev = z_glob: ℓ_con = log 2 exactly and its gradient is zero, i.e. round
    1 trains as FedAvg (the authors' code has no negative in its first round, a constant-zero
    term: the same training). A client that skipped rounds contrasts with its model of the last
    round it took part in.
Traffic: as FedAvg's (the model up, the model down); the previous model never leaves the
client. The reported training loss includes μ·ℓ_con.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn
from torch.func import functional_call
from torch.nn import functional as F

from ..client_state import ClientExtras, ClientState
from ..data import ClientData
from ..knobs import MethodParams, knob
from ..models import FeatureTap, head_module
from ..training import LossFn, State
from .base import Algorithm, LocalStats, Scored



@dataclass(frozen=True)
class MOONParams(MethodParams):
    moon_mu: float = knob(1.0, "weight μ of the model-contrastive loss (paper: 1 for CIFAR-100 / Tiny-ImageNet, "
                          "5 for CIFAR-10; 0: FedAvg exactly)", low=0)
    moon_tau: float = knob(0.5, "temperature τ of the model-contrastive loss (paper: 0.5)", low=0, low_open=True)


def model_contrastive_loss(z: Tensor, z_glob: Tensor, z_prev: Tensor, tau: float) -> Tensor:
    """The batch mean of −log(e^{s_g/τ} / (e^{s_g/τ} + e^{s_p/τ})), s_g = cos(z, z_glob) and
    s_p = cos(z, z_prev) per row (B × d features)."""
    logits = torch.stack([F.cosine_similarity(z, z_glob, dim=1), F.cosine_similarity(z, z_prev, dim=1)], dim=1) / tau
    return (torch.logsumexp(logits, dim=1) - logits[:, 0]).mean()


@dataclass(slots=True, eq=False)
class MOONExtras(ClientExtras):
    moon_prev: State | None = None  # its model at the end of its last local update


class MOON(Algorithm):
    name = "moon"
    display = "MOON"
    Params = MOONParams
    Extras = MOONExtras
    acc_from = Scored.GLOBAL
    default_bn_stats = "global"  # one global model, as FedAvg

    def __init__(self, config, trainer, model_name) -> None:
        super().__init__(config, trainer, model_name)
        self.head = head_module(trainer.model, model_name)
        self.modules = list(trainer.model.modules())

    def objective(self, glob: State, prev: State) -> LossFn:
        """The local loss CE + μ·ℓ_con against the states `glob` (w^t) and `prev` (the previous
        local model; `prev is glob` computes their one representation once)."""
        mu, tau, head, modules = self.params.moon_mu, self.params.moon_tau, self.head, self.modules

        def loss_fn(model: nn.Module, x: Tensor, y: Tensor) -> Tensor:
            with FeatureTap(head) as tap:
                logits = model(x)
                modes = [m.training for m in modules]
                with torch.no_grad():
                    for m in modules:  # eval mode for the reference models (flag writes, as the trainer's)
                        m.training = False
                    try:
                        functional_call(model, glob, (x,))
                        if prev is not glob:
                            functional_call(model, prev, (x,))
                    finally:
                        for m, mode in zip(modules, modes):
                            m.training = mode
            seen = tap.features
            z, z_glob = seen[0], seen[1]
            z_prev = z_glob if prev is glob else seen[2]
            return F.cross_entropy(logits, y) + mu * model_contrastive_loss(z, z_glob, z_prev, tau)

        return loss_fn

    def local_update(self, k: int, client: ClientState, data: ClientData, rnd: int) -> LocalStats:
        # The received model with the client's buffers: passes return new tensors, never modify these.
        received = dict(client.state)
        if self.params.moon_mu == 0:
            stats = super().local_update(k, client, data, rnd)
        else:
            prev = received if client.extra.moon_prev is None else client.extra.moon_prev
            stats = self.run_epochs(k, client, data, rnd, self.config.local_epochs, self.full_update(),
                                    loss_fn=self.objective(received, prev))
        # The trained state's tensors are replaced, not modified, by the broadcast: keep them as they are.
        client.extra.moon_prev = dict(client.state)
        return stats
