"""FedAvg — McMahan et al., "Communication-Efficient Learning of Deep Networks from
Decentralized Data", AISTATS 2017.

Evaluated per client: the global model after the broadcast (`acc_global`). Every parameter is
averaged; buffers (BatchNorm running statistics) stay on the client, as in FedSelect, so that
FedSelect with p = 0 is exactly this method.
"""
from __future__ import annotations

from .base import Algorithm


class FedAvg(Algorithm):
    name = "fedavg"
    display = "FedAvg"
    acc_from = "global"
