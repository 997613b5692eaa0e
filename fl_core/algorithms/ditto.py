"""Ditto — Li, Hu, Beirami, Smith, "Ditto: Fair and Robust Federated Learning Through
Personalization", ICML 2021 (Algorithm 1; official code github.com/litian96/ditto).

Evaluated per client: its personal model v_k (`acc_from = "custom"`, `personalized_state`).
`acc_local` is the client's copy of the global model after its local steps, `acc_global` the
broadcast FedAvg model.

Every client holds two models. The global one, w (`client.state`), is trained exactly as in
FedAvg: `local_epochs` epochs of plain local SGD from the received w^t, then averaged by the
server. The personal one, v_k (`client.extra.personal`, a full state that never leaves the
client), starts at the same initial model and is trained every round for `local_epochs` epochs on

    h_k(v; w^t) = F_k(v) + λ/2 · ||v − w^t||²,

with w^t the global model the client received at the start of the round (a copy taken before w
is trained), λ = `ditto_lambda`. λ = 0 is pure local training, λ → ∞ pulls v onto the global model.

The personal passes see the same mini-batches as the global passes (both use the batch order of
purpose "global", as FedAvg and Local do), as in the official code, where each local iteration
takes one batch and makes one personal and one global step on it. Hence with λ = 0 the personal
models equal, bit for bit, the models of the `local` algorithm, and the global part equals FedAvg.

The paper tunes λ per device on validation data from {0.1, 1, 2} (from {0.05, 0.1, 0.2} under
strong attacks) and uses a fixed λ = 1 in its clean runs; `ditto_lambda` is one global value.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..client_state import ClientState, PersonalModel
from ..data import ClientData
from ..knobs import MethodParams, Space, knob
from ..training import Proximal, State
from .base import Algorithm, LocalStats, Scored


@dataclass(frozen=True)
class DittoParams(MethodParams):
    ditto_lambda: float = knob(1.0, "weight λ of the proximal term λ/2·||v - w||² of the personal model "
                               "(1 = the paper's clean-data setting)", low=0,
                               search=Space(choices=(0.1, 1.0, 2.0), source="the paper's grid of λ, {0.1, 1, 2}"))


class Ditto(Algorithm):
    name = "ditto"
    display = "Ditto"
    Params = DittoParams
    Extras = PersonalModel
    acc_from = Scored.CUSTOM
    evaluates = "personal model"

    def init_client(self, k: int, init: State) -> ClientState:
        client = super().init_client(k, init)
        client.extra.personal = {n: t.clone() for n, t in init.items()}  # v_k^0 = w^0
        return client

    def local_update(self, k: int, client: ClientState, data: ClientData, rnd: int) -> LocalStats:
        epochs = self.config.local_epochs
        received = {n: client.state[n].clone() for n in self.param_names}  # w^t, the prox anchor
        # Global part: plain local SGD on w, exactly FedAvg's client step.
        stats = self.run_epochs(k, client, data, rnd, epochs, self.full_update())
        # Personal part: SGD on F_k(v) + λ/2 ||v - w^t||², same batches as the global passes.
        personal = ClientState(state=client.extra.personal)
        pstats = self.run_epochs(k, personal, data, rnd, epochs, self.full_update(), purpose="global",
                                 corrections=[Proximal(self.params.ditto_lambda, received)])
        client.extra.personal = personal.state
        # Reported loss: the mean cross-entropy over both kinds of pass (the prox term is not in it).
        return LocalStats(stats.loss_sum + pstats.loss_sum, stats.samples + pstats.samples)

    def personalized_model(self, k: int, client: ClientState, data: ClientData, rnd: int) -> State:
        return client.extra.personal

    def personal_fraction(self, client: ClientState) -> float:
        """The evaluated (personal) model never leaves the client; the global copy is FedAvg's."""
        return 1.0
