"""LotteryFL — Li, Sun, Wang, Duan, Li, Chen, Li, "LotteryFL: Personalized and
Communication-Efficient Federated Learning with Lottery Ticket Hypothesis on Non-IID Datasets",
arXiv:2008.03371, 2020 (Algorithm 1).

Evaluated per client: its sparse model after local training (`acc_local`), i.e. its lottery
ticket network (LTN).

Each client keeps a pruning mask over the prunable tensors, every parameter named `*weight`
(`client.mask`, True = pruned; biases are never pruned). Pruned entries are zero and stay zero:
local SGD updates only unpruned entries and the broadcast is written into unpruned entries only.

ClientUpdate in round t, as in the paper's Algorithm 1:
  1. The client holds the global model restricted to its mask, θ^t ⊙ m_k (what it received at
     the end of the previous round; the initial model in round 1). It measures that model's
     accuracy on its local validation data (the official code: on the client's held-out data):
     the client's validation split when the run has one (`val_fraction` > 0), else its
     *training* data (test data must never steer training). Reported as the per-client metric
     `lottery_val_acc`, with the pruning rate `lottery_sparsity`.
  2. If that accuracy is strictly above `lottery_acc_threshold` (acc > acc_threshold, as in the
     paper and its official code: a model that only predicts one class of a balanced two-class
     client, accuracy 0.5, does not count as good at the default 0.5; and threshold 1.0 never
     prunes) and the client's sparsity is below `lottery_target_sparsity`, it prunes, in each
     prunable tensor (layer-wise, as the official code), `lottery_prune_step` of the remaining
     entries — those of smallest magnitude in θ^t ⊙ m_k — capped so that no tensor goes beyond
     the target (the official code may overshoot it by up to one step). Then, following the
     lottery-ticket procedure (Frankle & Carbin 2019) as the paper does, it resets the remaining
     weights to their *initial* values θ^0 (the common initial model of round 1, not the global
     model of this round): θ_k <- θ^0 ⊙ m_k. Non-prunable parameters (biases) are reset to θ^0
     too, as in the official code; buffers (BatchNorm statistics) stay the client's own.
  3. `local_epochs` epochs of SGD on the unpruned entries.
Pruning happens at most once per round per client, so the sparsity after n prunes is about
1 - (1 - step)^n, capped at the target. At most one reset per prune: once the target is reached
the client trains its ticket like masked FedAvg.

Server: for each entry, the mean over the clients in whose ticket it is (`masks.masked_average`
with contribution = ~pruned); an entry pruned by every client keeps its previous global value.
Communication per client and round: its unpruned entries (the prunable tensors' unpruned
entries plus every non-prunable parameter), each way.

`personal_fraction` reports the pruned share of *all* parameter entries (the same denominator
as the other methods, so that bytes = 4 · total entries · (1 − personal_fraction)); the paper's
pruning rate over prunable weights only is `extra.sparsity`.

The authors' runs (official code README): prune step r_p = 20 %; acc_threshold 0.5 on MNIST and
EMNIST, 0.1 on CIFAR-10; and their r_target ("prune_end_rate") is the share of weights that
*remain*: 0.1 on MNIST/EMNIST (our `lottery_target_sparsity` = 0.9) and 0.5 on CIFAR-10 (0.5).
Left at none, `lottery_acc_threshold` and `lottery_target_sparsity` take those values by dataset:
the MNIST ones for the MNIST-like sources (`mnist`, `digits` and their corrupted variants), the
CIFAR-10 ones for every other dataset.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from ..client_state import ClientExtras, ClientState
from ..data import ClientData
from ..knobs import MethodParams, knob
from ..masks import personal_fraction, zero_where
from ..sparse import prune_smallest
from ..training import State
from .base import Algorithm, ClientInfo, LocalStats, Scored


@dataclass(frozen=True)
class LotteryFLParams(MethodParams):
    lottery_acc_threshold: float | None = knob(None, "prune only while local accuracy is above this (1 = never prune; "
                                               "none: the authors' 0.5 on MNIST-like data, 0.1 otherwise)",
                                               low=0, high=1)
    lottery_prune_step: float = knob(0.2, "share of the remaining weights pruned per pruning step", low=0, high=1)
    lottery_target_sparsity: float | None = knob(None, "stop pruning at this share of pruned weights (none: the "
                                                 "authors' 0.9 on MNIST-like data, 0.5 otherwise)", low=0, high=1)


MNIST_LIKE = ("mnist", "fmnist", "digits", "emnist")  # 28x28 (or 8x8) grayscale, small LeNets
AUTHORS_DEFAULTS = {True: {"acc_threshold": 0.5, "target_sparsity": 0.9},   # MNIST / EMNIST runs
                    False: {"acc_threshold": 0.1, "target_sparsity": 0.5}}  # CIFAR-10 runs


def mnist_like(dataset: str) -> bool:
    return dataset.split("_")[0] in MNIST_LIKE


@dataclass(slots=True, eq=False)
class LotteryFLExtras(ClientExtras):
    sparsity: float | None = None  # the share of prunable weights its mask has pruned
    val_acc: float | None = None   # its accuracy on its validation split at its last update


class LotteryFL(Algorithm):
    name = "lotteryfl"
    display = "LotteryFL"
    Params = LotteryFLParams
    Extras = LotteryFLExtras
    acc_from = Scored.LOCAL

    def __init__(self, config, trainer, model_name) -> None:
        super().__init__(config, trainer, model_name)
        self.prunable = [n for n in self.param_names if n.endswith("weight")]
        self.initial: State = {}
        authors = AUTHORS_DEFAULTS[mnist_like(config.dataset)]
        given = self.params
        self.acc_threshold = (authors["acc_threshold"] if given.lottery_acc_threshold is None
                              else given.lottery_acc_threshold)
        self.target_sparsity = (authors["target_sparsity"] if given.lottery_target_sparsity is None
                                else given.lottery_target_sparsity)

    def setup(self, init: State, clients: list[ClientInfo]) -> list[ClientState]:
        # θ^0 for the resets. Not part of `state_dict`: a restored Simulation is built from the
        # same config (same seed), so `setup` recomputes exactly these values before restoring.
        self.initial = {n: init[n].clone() for n in self.param_names}
        return super().setup(init, clients)

    def init_client(self, k: int, init: State) -> ClientState:
        client = super().init_client(k, init)
        client.mask = {n: torch.zeros_like(init[n], dtype=torch.bool) for n in self.prunable}
        client.extra.sparsity = 0.0
        client.extra.val_acc = 0.0
        return client

    # ---------------------------------------------------------------- pruning schedule
    def cap(self, name: str) -> int:
        """Most entries of a tensor that may be pruned: never beyond the target sparsity."""
        return math.floor(self.target_sparsity * self.numels[name])

    def prune_counts(self, client: ClientState) -> dict[str, int]:
        """Entries each prunable tensor loses in one pruning step (0 where it is at the target)."""
        step = self.params.lottery_prune_step
        counts = {}
        for n in self.prunable:
            done = int(client.mask[n].sum())
            room = self.cap(n) - done
            want = round(step * (self.numels[n] - done))
            counts[n] = min(room, max(want, 1)) if step > 0 and room > 0 else 0
        return counts

    def sparsity(self, client: ClientState) -> float:
        """The paper's pruning rate: pruned share of the prunable entries."""
        total = sum(self.numels[n] for n in self.prunable)
        return sum(int(client.mask[n].sum()) for n in self.prunable) / total if total else 0.0

    def prune_and_reset(self, client: ClientState, counts: dict[str, int]) -> None:
        for n, count in counts.items():
            if count:
                client.mask[n] = prune_smallest(client.state[n], client.mask[n], count)
        for n in self.param_names:  # the lottery-ticket reset: θ^0 ⊙ m
            init = self.initial[n]
            mask = client.mask.get(n)
            client.state[n] = init.clone() if mask is None else zero_where(init, mask)
        client.extra.sparsity = self.sparsity(client)

    # ---------------------------------------------------------------- client side
    def local_update(self, k: int, client: ClientState, data: ClientData, rnd: int) -> LocalStats:
        x, y = (data.x_val, data.y_val) if data.n_val else (data.x_train, data.y_train)
        acc = self.trainer.evaluate(client.state, x, y) / y.shape[0]
        client.extra.val_acc = acc
        if acc > self.acc_threshold:
            counts = self.prune_counts(client)
            if any(counts.values()):
                self.prune_and_reset(client, counts)
        update = {n: ~client.mask[n] if n in client.mask else None
                  for n in self.param_names}
        stats = self.run_epochs(k, client, data, rnd, self.config.local_epochs, update)
        stats.metrics = {"lottery_sparsity": client.extra.sparsity, "lottery_val_acc": acc}
        return stats

    # ---------------------------------------------------------------- server side
    def receive(self, client: ClientState) -> None:
        for n in self.param_names:
            mask = client.mask.get(n)
            g = self.global_state[n]
            client.state[n] = g.clone() if mask is None else zero_where(g, mask)

    def personal_fraction(self, client: ClientState) -> float:
        return personal_fraction(client.mask, self.numels)
