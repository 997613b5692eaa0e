"""The round loop: `Simulation(config).run()` yields one `RoundResult` per round.

A round (hooks in fl_core/algorithms/base.py): the algorithm picks the participants; each trains
locally (a participant that missed broadcasts first downloads the current model); then either the
server averages the participants and broadcasts to them, or, for server-less methods, every
client averages with its neighbours; on evaluated rounds (`eval_every`, always the last) every
client is scored (a client that missed broadcasts as it would start its next round), each
distinct model once (`_evaluate`): the model after local training is scored again after the
communication step only if that step changed it (the step says whose models it changed: the
participants its broadcast wrote into, `broadcasts_model`, or every client that mixed with
neighbours), and a personalized model that is the very state just scored is not scored a second
time; `eval_models = "acc"` scores only the model reported as `acc`. Traffic is counted per
client, up and down separately. Unseen clients (`unseen_clients`, `unseen_domains`) never take
part; after the last round each joins as a newcomer and is scored (`_newcomer`), in rows marked
`pool = "unseen"` that no seen-client mean includes.

The whole state (server model, every client's state and mask, rounds done) is a plain dict of
tensors (`state_dict`), so a run can be checkpointed between rounds and restored; batch orders
are derived from (seed, round, client), so a restored run continues bit-identically on CPU.
"""
from __future__ import annotations

import os
import time
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, NamedTuple

import torch

