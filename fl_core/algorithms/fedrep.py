"""FedRep — Collins et al., "Exploiting Shared Representations for Personalized Federated
Learning", ICML 2021.

Evaluated per client: the model it holds after the broadcast (`acc_global`): the averaged
representation with its own head, as the authors' FedRep/LG-FedAvg evaluation code tests a
client (after the server step).

The representation (the registry's body) is shared and averaged; the head stays on the client.
A local update alternates once: first `head_epochs` epochs on the head with the body frozen,
then `local_epochs` epochs on the body with the (new) head frozen.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..client_state import ClientState
from ..data import ClientData
from ..knobs import MethodParams, knob
from .base import Algorithm, LocalStats


@dataclass(frozen=True)
class FedRepParams(MethodParams):
    head_epochs: int = knob(10, "epochs training the head (body frozen) before the body epochs", low=0)


class FedRep(Algorithm):
    name = "fedrep"
    display = "FedRep"
    Params = FedRepParams
    acc_from = "global"

    def local_update(self, k: int, client: ClientState, data: ClientData, rnd: int) -> LocalStats:
        head = self.run_epochs(k, client, data, rnd, self.params.head_epochs,
                               {n: None for n in self.head_names}, purpose="head")
        body = self.run_epochs(k, client, data, rnd, self.config.local_epochs,
                               {n: None for n in self.body_names}, purpose="global")
        return LocalStats(head.loss_sum + body.loss_sum, head.samples + body.samples)

    def shared_names(self) -> list[str]:
        return self.body_names
