"""Per-trial resources: refuse impossible requests up front (`--gpus-per-trial auto` is decided by
measurement before this check: sweeps/probe.py).

Ray leaves a trial that asks for more than the cluster has PENDING forever, without an error, so
every request is checked against `ray.cluster_resources()` before the sweep is launched.
"""
from __future__ import annotations

from dataclasses import dataclass

from .errors import SweepError

AUTO_GPU_FRACTION = 0.25  # where auto takes the GPU (sweeps/probe.py), four trials share one


@dataclass(frozen=True)
class TrialResources:
    cpus: float
    gpus: float

    def as_tune(self) -> dict[str, float]:
        return {"cpu": self.cpus, "gpu": self.gpus}

    @property
    def threads(self) -> int:
        """torch threads a trial uses: its whole CPUs, at least one."""
        return max(1, int(self.cpus))


def parse_gpus(text: str) -> float | str:
    """argparse type of --gpus-per-trial: a number >= 0 or `auto`."""
    if text == "auto":
        return text
    try:
        value = float(text)
    except ValueError:
        raise SweepError(f"--gpus-per-trial {text!r} is not a number or 'auto'") from None
    return value


def resolve(cpus: float, gpus: float, cluster: dict[str, float]) -> TrialResources:
    """Turn the flags (`--gpus-per-trial auto` already decided: sweeps/probe.py) into a request the
    cluster can satisfy, or raise SweepError naming why not."""
    if isinstance(gpus, str):
        raise TypeError(f"resolve takes the GPUs per trial as a number, not {gpus!r}: decide auto first")
    have_cpus, have_gpus = cluster.get("CPU", 0.0), cluster.get("GPU", 0.0)
    if cpus <= 0:
        raise SweepError(f"--cpus-per-trial {cpus:g} must be > 0")
    if gpus < 0:
        raise SweepError(f"--gpus-per-trial {gpus:g} must be >= 0 (or 'auto')")
    if gpus > 1 and gpus != int(gpus):
        raise SweepError(f"--gpus-per-trial {gpus:g}: above 1 a trial must ask for whole GPUs")
    if cpus > have_cpus:
        raise SweepError(f"--cpus-per-trial {cpus:g} but the Ray cluster has {have_cpus:g} CPUs in all; "
                         f"ask for at most {have_cpus:g}")
    if gpus > have_gpus:
        where = "no GPU" if have_gpus == 0 else f"{have_gpus:g} GPUs"
        raise SweepError(f"--gpus-per-trial {gpus:g} but the Ray cluster has {where}; trials would stay PENDING "
                         f"forever. Use --gpus-per-trial 0 (or auto), or join a cluster with GPUs via --address")
    return TrialResources(cpus=float(cpus), gpus=float(gpus))
