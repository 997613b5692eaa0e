"""The round loop: `Simulation(config).run()` yields one `RoundResult` per round.

A round (hooks in fl_core/algorithms/base.py): the algorithm picks the participants; each trains
locally (a participant that missed broadcasts first downloads the current model); then either the
server averages the participants and broadcasts to them, or, for server-less methods, every
client averages with its neighbours; on evaluated rounds (`eval_every`, always the last) every
client is scored (a client that missed broadcasts as it would start its next round), each
distinct model once: the model after local training is scored again after the communication step
only if that step changed it, and a personalized model that is the broadcast state is not scored
a second time (`_Snapshot`); `eval_models = "acc"` scores only the model reported as `acc`.
Traffic is counted per client, up and down separately. Unseen clients (`unseen_clients`, `unseen_domains`)
never take part; after the last round each joins as a newcomer and is scored (`_newcomer`), in
rows marked `pool = "unseen"` that no seen-client mean includes.

The whole state (server model, every client's state and mask, rounds done) is a plain dict of
tensors (`state_dict`), so a run can be checkpointed between rounds and restored; batch orders
are derived from (seed, round, client), so a restored run continues bit-identically on CPU.
"""
from __future__ import annotations

import os
import time
import weakref
from collections.abc import Iterator
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, NamedTuple

import torch

from .algorithms import get_algorithm
from .algorithms.base import ClientInfo, Traffic
from .checkpoints import torch_save_atomic
from .client_state import ClientState
from .config import ConfigError, RunConfig
from .data import ClientData, FederatedData, load_data
from .data.catalog import input_shape_of
from .models import load_init_weights, resolve_model_name
from .results import STANDARD_CLIENT_COLUMNS, client_mean, client_std
from .training import LocalTrainer, SGDSettings, derive_seed, read_state

STATE_FORMAT = 2
NAN = float("nan")


@dataclass(frozen=True)
class ClientRound:
    """One client's numbers at the end of one round (accuracies are NaN on rounds that are not
    evaluated; loss and the method's metrics are NaN for clients that did not take part)."""

    client: int
    participated: bool
    acc_local: float        # after local training, before the communication step
    acc_global: float       # after the communication step
    acc: float              # the algorithm's personalized accuracy (one of the above, or its own model)
    acc_val: float          # the personalized model on the client's validation split (NaN without one)
    acc_val_global: float   # the model after the communication step on that split (before any fine-tuning)
    loss: float             # mean training loss over this round's local passes
    n_train: int
    n_val: int
    n_test: int
    personal_fraction: float
    bytes_up: int
    bytes_down: int
    seconds: float          # local training and evaluation of this client
    metrics: dict[str, float] = field(default_factory=dict)  # the method's own (LocalStats.metrics)
    pool: str = "seen"      # "unseen": held out of training, scored as a newcomer after the last round

    def row(self) -> dict[str, Any]:
        out = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "metrics"}
        return out | self.metrics


@dataclass(frozen=True)
class RoundResult:
    round: int              # 1-based
    clients: list[ClientRound]
    seconds: float          # wall time of the whole round
    evaluated: bool = True  # accuracies were measured this round (`eval_every`; always the last)
    lr: float = NAN         # the local learning rate of this round

    def mean(self, metric: str, pool: str = "seen") -> float:
        """Unweighted mean over the pool's clients, as the papers report (NaN entries skipped)."""
        return client_mean([getattr(c, metric) for c in self.clients if c.pool == pool])

    def std(self, metric: str) -> float:
        return client_std([getattr(c, metric) for c in self.clients if c.pool == "seen"])

    def rows(self) -> list[dict[str, Any]]:
        """One dict per client: the round, its `ClientRound` fields and the method's metrics."""
        return [{"round": self.round} | c.row() for c in self.clients]


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise ConfigError("device='cuda' was requested but torch sees no CUDA device; use cpu or auto")
    return torch.device(name)


