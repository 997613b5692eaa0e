"""FedALA — Zhang, Hua, Wang, Song, Xue, Ma, Guan, "FedALA: Adaptive Local Aggregation for
Personalized Federated Learning", AAAI 2023 (arXiv 2212.01197; authors' code
github.com/TsingZ0/FedALA).

Evaluated per client: its model after local training (`acc_local`, `acc_from = "local"`): the
model a client ends its round with and uploads, trained from its adaptive local aggregation (ALA)
of the global model. The authors' code scores each client's model right after ALA, before local
training (in serverALA.py `evaluate` follows `send_models`); that point is not reported here.
`acc_global` is the broadcast average θ_g (with the client's own BatchNorm statistics), the model
FedAvg reports as its `acc`.

The server is FedAvg's: it averages every parameter of the participants (`aggregation_weights`)
and broadcasts the average θ_g. A client does not overwrite its model with θ_g: on receiving it
keeps its last trained parameters θ_k (`client.extra.fedala_local`), and at the start of its
next local update builds its initial model by ALA:
  - the lower layers take θ_g as is;
  - the top p = `fedala_layers` layers take θ_k + (θ_g − θ_k) ⊙ W, with element-wise weights W
    (one per entry of those layers, `client.extra.fedala_w`, kept between rounds), initialised
    to 1 and learned on a random s = `fedala_rand_percent` % of the client's training samples
    (drawn anew each round, visited in batches of `batch_size`, the same order every epoch): per
    batch, with the cross-entropy L of the aggregated model,
        W ← clip(W − η · ∂L/∂θ ⊙ (θ_g − θ_k), 0, 1)    (η = `fedala_eta`; ∂L/∂W by the chain rule)
    The first time a client runs ALA, W is trained until the losses converge: after each epoch
    the loss of its last batch is recorded, and training stops once the standard deviation of
    the last `fedala_window` of them is below `fedala_threshold` (or after `fedala_max_epochs`
    epochs); every later round it is trained one epoch;
then trains all parameters for `local_epochs` epochs of plain local SGD, exactly as FedAvg.
Layers: the head, then the model's layer groups below it (`models.layer_groups`: each conv with
its BatchNorm, each hidden linear layer, each residual block), counted from the top.

In round 1 (nothing received yet) and whenever the top layers of θ_k and θ_g are equal, ALA is
skipped (the model is θ_g), as in the authors' code. The aggregated model is written as
θ_g − (θ_g − θ_k) ⊙ (1 − W), the same value, so that W = 1 gives θ_g exactly: with η = 0 (W stays
1) or p = 0 the run is FedAvg's, bit for bit. Traffic is FedAvg's: the model up and down.
Per client and round it reports `ala_epochs` (epochs of W training) and `ala_weight_mean`.

Paper defaults: p = 1 (the head; the authors' code counts parameter tensors, weight and bias of
the last layer), s = 80 %, η = 1.0, threshold 0.01 with the last 10 losses (the authors' README:
"we set it to 0.01 in our paper"; their module's default is 0.1). The cap on first-round epochs
(`fedala_max_epochs`, 100) is ours: the authors loop until convergence. Departures: the authors'
code samples a contiguous slice of the (unshuffled) training data at a random offset, we sample s %
of the samples at random; their code runs ALA for every client every round, here a client runs it
when it next takes part (with full participation, the same).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor, nn
from torch.nn import functional as F

from .. import models
from ..client_state import ClientExtras, ClientState
from ..config import RunConfig
from ..data import ClientData
from ..knobs import ConfigError, MethodParams, knob
from ..training import LocalTrainer, State, derive_seed
from .base import Algorithm, LocalStats, Scored


@dataclass(frozen=True)
class FedALAParams(MethodParams):
    fedala_layers: int = knob(1, "p, the number of top layers aggregated adaptively (the head = 1; 0 = every layer "
                              "takes the global model, i.e. FedAvg)", low=0)
    fedala_rand_percent: int = knob(80, "s, the percentage of the client's training samples the ALA weights learn on",
                                    low=1, high=100)
    fedala_eta: float = knob(1.0, "η, the step size of the ALA weights W", low=0)
    fedala_threshold: float = knob(0.01, "first ALA: stop when the std of the last fedala_window epoch losses is "
                                   "below this", low=0)
    fedala_window: int = knob(10, "how many recent epoch losses the first ALA's convergence test looks at", low=2)
    fedala_max_epochs: int = knob(100, "cap on the first ALA's epochs (ours; the paper trains until convergence)",
                                  low=1)


def model_layers(model_name: str, param_names: list[str]) -> list[list[str]]:
    """Parameter names per layer, bottom to top: the model's layer groups, then the head."""
    head = [n for n in param_names if models.is_head(model_name, n)]
    return [members for _, members in models.layer_groups(model_name, param_names)] + [head]


