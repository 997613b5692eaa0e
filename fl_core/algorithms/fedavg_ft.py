"""FedAvg+FT — FedAvg, then each client fine-tunes the global model on its own data before it is
evaluated (the fine-tuning baseline of e.g. Yu et al. 2020, "Salvaging Federated Learning by
Local Adaptation", and of the FedSelect paper).

Evaluated per client: the broadcast global model after `ft_epochs` epochs of local SGD on all
parameters. The fine-tuned copy is only evaluated; federated training continues from the
un-tuned global model.
"""
from __future__ import annotations

from ..data import ClientData
from ..training import State
from .base import Algorithm, ClientState


class FedAvgFT(Algorithm):
    name = "fedavg_ft"
    acc_from = "custom"

    def personalized_state(self, k: int, client: ClientState, data: ClientData, rnd: int) -> State:
        tuned = ClientState(state=dict(client.state))
        self.run_epochs(tuned, data, rnd, k, self.config.ft_epochs, self.full_update(), purpose="finetune")
        return tuned.state
