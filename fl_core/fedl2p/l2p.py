"""L2P: FedL2P's meta-nets learned by each client alone, without federation (Lee et al., NeurIPS
2023, the "L2P" baseline of Tables 2-4: client-wise hyperparameter optimisation with the same
compute budget as FedL2P).

Every client starts from the same initial λ and makes FedL2P's meta iterations on its own data in
every round it takes part (`fl_core/fedl2p/algorithm.py`, same knobs), keeping its own λ; nothing
is sent. Each client keeps its own λ when it scores a lower validation loss than the λ kept so far
(`keep`: paired = both scored on the same batches, as FedL2P's server compares them; participants
= against the lowest loss seen) and stops after `patience` rounds without improvement.

Evaluated per client (`acc`): the pretrained model fine-tuned for e epochs under the policy of its
own kept λ. An unseen client has learned nothing: it is scored with the initial λ.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ..client_state import ClientState
from ..data import ClientData
from ..algorithms.base import LocalStats
from .algorithm import FedL2P, FedL2PExtras


@dataclass(slots=True, eq=False)
class L2PExtras(FedL2PExtras):
    own: dict[str, torch.Tensor] | None = None   # the client's own λ, meta-learned alone
    best: dict[str, torch.Tensor] | None = None  # the λ of its lowest validation loss so far
    best_loss: torch.Tensor | None = None        # that loss (inf before any)
    stale: torch.Tensor | None = None            # updates since it last improved (early stopping)


class L2P(FedL2P):
    name = "l2p"
    display = "L2P"
    Extras = L2PExtras
    communicates = False

    def init_client(self, k, init):
        client = super().init_client(k, init)
        client.extra.own, client.extra.best = dict(self.meta_state), dict(self.meta_state)
        client.extra.best_loss, client.extra.stale = torch.tensor(float("inf"), dtype=torch.float64), torch.tensor(0)
        return client

    def start_lambda(self, client: ClientState) -> dict[str, torch.Tensor]:
        return client.extra.own

    def local_update(self, k: int, client: ClientState, data: ClientData, rnd: int) -> LocalStats:
        if int(client.extra.stale) >= self.params.patience:
            return LocalStats(torch.zeros((), device=data.x_train.device), 0)
        started = client.extra.own
        stats = super().local_update(k, client, data, rnd)
        extra = client.extra
        if extra.meta is None:  # an unseen client: nothing learned
            return stats
        loss, kept_loss = extra.val_loss, extra.kept_loss
        if self.improves(float(loss), float(kept_loss), float(extra.best_loss)):
            extra.best, extra.best_loss, extra.stale = started, loss, torch.tensor(0)
        else:
            extra.stale = extra.stale + 1
        extra.own, extra.meta, extra.val_loss, extra.kept_loss = extra.meta, None, None, None
        return stats

    def evaluated_lambda(self, client: ClientState) -> dict[str, torch.Tensor]:
        return client.extra.best if float(client.extra.best_loss) < float("inf") else client.extra.own