from .algorithms import get_algorithm
from .algorithms.base import ClientInfo, Scored
from .checkpoints import torch_save_atomic
from .kernels import settle_cuda, slow_bf16
from .client_state import ClientState
from .config import ConfigError, RunConfig
from .data import ClientData, FederatedData, load_data
from .data.catalog import input_shape_of
from .models import load_init_weights, resolve_model_name
from .results import STANDARD_CLIENT_COLUMNS, client_mean, client_std
from .training import LocalTrainer, SGDSettings, derive_seed, precision_scope, read_state

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

    # False: score every model afresh, never reusing the scores of a model that did not change
    # (the check that reusing them changes no number: tests/test_method_contract.py).
    reuse_scores: bool = True

    def __init__(self, config: RunConfig, data: FederatedData | None = None,
                 profiles: list[dict[str, float]] | None = None) -> None:
        self.config = config
        if config.threads:
            torch.set_num_threads(config.threads)
        self.device = resolve_device(config.device)
        settle_cuda(self.device)  # the reproducible mode on a GPU (fl_core/kernels.py); nothing on the CPU
        if config.precision == "bf16" and (why := slow_bf16(self.device)):
            warnings.warn(f"precision=bf16 runs emulated here, several times slower than fp32: {why}", stacklevel=2)
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
        """One round in three steps: the participants train (`_train`), the communication step
        runs (`_communicate`, which says whose models it changed), and every client is scored on
        evaluated rounds (`_client_round`; unseen clients: `_newcomer`), all under the `precision`
        knob's scope (`precision_scope`)."""
        start = time.perf_counter()
        plan = self._plan(self.completed + 1)
        work = _Work.empty(len(self.clients))
        with precision_scope(self.config.precision, self.device):
            self._train(plan, work)
            changed = self._communicate(plan, work)
            losses = dict(zip(work.losses, torch.stack(list(work.losses.values())).tolist())) if work.losses else {}
            results = [self._newcomer(k, plan.rnd) if k in self.data.unseen
                       else self._client_round(k, plan, work, k in changed, losses.get(k, NAN))
                       for k in range(len(self.clients))]
        self.completed = plan.rnd
        return RoundResult(round=plan.rnd, clients=results, seconds=time.perf_counter() - start,
                           evaluated=plan.evaluate, lr=self.config.lr_at(plan.rnd))

    def _plan(self, rnd: int) -> "_Plan":
        """Who takes part in round `rnd`, who averages with whom, and whether it is scored."""
        algo = self.algorithm
        participants = algo.participants(rnd)
        graph = algo.neighbours(rnd, participants) if algo.communicates else None  # asked once per round
        evaluate = rnd % self.config.eval_every == 0 or rnd == self.config.rounds
        return _Plan(rnd, participants, graph, algo.communicates and graph is None, evaluate)

    def _train(self, plan: "_Plan", work: "_Work") -> None:
        """The participants' local updates (a participant that missed broadcasts first downloads
        the current model), scored right after where the model after local training is reported."""
        algo, rnd = self.algorithm, plan.rnd
        for k in plan.participants:
            t0 = time.perf_counter()
            client, d = self.clients[k], self.data.clients[k]
            if plan.server and not self.synced[k]:
                work.down[k] += download(algo, client)
                self.synced[k] = True
            stats = algo.local_update(k, client, d, rnd)
            work.losses[k] = (stats.loss_sum / stats.samples if stats.samples
                              else torch.full_like(stats.loss_sum, NAN))  # no training
            work.metrics[k] = _checked_metrics(algo.name, stats.metrics | algo.training_cost(k, self.data.input_shape))
            if plan.evaluate and self._scores_local():
                work.after_local[k] = self._scores(client.state, d)
            work.seconds[k] += time.perf_counter() - t0

    def _communicate(self, plan: "_Plan", work: "_Work") -> set[int]:
        """The communication step, where the method runs one this round: the server's (over the
        participants) or the neighbours' mixing. Adds its traffic to `work`; returns the clients
        whose models it changed: the participants the broadcast wrote into, or every client that
        mixed with neighbours."""
        algo, clients, data = self.algorithm, self.clients, self.data.clients
        if not (algo.communicates and algo.aggregates_in(plan.rnd)):
            return set()
        if plan.graph is not None:
            traffic = algo.mix_neighbours(clients, data, plan.graph, plan.rnd)
            work.add_traffic(range(len(clients)), traffic.up, traffic.down)
            return set(plan.graph)
        placed, placed_data = [clients[k] for k in plan.participants], [data[k] for k in plan.participants]
        traffic = algo.aggregate(placed, placed_data, plan.rnd)
        stats = algo.share_statistics(placed, placed_data)  # bn_stats = "global": BatchNorm's running statistics
        work.add_traffic(plan.participants, [b + stats for b in traffic.up], [b + stats for b in traffic.down])
        taking_part = set(plan.participants)
        self.synced = [k in taking_part for k in range(len(clients))]
        return taking_part if self._broadcast_changes_models() else set()

    def _broadcast_changes_models(self) -> bool:
        """Whether receiving the server's broadcast changes a client's model (not for FedL2P,
        whose broadcast is λ alone, unless BatchNorm statistics are shared)."""
        return self.algorithm.broadcasts_model or self.algorithm.statistics_bytes() > 0

    def _scores_local(self) -> bool:
        """Whether the model after local training is scored (`eval_models = "acc"`: only the
        model reported as `acc`)."""
        return self.config.eval_models != "acc" or self.algorithm.acc_from == Scored.LOCAL

    def _client_round(self, k: int, plan: "_Plan", work: "_Work", changed: bool, loss: float) -> ClientRound:
        """Seen client k's row: on evaluated rounds its scores (`_evaluate`); a client that missed
        broadcasts is scored as it would start its next round."""
        algo, client, d = self.algorithm, self.clients[k], self.data.clients[k]
        t0 = time.perf_counter()
        scores = _Scores.none()
        if plan.evaluate:
            local = work.after_local.get(k)
            if local is None and self._scores_local():
                local = self._scores(client.state, d)
            current = client
            if plan.server and not self.synced[k]:
                current, changed = _caught_up(algo, client), self._broadcast_changes_models()
            scores = self._evaluate(k, plan.rnd, local, current, changed, every_model=self.config.eval_models != "acc")
            own = _checked_metrics(algo.name, algo.evaluation_metrics(k, current, d))
            work.metrics[k] = work.metrics.get(k, {}) | own
        work.seconds[k] += time.perf_counter() - t0
        return ClientRound(
            client=k, participated=k in plan.participants, acc_local=scores.local[0], acc_global=scores.global_[0],
            acc=scores.acc[0], acc_val=scores.acc[1], acc_val_global=scores.global_[1], loss=loss,
            n_train=d.n_train, n_val=d.n_val, n_test=d.n_test, personal_fraction=algo.personal_fraction(client),
            bytes_up=work.up[k], bytes_down=work.down[k], seconds=work.seconds[k], metrics=work.metrics.get(k, {}))

    def _evaluate(self, k: int, rnd: int, local: tuple[float, float] | None, current: ClientState, changed: bool,
                  every_model: bool) -> "_Scores":
        """The one place that decides which models of client k are scored, each distinct model
        once. `local`: the scores of its model after local training (None: not scored);
        `current`: the client after the communication step, which `changed` its model or not;
        `every_model`: score the model after the communication step even where `acc` is another.
        The model after the communication step is scored again only if that step changed it, and a
        personalized model that is the very model just scored is not scored a second time."""
        algo, d = self.algorithm, self.data.clients[k]
        unscored = (NAN, NAN)
        reuse = self.reuse_scores and local is not None and not changed
        last = current.state if reuse else None  # the model whose scores are in hand
        global_ = local if last is not None else unscored
        if last is None and (every_model or algo.acc_from == Scored.GLOBAL):
            global_, last = self._scores(current.state, d), current.state
        if algo.acc_from == Scored.LOCAL:
            acc = local
        elif algo.acc_from == Scored.GLOBAL:
            acc = global_
        else:
            chosen = algo.personalized_model(k, current, d, rnd)
            just_scored = self.reuse_scores and last is not None and _same_model(chosen, last)
            acc = global_ if just_scored else self._scores(chosen, d)
        return _Scores(local or unscored, global_, acc)

    def _newcomer(self, k: int, rnd: int) -> ClientRound:
        """An unseen client's row: nothing before the last round; after it, the client joins as a
        seen one would run a round (receive the broadcast, the method's local update, the
        broadcast's shared parts again where the method evaluates after it) without its update
        reaching anyone, and is scored on its own test data (every model, whatever `eval_models`
        says). Its stored state is left as it was."""
        algo, d, client = self.algorithm, self.data.clients[k], self.clients[k]
        row = dict(client=k, participated=False, n_train=d.n_train, n_val=d.n_val, n_test=d.n_test, pool="unseen")
        if rnd < self.config.rounds:
            return ClientRound(acc_local=NAN, acc_global=NAN, acc=NAN, acc_val=NAN, acc_val_global=NAN, loss=NAN,
                               personal_fraction=algo.personal_fraction(client), bytes_up=0, bytes_down=0,
                               seconds=0.0, **row)
        t0 = time.perf_counter()
        joined = client.copy()
        down = download(algo, joined) if algo.communicates else 0
        stats = algo.local_update(k, joined, d, rnd)
        local = self._scores(joined.state, d)
        again = algo.communicates and algo.acc_from != Scored.LOCAL
        if again:
            download(algo, joined)
        scores = self._evaluate(k, rnd, local, joined, changed=again, every_model=True)
        return ClientRound(acc_local=scores.local[0], acc_global=scores.global_[0], acc=scores.acc[0],
                           acc_val=scores.acc[1], acc_val_global=scores.global_[1],
                           loss=float(stats.loss_sum) / stats.samples if stats.samples else NAN,
                           personal_fraction=algo.personal_fraction(joined), bytes_up=0, bytes_down=down,
                           seconds=time.perf_counter() - t0,
                           metrics=_checked_metrics(algo.name, stats.metrics | algo.evaluation_metrics(k, joined, d)),
                           **row)

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
        def to_device(obj: Any) -> Any:
            return _map_tensors(obj, lambda t: t.to(self.device))

        self.algorithm.load_state_dict(to_device(state["algorithm"]))
        self.clients = [ClientState.from_dict(to_device(c), self.algorithm.Extras) for c in state["clients"]]
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


