"""FedFomo — Zhang, Sapra, Fidler, Yeung, Alvarez, "Personalized Federated Learning with First
Order Model Optimization", ICLR 2021 (arXiv 2012.08565; authors' code github.com/NVlabs/FedFomo).

Evaluated per client: its model right after this round's FOMO update (its trained model combined
with the M models it downloaded: `acc_global`, `acc_from = "global"`), the model it starts the next
round's local training from; the authors' code scores this model (main.py evaluates after the
update, before training). `acc_local` is its own model after local training, before the update.

There is no global model. Every client keeps its own model θ_k; the server only relays models
and keeps the affinity matrix P (N × N, zeros at the start; `state_dict`). A round:
  1. every participant trains its own model for `local_epochs` epochs of plain local SGD (the
     same passes, batch for batch, as the `local` algorithm);
  2. it uploads θ_k; the server sends each participant k the models of M = `fedfomo_m` other
     participants of this round, picked ε-greedily from row k of P: for each of the M slots,
     with probability ε_t the next one of a random order of the others, else the not yet picked
     one with the highest affinity (ties broken at random), ε_t = max(0, ε − δ·t) in round t with
     ε = `fedfomo_epsilon`, δ = `fedfomo_epsilon_decay` (the authors' schedule: their first update
     comes at round index 1), seeded by `derive_seed(seed, t, k)`;
  3. client k scores every downloaded θ_n on its own validation split (mean cross-entropy in
     eval mode, its own BatchNorm statistics) and weighs it by the first-order estimate
         w_n = (L_k(θ_k) − L_k(θ_n)) / ‖θ_n − θ_k‖            (0 when θ_n = θ_k)
     keeps the positive ones, normalised to sum 1, and updates
         θ_k ← θ_k + Σ_n w_n (θ_n − θ_k);
     if no weight is positive (or M = 0) it keeps its own model exactly. All updates use the
     models as uploaded (synchronous). The server adds the signed w_n (before clipping and
     normalising, as the authors' code adds the signed deltas) to P[k, n].
So with M = 0 the run is `local`, bit for bit. The paper orders a round as download, FOMO
update, train, upload (round 1: train and upload only); here the update ends the round instead,
the same sequence of operations, so that both models are scored in one round.

Traffic per participant and round: up one model (its parameters, float32) to the server, down
the M downloaded models (min(M, participants − 1) of them). BatchNorm statistics never travel.
The server relays (busiest node = the server, `has_server`); the exchange runs through the
engine's server-less hooks (`neighbours` = who downloads whose model, `mix_neighbours` = the
update), which fit it exactly: per-client groups from one snapshot, and per-client traffic.

Knobs and defaults: `fedfomo_m` = 5 (this project's choice; the authors' config file defaults to
8, and we could not check the paper's own value here), ε = 0.3 and δ = 0.05 per round (the
authors' config: EPSILON 0.3, EPSILON_DECAY 0.05, so exploration ends after 6 rounds). The
validation split is the run's `val_fraction` (the paper holds out a validation split per client); a
run without one is refused.

Departures from the paper and the authors' code: the candidates are the models uploaded in the
current round only (the authors' code: the last round's uploads; under full participation the
same); the FOMO baseline is the client's current model θ_k, and its own model is not among the
candidates (the authors' code compares against the model it started the previous local training
from and includes its own trained model as a candidate); parameters only are combined (the
authors' code also combines BatchNorm statistics); an unseen newcomer downloads the initial
model once and trains locally, as every client does in round 1.
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn
from torch.nn import functional as F

from ..client_state import ClientState
from ..config import RunConfig
from ..data import ClientData
from ..knobs import ConfigError, MethodParams, knob
from ..training import LocalTrainer, State, derive_seed
from .base import Algorithm, ClientInfo, Scored, Traffic


@dataclass(frozen=True)
class FedFomoParams(MethodParams):
    fedfomo_m: int = knob(5, "M, the number of other clients' models each client downloads per round "
                          "(0 = local training only)", low=0)
    fedfomo_epsilon: float = knob(0.3, "ε, the starting probability that a download slot takes a random client "
                                  "instead of the highest-affinity one", low=0, high=1)
    fedfomo_epsilon_decay: float = knob(0.05, "δ, how much ε drops per round (ε_t = max(0, ε − δ·t))", low=0)


@torch.no_grad()
def validation_loss(trainer: LocalTrainer, state: State, x: Tensor, y: Tensor, batch_size: int = 1024) -> float:
    """Mean cross-entropy of `state` on (x, y), in eval mode (BatchNorm running statistics)."""
    total = torch.zeros((), dtype=torch.float64, device=x.device)
    with trainer.bound(state) as model:
        model.train(False)
        try:
            for start in range(0, x.shape[0], batch_size):
                total += F.cross_entropy(model(x[start:start + batch_size]), y[start:start + batch_size],
                                         reduction="sum").double()
        finally:
            model.train(True)
    return float(total) / x.shape[0]


def fomo_weights(own_loss: float, losses: Sequence[float],
                 distances: Sequence[float]) -> tuple[list[float], list[float]]:
    """(signed first-order weights (L_own − L_n)/‖θ_n − θ_own‖, their positive parts normalised
    to sum 1, or all 0 when none is positive)."""
    raw = [(own_loss - loss) / dist if dist > 0 else 0.0 for loss, dist in zip(losses, distances)]
    positive = [max(w, 0.0) for w in raw]
    total = sum(positive)
    return raw, [w / total for w in positive] if total > 0 else [0.0] * len(raw)


def epsilon_greedy(affinity: np.ndarray, candidates: Sequence[int], m: int, epsilon: float,
                   rng: np.random.Generator) -> list[int]:
    """min(m, len(candidates)) distinct candidates: per slot, with probability `epsilon` the next
    of a random order, else the next not yet picked by descending `affinity` (random ties)."""
    candidates = np.asarray(candidates, dtype=np.int64)
    ranked = list(candidates[np.lexsort((rng.random(len(candidates)), -affinity[candidates]))])
    shuffled = list(rng.permutation(candidates))
    picked: list[int] = []
    for _ in range(min(m, len(candidates))):
        order = shuffled if rng.random() < epsilon else ranked
        while order[0] in picked:
            order.pop(0)
        picked.append(int(order.pop(0)))
    return picked


class FedFomo(Algorithm):
    name = "fedfomo"
    display = "FedFomo"
    Params = FedFomoParams
    acc_from = Scored.GLOBAL
    server = True  # it relays every model clients download and keeps the affinity matrix
    evaluates = ("its model after the FOMO update with the downloaded models (acc_local: after local training, "
                 "before it)")

    @classmethod
    def build_model(cls, config: RunConfig, model_name: str, input_shape: tuple[int, int, int],
                    num_classes: int) -> nn.Module:
        if config.val_fraction <= 0:
            raise ConfigError(f"fedfomo weighs the downloaded models on each client's validation split: "
                              f"val_fraction={config.val_fraction} is not allowed; give val_fraction in (0, 1) "
                              f"(e.g. 0.2)")
        return super().build_model(config, model_name, input_shape, num_classes)

    def setup(self, init: State, clients: Sequence[ClientInfo]) -> list[ClientState]:
        self.affinity = torch.zeros(len(clients), len(clients), dtype=torch.float64)
        return super().setup(init, clients)

    def epsilon(self, rnd: int) -> float:
        return max(0.0, self.params.fedfomo_epsilon - self.params.fedfomo_epsilon_decay * rnd)

    def neighbours(self, rnd: int, participants: Sequence[int]) -> dict[int, list[int]]:
        """k -> the clients whose models the server sends to k this round."""
        affinity = self.affinity.numpy()
        return {k: epsilon_greedy(affinity[k], [j for j in participants if j != k], self.params.fedfomo_m,
                                  self.epsilon(rnd), np.random.default_rng(derive_seed(self.config.seed, rnd, k,
                                                                                       "fedfomo-pick")))
                for k in participants}

    def mix_neighbours(self, clients: Sequence[ClientState], data: Sequence[ClientData],
                       graph: dict[int, list[int]], rnd: int) -> Traffic:
        snapshot = [c.state for c in clients]
        names = self.param_names
        updated = {}
        for k, others in graph.items():
            if not others:
                continue
            own, d = snapshot[k], data[k]
            own_loss = validation_loss(self.trainer, own, d.x_val, d.y_val)
            losses = [validation_loss(self.trainer, own | {n: snapshot[j][n] for n in names}, d.x_val, d.y_val)
                      for j in others]
            distances = [math.sqrt(sum(float((snapshot[j][n] - own[n]).double().pow(2).sum()) for n in names))
                         for j in others]
            raw, weights = fomo_weights(own_loss, losses, distances)
            for j, w in zip(others, raw):
                self.affinity[k, j] += w
            if any(weights):
                updated[k] = {n: own[n] + sum(w * (snapshot[j][n] - own[n]) for j, w in zip(others, weights) if w)
                              for n in names}
        for k, values in updated.items():
            clients[k].state = clients[k].state | values
        model = [self.sent_bytes(c) for c in clients]
        uploaded = set(graph) | {j for others in graph.values() for j in others}
        return Traffic(up=[model[j] if j in uploaded else 0 for j in range(len(clients))],
                       down=[sum(model[j] for j in graph.get(k, [])) for k in range(len(clients))])

    def state_dict(self) -> dict[str, Any]:
        return super().state_dict() | {"affinity": self.affinity}

    def load_state_dict(self, d: dict[str, Any]) -> None:
        super().load_state_dict(d)
        self.affinity = d["affinity"].cpu().to(torch.float64)
