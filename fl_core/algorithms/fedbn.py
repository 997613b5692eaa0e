"""FedBN — Li, Jiang, Zhang, Kamp and Dou, "FedBN: Federated Learning on Non-IID Features via
Local Batch Normalization", ICLR 2021 (authors' code: github.com/med-air/FedBN).

Evaluated per client: the model it holds after the broadcast (`acc_global`): the averaged
weights of every layer that is not BatchNorm, with its own BatchNorm layers (affine weight and
bias, running mean and variance, batch counter), as the paper evaluates a client on its own
local BN.

FedAvg in every other respect: `local_epochs` of SGD on every parameter, then the server
averages the parameters outside BatchNorm and broadcasts them; a BatchNorm layer's weight and
bias never leave the client, so they are neither averaged nor counted in the bytes sent, and
neither are its running statistics (`bn_stats` is fixed at "local" here). FedBN therefore differs
from FedAvg under `bn_stats = "local"` in exactly the BN weights and biases, and from the default
FedAvg (one global model, statistics averaged) in every BatchNorm entry; on a model without
BatchNorm FedBN is FedAvg.
"""
from __future__ import annotations

from itertools import chain

from torch import nn

from .base import Algorithm, Scored


def batchnorm_entries(model: nn.Module) -> list[str]:
    """Names of every state-dict entry (parameters and buffers) of the model's BatchNorm layers."""
    names = []
    for prefix, module in model.named_modules():
        if isinstance(module, nn.modules.batchnorm._BatchNorm):
            entries = chain(module.named_parameters(recurse=False), module.named_buffers(recurse=False))
            names += [f"{prefix}.{name}" if prefix else name for name, _ in entries]
    return names


class FedBN(Algorithm):
    name = "fedbn"
    display = "FedBN"
    acc_from = Scored.GLOBAL
    bn_stats_fixed = True  # local BatchNorm is the method
    evaluates = "after the broadcast, with the client's own BatchNorm layers"

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.local_bn = set(batchnorm_entries(self.trainer.model))
        self._shared = [n for n in self.param_names if n not in self.local_bn]

    def shared_names(self) -> list[str]:
        return self._shared
