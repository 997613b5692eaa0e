"""FedNova — Wang, Liu, Liang, Joshi, Poor, "Tackling the Objective Inconsistency Problem in
Heterogeneous Federated Optimization", NeurIPS 2020 (a baseline of PerFedMask's poster, compared
after fine-tuning).

Evaluated per client: the broadcast global model (`acc_global`, as FedAvg). `acc` is that same
model by default (`ft_epochs` 0); a study that sets `ft_epochs` (PerFedMask's personalisation: 5
epochs, `ft_momentum` 0.9) gets `acc` after fine-tuning a copy on the client's data, with
`acc_global` the accuracy before it. The fine-tuned copy is only evaluated.

Clients that make different numbers of local steps pull FedAvg's average towards the optimum of
the busier clients' objectives. FedNova averages *normalised* updates instead. Client i starts
from the global model x, runs τ_i local SGD steps to x_i and reports a_i, the ℓ1 norm of its
vector of step weights; the server computes

    d_i = (x − x_i) / a_i,    τ_eff = Σ_i p_i a_i,    x ← x − τ_eff · Σ_i p_i d_i,

p_i being the participants' aggregation weights (`weighting`: uniform or by sample count; they
sum to 1). The learning rate is inside x − x_i and cancels nowhere: every client uses the round's.

The step weights a_i, for this engine's optimiser. A local epoch makes τ = ⌈n_i / batch_size⌉
steps of v ← ρ v + g, w ← w − lr·v with v = 0 at the start of each epoch (the engine restarts the
momentum buffer with every pass). Unrolled, the gradient of step s enters v_t with weight ρ^(t−s)
for t ≥ s, so it moves w by lr · Σ_{t=s..τ} ρ^(t−s) = lr · (1 − ρ^(τ−s+1)) / (1 − ρ). Summing over
s = 1..τ gives

    a(τ) = Σ_{j=1..τ} (1 − ρ^j)/(1 − ρ) = [τ − ρ(1 − ρ^τ)/(1 − ρ)] / (1 − ρ),   a(τ) = τ at ρ = 0,

which is the paper's ||a_i||_1 for local momentum SGD (Section 5 and its appendix on momentum:
a_i = [τ_i − ρ(1 − ρ^τ_i)/(1 − ρ)]/(1 − ρ)), and for plain SGD a_i = τ_i. As the buffer
restarts every epoch, a client's a_i is the sum of a(τ) over its epochs; its τ_i the sum of τ.
Under `momentum_scope = "round"` one buffer spans the round: a_i = a(τ_i).
(On a loss with a constant gradient g, an epoch moves w by exactly lr·a(τ)·g: the tests check it.)

With equal τ_i on every client (equal sizes, equal epochs), a_i = a for all i and the update is
x − Σ p_i (x − x_i) = Σ p_i x_i, FedAvg's average (up to float rounding).

`local_epochs_min` gives the paper's heterogeneous-work setting: each participant draws its
number of epochs uniformly from {local_epochs_min, ..., local_epochs} every round, seeded by
(seed, round, client). `weak_epochs` gives PerFedMask's: a device below full width runs ⌈E·f⌉
epochs (fl_core/devices.py). Unset, every client runs `local_epochs` and only unequal data sizes
make τ_i differ. Per client, the Parquet rows carry `local_steps` (τ_i) and `nova_a` (a_i).

`nova_form = "lr"` applies the normalisation as the PerFedMask authors' code does
(github.com/MehdiSet/PerFedMask, `fed_dataHetComp.py`, read at 2ecd165): before training, client i's
learning rate is scaled by τ_eff / a_i, with τ_eff = Σ_k p_k a_k over every client (not only the
round's participants), and the server takes the plain weighted average of the participants'
models. To first order in the learning rate the two forms move the model alike; they differ
beyond it, and in which clients τ_eff sums over.

Left out of the paper: its variants with server momentum and with FedProx's proximal term
(FedNova's general form takes any local solver; here it is the engine's SGD). BatchNorm running
statistics are averaged by the server as FedAvg's (`bn_stats`, global by default).
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from ..client_state import ClientExtras, ClientState
from ..config import RunConfig
from ..data import ClientData
from ..knobs import ConfigError, knob
from ..training import LocalTrainer, derive_seed
from .base import LocalStats, Traffic
from .fedavg_ft import FineTuneProtocol, FineTuning, LimitedFineTuneParams


NOVA_FORMS = ("server", "lr")


def momentum_steps_weight(steps: int, momentum: float) -> float:
    """a(τ): the ℓ1 norm of the step weights of one pass of `steps` momentum-SGD steps whose buffer
    starts at zero (see the module docstring); `steps` at momentum 0."""
    if momentum == 0:
        return float(steps)
    rho = momentum
    return (steps - rho * (1 - rho ** steps) / (1 - rho)) / (1 - rho)


def local_steps_weight(epochs: int, per_epoch: int, momentum: float, scope: str) -> tuple[int, float]:
    """(τ, a): the SGD steps of `epochs` passes of `per_epoch` steps and the ℓ1 norm of their step
    weights; the momentum buffer restarts every pass, or spans them all under scope "round"."""
    steps = epochs * per_epoch
    if scope == "round":
        return steps, momentum_steps_weight(steps, momentum)
    return steps, epochs * momentum_steps_weight(per_epoch, momentum)


@dataclass(frozen=True)
class FedNovaParams(LimitedFineTuneParams):
    local_epochs_min: int | None = knob(None, "heterogeneous local work: each client draws its epochs per round "
                                        "uniformly from [local_epochs_min, local_epochs] (none: every client runs "
                                        "local_epochs)", low=1)
    nova_form: str = knob("server", "where the normalisation acts: server = the paper's normalised average of the "
                          "updates; lr = the PerFedMask authors' code, client i's lr times τ_eff/a_i, then a plain "
                          "average", choices=NOVA_FORMS, added=True)

    def validate(self) -> None:
        super().validate()
        if self.local_epochs_min is not None and self.weak_epochs is not None:
            raise ConfigError(f"local_epochs_min={self.local_epochs_min} and weak_epochs={self.weak_epochs} are two "
                              f"sources of unequal local work; set one of them")


@dataclass(slots=True, eq=False)
class FedNovaExtras(ClientExtras):
    nova_a: float | None = None  # ||a_i||_1 of this round's update, read (and dropped) by `aggregate`


class FedNova(FineTuning):
    name = "fednova"
    display = "FedNova"
    Params = FedNovaParams
    Extras = FedNovaExtras
    protocol = FineTuneProtocol(epochs=0)  # acc = the broadcast model unless a study sets ft_epochs
    evaluates = "the broadcast model, fine-tuned when ft_epochs > 0 (acc_global: before fine-tuning)"
    default_bn_stats = "global"  # one global model, as FedAvg

    def __init__(self, config: RunConfig, trainer: LocalTrainer, model_name: str) -> None:
        super().__init__(config, trainer, model_name)
        low = self.params.local_epochs_min
        if low is not None and low > config.local_epochs:  # the knob cannot see local_epochs itself
            raise ConfigError(f"local_epochs_min={low} is more than local_epochs={config.local_epochs}; "
                              f"the epochs are drawn from [local_epochs_min, local_epochs]")

    def epochs_of(self, k: int, rnd: int) -> int:
        """Client k's local epochs in round `rnd`."""
        low, high = self.params.local_epochs_min, self.config.local_epochs
        if low is None or low == high:
            return super().epochs_of(k, rnd)
        rng = np.random.default_rng(derive_seed(self.config.seed, rnd, k, "fednova_epochs"))
        return int(rng.integers(low, high + 1))

    def steps_weight(self, k: int, n_train: int, rnd: int) -> tuple[int, float]:
        """(τ_k, a_k) of client k's local update in round `rnd`."""
        per_epoch = math.ceil(n_train / self.config.batch_size)  # the steps of one pass
        return local_steps_weight(self.epochs_of(k, rnd), per_epoch, self.config.momentum, self.config.momentum_scope)

    def lr_scale(self, k: int, a: float, rnd: int) -> float:
        """`nova_form = "lr"`: τ_eff / a_k, τ_eff summed over every client that trains."""
        seen = [info for info in self.clients_info if info.seen]
        weights = self.aggregation_weights(seen)
        tau_eff = sum(p * self.steps_weight(info.k, info.n_train, rnd)[1] for p, info in zip(weights, seen))
        return tau_eff / a

    def local_update(self, k: int, client: ClientState, data: ClientData, rnd: int) -> LocalStats:
        steps, a = self.steps_weight(k, data.x_train.shape[0], rnd)
        options = {}
        if self.params.nova_form == "lr" and a > 0:
            options["lr"] = self.lr(rnd) * self.lr_scale(k, a, rnd)
        stats = self.limited_update(k, client, data, rnd, self.full_update(), **options)
        client.extra.nova_a = a  # read (and dropped) by `aggregate`
        stats.metrics |= {"local_steps": float(steps), "nova_a": a}
        return stats

    def aggregate(self, clients: Sequence[ClientState], data: Sequence[ClientData], rnd: int) -> Traffic:
        """x ← x − τ_eff Σ p_i (x − x_i)/a_i over the shared parameters (`nova_form = "lr"`: the
        plain average, the clients' learning rates having been scaled); traffic as FedAvg's (each
        participant sends its model and receives the new one)."""
        norms = [float(c.extra.nova_a) for c in clients]
        for c in clients:
            c.extra.nova_a = None  # this round's only
        if self.params.nova_form == "lr":
            return super().aggregate(clients, data, rnd)
        weights = self.aggregation_weights(data)
        tau_eff = sum(p * a for p, a in zip(weights, norms))
        for name in self.shared_names():
            x = self.global_state[name]
            direction = torch.zeros_like(x)
            for client, p, a in zip(clients, weights, norms):
                if a > 0:  # a client without a step (no training data) moved nowhere
                    direction.add_(x - client.state[name], alpha=p / a)
            self.global_state[name] = x - tau_eff * direction
        sent = [self.sent_bytes(c) for c in clients]
        for client in clients:
            self.receive(client)
        return Traffic(up=sent, down=list(sent))
