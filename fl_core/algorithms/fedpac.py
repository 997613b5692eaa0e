"""FedPAC — Xu, Tong, Huang, "Personalized Federated Learning with Feature Alignment and
Classifier Collaboration", ICLR 2023 (code: github.com/JianXu95/FedPAC).

Evaluated per client: the model it receives at the end of the round (`acc_global`): the
aggregated feature extractor θ with its own combined classifier φ̂_i = Σ_j α_ij φ_j. In the
paper a client's personalized model is exactly this pair (shared representation, personalized
head); the authors' code logs its accuracy (the test at the start of the next local update)
alongside the accuracy after local training, which we report as `acc_local`.

The model is split into the feature extractor (`body_names`) and the classifier head
(`head_names`, the registry's head module; its input is the feature vector z = f_θ(x)).

Round t, client i (`local_update`):
 0. Feature statistics for classifier collaboration, under the received (global) extractor θ^t
    and before any local step, as the authors' code does; so every client's statistics live in
    the same feature space. With p_i(k) the client's label distribution, μ_ik the mean feature
    of class k and n_i its sample count:
        h_i[k] = p_i(k) μ_ik                                    (a C × d matrix)
        V_i   = ( Σ_k p_i(k) E[‖z‖² | k] − Σ_k p_i(k)² ‖μ_ik‖² ) / n_i
    i.e. h_i = E[z e_yᵀ] and V_i = E‖z e_yᵀ − h_i‖² / n_i, the variance of the estimate of h_i.
 1. One epoch on the head with the extractor frozen (cross-entropy).
 2. `local_epochs` epochs on the extractor with the (new) head frozen, loss
        CE + λ · (1/(B·d)) Σ_b ‖f_θ(x_b) − c_{y_b}‖²₂        (λ = `fedpac_lambda`)
    with c the global class prototypes (centroids) of the previous round. The paper writes the
    regulariser R_i as the batch mean of the squared ℓ2 distance; its λ = 1 was used with the
    authors' `nn.MSELoss`, which also averages over the d feature entries, so we divide by d
    too: λ = 1 is then the authors' setting. (Without the 1/d, λ = 1 is d times stronger — 84×
    for lenet — and local SGD at lr 0.1 diverges on digits.) Samples of classes without a
    global prototype (every class in round 1) add nothing to the term.
 3. Local prototypes: per-class mean feature under the trained extractor, with class counts.
Sent up: extractor, head, prototypes with counts, (h_i, V_i).

Server (`aggregate`):
 - extractor: weighted average of the clients' extractors (`aggregation_weights`: uniform, or by
   training samples with `weighting=samples`; the authors' code weights by samples);
 - global prototypes: c_k = Σ_i n_ik ĉ_ik / Σ_i n_ik over the clients holding class k (a class
   nobody holds keeps its previous prototype, or none);
 - classifier collaboration: for each client i, α_i = argmin over the simplex (α ≥ 0, Σ_j α_j = 1)
   of the paper's estimated test-loss bound
        Σ_j α_j² V_j + ‖Σ_j α_j (h_i − h_j)‖²_F  =  αᵀ (diag(V) + G_i) α,
        (G_i)_jk = ⟨h_i − h_j, h_i − h_k⟩_F,
   solved exactly by `simplex_qp` (no zeroing of small weights, which the authors' code adds);
   client i's new head is Σ_j α_ij φ_j over the heads after local training.
Received: the extractor, the combined head and (kept by the server, identical for all clients
under full participation) the global prototypes for the next round's alignment.

Local SGD uses the run's one learning rate for both phases (the authors' code uses 0.1 with
momentum 0.5 and weight decay 5e-4 for the head phase). Communication per client and direction
(one number in this engine): extractor + head + C·d prototype entries (local up, global down);
the collaboration statistics (C·d + 1 values) and class counts (C) go up only and are not
counted.
"""
from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch import Tensor, nn
from torch.nn import functional as F

from dataclasses import dataclass

from ..client_state import ClientExtras, ClientState
from ..data import ClientData
from ..knobs import MethodParams, knob
from ..masks import masked_average
from ..models import FeatureTap, head_module
from ..training import State, load_state
from .base import Algorithm, BYTES_PER_ENTRY, ClientInfo, LocalStats, Scored, Traffic


