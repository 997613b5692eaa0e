"""FedBABU — Oh et al., "FedBABU: Toward Enhanced Representation for Federated Image
Classification", ICLR 2022 (authors' code: github.com/jhoon-oh/FedBABU).

Evaluated per client: a copy of its model fine-tuned on its own data (every parameter, head
included, as in the paper's personalization step) (`acc`); the same model before fine-tuning is
`acc_global`. The fine-tuned copy is only evaluated; federated training continues from the
un-tuned model.

During federated training the head keeps its random initialisation: all clients start from one
init, the head is never trained (frozen in every local pass) and never sent, so it is the same on
every client and on the server. Only the body is trained and averaged.

Fine-tuning protocol by default, from the authors' personalization code (`analysis.ipynb`:
`personalization_epoch = 5`, SGD at lr 1e-3 with momentum 0.9 on body and head): 5 epochs, or
`local_epochs` if more (a fine-tuning budget is never below a round's local update), lr 0.001,
momentum 0.9 (the momentum buffer restarts each epoch here; one optimizer spans the 5 epochs
there). At the training lr (0.1, no momentum) fine-tuning the fixed random head overshoots:
digits, 5 local epochs, 2 shards / Dir(0.1): 0.634 / 0.593, against 0.976 / 0.967 with the
authors' protocol and 0.834 / 0.905 without fine-tuning (issue 14's audit).

In PerFedMask's comparison the devices' limits apply (`weak_epochs`, fl_core/devices.py): a
device below full width runs ⌈E·f⌉ of the E local epochs, as the PerFedMask authors run FedBABU.
"""
from __future__ import annotations

from ..client_state import ClientState
from ..data import ClientData
from ..training import UpdateSpec
from .base import LocalStats
from .fedavg_ft import FineTuneProtocol, FineTuning, LimitedFineTuneParams


class FedBABU(FineTuning):
    name = "fedbabu"
    display = "FedBABU"
    Params = LimitedFineTuneParams
    protocol = FineTuneProtocol(min_epochs=5, lr=1e-3, momentum=0.9)
    default_bn_stats = "global"  # one global body trained as FedAvg, statistics included, then fine-tuned

    def local_update(self, k: int, client: ClientState, data: ClientData, rnd: int) -> LocalStats:
        return self.limited_update(k, client, data, rnd, self.trained_entries(k))

    def trained_entries(self, k: int) -> UpdateSpec:
        return {n: None for n in self.body_names}  # the head stays at its initialisation

    def shared_names(self) -> list[str]:
        return self.body_names
