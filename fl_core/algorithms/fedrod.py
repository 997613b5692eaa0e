"""FedRoD — Chen, Chao, "On Bridging Generic and Personalized Federated Learning for Image
Classification", ICLR 2022 (Fed-RoD with a linear personalized head).

Evaluated per client: the personalized prediction g(z) + p(z) of the model it holds after the
broadcast: the averaged body f and generic head g with its own personalized head p (`acc`,
`acc_from = "custom"`). `acc_global` is the generic model (body + G-head) after the broadcast,
`acc_local` the client's generic model after its local training.

The network (`build_model`) is the registered model (its body f, giving the features z, and its
head, the generic head g or G-head), with the same parameter names, plus `personal_head`, a
linear layer z -> logits of the G-head's shape (the P-head), and `personal`, a 0/1 buffer: the
forward pass returns g(z) + personal · p(z). Every client's state keeps `personal` = 0, so the
engine's own evaluations of a client's state (`acc_local`, `acc_global`) score the generic model;
`personalized_model` scores the same state with `personal` = 1. The P-head starts at zero (our
choice), so an untrained P-head predicts exactly as the generic model.
Keeping the P-head in the network (rather than beside it, in `client.extra`) lets one ordinary
`train_pass` train the three parts together, momentum and weight decay included, and keeps the
P-head in the client's saved state.

Local update, `local_epochs` passes, each mini-batch (x, y) one SGD step on the sum of two losses
whose gradients never meet (Fed-RoD (linear): the P-head learns on top of the generic predictor):
  - f and g: the balanced-softmax loss CE(g(z) + log π_k, y), with π_k the client's class prior
    from its training label histogram (`fedrod_loss` = bsm, the paper's default; classes it lacks
    get log 0 = −∞ and no probability); `fedrod_loss` = ce trains them with plain cross-entropy instead;
  - p: the cross-entropy of the personalized prediction, CE(g(z) + p(z), y), with z and g(z)
    detached, so that this loss moves the P-head only (the simple version; public reproductions
    differ here, e.g. FL-bench lets this loss reach the body and scores p(z) alone).
The reported training loss is the sum of the two.
The server averages the body and the G-head (FedAvg: `aggregation_weights`) and broadcasts them;
the P-head never leaves the client. Traffic per participant: body + G-head, up and down.

Not supported: `init_weights` and `pretrained` (their states are the registered model's, without
the P-head), refused when the network is built; a run's final model (`checkpoint_dir`) holds the
P-head and the switch too, so a second stage of another method cannot start from it. The paper's
hypernetwork-generated P-head (its "Fed-RoD (hyper)") is left out.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn
from torch.nn import functional as F

from .. import models
from ..client_state import ClientState
from ..config import ConfigError, RunConfig
from ..data import ClientData
from ..knobs import MethodParams, knob
from ..training import LossFn, State, UpdateSpec
from .base import Algorithm, LocalStats, Scored

P_HEAD = "personal_head"
SWITCH = "personal"  # the buffer: 0 = generic prediction g(z), 1 = personalized g(z) + p(z)


@dataclass(frozen=True)
class FedRoDParams(MethodParams):
    fedrod_loss: str = knob("bsm", "loss of the body and generic head: bsm = balanced softmax (the paper), ce = "
                            "cross-entropy", choices=("bsm", "ce"))


class TwoHeadNet(nn.Module):
    """The registered model's modules under their own names, plus a P-head on its features."""

    def __init__(self, generic: nn.Module, head: nn.Linear) -> None:
        super().__init__()
        if next(generic.parameters(recurse=False), None) is not None or list(generic.buffers(recurse=False)):
            raise ValueError("TwoHeadNet: the model holds tensors outside its submodules")
        self.register_buffer(SWITCH, torch.zeros(()))
        for name, child in generic.named_children():
            self.add_module(name, child)
        self.add_module(P_HEAD, nn.Linear(head.in_features, head.out_features))
        nn.init.zeros_(self.personal_head.weight)
        nn.init.zeros_(self.personal_head.bias)
        # Not submodules (their modules are registered above): the generic model's forward gives
        # g(z), and its head's input is z.
        self.__dict__["generic"] = generic
        self.__dict__["head"] = head

    def outputs(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """(g(z), z): the generic logits and the features they were computed from."""
        with models.FeatureTap(self.__dict__["head"]) as tap:
            logits = self.generic(x)
        return logits, tap.z

    def forward(self, x: Tensor) -> Tensor:
        g, z = self.outputs(x)
        return g + self.personal * self.personal_head(z)


def balanced_softmax_loss(logits: Tensor, y: Tensor, log_prior: Tensor) -> Tensor:
    """Mean over the batch of −log(π_y e^{l_y} / Σ_c π_c e^{l_c}) = CE(l + log π, y)."""
    return F.cross_entropy(logits + log_prior, y)


def rod_objective(log_prior: Tensor | None) -> LossFn:
    """The local loss: generic loss on g(z) (balanced softmax with `log_prior`, or cross-entropy
    when None) plus the personalized cross-entropy of g(z) + p(z) that reaches only p."""

    def loss_fn(model: nn.Module, x: Tensor, y: Tensor) -> Tensor:
        g, z = model.outputs(x)
        generic = F.cross_entropy(g, y) if log_prior is None else balanced_softmax_loss(g, y, log_prior)
        return generic + F.cross_entropy(g.detach() + model.personal_head(z.detach()), y)

    return loss_fn


class FedRoD(Algorithm):
    name = "fedrod"
    display = "FedRoD"
    Params = FedRoDParams
    acc_from = Scored.CUSTOM
    evaluates = "personalized prediction g(z) + p(z) after the broadcast (acc_global: the generic model)"

    @classmethod
    def build_model(cls, config: RunConfig, model_name: str, input_shape: tuple[int, int, int],
                    num_classes: int) -> nn.Module:
        if config.init_weights is not None or config.pretrained:
            raise ConfigError("fedrod adds a personalized head to the network, which an init_weights or pretrained "
                              "state of the plain model does not hold; leave both unset")
        generic = models.build_model(model_name, input_shape, num_classes, width=config.model_width)
        return TwoHeadNet(generic, models.head_module(generic, model_name))

    def __init__(self, config, trainer, model_name) -> None:
        super().__init__(config, trainer, model_name)
        self.p_names = [n for n in self.param_names if n.startswith(P_HEAD + ".")]
        self.generic_names = [n for n in self.param_names if n not in self.p_names]
        self.num_classes = trainer.model.personal_head.out_features

    def shared_names(self) -> list[str]:
        return self.generic_names  # body + G-head; the P-head never leaves the client

    def log_prior(self, data: ClientData) -> Tensor | None:
        """log π_k from the client's training labels (None under `fedrod_loss` = ce)."""
        if self.params.fedrod_loss == "ce":
            return None
        counts = torch.bincount(data.y_train, minlength=self.num_classes).to(torch.float32)
        return (counts / counts.sum()).log()

    def trained_entries(self, k: int) -> UpdateSpec:
        return self.full_update()  # body, G-head and P-head, each by its own loss

    def local_update(self, k: int, client: ClientState, data: ClientData, rnd: int) -> LocalStats:
        return self.run_epochs(k, client, data, rnd, self.config.local_epochs, self.trained_entries(k),
                               loss_fn=rod_objective(self.log_prior(data)))

    def personalized_model(self, k: int, client: ClientState, data: ClientData, rnd: int) -> State:
        return client.state | {SWITCH: torch.ones_like(client.state[SWITCH])}
