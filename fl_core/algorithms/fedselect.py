"""FedSelect — Tamirisa et al., "FedSelect: Personalized Federated Learning with Customized
Selection of Parameters for Fine-Tuning", CVPR 2024.

Evaluated per client: its model after local training (`acc_local`): its personal entries plus
the global entries it received and fine-tuned this round.

Each round a client runs LocalAlt (Pillutla et al. 2022) — per epoch one pass updating only its
personal entries, then one pass updating only its global entries — and then GradSelect: among
the entries still global, those whose value moved most during LocalAlt (|Δ|) become personal,
per tensor, so that the personal fraction f grows as f <- min(α, f + p(1 - f)). The server
averages only global entries (`masks.masked_average`); personal entries never leave the client.
With p = 0 or α = 0 nothing becomes personal and the run is exactly FedAvg.

The mask GradSelect returns in round t is the mask of round t + 1 (the paper, §4.5: "m_{t+1} is
the mask to be used for local updates in the subsequent communication round"; GradSelect returns
the parameters trained under m_t). So round t's upload, average and broadcast use the mask the
client trained with, m_t: entries that became personal in round t are still averaged once and
start their personal life from the round-t global value. The public reference code does the
same (it uploads and broadcasts with the training mask). Both modes follow this rule.

Ablations (the paper's Table 3), chosen by `fedselect_variant`; they change only which entries
become personal, never the schedule:
- `personalize_least`: the still-global entries with the *smallest* |Δ| become personal;
- `random`: random still-global entries (seeded by run seed, round, client and tensor);
- `layer`: no selection at all; one whole block (`layer_block`, A-D as defined in
  fl_core/models.py) is personal from the start and everything else stays global.

`fedselect_mode="faithful"` (the class `FaithfulFedSelect`, below) follows the public reference
code (github.com/lapisrocks/fedselect, `fedselect.py` and `lottery_ticket.py`) where it differs
from the paper's description:
- the mask grows at the 0-based rounds k, 2k, 3k, ... (k = `mask_every`), never in round 0:
  here the 1-based rounds k + 1, 2k + 1, ...;
- Δ is measured from the client's state after local training (before the broadcast) at its
  previous mask update (the initial model before the first), not from the start of LocalAlt;
- per tensor, the mask grows whenever that tensor's personal share (a float32 quotient) is at
  most α (checked before growing, so it may overshoot α), by the global entries whose |Δ|
  reaches the value at sorted position round((1 - p)·G) of the G global entries' |Δ| (numpy's
  round), ties included;
- the last round is not aggregated;
- the server sums the global entries and divides by their count (weights 1, not 1/K: the same
  mean, rounded as the reference rounds it; benchmarks/parity/fedselect.py shows the two runs
  then agree bit for bit, and that a last-bit difference here grows into different masks).
Not reproduced (pitfalls of the reference): after its first evaluation the reference
trains in eval mode, and it runs the personal pass even when nothing is personal; both matter only
for BatchNorm or dropout (its running statistics), so the parity runs use LeNet, which has neither.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from ..client_state import ClientExtras, ClientState, PackedMask
from ..data import ClientData
from ..knobs import ConfigError, MethodParams, Space, knob
from ..masks import grow_count, personal_fraction, select_largest
from ..models import block_of
from ..training import State, derive_seed
from .base import Algorithm, LocalStats, Scored

VARIANTS = ("gradselect", "personalize_least", "layer", "random")
BLOCKS = ("A", "B", "C", "D")
VARIANT_LABELS = {"personalize_least": "personalize least", "random": "random"}


@dataclass(frozen=True)
class FedSelectParams(MethodParams):
    pers_rate: float = knob(0.25, "FedSelect p: share of the still-global entries made personal each round",
                            low=0, high=1,
                            search=Space(0.05, 0.6, source="around the paper's p = 0.25; our grids' 0.1-0.5 widened"))
    pers_limit: float = knob(0.8, "FedSelect alpha: cap on the personal fraction of each tensor", low=0, high=1,
                             search=Space(0.2, 0.95, source="the paper's grid of alpha, 0.2-0.8 (its CIFAR-10 runs), "
                                          "up to near local training"))
    select_params: str = knob("weights", "tensors that may become personal (weights = *weight tensors; all = every "
                              "parameter)", choices=("weights", "all"))
    fedselect_mode: str = knob("default", "semantics: default (this file's docstring) or faithful (the public "
                               "reference code)", choices=("default", "faithful"))
    mask_every: int = knob(1, "faithful mode: grow the mask every k rounds", low=1)
    fedselect_variant: str = knob("gradselect", "ablation (paper Table 3): gradselect = largest |Δ|; "
                                  "personalize_least = smallest |Δ|; layer = one whole block; random = random entries",
                                  choices=VARIANTS)
    layer_block: str = knob("A", "layer ablation: the block made personal (A-D, see fl_core/models.py)", choices=BLOCKS)

    def label(self, display: str) -> str:
        if self.fedselect_variant == "gradselect":
            return display
        if self.fedselect_variant == "layer":
            return f"{display} (layer {self.layer_block})"
        return f"{display} ({VARIANT_LABELS[self.fedselect_variant]})"


@dataclass(slots=True, eq=False)
class FedSelectExtras(ClientExtras):
    fraction: float | None = None      # the personal share its next mask grows to
    next_mask: dict | None = None      # the grown mask (PackedMask.to_dict()), applied at the broadcast


class FedSelect(Algorithm):
    """The paper's FedSelect; `fedselect_mode="faithful"` makes the run a `FaithfulFedSelect`."""

    name = "fedselect"
    display = "FedSelect"
    Params = FedSelectParams
    Extras = FedSelectExtras
    acc_from = Scored.LOCAL
    include_ties = False  # entries tied with the last one selected become personal too

    def __new__(cls, config=None, *args, **kwargs):
        if cls is FedSelect and config is not None and config.method.fedselect_mode == "faithful":
            cls = FaithfulFedSelect
        return super().__new__(cls)

    def __init__(self, config, trainer, model_name) -> None:
        super().__init__(config, trainer, model_name)
        if self.params.select_params == "all":
            self.selectable = list(self.param_names)
        else:  # conv, linear and BatchNorm-gamma weights; biases and BN beta stay global
            self.selectable = [n for n in self.param_names if n.endswith("weight")]

    def init_client(self, k: int, init: State) -> ClientState:
        client = super().init_client(k, init)
        client.mask = {n: torch.zeros_like(init[n], dtype=torch.bool) for n in self.selectable}
        if self.params.fedselect_variant == "layer":
            block = self.params.layer_block
            if not any(block_of(self.model_name, n) == block for n in self.param_names):
                raise ConfigError(f"layer_block={block!r} names no parameter of model {self.model_name}")
            client.mask = {n: torch.full_like(init[n], block_of(self.model_name, n) == block, dtype=torch.bool)
                           for n in self.param_names}
        client.extra.fraction = 0.0
        return client

    # ---------------------------------------------------------------- client side
    def local_update(self, k: int, client: ClientState, data: ClientData, rnd: int) -> LocalStats:
        self.apply_next_mask(client)  # normally done by `receive`; here if no broadcast came
        grows = self.grows_in(rnd) and self.params.fedselect_variant != "layer"
        reference = self.delta_reference(client) if grows else None
        stats = self.local_alt(k, client, data, rnd)
        if grows:
            # kept bit-packed (as plain tensors, so that a saved state stays loadable) until the broadcast
            client.extra.next_mask = PackedMask(self.grad_select(client, reference, rnd, k)).to_dict()
            self.after_growth(client)
        return stats

    def delta_reference(self, client: ClientState) -> State:
        """What Δ is measured from: the start of LocalAlt, the tensors held now (training leaves
        them as they are: its first pass copies)."""
        return {n: client.state[n] for n in self.selectable}

    def after_growth(self, client: ClientState) -> None:
        """After GradSelect chose the next mask (nothing to keep here)."""

    def grows_in(self, rnd: int) -> bool:
        return True

    def local_alt(self, k: int, client: ClientState, data: ClientData, rnd: int) -> LocalStats:
        mask = client.mask
        personal_pass = dict(mask.items())
        global_pass = {n: ~mask[n] if n in mask else None for n in self.param_names}
        has_personal = any(bool(m.any()) for m in mask.values())
        stats = LocalStats(torch.zeros((), device=data.x_train.device), 0)
        own = {}  # after the first pass the state is this update's own copy: later passes train it in place
        for epoch in range(self.config.local_epochs):
            if has_personal:  # with nothing personal the pass would change nothing but BN statistics
                self.train_pass(k, client, data, rnd, epoch, personal_pass, "personal", stats, **own)
                own = {"inplace": True}
            self.train_pass(k, client, data, rnd, epoch, global_pass, "global", stats, **own)
            own = {"inplace": True}
        return stats

    def grad_select(self, client: ClientState, reference: State, rnd: int, k: int) -> dict[str, torch.Tensor]:
        """The next round's mask: each selectable tensor's personal set grown by the entries
        that moved most since `reference` (largest |Δ| first; the ablations score otherwise)."""
        grown = {}
        count = self.growth_count(client)
        for n in self.selectable:
            mask = client.mask[n]
            add = count(n, mask)
            if add > 0:
                scores = self.selection_scores(client.state[n] - reference[n], rnd, k, n)
                mask = select_largest(scores, mask, add, include_ties=self.include_ties)
            grown[n] = mask
        return grown

    def growth_count(self, client: ClientState):
        """(tensor name, its mask) -> how many entries become personal this round: the paper's
        schedule, f <- min(α, f + p(1 - f)) of each tensor's entries (the client's f advanced once)."""
        p, alpha = self.params.pers_rate, self.params.pers_limit
        f = min(alpha, client.extra.fraction + p * (1.0 - client.extra.fraction))
        client.extra.fraction = f
        return lambda n, mask: grow_count(self.numels[n], f) - int(mask.sum())

    def selection_scores(self, delta: torch.Tensor, rnd: int, k: int, name: str) -> torch.Tensor:
        """Non-negative scores; the highest become personal. GradSelect: |Δ|; ablations differ."""
        variant = self.params.fedselect_variant
        if variant == "personalize_least":
            magnitude = delta.abs()
            return magnitude.max() - magnitude
        if variant == "random":
            generator = torch.Generator().manual_seed(derive_seed(self.config.seed, rnd, k, name, "random"))
            return torch.rand(delta.shape, generator=generator).to(delta.device)
        return delta.abs_()  # `delta` is grad_select's own difference

    @staticmethod
    def apply_next_mask(client: ClientState) -> None:
        """Switch to the mask GradSelect chose (after this round's broadcast used the old one)."""
        grown, client.extra.next_mask = client.extra.next_mask, None
        if grown is not None:
            client.mask = PackedMask.from_dict(grown)

    # ---------------------------------------------------------------- server side
    def receive(self, client: ClientState) -> None:
        """Broadcast into the entries global under the training mask, then switch masks."""
        for n in self.param_names:
            mask = client.mask.get(n)
            g = self.global_state[n]
            client.state[n] = g.clone() if mask is None else torch.where(mask, client.state[n], g)
        self.apply_next_mask(client)

    def personal_fraction(self, client: ClientState) -> float:
        """Of the mask the client holds for its next round."""
        grown = client.extra.next_mask
        return personal_fraction(client.mask if grown is None else PackedMask.from_dict(grown), self.numels)