def ala_step(trainer: LocalTrainer, start: State, diff: State, weights: State, x: Tensor, y: Tensor,
             eta: float) -> tuple[State, Tensor]:
    """One step of the ALA weights on a batch: returns (clip(W − η ∂L/∂θ ⊙ (θ_g − θ_k), 0, 1), the
    batch loss). `start` is θ_g (the global model with the client's buffers), `diff` θ_g − θ_k of the
    adaptive tensors, `weights` their W."""
    record = []

    def loss_fn(model: nn.Module, xb: Tensor, yb: Tensor) -> Tensor:
        loss = F.cross_entropy(model(xb), yb)
        record.append(loss.detach())
        return loss

    grads = trainer.gradients(aggregated(start, diff, weights), x, y, list(weights), loss_fn=loss_fn)
    return {n: (w - eta * grads[n] * diff[n]).clamp_(0, 1) for n, w in weights.items()}, record[-1]


def aggregated(start: State, diff: State, weights: State) -> State:
    """θ_g with the adaptive tensors set to θ_g − (θ_g − θ_k) ⊙ (1 − W) = θ_k + (θ_g − θ_k) ⊙ W."""
    return start | {n: start[n] - diff[n] * (1 - w) for n, w in weights.items()}


@dataclass(slots=True, eq=False)
class FedALAExtras(ClientExtras):
    fedala_local: State | None = None  # θ_k: its parameters after its last local training
    fedala_w: State | None = None      # W: its learned aggregation weights, kept between rounds


class FedALA(Algorithm):
    name = "fedala"
    display = "FedALA"
    Params = FedALAParams
    Extras = FedALAExtras
    acc_from = Scored.LOCAL
    evaluates = ("its model after local training, started from its adaptive local aggregation "
                 "(acc_global: the FedAvg model)")

    @classmethod
    def build_model(cls, config: RunConfig, model_name: str, input_shape: tuple[int, int, int],
                    num_classes: int) -> nn.Module:
        model = super().build_model(config, model_name, input_shape, num_classes)
        layers = len(model_layers(model_name, [n for n, _ in model.named_parameters()]))
        if config.method.fedala_layers > layers:
            raise ConfigError(f"fedala_layers={config.method.fedala_layers} is outside the allowed range "
                              f"[0, {layers}]: model={model_name} has {layers} layers")
        return model

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        layers = model_layers(self.model_name, self.param_names)
        p = self.params.fedala_layers
        self.adaptive_names = [n for members in (layers[len(layers) - p:] if p else []) for n in members]

    def receive(self, client: ClientState) -> None:
        """Keep the trained parameters θ_k for ALA (unless it has not trained since the last
        broadcast), then take the broadcast θ_g."""
        if client.extra.fedala_local is None:
            client.extra.fedala_local = {n: client.state[n] for n in self.param_names}
        super().receive(client)

    def local_update(self, k: int, client: ClientState, data: ClientData, rnd: int) -> LocalStats:
        local, client.extra.fedala_local = client.extra.fedala_local, None
        metrics = {"ala_epochs": 0.0}
        if local is not None:
            metrics = self.adaptive_local_aggregation(k, client, data, rnd, local)
        w = client.extra.fedala_w  # NaN until the client's first ALA
        metrics["ala_weight_mean"] = (float(sum(t.sum() for t in w.values()) / sum(t.numel() for t in w.values()))
                                      if w else float("nan"))
        stats = self.run_epochs(k, client, data, rnd, self.config.local_epochs, self.full_update())
        stats.metrics = metrics
        return stats

    def adaptive_local_aggregation(self, k: int, client: ClientState, data: ClientData, rnd: int,
                                   local: State) -> dict[str, float]:
        """Client k's initial model from the received θ_g (`client.state`) and its last trained
        parameters `local`: learns W (kept in `client.extra`) and writes the model into the client."""
        start, names = client.state, self.adaptive_names
        if not names or all(torch.equal(start[n], local[n]) for n in names):
            return {"ala_epochs": 0.0}
        p = self.params
        diff = {n: start[n] - local[n] for n in names}
        first = client.extra.fedala_w is None
        weights = client.extra.fedala_w or {n: torch.ones_like(start[n]) for n in names}
        count = max(1, int(p.fedala_rand_percent / 100 * data.n_train))
        generator = torch.Generator().manual_seed(derive_seed(self.config.seed, rnd, k, "fedala"))
        sample = torch.randperm(data.n_train, generator=generator)[:count].to(data.x_train.device)
        x, y, batch = data.x_train[sample], data.y_train[sample], self.config.batch_size
        losses, epochs = [], 0
        while True:
            for begin in range(0, count, batch):
                weights, loss = ala_step(self.trainer, start, diff, weights, x[begin:begin + batch],
                                         y[begin:begin + batch], p.fedala_eta)
            losses.append(float(loss))
            epochs += 1
            if not first or epochs >= p.fedala_max_epochs:
                break
            if len(losses) > p.fedala_window and np.std(losses[-p.fedala_window:]) < p.fedala_threshold:
                break
        client.extra.fedala_w = weights
        client.state = aggregated(start, diff, weights)
        return {"ala_epochs": float(epochs)}
