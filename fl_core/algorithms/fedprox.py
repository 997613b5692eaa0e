"""FedProx — Li, Sahu, Zaheer, Sanjabi, Talwalkar, Smith, "Federated Optimization in
Heterogeneous Networks", MLSys 2020 (a baseline of PerFedMask's poster, compared after fine-tuning).

Evaluated per client: the broadcast global model (`acc_global`, as FedAvg). `acc` is that same
model by default (`ft_epochs` 0); a study that sets `ft_epochs` (PerFedMask's personalisation: 5
epochs, `ft_momentum` 0.9) gets `acc` after fine-tuning a copy on the client's data, with
`acc_global` the accuracy before it. The fine-tuned copy is only evaluated.

A round is FedAvg's, except that every local SGD step descends the proximal objective

    h_k(w; w^t) = F_k(w) + μ/2 · ||w − w^t||²,

w^t being the model the client received at the start of the round (μ = `mu`). The term pulls the
local model back towards w^t, limiting client drift under heterogeneous data. Its gradient
μ(w − w^t) is added to the loss gradient before momentum and weight decay act, as a term of the
loss would be. With μ = 0 the term is skipped altogether, so the method is FedAvg bit for bit.

Systems heterogeneity: the paper lets devices run fewer local epochs ("γ-inexact" solutions)
instead of dropping them; here that is `weak_epochs`, the PerFedMask authors' rule (a device below
full width runs ⌈E·f⌉ epochs, fl_core/devices.py); unset, every client runs `local_epochs`.
The paper samples devices with probability ∝ n_k and averages uniformly; here the run's
`participation` and `weighting` apply, as for every method.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..client_state import ClientState
from ..data import ClientData
from ..knobs import Space, knob
from ..training import Proximal
from .base import LocalStats
from .fedavg_ft import FineTuneProtocol, FineTuning, LimitedFineTuneParams


@dataclass(frozen=True)
class FedProxParams(LimitedFineTuneParams):
    mu: float = knob(0.01, "weight μ of the proximal term μ/2·||w - w_global||² in every local step "
                     "(0: FedAvg exactly)", low=0,
                     search=Space(choices=(0.001, 0.01, 0.1, 1.0), source="the paper's candidate set of μ, "
                                  "{0.001, 0.01, 0.1, 1}"))


class FedProx(FineTuning):
    name = "fedprox"
    display = "FedProx"
    Params = FedProxParams
    protocol = FineTuneProtocol(epochs=0)  # acc = the broadcast model unless a study sets ft_epochs
    evaluates = "the broadcast model, fine-tuned when ft_epochs > 0 (acc_global: before fine-tuning)"
    default_bn_stats = "global"  # one global model, as FedAvg

    def local_update(self, k: int, client: ClientState, data: ClientData, rnd: int) -> LocalStats:
        mu = self.params.mu
        if mu == 0:
            return super().local_update(k, client, data, rnd)
        # w^t: the received tensors themselves (a pass returns new tensors and never writes these).
        anchor = {n: client.state[n] for n in self.param_names}
        return self.limited_update(k, client, data, rnd, self.full_update(), corrections=[Proximal(mu, anchor)])
