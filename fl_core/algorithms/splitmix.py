"""Split-Mix FL — Hong, Wang, Wang, Zhou, "Efficient Split-Mix Federated Learning for On-Demand
and In-Situ Customization", ICLR 2022 (authors' code github.com/illidanlab/SplitMix); a baseline of
PerFedMask, whose device widths (`slim_ratios`) it shares.

Evaluated per client: the mix of the bases the device can afford, bases 0..k_n−1 of the broadcast
model (the mean of their logits), both as `acc_global` and, by default (`ft_epochs` 0), as `acc`.
A study that sets `ft_epochs` gets `acc` after fine-tuning a copy of those k_n bases (only them,
on the sum of their cross-entropies) on the client's data; `acc_global` stays the un-tuned mix.

The model. Instead of one network of width 1, Split-Mix trains M = round(1/r_min) narrow *base
models*, each a complete copy of the registered network at width 1/M (r_min: the smallest ratio
in `slim_ratios`; `8-1` gives eight LeNets with ⌈C/8⌉ of every hidden layer's C channels). The run's
network (`build_model`) is their ensemble: `bases`, an `nn.ModuleList` of the M copies, and
`active`, a persistent 0/1 buffer of length M; the forward pass is the mean of the logits of the
active bases. Being a buffer, `active` is part of each client's state and never sent or averaged
(as BatchNorm statistics here): every client's `active` marks its own bases 0..k_n−1, so the
engine's ordinary evaluation of a client's state — after local training, after the broadcast, of
the fine-tuned copy — scores the device's own mix, with no engine hook. Only the small CNNs can be
built narrower (`models.WIDTH_MODELS`); other models and `init_weights` (a width-1 file cannot
initialise the narrow bases) are ConfigErrors.

Training. Device n with ratio r_n (fl_core/devices.py: the schedule, `full_share`, or a profile's
`ratio`) trains k_n = round(r_n / r_min) bases each round (clamped to 1..M): the k_n consecutive
bases (mod M) from a random shift drawn per round and client (seeded by (seed, round, client)), so
that the narrow devices between them train every base. Its loss is the sum of each trained base's
own cross-entropy, so the bases' gradients never mix (each is trained as an independent model,
as in the paper). It sends only the bases it trained; the server averages each base over the
participants that trained it (the one masked-averaging primitive; the other bases are sent as
all-False masks) and a base nobody trained keeps its value. Everyone receives the whole model.
Per client the rows carry `width` (r_n), `bases` (k_n), `trainable_params` (k_n bases' parameters)
and per-sample `fwd_mflops` / `bwd_mflops` of k_n bases (the k_n forward and backward passes of one
base; the bases it does not train are never run).

With `slim_ratios` "1" there is one base, the whole model, which every device trains: Split-Mix is
then FedAvg, bit for bit.

Left out of the authors' code: the dual BatchNorm and the adversarial training of the in-situ
robustness customisation (clean/noised statistics per base); the authors' re-scaling options for
the narrow bases' initialisation and layer outputs; their evaluation of every width of the global
mix on a shared test set (here each device scores its own mix on its own data, or with
`score_width = "full"` the mix of all bases, fine-tuned whole, as the PerFedMask authors score
Split-Mix; the device's own mix is then `acc_device`).
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor, nn
from torch.nn import functional as F

from .. import models
from ..client_state import ClientExtras, ClientState
from ..config import ConfigError, RunConfig
from ..data import ClientData
from ..devices import WidthScoringParams, parse_ratios
from ..masks import Mask
from ..training import State, UpdateSpec, derive_seed
from .base import ClientInfo, LocalStats
from .fedavg_ft import FineTuneParams, FineTuneProtocol, WidthScoring


@dataclass(frozen=True)
class SplitMixParams(FineTuneParams, WidthScoringParams):
    """Split-Mix's knobs: fine-tuning before evaluation, and the devices' width ratios (whose
    smallest sets the base width)."""


class BaseEnsemble(nn.Module):
    """M narrow base models; the forward pass is the mean logit of those marked in `active`."""

    def __init__(self, bases: Sequence[nn.Module]) -> None:
        super().__init__()
        self.bases = nn.ModuleList(bases)
        self.register_buffer("active", torch.ones(len(self.bases)))

    def forward(self, x: Tensor) -> Tensor:
        chosen = [b for b, on in zip(self.bases, self.active.tolist()) if on]
        if not chosen:
            raise RuntimeError("Split-Mix: no base model is active")
        out = chosen[0](x)
        for base in chosen[1:]:
            out = out + base(x)
        return out / len(chosen)


def base_count(slim_ratios: str) -> int:
    """M, the number of base models: round(1 / the smallest device ratio)."""
    return round(1.0 / min(parse_ratios(slim_ratios)))


def sum_of_base_losses(bases: Sequence[int]):
    """A loss_fn: the sum of the named bases' own cross-entropies (their gradients stay apart)."""

    def loss_fn(model: nn.Module, x: Tensor, y: Tensor) -> Tensor:
        loss = F.cross_entropy(model.bases[bases[0]](x), y)
        for i in bases[1:]:
            loss = loss + F.cross_entropy(model.bases[i](x), y)
        return loss

    return loss_fn


