"""PerFedMask — Setayesh, Li and Wong, "PerFedMask: Personalized Federated Learning with Optimized
Masking Vectors", ICLR 2023 (poster; authors' code github.com/MehdiSet/PerFedMask).

Evaluated per client: a copy of its model fine-tuned on its own data after training (`acc`); the
same model before fine-tuning is `acc_global` (the poster reports both).

Devices differ in how many parameters they can train: device n may train ψ_n = r_n·d_w of the
body's d_w parameters, r_n its width ratio (fl_core/devices.py; the authors' `--slim_ratios 8-1`:
half the devices at 1/8, half at 1). Before round 1 the server solves the mask problem P^mask
once (fl_core/mask_problem.py): which layer groups (fl_core/models.py `LAYER_GROUPS`: the authors'
stem / residual blocks / final group for PreResNet-18, one group per layer for the small CNNs)
each device trains, within its budget, minimising the masking bias of the convergence bound. By
default with the paper's method (successive convex approximation from the best greedy start,
`mask_solver = sca`); `exact` solves it to optimality (small instances), `greedy` skips the SCA.

A round:
- the classifier head keeps its random initialisation and is never trained or sent (FedBABU style,
  the authors' `requires_grad=False` on `linear`);
- device n runs local SGD on its groups only; the other groups are frozen (used in the forward
  pass, no gradient step);
- the server averages each body entry over the participants that trained it (the one
  masked-averaging primitive with each client's untrained groups marked as not sent; weights by
  sample count, as the authors' `mask_add` with the data fraction), keeps the previous value of
  an entry no participant trained, and broadcasts the whole body.
Fine-tuning (the authors' `personalization`): 5 epochs of SGD on every parameter, head included
(the poster: the heads are fine-tuned; the authors' optimiser covers `model.parameters()`), at the
round's scheduled lr (after the last round: the final global lr), momentum 0.9, and the run's
weight decay (the authors' 5e-4 in training and fine-tuning: set `weight_decay = 0.0005`).

Per client, the Parquet rows carry `ratio` (r_n), `trained_groups`, `mask_objective` (the P^mask
objective of the masks in use, the same for every client) and, as every fine-tuned method here,
`trainable_params` and per-sample `fwd_mflops` / `bwd_mflops` (frozen groups have no weight
gradient; fl_core/flops.py).

Differences from the authors' code: their BN layers keep no running statistics (ours do, local to
each client as every method here); a device whose budget fits no group trains nothing (their
greedy start refuses such masks); they solve the SCA with MOSEK, here Clarabel, and take the
rounding of the last iterate, here the best rounding over the iterates, never worse than the
greedy start (fl_core/mask_problem.py says why and by how much).
"""
from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from ..client_state import ClientExtras, ClientState
from ..data import ClientData
from ..devices import DeviceParams
from ..knobs import ConfigError, knob
from ..masks import Mask
from ..mask_problem import MaskProblem, MaskSolution, solve
from ..models import layer_groups
from ..training import State, UpdateSpec
from .base import BYTES_PER_ENTRY, ClientInfo, LocalStats, Traffic
from .fedavg_ft import FineTuneParams, FineTuneProtocol, FineTuning

MASK_SOLVERS = ("sca", "exact", "greedy")


@dataclass(frozen=True)
class PerFedMaskParams(FineTuneParams, DeviceParams):
    mask_solver: str = knob("sca", "how the server solves the mask problem: sca (the paper's successive convex "
                            "approximation from the best greedy start), exact (optimal; small instances) or greedy",
                            choices=MASK_SOLVERS)


@functools.lru_cache(maxsize=16)
def _solve_cached(sizes: tuple[int, ...], budgets: tuple[float, ...], method: str) -> MaskSolution:
    """One solve per instance and process: every seed and round of a study asks the same question."""
    return solve(MaskProblem(np.array(sizes), np.array(budgets)), method=method)


@dataclass(slots=True, eq=False)
class PerFedMaskExtras(ClientExtras):
    device: int | None = None  # which device it is: `contribution` looks up its frozen groups


class PerFedMask(FineTuning):
    name = "perfedmask"
    display = "PerFedMask"
    Params = PerFedMaskParams
    Extras = PerFedMaskExtras
    protocol = FineTuneProtocol(epochs=5, lr=None, momentum=0.9)

    def setup(self, init: State, clients: Sequence[ClientInfo]) -> list[ClientState]:
        groups = layer_groups(self.model_name, self.param_names)
        sizes = tuple(sum(self.numels[p] for p in members) for _, members in groups)
        self.ratios = self.params.ratios(len(clients), [info.profile for info in clients])
        budgets = tuple(r * sum(sizes) for r in self.ratios)
        try:
            self.solution = _solve_cached(sizes, budgets, self.params.mask_solver)
        except ValueError as err:  # e.g. `exact` on an instance too large for it: before any training
            raise ConfigError(f"mask_solver={self.params.mask_solver!r}: {err}") from None
        masks = np.asarray(self.solution.masks, dtype=bool)
        self.trains = [[p for j, (_, members) in enumerate(groups) if masks[k, j] for p in members]
                       for k in range(len(clients))]
        self.group_counts = masks.sum(axis=1).tolist()
        return super().setup(init, clients)

    def init_client(self, k: int, init: State) -> ClientState:
        client = super().init_client(k, init)
        client.extra.device = k  # which device it is: `contribution` looks up its frozen groups
        return client

    def trained_entries(self, k: int) -> UpdateSpec:
        return {n: None for n in self.trains[k]}

    def local_update(self, k: int, client: ClientState, data: ClientData, rnd: int) -> LocalStats:
        if self.trains[k]:
            stats = self.run_epochs(k, client, data, rnd, self.config.local_epochs, self.trained_entries(k))
        else:  # a budget below every group: the device trains nothing
            stats = LocalStats(torch.zeros((), device=data.x_train.device), 0)
        stats.metrics |= {"ratio": self.ratios[k], "trained_groups": float(self.group_counts[k]),
                          "mask_objective": float(self.solution.objective)}
        return stats

    def shared_names(self) -> list[str]:
        return self.body_names

    def contribution(self, client: ClientState) -> Mask | None:
        """A device sends the groups it trains; its frozen body tensors are not sent."""
        trained = set(self.trains[client.extra.device])
        return self.withheld(n for n in self.body_names if n not in trained)

    def aggregate(self, clients: Sequence[ClientState], data: Sequence[ClientData], rnd: int) -> Traffic:
        traffic = super().aggregate(clients, data, rnd)
        body = sum(self.numels[n] for n in self.body_names) * BYTES_PER_ENTRY  # every device downloads the body
        return Traffic(up=traffic.up, down=[body] * len(clients))

