"""DisPFL — Dai, Shen, He, Tian, Tao, "DisPFL: Towards Communication-Efficient Personalized
Federated Learning via Decentralized Sparse Training", ICML 2022 (arXiv 2206.00187); read from a
reproduction report of it (its Alg. 1-2), with the gaps
filled from the authors' code rong-dai/DisPFL, marked [C].

Evaluated per client: its sparse personalized model after local training (`acc_local`, the
report's "after train"); `acc_global` is the same client after aggregating with its neighbours
under its new mask (the report's "after aggregation", which the authors measure just before the
next round's training).

No server. Every client keeps its own sparse model w_k and active mask m_k (`client.mask` holds
the complement: True = inactive, zero, never sent). A round, for each active client k:
  1. local training: `local_epochs` epochs of SGD on the active entries only (inactive entries
     stay exactly 0, as the authors' `param *= mask` after every step), gradient-norm clip
     `max_grad_norm` [C: 10]; the authors' lr 0.1 · 0.998^round, weight decay 5e-4, momentum 0 are
     the common knobs (`--lr-schedule exp --lr-decay 0.998 --weight-decay 5e-4`);
  2. mask search (Alg. 2), unless `static_masks` (RSM): per tensor, prune the ⌈α_t · active⌉
     smallest-magnitude active weights, α_t = α₀/2 · (1 + cos(t·π/T)) with t the 0-based round
     [C: fire_mask], and regrow as many inactive entries, at random [C: the scripts' default] or
     by the largest |dense gradient| of one training batch; the active count never changes;
  3. communication (synchronous, from the start-of-round snapshot): k pulls its neighbours' models
     (`topology`, fl_core/topology.py) and averages each entry over itself and the neighbours
     whose *sent* mask (the one trained under) has it active (`masks.masked_average`), then
     multiplies by its new mask: pruned entries become 0, regrown ones take the neighbours'
     average, or 0 where no neighbour has them [C: `_aggregate_func`]. BatchNorm statistics stay
     local (they are buffers, not parameters).
Traffic: a client sends its active entries (4 bytes each) plus its mask (1 bit per entry of
every masked tensor) to each client that pulls from it; up and down are counted per client.
Per client and round it also reports `mask_density` (share of active entries; named apart from
the `density` knob, whose column it overwrote before), `mask_churn` (share of entries whose mask
changed) and `train_gflops` / `train_gflops_dense` (fl_core/flops.py).

Masks cover every parameter tensor; ERK makes the 1-D ones (biases, BN weights) dense [C:
`calculate_sparsities`]. Each client draws its own random initial mask [C: `--different_initial`,
used by every script], or the same one (`same_masks`); `mixed_density` gives client k density
(0.2, 0.4, 0.6, 0.8, 1.0)[k mod 5] [C: `--diff_spa`]. Differences from [C]: an inactive client
(`active` < 1) neither trains nor communicates (in [C] it still trains alone); the fixed-graph
and ring topologies run over the active clients.
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from ..client_state import ClientExtras, ClientState
from ..data import ClientData
from ..flops import layer_flops, sparse_flops
from ..knobs import knob
from ..masks import count_nonzero, personal_fraction, zero_where
from ..sparse import (DISTRIBUTIONS, anneal_rate, hamming, layer_densities, prune_count, prune_smallest, random_masks,
                      regrow)
from ..topology import TopologyParams
from ..training import State, clipped, derive_seed
from .base import ClientInfo, LocalStats, Scored, Traffic
from .dpsgd import DPSGD

MIXED_DENSITIES = (0.2, 0.4, 0.6, 0.8, 1.0)
REGROWTH = ("random", "gradient")


@dataclass(frozen=True)
class DisPFLParams(TopologyParams):
    density: float = knob(0.5, "share of each client's parameter entries that are active (the authors' dense_ratio)",
                          low=0, low_open=True, high=1)
    density_distribution: str = knob("erk", "how the density is spread over tensors: erk (denser small layers; "
                                     "1-D tensors dense) or uniform", choices=DISTRIBUTIONS)
    same_masks: bool = knob(False, "every client starts from the same random mask (default: one mask per client, "
                                   "the authors' --different_initial)")
    mixed_density: bool = knob(False, "client k's density is (0.2, 0.4, 0.6, 0.8, 1.0)[k mod 5] (the authors' "
                                      "--diff_spa) instead of density")
    anneal_factor: float = knob(0.5, "α₀ of the cosine-annealed prune rate α_t = α₀/2·(1 + cos(tπ/T))", low=0, high=1)
    regrowth: str = knob("random", "which inactive entries regrow: random (the authors' scripts) or gradient (the "
                         "largest |dense gradient| of one training batch)", choices=REGROWTH)
    static_masks: bool = knob(False, "masks never change (RSM: random sparse masks, no prune/regrow)")
    max_grad_norm: float | None = knob(10.0, "local SGD gradient-norm clip (the authors' 10); none = no clip",
                                       low=0, low_open=True)

    def label(self, display: str) -> str:
        return display + (" (RSM)" if self.static_masks else "")


@dataclass(slots=True, eq=False)
class DisPFLExtras(ClientExtras):
    next_mask: State | None = None  # the mask it grew this round, applied after aggregation


class DisPFL(DPSGD):
    """D-PSGD's rounds (participants, topology) with sparse personalized models."""

    name = "dispfl"
    display = "DisPFL"
    Params = DisPFLParams
    Extras = DisPFLExtras
    acc_from = Scored.LOCAL
    evaluates = "its sparse model after local training (acc_global: after aggregation, under its new mask)"
    sparse_states = True  # inactive entries are exactly 0 (set at init, kept by masked training and mixing)

    def setup(self, init: State, clients: Sequence[ClientInfo]) -> list[ClientState]:
        self.shapes = {n: tuple(init[n].shape) for n in self.param_names}
        return super().setup(init, clients)

    def density_of(self, k: int) -> float:
        return MIXED_DENSITIES[k % len(MIXED_DENSITIES)] if self.params.mixed_density else self.params.density

    def init_client(self, k: int, init: State) -> ClientState:
        densities = layer_densities(self.shapes, self.density_of(k), self.params.density_distribution)
        generator = torch.Generator().manual_seed(derive_seed(self.config.seed, "mask",
                                                              0 if self.params.same_masks else k))
        active = {n: m.to(init[n].device) for n, m in random_masks(self.shapes, densities, generator).items()}
        state = {n: t * active[n] if n in active else t.clone() for n, t in init.items()}
        client = ClientState(state=state, extra=self.Extras())
        client.mask = {n: ~m for n, m in active.items()}
        return client

    # ---------------------------------------------------------------- client side
    def local_update(self, k: int, client: ClientState, data: ClientData, rnd: int) -> LocalStats:
        old = {n: client.mask[n] for n in self.param_names}  # unpacked once
        update = {n: ~old[n] for n in self.param_names}
        stats = self.run_epochs(k, client, data, rnd, self.config.local_epochs, update,
                                corrections=clipped(self.params.max_grad_norm))
        new = old if self.params.static_masks else self.search_mask(k, client, data, rnd, old)
        client.extra.next_mask = new
        entries = sum(m.numel() for m in old.values())
        stats.metrics = {"mask_density": 1 - sum(count_nonzero(m) for m in new.values()) / entries,
                         "mask_churn": hamming(old, new) / entries} | self.training_gflops(old, data)
        return stats

    def training_gflops(self, pruned: dict, data: ClientData) -> dict[str, float]:
        """This round's training GFLOPs under the mask trained with, and dense (torch's FLOP
        counter per layer, fl_core/flops.py); gradient regrowth adds one dense batch."""
        if not hasattr(self, "layer_flops"):
            self.layer_flops = layer_flops(self.trainer.model, tuple(data.x_train.shape[1:]))
        # the pruned share as a float32 quotient (what a float32 mean of the mask gives)
        density = {m: 1 - float(np.float32(count_nonzero(pruned[w])) / np.float32(pruned[w].numel()))
                   for m in self.layer_flops if (w := f"{m}.weight") in pruned}
        samples = self.config.local_epochs * data.n_train
        dense = sparse_flops(self.layer_flops, {})
        screening = min(self.config.batch_size, data.n_train) * dense if self.params.regrowth == "gradient" else 0.0
        return {"train_gflops": (samples * sparse_flops(self.layer_flops, density) + screening) / 1e9,
                "train_gflops_dense": samples * dense / 1e9}

    def search_mask(self, k: int, client: ClientState, data: ClientData, rnd: int, pruned: dict) -> dict:
        """Alg. 2: prune ⌈α_t · active⌉ smallest active weights per tensor, regrow as many."""
        rate = anneal_rate(self.params.anneal_factor, rnd - 1, self.config.rounds)
        scores = None
        if self.params.regrowth == "gradient":
            batch = torch.randperm(data.n_train, generator=torch.Generator().manual_seed(
                derive_seed(self.config.seed, rnd, k, "regrow-batch")))[:self.config.batch_size].to(data.x_train.device)
            scores = self.trainer.gradients(client.state, data.x_train[batch], data.y_train[batch], self.param_names)
        generator = torch.Generator().manual_seed(derive_seed(self.config.seed, rnd, k, "regrow"))
        new = {}
        for n in self.param_names:
            count = prune_count(rate, pruned[n].numel() - count_nonzero(pruned[n]))
            cut = prune_smallest(client.state[n], pruned[n], count)
            grown = regrow(cut.cpu(), count, generator, None if scores is None else scores[n].cpu())
            new[n] = grown.to(pruned[n].device)
        return new

    # ---------------------------------------------------------------- communication
    def mix_neighbours(self, clients: Sequence[ClientState], data: Sequence[ClientData],
                       graph: dict[int, list[int]], rnd: int) -> Traffic:
        traffic = super().mix_neighbours(clients, data, graph, rnd)  # under the masks trained with
        for client in clients:  # then each client's new mask: pruned entries 0, regrown ones as averaged
            new, client.extra.next_mask = client.extra.next_mask, None
            if new is not None:
                client.state = client.state | {n: zero_where(client.state[n], m) for n, m in new.items()}
                client.mask = new
        return traffic

    def sent_bytes(self, client: ClientState) -> int:
        """Active entries (float32) plus the mask, one bit per entry of every masked tensor."""
        return super().sent_bytes(client) + sum(math.ceil(math.prod(s) / 8) for s in self.shapes.values())

    def personal_fraction(self, client: ClientState) -> float:
        """Inactive share of all parameter entries (they never leave the client)."""
        return personal_fraction(client.mask, self.numels)