@dataclass(frozen=True)
class FedPACParams(MethodParams):
    fedpac_lambda: float = knob(1.0, "weight λ of the feature-alignment loss (a mean over batch and feature "
                                "entries, as the authors' MSELoss)", low=0)


# ---------------------------------------------------------------------------- the pieces, pure functions
def class_statistics(z: Tensor, y: Tensor, num_classes: int) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Per-class counts, feature means (0 for absent classes), and the collaboration statistics
    (h, V) of one client's features `z` (n × d) with labels `y`; computed in float64."""
    z = z.to(torch.float64)
    n = z.shape[0]
    counts = torch.bincount(y, minlength=num_classes).to(torch.float64)
    sums = torch.zeros(num_classes, z.shape[1], dtype=torch.float64, device=z.device).index_add_(0, y, z)
    means = sums / counts.clamp_min(1.0).unsqueeze(1)
    prior = counts / n
    h = prior.unsqueeze(1) * means
    v = (z.pow(2).sum() / n - (prior.pow(2) * means.pow(2).sum(1)).sum()) / n
    return counts, means, h, v


def collaboration_matrix(i: int, h: Tensor, v: Tensor) -> Tensor:
    """The QP matrix diag(V) + G_i of client i: `h` is N × C × d, `v` holds the N variance terms."""
    diff = (h[i].unsqueeze(0) - h).reshape(h.shape[0], -1)  # row j: h_i − h_j
    return torch.diag(v) + diff @ diff.T


def project_simplex(x: np.ndarray) -> np.ndarray:
    """Euclidean projection onto {a : a >= 0, Σ a = 1} (sort-based, Held et al. / Duchi et al.)."""
    u = np.sort(x)[::-1]
    cumulative = np.cumsum(u) - 1.0
    ranks = np.arange(1, x.size + 1)
    rho = np.nonzero(u - cumulative / ranks > 0)[0][-1]
    return np.maximum(x - cumulative[rho] / (rho + 1), 0.0)


def _kkt_solution(P: np.ndarray, support: np.ndarray, tol: float) -> np.ndarray | None:
    """The minimiser restricted to `support` (equality constraint only), if it is feasible and
    satisfies the KKT conditions of the full problem; else None."""
    s = np.nonzero(support)[0]
    m = s.size
    kkt = np.zeros((m + 1, m + 1))
    kkt[:m, :m] = 2.0 * P[np.ix_(s, s)]
    kkt[:m, m] = -1.0
    kkt[m, :m] = 1.0
    rhs = np.zeros(m + 1)
    rhs[m] = 1.0
    sol = np.linalg.lstsq(kkt, rhs, rcond=None)[0]
    a_s, nu = sol[:m], sol[m]
    if not np.all(np.isfinite(sol)) or a_s.min() < -tol or abs(a_s.sum() - 1.0) > tol:
        return None
    a = np.zeros(P.shape[0])
    a[s] = np.maximum(a_s, 0.0)
    a /= a.sum()
    grad = 2.0 * P @ a
    scale = max(1.0, float(np.abs(P).max()))
    if np.any(np.abs(grad[s] - nu) > tol * scale) or np.any(grad[~support] < nu - tol * scale):
        return None
    return a


def simplex_qp(P: Tensor | np.ndarray, max_iter: int = 20000, tol: float = 1e-9) -> np.ndarray:
    """argmin_a aᵀ P a subject to a >= 0, Σ a = 1, for a symmetric PSD `P` (float64 result).

    Accelerated projected gradient (FISTA with adaptive restart) finds the support; every few
    iterations the minimiser on that support is solved exactly from its KKT system and accepted
    once it is feasible and optimal for the whole problem, so the answer is exact up to
    round-off, not just up to the iteration's accuracy. Starts from uniform weights, which
    decides ties (e.g. P = 0 gives uniform weights).
    """
    P = np.asarray(P.detach().cpu() if isinstance(P, Tensor) else P, dtype=np.float64)
    P = 0.5 * (P + P.T)
    n = P.shape[0]
    a = np.full(n, 1.0 / n)
    lipschitz = 2.0 * float(np.linalg.eigvalsh(P).max()) if n else 0.0
    if n <= 1 or lipschitz <= 0.0:
        return a
    step = 1.0 / lipschitz
    y, t = a.copy(), 1.0
    objective = float(a @ P @ a)
    for it in range(1, max_iter + 1):
        a_next = project_simplex(y - step * 2.0 * (P @ y))
        obj_next = float(a_next @ P @ a_next)
        if obj_next > objective and t > 1.0:  # restart the momentum (a plain step from a always descends)
            y, t = a.copy(), 1.0
            continue
        t_next = 0.5 * (1.0 + np.sqrt(1.0 + 4.0 * t * t))
        y = a_next + ((t - 1.0) / t_next) * (a_next - a)
        moved = np.abs(a_next - a).max()
        a, t, objective = a_next, t_next, obj_next
        if it % 25 == 0 or moved == 0.0:
            exact = _kkt_solution(P, a > 0.0, tol)
            if exact is not None and float(exact @ P @ exact) <= objective + tol * max(1.0, abs(objective)):
                return exact
    return a


