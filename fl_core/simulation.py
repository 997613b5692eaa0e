"""The round loop: `Simulation(config).run()` yields one `RoundResult` per round.

The whole state (server model, every client's state and mask, rounds done) is a plain dict of
tensors (`state_dict`), so a run can be checkpointed between rounds and restored; batch orders
are derived from (seed, round, client), so a restored run continues bit-identically on CPU.
"""
from __future__ import annotations

import io
import os
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from .algorithms import ClientState, get_algorithm
from .config import ConfigError, RunConfig
from .data import FederatedData, build_federated_data
from .models import build_model, resolve_model_name
from .training import LocalTrainer, SGDSettings, derive_seed, read_state

STATE_FORMAT = 1


@dataclass(frozen=True)
class ClientRound:
    """One client's numbers at the end of one round."""

    client: int
    acc_local: float        # after local training, before the broadcast
    acc_global: float       # after the broadcast
    acc: float              # the algorithm's personalized accuracy (one of the above, or its own model)
    loss: float             # mean training loss over this round's local passes
    n_train: int
    n_test: int
    personal_fraction: float
    bytes_up: int
    bytes_down: int
    seconds: float          # local training and evaluation of this client


@dataclass(frozen=True)
class RoundResult:
    round: int              # 1-based
    clients: list[ClientRound]
    seconds: float          # wall time of the whole round

    def mean(self, metric: str) -> float:
        """Unweighted mean over clients, as the papers report."""
        return sum(getattr(c, metric) for c in self.clients) / len(self.clients)

    def weighted_acc(self) -> float:
        """Test-sample-weighted mean accuracy (reported alongside the unweighted mean)."""
        return sum(c.acc * c.n_test for c in self.clients) / sum(c.n_test for c in self.clients)

    def std(self, metric: str) -> float:
        values = torch.tensor([getattr(c, metric) for c in self.clients], dtype=torch.float64)
        return float(values.std(unbiased=False))


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise ConfigError("device='cuda' was requested but torch sees no CUDA device; use cpu or auto")
    return torch.device(name)


def load_data(config: RunConfig) -> FederatedData:
    """Load and partition the config's data setting (on CPU)."""
    return build_federated_data(
        dataset=config.dataset, num_clients=config.num_clients, partition=config.partition,
        seed=config.seed, shards_per_client=config.shards_per_client, dir_alpha=config.dir_alpha,
        samples_per_client=config.samples_per_client,
        test_samples_per_client=config.test_samples_per_client, min_samples=config.min_samples,
        data_root=config.data_root, download=config.download)


class Simulation:
    def __init__(self, config: RunConfig, data: FederatedData | None = None) -> None:
        self.config = config
        if config.threads:
            torch.set_num_threads(config.threads)
        self.device = resolve_device(config.device)
        data = load_data(config) if data is None else data
        if len(data.clients) != config.num_clients:
            raise ConfigError(f"data has {len(data.clients)} clients but num_clients={config.num_clients}")
        self.data = data.to(self.device)
        self.model_name = resolve_model_name(config.model, data.input_shape)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(derive_seed(config.seed, "init"))
            model = build_model(self.model_name, data.input_shape, data.num_classes)
        model.to(self.device)
        sgd = SGDSettings(lr=config.lr, batch_size=config.batch_size, momentum=config.momentum,
                          weight_decay=config.weight_decay)
        self.trainer = LocalTrainer(model, sgd)
        self.algorithm = get_algorithm(config.algorithm)(config, self.trainer, self.model_name)
        self.clients: list[ClientState] = self.algorithm.setup(read_state(model), config.num_clients)
        self.completed = 0

    # ---------------------------------------------------------------- the loop
    def run(self) -> Iterator[RoundResult]:
        """Run the remaining rounds, yielding after each."""
        while self.completed < self.config.rounds:
            yield self.run_round()

    def run_round(self) -> RoundResult:
        rnd = self.completed + 1
        algo, trainer, clients, data = self.algorithm, self.trainer, self.clients, self.data.clients
        start = time.perf_counter()
        seconds = [0.0] * len(clients)
        local_correct, losses = [], []
        for k, (client, d) in enumerate(zip(clients, data)):
            t0 = time.perf_counter()
            stats = algo.local_update(k, client, d, rnd)
            losses.append(stats.loss_sum / max(stats.samples, 1))
            local_correct.append(trainer.evaluate(client.state, d.x_test, d.y_test))
            seconds[k] += time.perf_counter() - t0

        aggregated = algo.aggregates_in(rnd)
        sent = algo.aggregate(clients, data, rnd) if aggregated else [0] * len(clients)

        results = []
        loss_values = torch.stack(losses).tolist()  # one host sync for all clients' losses
        for k, (client, d) in enumerate(zip(clients, data)):
            t0 = time.perf_counter()
            acc_local = local_correct[k] / d.n_test
            acc_global = trainer.evaluate(client.state, d.x_test, d.y_test) / d.n_test if aggregated else acc_local
            if algo.acc_from == "custom":
                acc = trainer.evaluate(algo.personalized_state(k, client, d, rnd), d.x_test, d.y_test) / d.n_test
            else:
                acc = acc_local if algo.acc_from == "local" else acc_global
            seconds[k] += time.perf_counter() - t0
            results.append(ClientRound(
                client=k, acc_local=acc_local, acc_global=acc_global, acc=acc, loss=loss_values[k],
                n_train=d.n_train, n_test=d.n_test, personal_fraction=algo.personal_fraction(client),
                bytes_up=sent[k], bytes_down=sent[k], seconds=seconds[k]))
        self.completed = rnd
        return RoundResult(round=rnd, clients=results, seconds=time.perf_counter() - start)

    # ---------------------------------------------------------------- save / restore
    def state_dict(self) -> dict[str, Any]:
        return {
            "format": STATE_FORMAT,
            "config_hash": self.config.config_hash(),
            "completed": self.completed,
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

    def save(self, path: str | os.PathLike, **extra: Any) -> None:
        """Write the state (plus any small `extra` values) atomically: temp file, then rename."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        buffer = io.BytesIO()
        torch.save(self.state_dict() | {"extra": extra}, buffer)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        tmp.write_bytes(buffer.getvalue())
        os.replace(tmp, path)

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


def client_round_dict(result: RoundResult) -> list[dict[str, Any]]:
    return [{"round": result.round, **asdict(c)} for c in result.clients]
