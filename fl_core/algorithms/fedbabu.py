"""FedBABU — Oh et al., "FedBABU: Toward Enhanced Representation for Federated Image
Classification", ICLR 2022.

Evaluated per client: a copy of its model fine-tuned on its own data for `ft_epochs` epochs
(every parameter, head included, as in the paper's personalization step). The fine-tuned copy is
only evaluated; federated training continues from the un-tuned model.

During federated training the head keeps its random initialisation: all clients start from one
init, the head is never trained (frozen in every local pass) and never sent, so it is the same on
every client and on the server. Only the body is trained and averaged.

Training against a fixed head, the body learns features of large norm (on digits with lenet
about 3x FedAvg's), so fine-tuning the head at the training lr can overshoot in its first
epoch: use a smaller lr or more `ft_epochs` than FedAvg+FT needs.
"""
from __future__ import annotations

from ..client_state import ClientState
from ..data import ClientData
from ..training import State
from .base import Algorithm, LocalStats
from .fedavg_ft import FineTuneParams


class FedBABU(Algorithm):
    name = "fedbabu"
    display = "FedBABU"
    Params = FineTuneParams
    acc_from = "custom"

    def local_update(self, k: int, client: ClientState, data: ClientData, rnd: int) -> LocalStats:
        body_only = {n: None for n in self.body_names}
        return self.run_epochs(k, client, data, rnd, self.config.local_epochs, body_only)

    def shared_names(self) -> list[str]:
        return self.body_names

    def personalized_model(self, k: int, client: ClientState, data: ClientData, rnd: int) -> State:
        tuned = ClientState(state=dict(client.state))  # train_pass returns new tensors: no aliasing
        self.run_epochs(k, tuned, data, rnd, self.params.ft_epochs, self.full_update(), purpose="finetune")
        return tuned.state
