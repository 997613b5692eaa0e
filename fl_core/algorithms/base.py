"""What every algorithm shares: the hooks a method overrides and the helpers it calls.

The simulation (fl_core/simulation.py) calls, every round t (1-based):
  1. `participants(t)`: who takes part (a seeded sample of `participation`; everyone by default);
  2. for each participant k: `local_update(k, client, data, t)` (train in place, maybe grow a
     mask); it returns `LocalStats`, whose `metrics` (the method's own per-client numbers)
     become Parquet columns and MLflow metrics without further code;
  3. if `aggregates_in(t)`: with a server (`neighbours(t, ...)` is None) `aggregate` averages
     what the participants send (`contribution`, `shared_names`, `aggregation_weights`) with the
     one masked-averaging primitive and broadcasts it back (`receive`); server-less methods
     return a graph from `neighbours` and `mix_neighbours` averages each client with its
     neighbours from one start-of-round snapshot. Both return the bytes each client sent up and
     received down;
  4. on evaluated rounds (`eval_every`, and always the last): the model after local training
     (`acc_local`), after the communication step (`acc_global`) and, for `acc_from = "custom"`,
     `personalized_model(k, client, data, t)`: a state, or a predictor `x -> logits` (to mix BN
     statistics or ensemble).
`acc_from` says which model is the method's personalized accuracy `acc`: "local", "global" or
"custom". A method declares its own knobs as `Params` (a `MethodParams` dataclass in its file)
and reads them from `self.params`.

The core: most methods override only a few of these, in this order of frequency:
  `local_update` (the client's training: nearly every method), `setup` / `init_client` (per-client
  state), `shared_names` (what is averaged), `personalized_model` (the scored model under
  `acc_from = "custom"`), `aggregate` / `receive` (a server step other than the masked average and
  its broadcast) and `state_dict` / `load_state_dict` (server state kept between rounds).
Declarations (class attributes, no code): `name`, `display`, `Params`, `acc_from` (a `Scored`),
  `communicates`, `server`, `broadcasts_model`, `sampled_by`, `evaluates`, `reports_cost`,
  `sparse_states`, `default_bn_stats`, `bn_stats_fixed`; `has_server()` and `evaluated_model()`
  follow from them.
The rest, grouped: who takes part and when (`participants`, `aggregates_in`); server-less methods
  (`neighbours`, `mix_neighbours`); what travels (`contribution`, `aggregation_weights`,
  `sent_bytes`, `sent_entries`, `withheld`); BatchNorm statistics under bn_stats = "global"
  (`share_statistics`, `receive_statistics`, `statistics_bytes`); cost accounting
  (`trained_entries`, `training_cost`); evaluation extras (`evaluation_metrics`,
  `personal_fraction`); the network (`build_model`, a classmethod run once before `setup`).
Helpers (call): `train_pass`, `run_epochs`, `full_update`, `lr`, `withheld`, and on `self.trainer`:
  `evaluate`, `gradients`; gradient corrections (`fl_core.training`: `Proximal`, `ShiftGradient`,
  `ClipGradNorm`); differentiable updates live in fl_core/functional.py.
Where a hook or helper takes a client, the arguments are always (k, client, data, rnd, ...).
"""
from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, ClassVar

import numpy as np
import torch
from torch import Tensor, nn

from .. import models
from ..client_state import ClientExtras, ClientState
from ..config import RunConfig
from ..data import ClientData
from ..knobs import MethodParams, NoParams
from ..masks import Inverted, Mask, count_nonzero, masked_average
from ..models import is_head
from ..training import LocalTrainer, State, UpdateSpec, derive_seed

BYTES_PER_ENTRY = 4  # float32 on the wire
Predictor = Callable[[Tensor], Tensor]  # x -> logits


@dataclass(frozen=True)
class ClientInfo:
    """What the server may know of client k before training: sizes, label histogram, profile."""

    k: int
    n_train: int
    n_val: int
    n_test: int
    train_label_hist: np.ndarray
    profile: dict[str, float] = field(default_factory=dict)  # device capabilities (e.g. a budget)
    seen: bool = True  # False: held out of training (`unseen_clients`), scored as a newcomer at the end


