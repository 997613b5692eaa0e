"""FedAvg+FT — FedAvg, then each client fine-tunes the global model on its own data before it is
evaluated (the fine-tuning baseline of e.g. Yu et al. 2020, "Salvaging Federated Learning by
Local Adaptation", and of the FedSelect paper, which does not state its fine-tuning protocol).

Evaluated per client: the broadcast global model after `ft_epochs` epochs of local SGD on all
parameters (`acc`); the same model before fine-tuning is `acc_global`. The fine-tuned copy is
only evaluated; federated training continues from the un-tuned global model.

Default protocol (`ft_epochs`, `ft_lr`, `ft_momentum` left at none): fine-tune for as many epochs
as a round's local update (`local_epochs`) with the training optimizer (`lr` of the round,
`momentum`). A fine-tuning budget below the local update's would hand FedAvg+FT less local
adaptation than every personalized method gets each round (with 1 epoch at lr 0.1 after 5-epoch
rounds, some digits clients collapse to one class: 0.912 vs 0.987 on 2 shards per client).

`weak_epochs` holds FedAvg+FT (and FedBABU, FedProx, FedNova) to the devices' limits of
PerFedMask's comparison: a device below full width runs ⌈E·f⌉ of the E local epochs
(fl_core/devices.py), as the PerFedMask authors run their full-model baselines.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from .. import models
from ..client_state import ClientState
from ..data import ClientData
from ..devices import WeakDeviceParams
from ..knobs import ConfigError, MethodParams, knob
from ..training import State, UpdateSpec
from .base import Algorithm, ClientInfo, LocalStats, Scored


@dataclass(frozen=True)
class FineTuneParams(MethodParams):
    """Fine-tuning before evaluation. None = the method's own protocol (see its file)."""

    ft_epochs: int | None = knob(None, "fine-tuning epochs before each evaluation (none: the method's protocol, "
                                 "FedAvg+FT local_epochs, FedBABU max(5, local_epochs))", low=0)
    ft_lr: float | None = knob(None, "fine-tuning learning rate (none: FedAvg+FT the round's lr, FedBABU 0.001)",
                               low=0, low_open=True)
    ft_momentum: float | None = knob(None, "fine-tuning SGD momentum (none: FedAvg+FT the training momentum, "
                                     "FedBABU 0.9)", low=0, high=1, high_open=True)


@dataclass(frozen=True)
class FineTuneProtocol:
    """A method's fine-tuning defaults; `resolve` fills the knobs left at None."""

    min_epochs: int = 0            # epochs at least (on top of matching local_epochs)
    epochs: int | None = None      # a fixed number instead (PerFedMask: 5; 0: acc is the un-tuned model)
    lr: float | None = None        # None: the round's scheduled training lr
    momentum: float | None = None  # None: the training momentum

    def resolve(self, params: FineTuneParams, local_epochs: int) -> tuple[int, float | None, float | None]:
        """(epochs, lr or None for the round's lr, momentum or None for the training one)."""
        epochs = params.ft_epochs
        if epochs is None:
            epochs = max(self.min_epochs, local_epochs) if self.epochs is None else self.epochs
        lr = self.lr if params.ft_lr is None else params.ft_lr
        momentum = self.momentum if params.ft_momentum is None else params.ft_momentum
        return epochs, lr, momentum


@dataclass(frozen=True)
class LimitedFineTuneParams(FineTuneParams, WeakDeviceParams):
    """Fine-tuning, and the devices' limits on the local epochs (PerFedMask's full-model baselines)."""


