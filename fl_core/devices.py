"""Device capability profiles: how much of the model each client can train (PerFedMask, HeteroFL).

A device's capability is a width ratio r ∈ (0, 1], as in the Split-Mix / PerFedMask authors' code
(`--slim_ratios`, e.g. `8-1`: ratios 1/8 and 1). Methods read it two ways:
- PerFedMask: a budget ψ_n = r_n · d_w of body parameters the device may train (the authors'
  `users_max_comp[n] * totalParamNum`);
- HeteroFL: a sub-model with r_n of every hidden layer's channels (≈ r_n² of its parameters).

Which device gets which ratio (`device_ratios`):
- by default as the authors' `get_slim_ratio_schedule`: the ratios sorted ascending split the
  clients into equal consecutive groups, client k taking ratios[⌊len(ratios)·k/N⌋] (`8-1` with
  20 clients: clients 0-9 at 1/8, 10-19 at 1);
- with `full_share` ν (the poster's ablation, "the share of devices able to update the whole
  model"): the last round(ν·N) clients take the largest ratio and the others are split as above
  over the smaller ones (with a single ratio given, everyone is at it).
Client indices carry no data meaning (partitions are seeded and shuffled), so the grouping by index
is as random as any.

An explicit per-client profile (`Simulation(profiles=[{"ratio": r}, ...])`) overrides the schedule.

The full-model baselines of PerFedMask's comparison (FedAvg+FT, FedBABU, FedProx, FedNova) train
the whole model on every device, but the authors hold them to the devices' limits too: a device
whose ratio is below 1 runs ⌈E · f⌉ of the E local epochs (their `--wk_factor` f, 0.5; PerFedMask,
HeteroFL and Split-Mix meet the limits through masks or widths instead and run E everywhere).
`WeakDeviceParams` gives those methods that rule as the knob `weak_epochs` (f; none = off).
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from .knobs import ConfigError, MethodParams, knob


def parse_ratios(spec: str) -> list[float]:
    """`8-4-2-1` -> [0.125, 0.25, 0.5, 1.0]: each part p is a 1/p-wide device (sorted ascending,
    duplicates removed). Anything else is a ConfigError naming the spec."""
    parts = spec.split("-") if isinstance(spec, str) else []
    try:
        divisors = [int(p) for p in parts]
    except ValueError:
        divisors = []
    if not divisors or any(d < 1 for d in divisors):
        raise ConfigError(f"slim_ratios={spec!r} is not allowed; give dash-separated positive integers p, each "
                          f"a device class at width 1/p (e.g. 8-1 or 8-4-2-1)")
    return sorted({1.0 / d for d in divisors})


def device_ratios(spec: str, num_clients: int, full_share: float | None = None) -> list[float]:
    """Each client's width ratio (see the module docstring)."""
    ratios = parse_ratios(spec)
    if full_share is None or len(ratios) == 1:
        return [ratios[len(ratios) * k // num_clients] for k in range(num_clients)]
    full = round(full_share * num_clients)
    rest, smaller = num_clients - full, ratios[:-1]
    return [smaller[len(smaller) * k // rest] for k in range(rest)] + [ratios[-1]] * full


SLIM_RATIOS_HELP = ("device width ratios as dash-separated divisors (8-1: half the clients at width 1/8, half at 1; "
                    "PerFedMask's budget is that share of the body's parameters)")
FULL_SHARE_HELP = ("ν, the share of clients able to train the whole model (the rest split over the smaller ratios); "
                   "none: equal groups per ratio")


@dataclass(frozen=True)
class DeviceParams(MethodParams):
    """Knobs of the methods that see device capabilities."""

    slim_ratios: str = knob("8-1", SLIM_RATIOS_HELP)
    full_share: float | None = knob(None, FULL_SHARE_HELP, low=0, high=1)

    def validate(self) -> None:
        parse_ratios(self.slim_ratios)

    def label(self, display: str) -> str:
        """`PerFedMask`, or with non-default devices `PerFedMask (8-4-2-1, ν = 0.2)`: a table never
        puts two device populations in one row."""
        parts = self.label_parts()
        return f"{display} ({', '.join(parts)})" if parts else display

    def label_parts(self) -> list[str]:
        """The non-default device population, as the label shows it."""
        return ([] if self.slim_ratios == "8-1" else [self.slim_ratios]) + \
               ([] if self.full_share is None else [f"ν = {self.full_share:g}"])

    def ratios(self, num_clients: int, profiles: Sequence[dict[str, float]] = ()) -> list[float]:
        """Each client's ratio: its profile's `ratio` where given, else the schedule."""
        schedule = device_ratios(self.slim_ratios, num_clients, self.full_share)
        out = []
        for k, r in enumerate(schedule):
            given = profiles[k].get("ratio") if k < len(profiles) else None
            if given is not None and not 0 < given <= 1:
                raise ConfigError(f"client {k}'s profile ratio={given!r} is outside (0, 1]")
            out.append(r if given is None else float(given))
        return out


SCORE_WIDTHS = ("device", "full")


@dataclass(frozen=True)
class WidthScoringParams(DeviceParams):
    """Which width scores a device in a method that trains sub-models (HeteroFL, Split-Mix)."""

    score_width: str = knob("device", "which model scores a device: device = its own width (its slice, its mix of "
                            "bases), as it could run it; full = the full-width global model, fine-tuned whole (the "
                            "PerFedMask authors' scoring), the device's own score then in acc_device",
                            choices=SCORE_WIDTHS, added=True)

    def label_parts(self) -> list[str]:
        return super().label_parts() + (["full width"] if self.score_width == "full" else [])


@dataclass(frozen=True)
class WeakDeviceParams(DeviceParams):
    """The device limits of a method that trains the whole model on every device (see the module
    docstring). The device knobs came after these methods' first results: at their defaults they
    stay out of the config hash (`added`), so a run without `weak_epochs` keeps its hash."""

    slim_ratios: str = knob("8-1", SLIM_RATIOS_HELP, added=True)
    full_share: float | None = knob(None, FULL_SHARE_HELP, low=0, high=1, added=True)
    weak_epochs: float | None = knob(None, "share f of the local epochs a device below full width runs, ⌈E·f⌉ "
                                     "(the PerFedMask authors' --wk_factor, 0.5, for their full-model baselines; "
                                     "devices from slim_ratios); none: every device runs E", low=0, low_open=True,
                                     high=1, added=True)

    def validate(self) -> None:
        super().validate()
        if self.weak_epochs is None and (self.slim_ratios != "8-1" or self.full_share is not None):
            raise ConfigError(f"slim_ratios={self.slim_ratios!r} / full_share={self.full_share!r} change nothing "
                              f"without weak_epochs (this method trains the whole model on every device); set "
                              f"weak_epochs (e.g. 0.5) or leave them out")

    def label_parts(self) -> list[str]:
        """`FedBABU (weak ×0.5)` under the limits (then the device population as `DeviceParams`)."""
        if self.weak_epochs is None:
            return []
        return [f"weak ×{self.weak_epochs:g}"] + super().label_parts()

    def epochs(self, local_epochs: int, ratio: float) -> int:
        """The local epochs of a device at width `ratio`."""
        if self.weak_epochs is None or ratio >= 1:
            return local_epochs
        return math.ceil(local_epochs * self.weak_epochs)