class Simulation:
    """One federated run. `profiles` (optional) gives each client's capability profile (e.g.
    PerFedMask's budget), which the algorithm's `setup` sees with the clients' sizes."""

    def __init__(self, config: RunConfig, data: FederatedData | None = None,
                 profiles: list[dict[str, float]] | None = None) -> None:
        self.config = config
        if config.threads:
            torch.set_num_threads(config.threads)
        self.device = resolve_device(config.device)
        if config.init_weights is not None and not Path(config.init_weights).expanduser().is_file():
            raise ConfigError(f"init_weights={config.init_weights!r}: no such file")  # before loading any data
        if config.pretrained:  # a missing or mismatched pretraining fails here, before any data is loaded
            from .checkpoints import read_pretrained
            read_pretrained(config, resolve_model_name(config.model, input_shape_of(config.dataset, config.image_size)))
        data = load_data(config) if data is None else data
        if len(data.clients) != config.num_clients:
            raise ConfigError(f"data has {len(data.clients)} clients but num_clients={config.num_clients}")
        if profiles is not None and len(profiles) != config.num_clients:
            raise ConfigError(f"{len(profiles)} capability profiles for {config.num_clients} clients")
        self.data = data.to(self.device)
        self.model_name = resolve_model_name(config.model, data.input_shape)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(derive_seed(config.seed, "init"))
            model = get_algorithm(config.algorithm).build_model(config, self.model_name, data.input_shape,
                                                                 data.num_classes)
        if config.init_weights is not None:  # every client and the server start from these weights
            load_init_weights(model, config.init_weights)
        if config.pretrained:
            from .checkpoints import load_pretrained
            load_pretrained(config, self.model_name, model)
        model.to(self.device)
        sgd = SGDSettings(lr=config.lr, batch_size=config.batch_size, momentum=config.momentum,
                          weight_decay=config.weight_decay)
        self.trainer = LocalTrainer(model, sgd)
        self.algorithm = get_algorithm(config.algorithm)(config, self.trainer, self.model_name)
        infos = [ClientInfo(k=k, n_train=d.n_train, n_val=d.n_val, n_test=d.n_test,
                            train_label_hist=data.train_hist[k], profile=dict(profiles[k]) if profiles else {},
                            seen=k not in data.unseen)
                 for k, d in enumerate(self.data.clients)]
        self.clients: list[ClientState] = self.algorithm.setup(read_state(model), infos)
        self.synced = [True] * config.num_clients  # client holds the latest broadcast
        self.completed = 0

    # ---------------------------------------------------------------- the loop
    def run(self) -> Iterator[RoundResult]:
        """Run the remaining rounds, yielding after each."""
        while self.completed < self.config.rounds:
            yield self.run_round()

    def run_round(self) -> RoundResult:
        rnd = self.completed + 1
        algo, clients, data = self.algorithm, self.clients, self.data.clients
        n = len(clients)
        start = time.perf_counter()
        participants = algo.participants(rnd)
        taking_part = set(participants)
        evaluate = rnd % self.config.eval_every == 0 or rnd == self.config.rounds
        seconds, up, down = [0.0] * n, [0] * n, [0] * n
        losses, metrics, after_local = {}, {}, {}
        graph = algo.neighbours(rnd, participants) if algo.communicates else None  # asked once per round
        server = algo.communicates and graph is None
        only_acc = self.config.eval_models == "acc"  # score only the model reported as acc
        score_local = not only_acc or algo.acc_from == "local"
        for k in participants:
            t0 = time.perf_counter()
            client, d = clients[k], data[k]
            if server and not self.synced[k]:  # missed broadcasts: download the current model first
                down[k] += download(algo, client)
                self.synced[k] = True
            stats = algo.local_update(k, client, d, rnd)
            losses[k] = stats.loss_sum / stats.samples if stats.samples else torch.full_like(stats.loss_sum, NAN)  # no training
            metrics[k] = _checked_metrics(algo.name, stats.metrics | algo.training_cost(k, self.data.input_shape))
            if evaluate and score_local:
                after_local[k] = self._scores(client.state, d), _Snapshot(client.state)
            seconds[k] += time.perf_counter() - t0

        aggregated = algo.communicates and algo.aggregates_in(rnd)
        if aggregated:
            traffic = self._communicate(rnd, participants, graph)
            for k, b_up, b_down in zip(traffic.clients, traffic.up, traffic.down):
                up[k] += b_up
                down[k] += b_down

        loss_values = dict(zip(losses, torch.stack(list(losses.values())).tolist())) if losses else {}
        results = []
        for k, (client, d) in enumerate(zip(clients, data)):
            if k in self.data.unseen:
                results.append(self._newcomer(k, rnd))
                continue
            t0 = time.perf_counter()
            acc_local = acc_global = acc = acc_val = val_local = val_global = NAN
            if evaluate:
                scored = None  # the model last scored, and its scores
                if k in after_local or score_local:
                    (acc_local, val_local), scored = (after_local[k] if k in after_local
                                                      else (self._scores(client.state, d), _Snapshot(client.state)))
                    scores = acc_local, val_local
                # A client that missed broadcasts is evaluated as it would start its next round.
                current = client if self.synced[k] or not server else _caught_up(algo, client)
                # One pass where the communication step left the scored model as it was (a method
                # that broadcasts no weights to this client: FedL2P's second stage, Local, ...).
                if scored is not None and scored.holds(current.state):
                    acc_global, val_global = acc_local, val_local
                elif not only_acc or algo.acc_from == "global":
                    scored = _Snapshot(current.state)
                    acc_global, val_global = scores = self._scores(current.state, d)
                if algo.acc_from == "custom":
                    chosen = algo.personalized_model(k, current, d, rnd)
                    # the model just scored (FedProx and the FT family at 0 epochs): no second pass
                    acc, acc_val = (scores if isinstance(chosen, dict) and scored is not None and scored.holds(chosen)
                                    else self._scores(chosen, d))
                else:
                    acc, acc_val = (acc_local, val_local) if algo.acc_from == "local" else (acc_global, val_global)
                metrics[k] = metrics.get(k, {}) | _checked_metrics(algo.name, algo.evaluation_metrics(k, current, d))
            seconds[k] += time.perf_counter() - t0
            results.append(ClientRound(
                client=k, participated=k in taking_part, acc_local=acc_local, acc_global=acc_global, acc=acc,
                acc_val=acc_val, acc_val_global=val_global, loss=loss_values.get(k, NAN), n_train=d.n_train,
                n_val=d.n_val, n_test=d.n_test,
                personal_fraction=algo.personal_fraction(client), bytes_up=up[k], bytes_down=down[k],
                seconds=seconds[k], metrics=metrics.get(k, {})))
        self.completed = rnd
        return RoundResult(round=rnd, clients=results, seconds=time.perf_counter() - start, evaluated=evaluate,
                           lr=self.config.lr_at(rnd))

    def _communicate(self, rnd: int, participants: list[int], graph: dict[int, list[int]] | None) -> "_Placed":
        """The communication step: the server's (participants only) or the neighbours' mixing."""
        algo, clients, data = self.algorithm, self.clients, self.data.clients
        if graph is not None:
            traffic = algo.mix_neighbours(clients, data, graph, rnd)
            return _Placed(list(range(len(clients))), traffic.up, traffic.down)
        placed, placed_data = [clients[k] for k in participants], [data[k] for k in participants]
        traffic = algo.aggregate(placed, placed_data, rnd)
        stats = algo.share_statistics(placed, placed_data)  # bn_stats = "global": BatchNorm's running statistics
        taking_part = set(participants)
        self.synced = [k in taking_part for k in range(len(clients))]
        return _Placed(participants, [b + stats for b in traffic.up], [b + stats for b in traffic.down])

    def _newcomer(self, k: int, rnd: int) -> ClientRound:
        """An unseen client's row: nothing before the last round; after it, the client joins as a
        seen one would run a round (receive the broadcast, the method's local update, the
        broadcast's shared parts again where the method evaluates after it) without its update
        reaching anyone, and is scored on its own test data. Its stored state is left as it was."""
        algo, d, client = self.algorithm, self.data.clients[k], self.clients[k]
        if rnd < self.config.rounds:
            return ClientRound(client=k, participated=False, acc_local=NAN, acc_global=NAN, acc=NAN, acc_val=NAN,
                               acc_val_global=NAN, loss=NAN, n_train=d.n_train, n_val=d.n_val, n_test=d.n_test,
                               personal_fraction=algo.personal_fraction(client), bytes_up=0, bytes_down=0,
                               seconds=0.0, pool="unseen")
        t0 = time.perf_counter()
        joined = ClientState(state=dict(client.state), mask=None if client.mask is None else client.mask.copy(),
                             extra=dict(client.extra))
        down = 0
        if algo.communicates:
            down = download(algo, joined)
        stats = algo.local_update(k, joined, d, rnd)
        acc_local, val_local = self._scores(joined.state, d)
        acc_global, val_global = acc_local, val_local
        if algo.communicates and algo.acc_from != "local":
            download(algo, joined)
            acc_global, val_global = self._scores(joined.state, d)
        if algo.acc_from == "custom":
            acc, acc_val = self._scores(algo.personalized_model(k, joined, d, rnd), d)
        else:
            acc, acc_val = (acc_local, val_local) if algo.acc_from == "local" else (acc_global, val_global)
        return ClientRound(client=k, participated=False, acc_local=acc_local, acc_global=acc_global, acc=acc,
                           acc_val=acc_val, acc_val_global=val_global,
                           loss=float(stats.loss_sum) / stats.samples if stats.samples else NAN, n_train=d.n_train,
                           n_val=d.n_val, n_test=d.n_test, personal_fraction=algo.personal_fraction(joined),
                           bytes_up=0, bytes_down=down, seconds=time.perf_counter() - t0,
                           metrics=_checked_metrics(algo.name, stats.metrics | algo.evaluation_metrics(k, joined, d)),
                           pool="unseen")

    def _scores(self, model, d: ClientData) -> tuple[float, float]:
        """(test accuracy, validation accuracy or NaN) of a state or predictor on client data."""
        acc = self.trainer.evaluate(model, d.x_test, d.y_test) / d.n_test
        val = self.trainer.evaluate(model, d.x_val, d.y_val) / d.n_val if d.n_val else NAN
        return acc, val

    def final_model(self) -> dict[str, torch.Tensor]:
        """The model this run hands to a second stage (`fl_core.checkpoints.server_model`)."""
        from .checkpoints import server_model
        seen = [c.state for k, c in enumerate(self.clients) if k not in self.data.unseen]
        return server_model(self.algorithm.global_state, seen,
                            self.algorithm.shared_names() + self.algorithm.statistic_names)

    # ---------------------------------------------------------------- save / restore
    def state_dict(self) -> dict[str, Any]:
        return {
            "format": STATE_FORMAT,
            "config_hash": self.config.config_hash(),
            "completed": self.completed,
            "synced": list(self.synced),
            "algorithm": self.algorithm.state_dict(),
            "clients": [c.to_dict() for c in self.clients],
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state.get("format") != STATE_FORMAT:
            raise ConfigError(f"simulation state format {state.get('format')!r} is not {STATE_FORMAT}")
        if state["config_hash"] != self.config.config_hash():
            raise ConfigError(f"the saved state belongs to config {state['config_hash']}, "
                              f"not to this run's config {self.config.config_hash()}")
        to_device = lambda obj: _map_tensors(obj, lambda t: t.to(self.device))
        self.algorithm.load_state_dict(to_device(state["algorithm"]))
        self.clients = [ClientState.from_dict(to_device(c)) for c in state["clients"]]
        self.completed = state["completed"]
        self.synced = list(state["synced"])

    def save(self, path: str | os.PathLike, **extra: Any) -> None:
        """Write the state (plus any small `extra` values) atomically: temp file, then rename."""
        torch_save_atomic(self.state_dict() | {"extra": extra}, path)

    def restore(self, path: str | os.PathLike) -> dict[str, Any]:
        """Load a state written by `save`; returns its `extra` values."""
        state = torch.load(path, map_location="cpu", weights_only=True)
        self.load_state_dict(state)
        return state.get("extra", {})


def _map_tensors(obj: Any, fn) -> Any:
    if isinstance(obj, torch.Tensor):
        return fn(obj)
    if isinstance(obj, dict):
        return {k: _map_tensors(v, fn) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_map_tensors(v, fn) for v in obj]
    return obj


class _Placed(NamedTuple):
    """Traffic of a communication step placed on client indices."""

    clients: list[int]
    up: list[int]
    down: list[int]


class _Snapshot:
    """Which tensors a state held when it was scored, and at which in-place version each, held
    weakly (a snapshot keeps no model alive): `holds(state)` is true while `state` holds exactly
    those tensors, none modified in place since (then its scores are still the state's)."""

    def __init__(self, state: dict[str, torch.Tensor]) -> None:
        self.refs = {n: (weakref.ref(t), t._version) for n, t in state.items()}

    def holds(self, state: dict[str, torch.Tensor]) -> bool:
        return state.keys() == self.refs.keys() and all(
            ref() is state[n] and state[n]._version == version for n, (ref, version) in self.refs.items())


def _caught_up(algo, client: ClientState) -> ClientState:
    """A copy of `client` after receiving the current broadcast (the client itself is unchanged)."""
    copy = ClientState(state=dict(client.state), mask=client.mask, extra=dict(client.extra))
    download(algo, copy)
    return copy


def download(algo, client: ClientState) -> int:
    """The client takes the server's current broadcast: the shared parameters (`receive`) and,
    under bn_stats = "global", the running statistics. Returns the bytes it received."""
    algo.receive(client)
    algo.receive_statistics(client)
    return algo.sent_bytes(client) + algo.statistics_bytes()


def _checked_metrics(method: str, metrics: dict[str, float]) -> dict[str, float]:
    clash = sorted(set(metrics) & STANDARD_CLIENT_COLUMNS)
    if clash:
        raise ValueError(f"{method} reports metric(s) {', '.join(clash)} that clash with standard result columns")
    return {k: float(v) for k, v in metrics.items()}
