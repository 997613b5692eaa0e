"""FT (BN C), FT (BN G), FT (BN I): fine-tuning a pretrained model, FedL2P's baselines (Lee et al.,
NeurIPS 2023, Tables 2-5).

The run starts from a pretrained model (`pretrained`: a pretraining run's config hash, the first
stage of the FedL2P study; or `init_weights`) and trains nothing federatedly: every client
fine-tunes that model on its own training split and is scored on its own test split.

Evaluated per client (`acc`): the pretrained model after `ft_epochs` (the paper's e) epochs of
plain SGD on every parameter at the run's `lr` (batch `batch_size`, no momentum or weight decay:
the authors' inner loop), every BatchNorm layer normalising, in fine-tuning and in evaluation, with
  C  (`bn_mode = "C"`): the client's statistics (β = 1), from one pass of its training split
     through the pretrained model (`fl_core.fedl2p.bn_mixing`, source "client");
  G  the pretrained (global) running statistics (β = 0);
  I  the incoming batch's statistics, no running statistics (FedBABU's);
  C_authors  FT (BN C) as the FedL2P authors' code runs it: the running statistics restart at
     0 and 1, fine-tuning in training mode normalises each batch with its own statistics while
     the running ones follow them, and evaluation uses those running estimates
     (`fl_core.fedl2p.personalize.fine_tune_tracking`). Ours (C) is the stronger baseline:
     statistics of the whole training split, fixed; the paper's FT (BN C) numbers are the
     authors' mode.
`acc_global` (and `acc_local`) is the pretrained model itself with its running statistics: the
papers' "Global Acc". Nothing travels: the model reached the clients with the pretraining.

`Personalizing` is the shared machinery of this file, FedL2P and L2P: the checks (a pretrained
BN model), the per-client meta-net inputs, and scoring a client under a fine-tuning policy.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import nn

from ..client_state import ClientState
from ..config import RunConfig
from ..data import ClientData
from ..fedl2p.bn_mixing import bn_layers
from ..fedl2p.personalize import ClientInputs, Policy, client_inputs, fine_tune, fine_tune_tracking, policy_predictor
from ..knobs import ConfigError, MethodParams, Space, knob
from ..training import derive_seed
from .base import Algorithm, LocalStats, Predictor, Scored

BN_MODES = ("C", "G", "I", "C_authors")


@dataclass(frozen=True)
class PersonalizeParams(MethodParams):
    # lr is the fine-tuning rate (FedL2P: LRNet's initial post-multiplier): FedL2P's grid for it
    common_search: ClassVar[dict[str, Space]] = {"lr": Space(1e-5, 1.0, log=True, source=(
        "FedL2P's fine-tuning grid {1, 0.1, 0.01, 1e-3, 1e-4, 1e-5} (its appendix D) as a range"))}
    ft_epochs: int = knob(5, "fine-tuning epochs e of the pretrained model on each client's training split before it "
                          "is scored (FedL2P's paper: 5 and 15)", low=0)


@dataclass(frozen=True)
class FTParams(PersonalizeParams):
    bn_mode: str = knob("C", "whose BatchNorm statistics the fine-tuned model uses: C = the client's (beta = 1), "
                        "G = the pretrained global ones (beta = 0), I = the incoming batch's; C_authors = BN C as "
                        "FedL2P's code runs it (batch statistics in fine-tuning, running estimates restarted at "
                        "0/1 then tracked, used at evaluation)", choices=BN_MODES)

    def label(self, display: str) -> str:
        return f"{display} (BN C, authors')" if self.bn_mode == "C_authors" else f"{display} (BN {self.bn_mode})"


class Personalizing(Algorithm):
    """Personalization of a pretrained model (shared by FT, FedL2P, L2P)."""

    acc_from = Scored.CUSTOM
    communicates = False
    evaluates = "pretrained model fine-tuned under the client's policy (acc_global: the pretrained model)"
    needs_validation: ClassVar[bool] = False

    @classmethod
    def build_model(cls, config: RunConfig, model_name: str, input_shape: tuple[int, int, int],
                    num_classes: int) -> nn.Module:
        if not config.pretrained and config.init_weights is None:
            raise ConfigError(f"{config.algorithm} personalizes a pretrained model: give pretrained=<config hash of "
                              f"the pretraining run> (the fedl2p study runs both stages) or init_weights=<file>")
        if cls.needs_validation and config.val_fraction <= 0:
            raise ConfigError(f"{config.algorithm} learns its policy on each client's validation split: give "
                              f"val_fraction > 0 (FedL2P's paper holds out 0.2)")
        model = super().build_model(config, model_name, input_shape, num_classes)
        if not bn_layers(model):
            raise ConfigError(f"{config.algorithm} mixes BatchNorm statistics and model={model_name} has no BatchNorm "
                              f"layer; use one that has (lenet_bn, cnn_bn, resnet18_cifar, preresnet18, ...)")
        return model

    def setup(self, init, clients):
        self.inputs_cache: dict[int, ClientInputs] = {}
        return super().setup(init, clients)

    def shared_names(self) -> list[str]:
        return []  # the model never travels after pretraining

    def local_update(self, k: int, client: ClientState, data: ClientData, rnd: int) -> LocalStats:
        return LocalStats(torch.zeros((), device=data.x_train.device), 0)

    def client_inputs(self, k: int, client: ClientState, data: ClientData) -> ClientInputs:
        """Client k's statistics from the pretrained model (one pass; cached: they never change)."""
        if k not in self.inputs_cache:
            with self.trainer.bound(client.state, copy_buffers=True) as model:
                self.inputs_cache[k] = client_inputs(model, data.x_train)
        return self.inputs_cache[k]

    def policy(self, k: int, client: ClientState, data: ClientData) -> Policy:
        raise NotImplementedError

    def personalized_model(self, k: int, client: ClientState, data: ClientData, rnd: int) -> Predictor:
        """The pretrained model fine-tuned under client k's policy, scored under its BN mixing. The
        batch order is the same for every method and round (seed, client), so FT and FedL2P with
        equal policies fine-tune identically."""
        policy = self.policy(k, client, data)
        stats = self.client_inputs(k, client, data).bn_stats
        model = self.trainer.model
        tuned = fine_tune(model, client.state, data.x_train, data.y_train, policy, stats,
                          epochs=self.params.ft_epochs, batch_size=self.config.batch_size,
                          seed=derive_seed(self.config.seed, k, "personalize"))
        return policy_predictor(model, tuned, policy, stats)


class FineTune(Personalizing):
    name = "ft"
    display = "FT"
    Params = FTParams

    def policy(self, k: int, client: ClientState, data: ClientData) -> Policy:
        beta, source = {"C": (1.0, "client"), "G": (0.0, "client"), "I": (1.0, "batch")}[self.params.bn_mode]
        return Policy(beta, {n: self.config.lr for n in self.param_names}, source)

    def personalized_model(self, k: int, client: ClientState, data: ClientData, rnd: int) -> Predictor:
        if self.params.bn_mode != "C_authors":
            return super().personalized_model(k, client, data, rnd)
        return fine_tune_tracking(self.trainer.model, client.state, data.x_train, data.y_train, self.config.lr,
                                  epochs=self.params.ft_epochs, batch_size=self.config.batch_size,
                                  seed=derive_seed(self.config.seed, k, "personalize"))