@dataclass
class LocalStats:
    """What a local update returns: the summed training loss, the samples it saw, and the
    method's own per-client metrics (name -> number; they become Parquet columns)."""

    loss_sum: Tensor
    samples: int
    metrics: dict[str, float] = field(default_factory=dict)

    def __add__(self, other: "LocalStats") -> "LocalStats":
        return LocalStats(self.loss_sum + other.loss_sum, self.samples + other.samples, self.metrics | other.metrics)


@dataclass(frozen=True)
class Traffic:
    """Bytes each client sent up and received down in one communication step (aligned with the
    clients passed to it)."""

    up: list[int]
    down: list[int]


class Scored(str, Enum):
    """Which model a method's personalized accuracy `acc` measures (`Algorithm.acc_from`)."""

    LOCAL = "local"     # its model after local training (`acc_local`)
    GLOBAL = "global"   # its model after the communication step (`acc_global`)
    CUSTOM = "custom"   # the model `personalized_model` returns


class Algorithm:
    name: ClassVar[str]                 # the registry name (`algorithm`)
    display: ClassVar[str]              # the name in tables and legends
    Params: ClassVar[type[MethodParams]] = NoParams
    Extras: ClassVar[type[ClientExtras]] = ClientExtras  # what a client keeps between rounds (client_state.py)
    acc_from: ClassVar[Scored] = Scored.LOCAL
    communicates: ClassVar[bool] = True
    # Whether a server carries the rounds' traffic (the busiest node is then the server): False for
    # the server-less methods (D-PSGD, DisPFL), True for FedFomo although clients pick whose models
    # they download (`neighbours`): the server relays them.
    server: ClassVar[bool] = True
    # Which model `acc` measures, in words for tables (the same training can be reported at two
    # points: FedSelect at p = 0 after local training, FedAvg after the broadcast).
    evaluates: ClassVar[str] = ""
    # Add each client's training cost to its metrics: trainable_params (entries its local update
    # changes) and fwd_mflops / bwd_mflops (per training sample, frozen layers known; fl_core/flops.py).
    reports_cost: ClassVar[bool] = False
    # Every client state is 0 wherever its contribution mask is False (sparse models, DisPFL):
    # averaging then skips the product with the mask (`masks.masked_average(zero_outside=True)`).
    sparse_states: ClassVar[bool] = False
    # Where BatchNorm running statistics live unless `bn_stats` says otherwise: "global" (the server
    # averages them with the weights: one global model, as the method's paper evaluates it) or
    # "local" (every client keeps its own). `bn_stats_fixed`: the other value would not be the
    # method (FedBN); a method without a server always keeps them local.
    default_bn_stats: ClassVar[str] = "local"
    bn_stats_fixed: ClassVar[bool] = False
    # The knob that says which clients take part in a round: the common `participation` (a seeded
    # sample of the seen clients, `participants`), or the method's own (D-PSGD and DisPFL: `active`,
    # each client on its own); a method with its own refuses `participation` below 1.
    sampled_by: ClassVar[str] = "participation"
    # Whether the server's broadcast writes into the clients' models (`receive`); False where only
    # other values travel (FedL2P: λ). The round loop then knows that the communication step left
    # a client's model as it was, and reuses its scores after local training.
    broadcasts_model: ClassVar[bool] = True

    def __init_subclass__(cls, **kwargs: Any) -> None:
        """A declared `acc_from` is one of `Scored` (a plain "local", "global" or "custom" is read as it)."""
        super().__init_subclass__(**kwargs)
        try:
            cls.acc_from = Scored(cls.acc_from)
        except ValueError:
            raise TypeError(f"{cls.__name__}.acc_from = {cls.acc_from!r}: choose one of "
                            f"{', '.join(s.value for s in Scored)}") from None

    @classmethod
    def has_server(cls) -> bool:
        """Whether rounds go through a server (`server`, for a method that communicates). The
        busiest node of a server method is its server (it carries every client's traffic); of a
        server-less one, the client with the most traffic."""
        return cls.communicates and cls.server

    @classmethod
    def evaluated_model(cls) -> str:
        points = {Scored.LOCAL: "after local training", Scored.GLOBAL: "after the broadcast"}
        return cls.evaluates or points[cls.acc_from]

    def __init__(self, config: RunConfig, trainer: LocalTrainer, model_name: str) -> None:
        self.config = config
        self.params = config.method  # this method's own knobs (an instance of `Params`)
        self.trainer = trainer
        self.model_name = model_name
        self.param_names = list(trainer.params)
        self.head_names = [n for n in self.param_names if is_head(model_name, n)]
        self.body_names = [n for n in self.param_names if not is_head(model_name, n)]
        self.numels = {n: p.numel() for n, p in trainer.params.items()}
        self.global_state: State = {}
        self.clients_info: list[ClientInfo] = []
        # BatchNorm running statistics the server averages (bn_stats = "global"), else none
        self.statistic_names = ([n for n, b in trainer.model.named_buffers() if b.is_floating_point()]
                                if config.bn_statistics() == "global" and self.has_server() else [])

    # ================================================================ hooks: set-up
    @classmethod
    def build_model(cls, config: RunConfig, model_name: str, input_shape: tuple[int, int, int],
                    num_classes: int) -> nn.Module:
        """The one network every client's state runs on, built by the simulation under its seeded
        RNG before anything else; the registered model at `model_width` by default (Split-Mix: an
        ensemble of narrow copies of it)."""
        return models.build_model(model_name, input_shape, num_classes, width=config.model_width)

    def setup(self, init: State, clients: Sequence[ClientInfo]) -> list[ClientState]:
        """Before round 1, with every client's sizes and capability profile (a server-side
        problem such as PerFedMask's masks is solved here)."""
        self.clients_info = list(clients)
        self.global_state = {n: t.clone() for n, t in init.items()}
        return [self.init_client(info.k, init) for info in clients]

    def init_client(self, k: int, init: State) -> ClientState:
        return ClientState(state={n: t.clone() for n, t in init.items()}, extra=self.Extras())

    # ================================================================ hooks: who, and the client side
    def participants(self, rnd: int) -> list[int]:
        """Clients taking part in round `rnd`: every seen client, or a seeded sample of
        max(1, ⌊participation·N⌋) of the N seen ones (unseen clients never take part)."""
        pool = [info.k for info in self.clients_info if info.seen]
        share = self.config.participation
        if share >= 1.0:
            return pool
        m = max(1, math.floor(share * len(pool) + 1e-9))
        rng = np.random.default_rng(derive_seed(self.config.seed, rnd, "participants"))
        return sorted(int(pool[i]) for i in rng.choice(len(pool), size=m, replace=False))

    def local_update(self, k: int, client: ClientState, data: ClientData, rnd: int) -> LocalStats:
        return self.run_epochs(k, client, data, rnd, self.config.local_epochs, self.full_update())

    # ================================================================ hooks: communication
    def aggregates_in(self, rnd: int) -> bool:
        """Whether the communication step runs at the end of round `rnd`."""
        return self.communicates

    def neighbours(self, rnd: int, participants: Sequence[int]) -> dict[int, list[int]] | None:
        """Server-less methods: who averages from whom in round `rnd` (k -> its neighbours, self
        excluded). None (the default) means a server: everyone from everyone."""
        return None

    def shared_names(self) -> list[str]:
        """Parameters that are averaged (all by default; body-only or head-only methods narrow it)."""
        return self.param_names

    def contribution(self, client: ClientState) -> Mapping[str, Tensor] | None:
        """Bool masks of the entries this client sends (None: all of them). A client's mask marks
        the entries that never leave it (FedSelect: personal; LotteryFL: pruned), each inverse made
        when the server reads it."""
        return None if client.mask is None else Inverted(client.mask)

    def withheld(self, names: Iterable[str]) -> Mask | None:
        """A contribution that sends nothing of the tensors `names` (whole tensors the client did not
        train: PerFedMask's frozen groups, Split-Mix's other bases) and all of the rest; None when
        `names` is empty. Each all-False mask is made once and shared, read only, by every client."""
        cache = self.__dict__.setdefault("_withheld", {})
        out = {}
        for n in names:
            if n not in cache:
                cache[n] = torch.zeros_like(self.trainer.params[n], dtype=torch.bool)
            out[n] = cache[n]
        return out or None

    def aggregation_weights(self, data: Sequence[ClientData]) -> list[float]:
        if self.config.weighting == "samples":
            total = sum(d.n_train for d in data)
            return [d.n_train / total for d in data]
        return [1.0 / len(data)] * len(data)

    def aggregate(self, clients: Sequence[ClientState], data: Sequence[ClientData], rnd: int) -> Traffic:
        """The server: average what the participants send, broadcast it back to them."""
        contribs = [self.contribution(c) for c in clients]
        self.global_state.update(masked_average(
            self.global_state, [c.state for c in clients], contribs,
            self.aggregation_weights(data), self.shared_names()))
        sent = [self.sent_bytes(c) for c in clients]  # before `receive` may change masks
        for client in clients:
            self.receive(client)
        return Traffic(up=sent, down=list(sent))

    def mix_neighbours(self, clients: Sequence[ClientState], data: Sequence[ClientData],
                       graph: dict[int, list[int]], rnd: int) -> Traffic:
        """Server-less step: client k becomes the masked average of itself and its neighbours
        `graph[k]`, all taken from one snapshot (synchronous). Where no one contributes an
        entry, k keeps its own value. k receives each neighbour's sent entries; each client
        sends its entries once per client that pulls from it."""
        snapshot = [c.state for c in clients]
        # made once each: every neighbourhood that holds a client reads its contribution again
        contribs = [None if c is None else dict(c.items()) for c in map(self.contribution, clients)]
        sent = [self.sent_bytes(c) for c in clients]
        up, down = [0] * len(clients), [0] * len(clients)
        mixed = {}
        for k, others in graph.items():
            group = sorted({k, *others})  # in index order: a full graph averages exactly as the server does
            mixed[k] = masked_average(snapshot[k], [snapshot[j] for j in group], [contribs[j] for j in group],
                                      self.aggregation_weights([data[j] for j in group]), self.shared_names(),
                                      zero_outside=self.sparse_states)
            for j in set(others) - {k}:
                up[j] += sent[j]
                down[k] += sent[j]
        for k, values in mixed.items():
            clients[k].state = clients[k].state | values
        return Traffic(up=up, down=down)

    def receive(self, client: ClientState) -> None:
        """Write the broadcast shared parameters into the client (buffers stay local)."""
        for n in self.shared_names():
            client.state[n] = self.global_state[n].clone()

    def share_statistics(self, clients: Sequence[ClientState], data: Sequence[ClientData]) -> int:
        """Under bn_stats = "global", after the server step: average the participants' running
        statistics with the aggregation weights and broadcast them back. Bytes each client sent
        (and received) for them; 0 without BatchNorm or under "local"."""
        names = self.statistic_names
        if not names or not clients:
            return 0
        self.global_state.update(masked_average(self.global_state, [c.state for c in clients], [None] * len(clients),
                                                self.aggregation_weights(data), names))
        for client in clients:
            self.receive_statistics(client)
        return self.statistics_bytes()

    def statistics_bytes(self) -> int:
        """Bytes of one copy of the running statistics the server averages (0 under "local")."""
        return sum(self.global_state[n].numel() for n in self.statistic_names) * BYTES_PER_ENTRY

    def receive_statistics(self, client: ClientState) -> None:
        """Write the server's running statistics into the client (nothing under bn_stats = "local")."""
        for n in self.statistic_names:
            client.state[n] = self.global_state[n].clone()

    def sent_bytes(self, client: ClientState) -> int:
        """Bytes of one copy of what the client sends (float32 entries; a method that also sends
        its mask adds the mask's bits)."""
        return self.sent_entries(client) * BYTES_PER_ENTRY

    def sent_entries(self, client: ClientState) -> int:
        contrib = self.contribution(client) or {}
        return sum(count_nonzero(contrib[n]) if n in contrib else self.numels[n] for n in self.shared_names())

    # ================================================================ hooks: evaluation
    def personalized_model(self, k: int, client: ClientState, data: ClientData, rnd: int) -> State | Predictor:
        """`acc_from = "custom"`: the model evaluated as client k's, a state or a predictor."""
        raise NotImplementedError(f"{self.name} evaluates acc_{self.acc_from}, not a custom model")

    def evaluation_metrics(self, k: int, client: ClientState, data: ClientData) -> dict[str, float]:
        """Client k's own numbers about the model it is scored with, on evaluated rounds (FedL2P:
        its policy per layer); they join the method's metrics as Parquet columns."""
        return {}

    def personal_fraction(self, client: ClientState) -> float:
        """Share of all parameter entries that never leave the client: everything for a method
        that does not communicate, else the parameters outside `shared_names` (mask-based
        methods override this)."""
        if not self.communicates:
            return 1.0
        shared = set(self.shared_names())
        return sum(v for n, v in self.numels.items() if n not in shared) / sum(self.numels.values())

    def trained_entries(self, k: int) -> UpdateSpec:
        """What client k's local update trains, as an UpdateSpec (for the cost counters; all
        parameters by default; methods that freeze layers or slice widths override it)."""
        return self.full_update()

    def training_cost(self, k: int, input_shape: tuple[int, ...]) -> dict[str, float]:
        """{} unless `reports_cost`; else client k's trainable entries and per-sample forward and
        backward MFLOPs of its local update, counted once per distinct `trained_entries` (devices
        of one capability share a count: a hundred clients cost a few counter passes)."""
        if not self.reports_cost:
            return {}
        spec = self.trained_entries(k)
        key = tuple((n, 0 if m is None else m.data_ptr()) for n, m in spec.items())  # masks are cached tensors
        cache = self.__dict__.setdefault("_cost", {})
        if key not in cache:
            from ..flops import training_flops  # the counter is only loaded by methods that report costs

            densities = {n.rsplit(".", 1)[0]: float(m.float().mean()) for n, m in spec.items()
                         if m is not None and n.endswith("weight")}
            fwd, bwd = training_flops(self.trainer.model, input_shape, list(spec), densities)
            cache[key] = {"trainable_params": float(sum(self.numels[n] if m is None else int(m.sum())
                                                        for n, m in spec.items())),
                          "fwd_mflops": fwd / 1e6, "bwd_mflops": bwd / 1e6}
        return dict(cache[key])

    # ================================================================ hooks: save / restore
    def state_dict(self) -> dict[str, Any]:
        return {"global_state": self.global_state}

    def load_state_dict(self, d: dict[str, Any]) -> None:
        self.global_state = d["global_state"]

    # ================================================================ helpers
    def full_update(self) -> UpdateSpec:
        return {n: None for n in self.param_names}

    def lr(self, rnd: int) -> float:
        """The learning rate of round `rnd` under the run's schedule."""
        return self.config.lr_at(rnd)

    def train_pass(self, k: int, client: ClientState, data: ClientData, rnd: int, epoch: int,
                   update: UpdateSpec, purpose: str, stats: LocalStats, **options: Any) -> None:
        """One pass of SGD on client k's training data, changing what `update` allows.

        The batch order depends on (seed, round, client, epoch, purpose) only, so two methods that
        make the same pass see the same batches. `options` go to `LocalTrainer.train_pass`
        (`loss_fn`, `corrections`, `lr`; the lr defaults to the round's scheduled one).
        """
        seed = derive_seed(self.config.seed, rnd, k, epoch, purpose)
        options.setdefault("lr", self.lr(rnd))
        client.state, loss, n = self.trainer.train_pass(client.state, data.x_train, data.y_train, update, seed,
                                                        **options)
        stats.loss_sum += loss
        stats.samples += n

    def run_epochs(self, k: int, client: ClientState, data: ClientData, rnd: int, epochs: int,
                   update: UpdateSpec, purpose: str = "global", **options: Any) -> LocalStats:
        """`epochs` passes of `train_pass`; under `momentum_scope="round"` they share one momentum
        buffer (one optimizer for the whole call), otherwise each pass starts its own."""
        stats = LocalStats(torch.zeros((), device=data.x_train.device), 0)
        if self.config.momentum_scope == "round":
            options.setdefault("velocity", {})
        for epoch in range(epochs):
            self.train_pass(k, client, data, rnd, epoch, update, purpose, stats, **options)
        return stats
