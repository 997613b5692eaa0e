"""FedPer — Arivazhagan et al., "Federated Learning with Personalization Layers", arXiv:1912.00818,
2019.

Evaluated per client: the model it holds after the broadcast (`acc_global`): the averaged
base layers with its own personalization layers, as the authors' FedRep/LG-FedAvg evaluation
code tests a client (after the server step).

The base layers (the registry's body) are averaged by the server; the personalization layers
(the registry's head) never leave the client. Local training updates every parameter for
`local_epochs` epochs.
"""
from __future__ import annotations

from .base import Algorithm, Scored


class FedPer(Algorithm):
    name = "fedper"
    display = "FedPer"
    acc_from = Scored.GLOBAL

    def shared_names(self) -> list[str]:
        return self.body_names
