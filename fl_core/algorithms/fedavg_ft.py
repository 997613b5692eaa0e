"""FedAvg+FT — FedAvg, then each client fine-tunes the global model on its own data before it is
evaluated (the fine-tuning baseline of e.g. Yu et al. 2020, "Salvaging Federated Learning by
Local Adaptation", and of the FedSelect paper).

Evaluated per client: the broadcast global model after `ft_epochs` epochs of local SGD on all
parameters. The fine-tuned copy is only evaluated; federated training continues from the
un-tuned global model.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..client_state import ClientState
from ..data import ClientData
from ..knobs import MethodParams, knob
from ..training import State
from .base import Algorithm


@dataclass(frozen=True)
class FineTuneParams(MethodParams):
    ft_epochs: int = knob(1, "fine-tuning epochs before each evaluation", low=0)


class FedAvgFT(Algorithm):
    name = "fedavg_ft"
    display = "FedAvg+FT"
    Params = FineTuneParams
    acc_from = "custom"

    def personalized_model(self, k: int, client: ClientState, data: ClientData, rnd: int) -> State:
        tuned = ClientState(state=dict(client.state))
        self.run_epochs(k, tuned, data, rnd, self.params.ft_epochs, self.full_update(), purpose="finetune")
        return tuned.state
