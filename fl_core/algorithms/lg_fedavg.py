"""LG-FedAvg — Liang et al., "Think Locally, Act Globally: Federated Learning with Local and
Global Representations", arXiv:2001.01523, 2020.

Evaluated per client: the model it holds after the broadcast (`acc_global`): its own local
representation with the averaged head, as the authors' FedRep/LG-FedAvg evaluation code tests a
client (after the server step).

The lower layers (the registry's body, the local representation) stay on the client; the top
layers (the registry's head) are global and averaged. Local training updates every parameter
jointly for `local_epochs` epochs.
"""
from __future__ import annotations

from .base import Algorithm


class LGFedAvg(Algorithm):
    name = "lg_fedavg"
    display = "LG-FedAvg"
    acc_from = "global"

    def shared_names(self) -> list[str]:
        return self.head_names
