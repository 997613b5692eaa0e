"""What every algorithm shares: client state, the server step, the hooks a method overrides.

An algorithm is a small class. The simulation calls, every round:
  1. `local_update(k, client, rnd)` for each client (train in place, maybe grow a mask);
  2. `aggregate(clients, rnd)`: the server's masked average of what each client sends
     (`contribution`), broadcast back with `receive`;
  3. evaluation of `personalized_state` when the method's accuracy needs a model of its own.
`acc_from` says which evaluated model is the method's personalized accuracy `acc`:
"local" (after local training), "global" (after the broadcast) or "custom"
(`personalized_state`, e.g. after fine-tuning).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch
from torch import Tensor

from ..client_state import ClientState
from ..config import RunConfig
from ..data import ClientData
from ..masks import Mask, masked_average
from ..models import is_head
from ..training import LocalTrainer, State, UpdateSpec, derive_seed

BYTES_PER_ENTRY = 4  # float32 on the wire


@dataclass
class LocalStats:
    loss_sum: Tensor
    samples: int


class Algorithm:
    name: ClassVar[str]
    acc_from: ClassVar[str] = "local"
    communicates: ClassVar[bool] = True

    def __init__(self, config: RunConfig, trainer: LocalTrainer, model_name: str) -> None:
        self.config = config
        self.trainer = trainer
        self.model_name = model_name
        self.param_names = list(trainer.params)
        self.head_names = [n for n in self.param_names if is_head(model_name, n)]
        self.body_names = [n for n in self.param_names if not is_head(model_name, n)]
        self.numels = {n: p.numel() for n, p in trainer.params.items()}
        self.global_state: State = {}

    # ---------------------------------------------------------------- set-up
    def init_client(self, k: int, init: State) -> ClientState:
        return ClientState(state={n: t.clone() for n, t in init.items()})

    def setup(self, init: State, num_clients: int) -> list[ClientState]:
        self.global_state = {n: t.clone() for n, t in init.items()}
        return [self.init_client(k, init) for k in range(num_clients)]

    # ---------------------------------------------------------------- client side
    def full_update(self) -> UpdateSpec:
        return {n: None for n in self.param_names}

    def train_pass(self, client: ClientState, data: ClientData, rnd: int, k: int, epoch: int,
                   update: UpdateSpec, purpose: str, stats: LocalStats, **options: Any) -> None:
        """One pass of SGD on client k's training data, changing what `update` allows.

        The batch order depends on (seed, round, client, epoch, purpose) only, so two methods that
        make the same pass see the same batches. `options` go to `LocalTrainer.train_pass`
        (`loss_fn`, `prox`).
        """
        seed = derive_seed(self.config.seed, rnd, k, epoch, purpose)
        client.state, loss, n = self.trainer.train_pass(client.state, data.x_train, data.y_train, update, seed,
                                                        **options)
        stats.loss_sum += loss
        stats.samples += n

    def run_epochs(self, client: ClientState, data: ClientData, rnd: int, k: int, epochs: int,
                   update: UpdateSpec, purpose: str = "global", **options: Any) -> LocalStats:
        stats = LocalStats(torch.zeros((), device=data.x_train.device), 0)
        for epoch in range(epochs):
            self.train_pass(client, data, rnd, k, epoch, update, purpose, stats, **options)
        return stats

    def local_update(self, k: int, client: ClientState, data: ClientData, rnd: int) -> LocalStats:
        return self.run_epochs(client, data, rnd, k, self.config.local_epochs, self.full_update())

    # ---------------------------------------------------------------- server side
    def aggregates_in(self, rnd: int) -> bool:
        """Whether the server averages and broadcasts at the end of round `rnd` (1-based)."""
        return self.communicates

    def contribution(self, client: ClientState) -> Mask | None:
        """Bool masks of the entries this client sends (None: all of them). A client's mask marks
        the entries that never leave it (FedSelect: personal; LotteryFL: pruned)."""
        return None if client.mask is None else {n: ~m for n, m in client.mask.items()}

    def aggregation_weights(self, data: list[ClientData]) -> list[float]:
        if self.config.weighting == "samples":
            total = sum(d.n_train for d in data)
            return [d.n_train / total for d in data]
        return [1.0 / len(data)] * len(data)

    def shared_names(self) -> list[str]:
        """Parameters the server averages (all by default; body-only or head-only methods narrow it)."""
        return self.param_names

    def sent_entries(self, client: ClientState) -> int:
        contrib = self.contribution(client) or {}
        return sum(int(contrib[n].sum()) if n in contrib else self.numels[n] for n in self.shared_names())

    def aggregate(self, clients: list[ClientState], data: list[ClientData], rnd: int) -> list[int]:
        """Average what clients send, broadcast it back; returns bytes sent per client (each way)."""
        contribs = [self.contribution(c) for c in clients]
        self.global_state.update(masked_average(
            self.global_state, [c.state for c in clients], contribs,
            self.aggregation_weights(data), self.shared_names()))
        for client in clients:
            self.receive(client)
        return [self.sent_entries(c) * BYTES_PER_ENTRY for c in clients]

    def receive(self, client: ClientState) -> None:
        """Write the broadcast shared parameters into the client (buffers stay local)."""
        for n in self.shared_names():
            client.state[n] = self.global_state[n].clone()

    def personalized_state(self, k: int, client: ClientState, data: ClientData, rnd: int) -> State:
        raise NotImplementedError(f"{self.name} evaluates acc_{self.acc_from}, not a custom model")

    def personal_fraction(self, client: ClientState) -> float:
        """Share of all parameter entries that never leave the client: everything for a method
        that does not communicate, else the parameters outside `shared_names` (mask-based
        methods override this)."""
        if not self.communicates:
            return 1.0
        shared = set(self.shared_names())
        return sum(v for n, v in self.numels.items() if n not in shared) / sum(self.numels.values())

    # ---------------------------------------------------------------- save / restore
    def state_dict(self) -> dict[str, Any]:
        return {"global_state": self.global_state}

    def load_state_dict(self, d: dict[str, Any]) -> None:
        self.global_state = d["global_state"]
