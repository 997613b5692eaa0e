"""pFedHN — Shamsian, Navon, Fetaya, Chechik, "Personalized Federated Learning using
Hypernetworks", ICML 2021 (authors' code: github.com/AvivSham/pFedHN).

Evaluated per client: the model the hypernetwork generates for it at the end of the round,
θ_k = h(v_k; φ) after the server step (`acc_global`), as the authors evaluate the hypernetwork's
output. `acc_local` is θ̃_k, the generated model after the client's local SGD steps.

The server holds a hypernetwork h: a learned embedding v_k per client (`pfedhn_embed_dim`; none =
⌊1 + N/4⌋, the authors' rule) fed to an MLP — an input layer to `pfedhn_hidden` units, then
`pfedhn_layers` × (ReLU, hidden-to-hidden linear) as the authors' `n_hidden` — whose output goes
through one linear layer to every parameter of the client's target model (all tensors at once;
the authors' per-tensor output layers are this layer's row blocks). It is built from the run's
seed alone (PyTorch's default initialisation, embeddings N(0, 1)).

Round t, participant k: the client holds θ_k = h(v_k; φ) (sent down at the end of its last round,
or again when it missed a server step); it runs `pfedhn_inner_steps` SGD steps of `batch_size`
samples (whole passes in the seeded batch order, then the remaining steps on a seeded sample of
the data; none: `local_epochs` passes) with the run's lr, momentum and weight decay (the authors'
inner optimiser: lr 5e-3, momentum 0.9, weight decay 5e-5) and sends Δθ_k = θ_k − θ̃_k up. The
server then makes one step of SGD (lr `pfedhn_server_lr`, momentum `pfedhn_server_momentum`,
weight decay `pfedhn_server_wd`: the authors' 1e-2, 0.9, 1e-3) on φ and the embeddings along

    ∇ Σ_k c_k ⟨h(v_k; φ), Δθ_k⟩   (c_k = m·w_k over the m participants: 1 each under uniform weighting)

the sum of the participants' vector-Jacobian products ∇_φ θ_kᵀ Δθ_k, taken at the φ that generated
their models (the round's start; only client k's term reaches v_k), after clipping the gradient
to L2 norm `pfedhn_max_grad_norm` (the authors' 50, which their code also applies to each inner
step, and so do we). Every participant then receives its new θ_k.

Departures. The paper updates φ after each client (one sampled client per server step); here a
round's participants make one step on the sum of their terms: to first order the paper's m steps
in turn, with momentum, weight decay and clipping applied once per round. Applying the m steps
in turn, each with its term at the round's φ, was unstable on digits (10 clients, 2 shards each:
the training loss jumped from 0.7 to 4.8 in round 2); taking the mean of the terms instead of the
sum left φ nearly still (acc 0.15 after 10 rounds against 0.71 with the sum, 10 inner steps). The
authors' optional separate embedding lr and spectral norm are left out. Buffers (BatchNorm
statistics) are not generated: they stay on the client. An unseen client is scored with what its
never-trained embedding generates (the paper's new-client embedding fitting is left out).

Traffic per participant and round: down θ_k, up Δθ_k, each the target model's parameters. Target
models above MAX_TARGET_PARAMS parameters are refused in `setup`: the output layer holds
`pfedhn_hidden` × P weights (plus as many for its gradient and momentum), e.g. 1.1 G entries for
ResNet-18 (11.2 M parameters); the limit admits lenet / lenet_bn on 8x8, 28x28 and 32x32 inputs
(137 K at most, about the authors' CIFAR target network) and cnn2 / cnn_bn on 8x8 inputs only.
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from ..client_state import ClientExtras, ClientState
from ..config import ConfigError
from ..data import ClientData
from ..knobs import MethodParams, knob
from ..training import State, clipped, derive_seed
from .base import Algorithm, BYTES_PER_ENTRY, ClientInfo, LocalStats, Scored, Traffic

MAX_TARGET_PARAMS = 250_000


@dataclass(frozen=True)
class PFedHNParams(MethodParams):
    pfedhn_embed_dim: int | None = knob(None, "size of each client's embedding v_k (none: floor(1 + N/4), the "
                                        "authors' rule)", low=1)
    pfedhn_hidden: int = knob(100, "units of the hypernetwork's hidden layers", low=1)
    pfedhn_layers: int = knob(3, "hidden-to-hidden layers after the MLP's input layer (the authors' n_hidden)",
                              low=0)
    pfedhn_inner_steps: int | None = knob(50, "local SGD steps of batch_size samples per round (none: local_epochs "
                                          "passes over the data)", low=1)
    pfedhn_server_lr: float = knob(1e-2, "learning rate of the server's SGD on the hypernetwork", low=0,
                                   low_open=True)
    pfedhn_server_momentum: float = knob(0.9, "momentum of the server's SGD", low=0, high=1, high_open=True)
    pfedhn_server_wd: float = knob(1e-3, "weight decay of the server's SGD", low=0)
    pfedhn_max_grad_norm: float | None = knob(50.0, "L2 norm the hypernetwork's gradient and each inner step's "
                                              "gradient are clipped to (none: no clipping)", low=0, low_open=True)


class HyperNetwork(nn.Module):
    """Client embeddings, an MLP, and one linear output layer giving every target tensor."""

    def __init__(self, num_clients: int, embed_dim: int, hidden: int, layers: int,
                 shapes: dict[str, torch.Size]) -> None:
        super().__init__()
        self.embeddings = nn.Embedding(num_clients, embed_dim)
        mlp: list[nn.Module] = [nn.Linear(embed_dim, hidden)]
        for _ in range(layers):
            mlp += [nn.ReLU(), nn.Linear(hidden, hidden)]
        self.mlp = nn.Sequential(*mlp)
        self.shapes = dict(shapes)
        self.out = nn.Linear(hidden, sum(math.prod(s) for s in self.shapes.values()))

    def forward(self, k: int) -> dict[str, Tensor]:
        flat = self.out(self.mlp(self.embeddings.weight[k]))
        pieces = flat.split([math.prod(s) for s in self.shapes.values()])
        return {n: piece.view(shape) for (n, shape), piece in zip(self.shapes.items(), pieces)}


@dataclass(slots=True, eq=False)
class PFedHNExtras(ClientExtras):
    pfedhn_client: int | None = None  # its index: its embedding row
    pfedhn_delta: State | None = None  # within a round: Δθ = θ − θ̃, read (and dropped) by `aggregate`


class PFedHN(Algorithm):
    name = "pfedhn"
    display = "pFedHN"
    Params = PFedHNParams
    Extras = PFedHNExtras
    acc_from = Scored.GLOBAL
    evaluates = "the model the hypernetwork generates for the client after the server step"

    # ---------------------------------------------------------------- set-up
    def setup(self, init: State, clients: Sequence[ClientInfo]) -> list[ClientState]:
        total = sum(self.numels.values())
        if total > MAX_TARGET_PARAMS:
            raise ConfigError(f"pfedhn generates every parameter of the target model, and model {self.model_name!r} "
                              f"has {total:,} of them; the limit is {MAX_TARGET_PARAMS:,} parameters (choose a smaller "
                              f"model, e.g. --model lenet)")
        p = self.params
        embed_dim = p.pfedhn_embed_dim or int(1 + len(clients) / 4)
        shapes = {n: t.shape for n, t in self.trainer.params.items()}
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(derive_seed(self.config.seed, "pfedhn-hypernetwork"))
            self.hypernet = HyperNetwork(len(clients), embed_dim, p.pfedhn_hidden, p.pfedhn_layers, shapes)
        self.hypernet.to(next(iter(init.values())).device)
        self.optimizer = torch.optim.SGD(self.hypernet.parameters(), lr=p.pfedhn_server_lr,
                                         momentum=p.pfedhn_server_momentum, weight_decay=p.pfedhn_server_wd)
        return super().setup(init, clients)

    def init_client(self, k: int, init: State) -> ClientState:
        client = ClientState(state={n: t.clone() for n, t in init.items()}, extra=PFedHNExtras(pfedhn_client=k))
        self.receive(client)  # θ_k^0 = h(v_k; φ^0); buffers from the built model
        return client

    @torch.no_grad()
    def generate(self, k: int) -> State:
        """θ_k = h(v_k; φ): the client's target parameters under the current hypernetwork."""
        return {n: t.clone() for n, t in self.hypernet(k).items()}

    # ---------------------------------------------------------------- client side
    def local_update(self, k: int, client: ClientState, data: ClientData, rnd: int) -> LocalStats:
        start = {n: client.state[n].clone() for n in self.param_names}
        stats = self.inner_steps(k, client, data, rnd)
        client.extra.pfedhn_delta = {n: start[n] - client.state[n] for n in self.param_names}
        return stats

    def inner_steps(self, k: int, client: ClientState, data: ClientData, rnd: int) -> LocalStats:
        """`pfedhn_inner_steps` SGD steps: whole passes over the data, then the remaining steps on
        a seeded sample of (remaining steps × batch_size) training samples."""
        steps, clip = self.params.pfedhn_inner_steps, self.params.pfedhn_max_grad_norm
        update = self.full_update()
        if steps is None:
            return self.run_epochs(k, client, data, rnd, self.config.local_epochs, update, corrections=clipped(clip))
        batch, n = self.config.batch_size, data.n_train
        passes, rest = divmod(steps, math.ceil(n / batch))
        options: dict[str, Any] = {"corrections": clipped(clip)}
        if self.config.momentum_scope == "round":
            options["velocity"] = {}
        stats = self.run_epochs(k, client, data, rnd, passes, update, **options)
        if rest:
            pick = torch.randperm(n, generator=torch.Generator().manual_seed(
                derive_seed(self.config.seed, rnd, k, "pfedhn-rest")))[:rest * batch].to(data.x_train.device)
            seed = derive_seed(self.config.seed, rnd, k, passes, "global")
            client.state, loss, m = self.trainer.train_pass(client.state, data.x_train[pick], data.y_train[pick],
                                                            update, seed, lr=self.lr(rnd), **options)
            stats.loss_sum += loss
            stats.samples += m
        return stats

    # ---------------------------------------------------------------- server side
    def shared_names(self) -> list[str]:
        return []  # nothing is averaged: every client's whole model is its own (personal_fraction 1)

    def server_step(self, ks: Sequence[int], deltas: Sequence[State], coefficients: Sequence[float]) -> None:
        """One SGD step on φ and the embeddings along ∇ Σ_k c_k ⟨h(v_k; φ), Δθ_k⟩ (the vector-Jacobian
        products of the participants, at the φ that generated their models), clipped."""
        params = list(self.hypernet.parameters())
        with torch.enable_grad():
            surrogate = sum(c * sum((theta * delta[n]).sum() for n, theta in self.hypernet(k).items())
                            for k, delta, c in zip(ks, deltas, coefficients))
            grads = torch.autograd.grad(surrogate, params)
        for p, g in zip(params, grads):
            p.grad = g
        if self.params.pfedhn_max_grad_norm is not None:
            nn.utils.clip_grad_norm_(params, self.params.pfedhn_max_grad_norm)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)

    def aggregate(self, clients: Sequence[ClientState], data: Sequence[ClientData], rnd: int) -> Traffic:
        ks = [c.extra.pfedhn_client for c in clients]
        deltas = [c.extra.pfedhn_delta for c in clients]
        for c in clients:
            c.extra.pfedhn_delta = None  # this round's only
        coefficients = ([len(clients) * w for w in self.aggregation_weights(data)]
                        if self.config.weighting == "samples" else [1.0] * len(clients))
        self.server_step(ks, deltas, coefficients)
        for client in clients:
            self.receive(client)
        size = self.sent_bytes(clients[0]) if clients else 0
        return Traffic(up=[size] * len(clients), down=[size] * len(clients))

    def receive(self, client: ClientState) -> None:
        """The server sends θ_k = h(v_k; φ) (buffers stay the client's)."""
        client.state.update(self.generate(client.extra.pfedhn_client))

    def sent_bytes(self, client: ClientState) -> int:
        """θ_k down or Δθ_k up: the target model's parameters."""
        return sum(self.numels.values()) * BYTES_PER_ENTRY

    # ---------------------------------------------------------------- save / restore
    def state_dict(self) -> dict[str, Any]:
        return super().state_dict() | {"hypernet": self.hypernet.state_dict(),
                                       "optimizer": self.optimizer.state_dict()}

    def load_state_dict(self, d: dict[str, Any]) -> None:
        super().load_state_dict(d)
        self.hypernet.load_state_dict(d["hypernet"])
        self.optimizer.load_state_dict(d["optimizer"])