@dataclass(slots=True, eq=False)
class FaithfulFedSelectExtras(FedSelectExtras):
    reference: State | None = None  # the selectable tensors at its last mask update (Δ is from them)


class FaithfulFedSelect(FedSelect):
    """`fedselect_mode="faithful"`: FedSelect as the public reference code runs it (the module
    docstring lists each difference; the same knobs, the same config hashes)."""

    Extras = FaithfulFedSelectExtras
    include_ties = True

    def init_client(self, k: int, init: State) -> ClientState:
        client = super().init_client(k, init)
        if self.params.fedselect_variant != "layer":  # the first Δ is from the initial model
            client.extra.reference = {n: init[n].clone() for n in self.selectable}
        return client

    def delta_reference(self, client: ClientState) -> State:
        """The state kept at the client's last mask update (the initial model before the first)."""
        return client.extra.reference

    def after_growth(self, client: ClientState) -> None:
        """The next Δ is measured from here (after training, before the broadcast)."""
        client.extra.reference = {n: client.state[n].clone() for n in self.selectable}

    def grows_in(self, rnd: int) -> bool:
        return rnd > 1 and (rnd - 1) % self.params.mask_every == 0

    def growth_count(self, client: ClientState):
        """How many entries the reference code makes personal in a tensor: none once its
        personal share exceeds α; else G - round((1 - p)·G) of its G global entries. The share is
        a float32 quotient, as the reference's tensor division gives it: a share of exactly α
        (8 of 10 entries at α = 0.8) reads 0.800000012 there and so already exceeds α."""
        def count(n: str, mask: torch.Tensor) -> int:
            personal = int(mask.sum())
            if float(np.float32(personal) / np.float32(mask.numel())) > self.params.pers_limit:
                return 0
            free = mask.numel() - personal
            return free - int(np.round((1.0 - self.params.pers_rate) * free))
        return count

    def aggregation_weights(self, data) -> list[float]:
        """Uniform weighting: weight 1 per client, so the masked average is the reference's sum
        of the global entries divided by their count (the same mean as weights 1/K, but rounded
        as the reference rounds it: with 1/K = 0.1 the two differ in the last bit)."""
        if self.config.weighting == "uniform":
            return [1.0] * len(data)
        return super().aggregation_weights(data)

    def aggregates_in(self, rnd: int) -> bool:
        return rnd != self.config.rounds