class _Plan(NamedTuple):
    """Round `rnd`'s participants, its neighbour graph (None: a server, or no communication),
    whether a server runs it, and whether its clients are scored."""

    rnd: int
    participants: list[int]
    graph: dict[int, list[int]] | None
    server: bool
    evaluate: bool


@dataclass
class _Work:
    """What the steps of one round leave for its rows, per client: training losses (tensors,
    read in one go), metrics, seconds, traffic, and the scores after local training."""

    losses: dict[int, torch.Tensor]
    metrics: dict[int, dict[str, float]]
    seconds: list[float]
    up: list[int]
    down: list[int]
    after_local: dict[int, tuple[float, float]]

    @classmethod
    def empty(cls, n: int) -> "_Work":
        return cls({}, {}, [0.0] * n, [0] * n, [0] * n, {})

    def add_traffic(self, clients, up: list[int], down: list[int]) -> None:
        for k, b_up, b_down in zip(clients, up, down):
            self.up[k] += b_up
            self.down[k] += b_down


class _Scores(NamedTuple):
    """(test, validation) accuracies of a client's three reported models (NaN: not scored)."""

    local: tuple[float, float]
    global_: tuple[float, float]
    acc: tuple[float, float]

    @classmethod
    def none(cls) -> "_Scores":
        return cls((NAN, NAN), (NAN, NAN), (NAN, NAN))


def _same_model(chosen, state: dict[str, torch.Tensor]) -> bool:
    """Whether a personalized model is the state just scored: the very same tensors (FedProx and
    the FT family at 0 epochs hand the client's state back)."""
    return (isinstance(chosen, dict) and chosen.keys() == state.keys()
            and all(chosen[n] is t for n, t in state.items()))


def _caught_up(algo, client: ClientState) -> ClientState:
    """A copy of `client` after receiving the current broadcast (the client itself is unchanged)."""
    copy = ClientState(state=dict(client.state), mask=client.mask, extra=client.extra.copy())
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
