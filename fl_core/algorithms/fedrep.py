"""FedRep — Collins et al., "Exploiting Shared Representations for Personalized Federated
Learning", ICML 2021.

Evaluated per client: the model it holds after the broadcast (`acc_global`): the averaged
representation with its own head, as the authors' FedRep/LG-FedAvg evaluation code tests a
client (after the server step).

The representation (the registry's body) is shared and averaged; the head stays on the client.
A local update alternates once: first `head_epochs` epochs on the head with the body frozen,
then `local_epochs` epochs on the body with the (new) head frozen.

Budget: in the authors' code (github.com/lgcollins/FedRep, `--local_ep 10 --local_rep_ep 1`) a
round is at least 10 passes over the data, the last `local_rep_ep` = 1 on the body and the rest
(9) on the head. Here `head_epochs` defaults to `local_epochs`, so a FedRep round makes
2 x local_epochs passes (local_epochs on the personal part, the head, then as many on the shared
part, the body) — the same as FedSelect's LocalAlt (a personal and a global pass per epoch) and
Ditto (local_epochs on the global model and as many on the personal one); v1 of this platform
made 10 + local_epochs. Set `--head-epochs 9 --local-epochs 1` for the
authors' split.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..client_state import ClientState
from ..data import ClientData
from ..knobs import MethodParams, knob
from .base import Algorithm, LocalStats, Scored


@dataclass(frozen=True)
class FedRepParams(MethodParams):
    head_epochs: int | None = knob(None, "epochs training the head (body frozen) before the local_epochs body epochs "
                                   "(none: local_epochs)", low=0)


class FedRep(Algorithm):
    name = "fedrep"
    display = "FedRep"
    Params = FedRepParams
    acc_from = Scored.GLOBAL

    def local_update(self, k: int, client: ClientState, data: ClientData, rnd: int) -> LocalStats:
        head_epochs = self.config.local_epochs if self.params.head_epochs is None else self.params.head_epochs
        head = self.run_epochs(k, client, data, rnd, head_epochs,
                               {n: None for n in self.head_names}, purpose="head")
        body = self.run_epochs(k, client, data, rnd, self.config.local_epochs,
                               {n: None for n in self.body_names}, purpose="global")
        return LocalStats(head.loss_sum + body.loss_sum, head.samples + body.samples)

    def shared_names(self) -> list[str]:
        return self.body_names