def aggregate_prototypes(protos: Tensor, counts: Tensor, previous: Tensor, known: Tensor) -> tuple[Tensor, Tensor]:
    """Count-weighted mean over clients of the local class prototypes (`protos` N × C × d,
    `counts` N × C); classes no client holds keep `previous` (and their `known` flag)."""
    total = counts.sum(0)
    mean = (counts.unsqueeze(2) * protos).sum(0) / total.clamp_min(1e-30).unsqueeze(1)
    held = total > 0
    return torch.where(held.unsqueeze(1), mean.to(previous.dtype), previous), known | held


def alignment_loss(z: Tensor, y: Tensor, protos: Tensor, known: Tensor) -> Tensor:
    """(1/(B·d)) Σ_b ‖z_b − c_{y_b}‖²₂ (B × d features `z`), summed over the samples whose class
    has a global prototype: the mean squared error of the authors' code when every class has one."""
    keep = known[y].to(z.dtype)
    return ((z - protos[y]).pow(2).sum(1) * keep).sum() / z.numel()


# ---------------------------------------------------------------------------- the algorithm
@dataclass(slots=True, eq=False)
class FedPACExtras(ClientExtras):
    stat_h: torch.Tensor | None = None        # h_i: its mean feature
    stat_v: float | None = None               # V_i: its feature variance term
    protos: torch.Tensor | None = None        # its per-class mean features
    proto_counts: torch.Tensor | None = None  # its per-class sample counts


