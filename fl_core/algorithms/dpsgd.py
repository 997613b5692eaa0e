"""D-PSGD — Lian, Zhang, Zhang, Hsieh, Zhang, Liu, "Can Decentralized Algorithms Outperform
Centralized Algorithms? A Case Study for Decentralized Parallel Stochastic Gradient Descent",
NeurIPS 2017; the decentralized FedAvg baseline of DisPFL (the authors' `dpsgd`, rong-dai/DisPFL).

Evaluated per client: its own dense model after local training (`acc_local`, the authors'
personal test of D-PSGD); `acc_global` is the model after averaging with its neighbours.

No server: each active client trains its dense model for `local_epochs` epochs, then averages it
with the models of its neighbours from the start-of-round snapshot (the same topologies and
dropout as DisPFL, fl_core/topology.py). With the `full` topology every client holds FedAvg's
global model after the round. Traffic: the whole model to every client that pulls from it.
"""
from __future__ import annotations

from collections.abc import Sequence

from ..topology import TopologyParams, active_clients, neighbours
from .base import Algorithm, Scored


class DPSGD(Algorithm):
    name = "dpsgd"
    display = "D-PSGD"
    Params = TopologyParams
    acc_from = Scored.LOCAL
    evaluates = "its own model after local training (acc_global: after averaging with its neighbours)"
    sampled_by = "active"  # each client active with that probability, no server to sample them
    server = False  # clients average with their neighbours; the busiest node is the busiest client

    def participants(self, rnd: int) -> list[int]:
        pool = [info.k for info in self.clients_info if info.seen]
        return active_clients(pool, self.params.active, self.config.seed, rnd)

    def neighbours(self, rnd: int, participants: Sequence[int]) -> dict[int, list[int]]:
        return neighbours(self.params.topology, participants, self.params.num_neighbours, self.config.seed, rnd,
                          len(self.clients_info))
