"""FedAvg — McMahan et al., "Communication-Efficient Learning of Deep Networks from
Decentralized Data", AISTATS 2017.

Evaluated per client: the global model after the broadcast (`acc_global`): one and the same
model for every client. Every parameter is averaged and, on a model with BatchNorm, so are the
running mean and variance (`bn_stats = "global"`, the default here): the server averages them with
the aggregation weights and broadcasts them, and the bytes count them. That is the single global
model the FedAvg paper evaluates and the FedSelect paper's protocol reports ("for FedAvg, accuracy
is reported for a single global model"), and what the FedBN paper's FedAvg baseline averages.

`bn_stats = "local"` keeps the running statistics on each client (every client then evaluates
the global weights normalised by statistics of its own data: a personalized FedAvg, and this
engine's FedAvg before the knob existed). With "local", FedSelect at p = 0 computes exactly this
method, and FedBN (fedbn.py) differs from it in exactly one thing: it keeps the BN weights and
biases local as well.
"""
from __future__ import annotations

from .base import Algorithm, Scored


class FedAvg(Algorithm):
    name = "fedavg"
    display = "FedAvg"
    acc_from = Scored.GLOBAL
    default_bn_stats = "global"  # one global model, running statistics included
