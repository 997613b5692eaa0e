"""LG-FedAvg — Liang et al., "Think Locally, Act Globally: Federated Learning with Local and
Global Representations", arXiv:2001.01523, 2020 (authors' code: github.com/pliang279/LG-FedAvg).

Evaluated per client: the model it holds after the broadcast (`acc_global`): its own local
representation with the averaged head, as the authors' FedRep/LG-FedAvg evaluation code tests a
client (after the server step).

The lower layers (the registry's body, the local representation) stay on the client; the top
layers (the registry's head) are global and averaged. Local training updates every parameter
jointly for `local_epochs` epochs.

Warm start: the authors start LG-FedAvg from a FedAvg model (`main_lg.py --load_fed`; their MNIST
script runs 400 FedAvg rounds, then 200 LG-FedAvg rounds). Here the first `lg_warmup_rounds`
rounds of the run are FedAvg (every parameter averaged and broadcast), within the same `rounds`
budget as every other method; left at none it is the first two thirds of the rounds, the
authors' MNIST split. 0 starts the local representations from the random initial model.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

from ..client_state import ClientState
from ..data import ClientData
from ..knobs import MethodParams, knob
from .base import Algorithm, Scored, Traffic


@dataclass(frozen=True)
class LGFedAvgParams(MethodParams):
    lg_warmup_rounds: int | None = knob(None, "first rounds run as FedAvg, the authors' warm start "
                                        "(none: two thirds of rounds, rounded down)", low=0)


class LGFedAvg(Algorithm):
    name = "lg_fedavg"
    display = "LG-FedAvg"
    Params = LGFedAvgParams
    acc_from = Scored.GLOBAL

    def __init__(self, config, trainer, model_name) -> None:
        super().__init__(config, trainer, model_name)
        given = self.params.lg_warmup_rounds
        self.warmup_rounds = config.rounds * 2 // 3 if given is None else given
        self.last_broadcast = 0  # round of the latest broadcast: it decides what a catch-up receives

    def aggregate(self, clients: Sequence[ClientState], data: Sequence[ClientData], rnd: int) -> Traffic:
        self.last_broadcast = rnd
        return super().aggregate(clients, data, rnd)

    def shared_names(self) -> list[str]:
        warm = self.last_broadcast <= self.warmup_rounds  # before round 1's broadcast: FedAvg's
        return self.param_names if warm else self.head_names

    def state_dict(self) -> dict[str, Any]:
        return super().state_dict() | {"last_broadcast": self.last_broadcast}

    def load_state_dict(self, d: dict[str, Any]) -> None:
        super().load_state_dict(d)
        self.last_broadcast = d["last_broadcast"]
