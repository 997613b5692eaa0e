"""FedAvg — McMahan et al., "Communication-Efficient Learning of Deep Networks from
Decentralized Data", AISTATS 2017.

Evaluated per client: the global model after the broadcast (`acc_global`). Every parameter is
averaged; buffers (BatchNorm running statistics) stay on the client, as in FedSelect, so that
FedSelect with p = 0 is exactly this method.

On a model with BatchNorm this means: BN weights and biases are averaged like any parameter, the
running mean and variance stay each client's own, so a client is evaluated with the global
weights normalised by statistics of its own data (the FedBN paper's FedAvg baseline averages the
statistics too; ours never sends them, and counts no bytes for them). FedBN (fedbn.py) differs
from this method in exactly one thing: it keeps the BN weights and biases local as well.
"""
from __future__ import annotations

from .base import Algorithm


class FedAvg(Algorithm):
    name = "fedavg"
    display = "FedAvg"
    acc_from = "global"
