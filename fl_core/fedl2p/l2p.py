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

import torch

from ..client_state import ClientState
from ..data import ClientData
from ..algorithms.base import LocalStats
from .algorithm import FedL2P


class L2P(FedL2P):
    name = "l2p"
    display = "L2P"
    communicates = False

    def init_client(self, k, init):
        client = super().init_client(k, init)
        client.extra |= {"own": dict(self.meta_state), "best": dict(self.meta_state),
                         "best_loss": torch.tensor(float("inf"), dtype=torch.float64), "stale": torch.tensor(0)}
        return client

    def start_lambda(self, client: ClientState) -> dict[str, torch.Tensor]:
        return client.extra["own"]

    def local_update(self, k: int, client: ClientState, data: ClientData, rnd: int) -> LocalStats:
        if int(client.extra["stale"]) >= self.params.patience:
            return LocalStats(torch.zeros((), device=data.x_train.device), 0)
        started = client.extra["own"]
        stats = super().local_update(k, client, data, rnd)
        if "meta" not in client.extra:  # an unseen client: nothing learned
            return stats
        loss, kept_loss = client.extra.pop("val_loss"), client.extra.pop("kept_loss")
        if self.improves(float(loss), float(kept_loss), float(client.extra["best_loss"])):
            client.extra |= {"best": started, "best_loss": loss, "stale": torch.tensor(0)}
        else:
            client.extra["stale"] = client.extra["stale"] + 1
        client.extra["own"] = client.extra.pop("meta")
        return stats

    def evaluated_lambda(self, client: ClientState) -> dict[str, torch.Tensor]:
        return client.extra["best"] if float(client.extra["best_loss"]) < float("inf") else client.extra["own"]