class FineTuning(Algorithm):
    """Shared by the methods that fine-tune a copy of the client's model for evaluation."""

    Params = FineTuneParams
    device_ratios: list[float] | None = None  # each device's width ratio, under `weak_epochs` only
    acc_from = Scored.CUSTOM
    evaluates = "fine-tuned copy (acc_global: before fine-tuning)"
    protocol = FineTuneProtocol()
    reports_cost = True  # PerFedMask's tables compare the fine-tuned methods' trainable parameters and FLOPs

    def setup(self, init: State, clients: Sequence[ClientInfo]) -> list[ClientState]:
        limits = self.params if isinstance(self.params, WeakDeviceParams) else None
        self.device_ratios = (limits.ratios(len(clients), [info.profile for info in clients])
                              if limits is not None and limits.weak_epochs is not None else None)
        return super().setup(init, clients)

    def epochs_of(self, k: int, rnd: int) -> int:
        """Client k's local epochs in round `rnd`: `local_epochs`, or fewer on a device below full
        width under `weak_epochs` (fl_core/devices.py)."""
        if self.device_ratios is None:
            return self.config.local_epochs
        return self.params.epochs(self.config.local_epochs, self.device_ratios[k])

    def device_metrics(self, k: int, epochs: int) -> dict[str, float]:
        """Under `weak_epochs`, each row's device: its width `ratio` and the local epochs it ran."""
        if self.device_ratios is None:
            return {}
        return {"ratio": self.device_ratios[k], "epochs_run": float(epochs)}

    def local_update(self, k: int, client: ClientState, data: ClientData, rnd: int) -> LocalStats:
        return self.limited_update(k, client, data, rnd, self.full_update())

    def limited_update(self, k: int, client: ClientState, data: ClientData, rnd: int, update: UpdateSpec,
                       **options) -> LocalStats:
        """`epochs_of(k, rnd)` epochs changing `update`, the device's metrics in the rows."""
        epochs = self.epochs_of(k, rnd)
        stats = self.run_epochs(k, client, data, rnd, epochs, update, **options)
        stats.metrics |= self.device_metrics(k, epochs)
        return stats

    def fine_tuned_entries(self, k: int) -> UpdateSpec:
        """What fine-tuning changes: every parameter (HeteroFL: the client's slice)."""
        return self.full_update()

    def fine_tune_options(self, k: int) -> dict:
        """Extra `train_pass` options of client k's fine-tuning (Split-Mix: its bases' loss)."""
        return {}

    def fine_tune_settings(self) -> tuple[int, float | None, float | None]:
        return self.protocol.resolve(self.params, self.config.local_epochs)

    def personalized_model(self, k: int, client: ClientState, data: ClientData, rnd: int) -> State:
        return self.fine_tuned(k, client, data, rnd, self.fine_tuned_entries(k), self.fine_tune_options(k))

    def fine_tuned(self, k: int, client: ClientState, data: ClientData, rnd: int, entries: UpdateSpec,
                   extra: dict) -> State:
        """A copy of `client`'s model after fine-tuning `entries` (`extra`: more `train_pass` options)."""
        epochs, lr, momentum = self.fine_tune_settings()
        if epochs == 0:  # the un-tuned model (PerFedMask's baselines unless a study fine-tunes them)
            return client.state
        tuned = ClientState(state=dict(client.state))  # train_pass returns new tensors: no aliasing
        options = {"momentum": self.config.momentum if momentum is None else momentum}
        if lr is not None:  # else the round's scheduled training lr
            options["lr"] = lr
        self.run_epochs(k, tuned, data, rnd, epochs, entries, purpose="finetune", **options, **extra)
        return tuned.state


class WidthScoring(FineTuning):
    """A method whose devices train sub-models of one global model (HeteroFL's slices, Split-Mix's
    bases), scored by default at the device's own width. Under `score_width = "full"` (the
    PerFedMask authors' scoring of both) `acc` is the full-width global model fine-tuned whole,
    and the device's own fine-tuned sub-model is the row's `acc_device`; `acc_global` stays the
    device's sub-model before fine-tuning. A full-width model with BatchNorm would score channels
    whose running statistics no device gathered for it (the authors gather static statistics
    after training): a ConfigError."""

    def __init__(self, config, trainer, model_name: str) -> None:
        super().__init__(config, trainer, model_name)
        self.device_scores: dict[int, float] = {}
        if self.params.score_width == "full" and model_name in models.RUNNING_STATS_MODELS:
            raise ConfigError(f"score_width='full' is not allowed with model {model_name!r}: its BatchNorm running "
                              f"statistics of the channels outside a device's width were never gathered; use a "
                              f"model without BatchNorm (e.g. lenet) or score_width='device'")

    def full_width(self, client: ClientState) -> tuple[ClientState, UpdateSpec, dict]:
        """The full-width global model as client `client` would hold it, what fine-tuning it
        changes, and its extra `train_pass` options."""
        raise NotImplementedError

    def personalized_model(self, k: int, client: ClientState, data: ClientData, rnd: int) -> State:
        device = super().personalized_model(k, client, data, rnd)
        if self.params.score_width == "device":
            return device
        self.device_scores[k] = self.trainer.evaluate(device, data.x_test, data.y_test) / data.n_test
        full, entries, extra = self.full_width(client)
        return self.fine_tuned(k, full, data, rnd, entries, extra)

    def evaluation_metrics(self, k: int, client: ClientState, data: ClientData) -> dict[str, float]:
        return {"acc_device": self.device_scores.pop(k)} if k in self.device_scores else {}


class FedAvgFT(FineTuning):
    name = "fedavg_ft"
    display = "FedAvg+FT"
    Params = LimitedFineTuneParams
    default_bn_stats = "global"  # FedAvg's global model, statistics included, is what is fine-tuned
