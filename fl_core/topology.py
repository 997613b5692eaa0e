"""Who averages with whom in a server-less round: the topologies of decentralized methods.

A method without a server (DisPFL, D-PSGD) returns `neighbours(...)` from its `neighbours` hook:
client k -> the clients whose models k pulls this round (k itself excluded; the masked average
always includes k). Every client averages from the same start-of-round snapshot (synchronous;
`Algorithm.mix_neighbours`). Only the round's active clients (`participants`) appear, as keys and
as neighbours.

    random   each active client draws `num_neighbours` others, afresh every round, seeded by
             (seed, round, client): DisPFL's time-varying graph (the authors' `cs = random`)
    fixed    the same draw, made once from (seed, client) and kept for every round: a static
             random directed graph (neighbours that are inactive in a round are skipped)
    ring     the left and right neighbours among the active clients, in client order
    full     every other active client

`active` (DisPFL's `--active`) is the probability that a client takes part in a round: each
seen client is kept with that probability (seeded by (seed, round)), and at least one is.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from .knobs import MethodParams, knob
from .training import derive_seed

TOPOLOGIES = ("random", "fixed", "ring", "full")


@dataclass(frozen=True)
class TopologyParams(MethodParams):
    """The knobs of a server-less method's communication graph."""

    topology: str = knob("random", "who averages with whom each round: random = num_neighbours drawn per round "
                         "(DisPFL's time-varying graph), fixed = drawn once, ring, full", choices=TOPOLOGIES)
    num_neighbours: int = knob(10, "random, fixed: neighbours each client pulls from per round (the authors' "
                               "client_num_per_round; capped at the active clients minus one)", low=1)
    active: float = knob(1.0, "probability that a client is active in a round (client dropout); inactive "
                         "clients neither train nor communicate", low=0, low_open=True, high=1)


def active_clients(pool: Sequence[int], probability: float, seed: int, rnd: int) -> list[int]:
    """The clients of `pool` active in round `rnd`: each kept with `probability`, at least one."""
    pool = list(pool)
    if probability >= 1.0 or not pool:
        return pool
    rng = np.random.default_rng(derive_seed(seed, rnd, "active"))
    keep = rng.random(len(pool)) < probability
    if not keep.any():
        keep[rng.integers(len(pool))] = True
    return [k for k, kept in zip(pool, keep) if kept]


def neighbours(kind: str, active: Sequence[int], num_neighbours: int, seed: int, rnd: int,
               num_clients: int) -> dict[int, list[int]]:
    """client -> its neighbours this round (sorted, itself excluded), over the active clients."""
    active = sorted(active)
    if kind not in TOPOLOGIES:
        raise ValueError(f"unknown topology {kind!r}; allowed: {', '.join(TOPOLOGIES)}")
    if kind == "full":
        return {k: [j for j in active if j != k] for k in active}
    if kind == "ring":
        n = len(active)
        return {k: sorted({active[(i - 1) % n], active[(i + 1) % n]} - {k}) for i, k in enumerate(active)}
    graph, present = {}, set(active)
    for k in active:
        if kind == "random":
            others = [j for j in active if j != k]
            rng = np.random.default_rng(derive_seed(seed, rnd, k, "neighbours"))
            graph[k] = sorted(int(j) for j in rng.choice(others, size=min(num_neighbours, len(others)), replace=False))
        else:  # fixed: k's neighbours drawn once among all clients; those inactive this round are skipped
            rng = np.random.default_rng(derive_seed(seed, k, "fixed-graph"))
            fixed = [int(j) for j in rng.permutation(num_clients) if j != k][:num_neighbours]
            graph[k] = sorted(j for j in fixed if j in present)
    return graph