@dataclass(slots=True, eq=False)
class SplitMixExtras(ClientExtras):
    bases: list[int] | None = None  # the bases the client trained last (its own mix before it trains)


class SplitMix(WidthScoring):
    name = "splitmix"
    display = "Split-Mix FL"
    Params = SplitMixParams
    Extras = SplitMixExtras
    protocol = FineTuneProtocol(epochs=0)  # acc = the device's mix unless a study sets ft_epochs
    evaluates = "the mix of the client's affordable bases of the broadcast model, fine-tuned when " \
                "ft_epochs > 0 (acc_global: before fine-tuning)"

    @classmethod
    def build_model(cls, config: RunConfig, model_name: str, input_shape: tuple[int, int, int],
                    num_classes: int) -> nn.Module:
        if config.init_weights is not None:
            raise ConfigError("splitmix trains narrow base models, which init_weights (a full model's state) "
                              "cannot initialise; leave init_weights unset")
        if model_name not in models.WIDTH_MODELS:
            raise ConfigError(f"splitmix needs a model that can be built narrower; model {model_name!r} cannot "
                              f"(models with a width: {', '.join(models.WIDTH_MODELS)})")
        m = base_count(config.method.slim_ratios)
        return BaseEnsemble([models.build_model(model_name, input_shape, num_classes, width=config.model_width / m)
                             for _ in range(m)])

    # ---------------------------------------------------------------- set-up
    def setup(self, init: State, clients: Sequence[ClientInfo]) -> list[ClientState]:
        self.m = len(self.trainer.model.bases)
        self.widths = self.params.ratios(len(clients), [info.profile for info in clients])
        self.counts = [min(self.m, max(1, round(r * self.m))) for r in self.widths]
        self.base_names = [[n for n in self.param_names if n.startswith(f"bases.{i}.")] for i in range(self.m)]
        return super().setup(init, clients)

    def init_client(self, k: int, init: State) -> ClientState:
        client = super().init_client(k, init)
        active = torch.zeros_like(init["active"])
        active[:self.counts[k]] = 1
        client.state["active"] = active  # the device's own mix: bases 0..k_n-1
        client.extra.bases = list(range(self.counts[k]))  # what it trained last (none yet: its own)
        return client

    # ---------------------------------------------------------------- training
    def bases_of_round(self, k: int, rnd: int) -> list[int]:
        """The k_n consecutive bases (mod M) client k trains in round `rnd`, from a seeded shift."""
        shift = int(np.random.default_rng(derive_seed(self.config.seed, rnd, k, "splitmix-shift")).integers(self.m))
        return [(shift + i) % self.m for i in range(self.counts[k])]

    def spec(self, bases: Sequence[int]) -> UpdateSpec:
        return {n: None for i in bases for n in self.base_names[i]}

    def local_update(self, k: int, client: ClientState, data: ClientData, rnd: int) -> LocalStats:
        bases = self.bases_of_round(k, rnd)
        client.extra.bases = bases
        stats = self.run_epochs(k, client, data, rnd, self.config.local_epochs, self.spec(bases),
                                loss_fn=sum_of_base_losses(bases))
        stats.metrics = {"width": self.widths[k], "bases": float(len(bases))}
        return stats

    def contribution(self, client: ClientState) -> Mask | None:
        """Nothing of the bases the client did not train this round (None when it trained all)."""
        trained = set(client.extra.bases)
        return self.withheld(n for i in range(self.m) if i not in trained for n in self.base_names[i])

    # ---------------------------------------------------------------- costs and evaluation
    def trained_entries(self, k: int) -> UpdateSpec:
        """k_n bases' parameters (which ones varies by round; the count does not)."""
        return self.spec(range(self.counts[k]))

    def fine_tuned_entries(self, k: int) -> UpdateSpec:
        return self.trained_entries(k)

    def training_cost(self, k: int, input_shape: tuple[int, ...]) -> dict[str, float]:
        """k_n times one base's parameters and per-sample FLOPs (counted once per run)."""
        cache = self.__dict__.setdefault("_cost", {})
        if "base" not in cache:
            from ..flops import training_flops

            base = self.trainer.model.bases[0]
            fwd, bwd = training_flops(base, input_shape)
            cache["base"] = (sum(p.numel() for p in base.parameters()), fwd, bwd)
        numel, fwd, bwd = cache["base"]
        n = self.counts[k]
        return {"trainable_params": float(n * numel), "fwd_mflops": n * fwd / 1e6, "bwd_mflops": n * bwd / 1e6}

    def full_width(self, client: ClientState) -> tuple[ClientState, UpdateSpec, dict]:
        """`score_width = "full"`: the mix of every base, all of them fine-tuned (the authors'
        `personalization_slimmable`, then scoring at width 1)."""
        every = list(range(self.m))
        whole = dict(client.state) | {"active": torch.ones_like(client.state["active"])}
        return ClientState(state=whole), self.spec(every), {"loss_fn": sum_of_base_losses(every)}

    def fine_tune_options(self, k: int) -> dict:
        """Fine-tuning changes the device's own bases 0..k_n-1, on the sum of their cross-entropies
        (its `active` buffer then scores their mix)."""
        return {"loss_fn": sum_of_base_losses(list(range(self.counts[k])))}