class FedPAC(Algorithm):
    name = "fedpac"
    display = "FedPAC"
    Params = FedPACParams
    Extras = FedPACExtras
    acc_from = Scored.GLOBAL

    def __init__(self, config, trainer, model_name) -> None:
        super().__init__(config, trainer, model_name)
        self.head = head_module(trainer.model, model_name)
        self.num_classes, self.feature_dim = self.head.weight.shape
        self.lam = self.params.fedpac_lambda
        self.global_protos: Tensor | None = None   # C × d, float32
        self.known: Tensor | None = None           # C bools: class has a global prototype
        self.alpha: Tensor | None = None           # N × N combination weights of the last round

    def setup(self, init: State, clients: list[ClientInfo]) -> list[ClientState]:
        device = next(iter(init.values())).device
        self.global_protos = torch.zeros(self.num_classes, self.feature_dim, device=device)
        self.known = torch.zeros(self.num_classes, dtype=torch.bool, device=device)
        return super().setup(init, clients)

    def shared_names(self) -> list[str]:
        return self.body_names

    # ---------------------------------------------------------------- client side
    @torch.no_grad()
    def features(self, state: State, x: Tensor, batch_size: int = 1024) -> Tensor:
        """Feature vectors (the head's input) of `x` under `state`, in eval mode."""
        model = self.trainer.model
        load_state(model, state)
        model.eval()
        out = []
        with FeatureTap(head_module(model, self.model_name)) as tap:
            for start in range(0, x.shape[0], batch_size):
                model(x[start:start + batch_size])
                out.append(tap.z)
        model.train()
        return torch.cat(out)

    def alignment_objective(self, protos: Tensor, known: Tensor):
        """The body phase's loss: cross-entropy + λ · alignment to the global prototypes."""
        lam, model_name = self.lam, self.model_name

        def loss_fn(model: nn.Module, x: Tensor, y: Tensor) -> Tensor:
            with FeatureTap(head_module(model, model_name)) as tap:
                logits = model(x)
            return F.cross_entropy(logits, y) + lam * alignment_loss(tap.z, y, protos, known)

        return loss_fn

    def local_update(self, k: int, client: ClientState, data: ClientData, rnd: int) -> LocalStats:
        # 0. collaboration statistics under the received extractor
        z = self.features(client.state, data.x_train)
        _, _, h, v = class_statistics(z, data.y_train, self.num_classes)
        client.extra.stat_h, client.extra.stat_v = h, float(v)
        # 1. the head, extractor frozen
        stats = self.run_epochs(k, client, data, rnd, 1, {n: None for n in self.head_names}, purpose="head")
        # 2. the extractor, head frozen, with feature alignment
        options = {}
        if self.lam > 0 and bool(self.known.any()):
            options["loss_fn"] = self.alignment_objective(self.global_protos, self.known)
        body = self.run_epochs(k, client, data, rnd, self.config.local_epochs, {n: None for n in self.body_names},
                               purpose="body", **options)
        stats.loss_sum += body.loss_sum
        stats.samples += body.samples
        # 3. local prototypes under the trained extractor
        counts, means, _, _ = class_statistics(self.features(client.state, data.x_train), data.y_train,
                                               self.num_classes)
        client.extra.protos, client.extra.proto_counts = means.to(z.dtype), counts
        return stats

    # ---------------------------------------------------------------- server side
    def combination_weights(self, h: Tensor, v: Tensor) -> Tensor:
        """α (N × N, rows on the simplex): row i minimises client i's estimated loss bound
        (`h` N × C × d and `v` (N,) are the clients' statistics, float64)."""
        n = h.shape[0]
        rows = []
        for i in range(n):
            P = collaboration_matrix(i, h, v)
            if torch.isfinite(P).all():
                rows.append(torch.from_numpy(simplex_qp(P)))
            else:  # diverged features: keep the client's own head (as the authors' code on a failed QP)
                rows.append(torch.eye(n, dtype=torch.float64)[i])
        return torch.stack(rows)

    def aggregate(self, clients: list[ClientState], data: list[ClientData], rnd: int) -> Traffic:
        # extractor
        self.global_state.update(masked_average(
            self.global_state, [c.state for c in clients], [None] * len(clients),
            self.aggregation_weights(data), self.body_names))
        # global prototypes
        self.global_protos, self.known = aggregate_prototypes(
            torch.stack([c.extra.protos for c in clients]), torch.stack([c.extra.proto_counts for c in clients]),
            self.global_protos, self.known)
        # classifier collaboration over the heads after local training
        h = torch.stack([c.extra.stat_h for c in clients])
        v = torch.tensor([c.extra.stat_v for c in clients], dtype=torch.float64, device=h.device)
        self.alpha = self.combination_weights(h, v).to(h.device)
        heads = {n: torch.stack([c.state[n] for c in clients]) for n in self.head_names}
        for i, client in enumerate(clients):
            self.receive(client)
            weights = self.alpha[i].to(heads[self.head_names[0]].dtype)
            for n, stacked in heads.items():
                client.state[n] = torch.tensordot(weights, stacked, dims=1)
        entries = sum(self.numels[n] for n in self.param_names) + self.num_classes * self.feature_dim
        # Up: extractor, head and the C·d prototypes, plus the collaboration statistics h_i (C·d)
        # and V_i (1) and the class counts (C); down: extractor, combined head, global prototypes.
        down = entries * BYTES_PER_ENTRY
        up = down + (self.num_classes * self.feature_dim + 1 + self.num_classes) * BYTES_PER_ENTRY
        return Traffic(up=[up] * len(clients), down=[down] * len(clients))

    # ---------------------------------------------------------------- save / restore
    def state_dict(self) -> dict[str, Any]:
        return super().state_dict() | {"global_protos": self.global_protos, "known": self.known, "alpha": self.alpha}

    def load_state_dict(self, d: dict[str, Any]) -> None:
        super().load_state_dict(d)
        self.global_protos, self.known, self.alpha = d["global_protos"], d["known"], d["alpha"]
