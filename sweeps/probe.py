"""`--gpus-per-trial auto` decided by measurement: the GPU only where packed GPU trials would finish
more rounds per second than the CPUs.

Before Ray starts, the driver runs the study's first configuration through the engine directly,
for a couple of rounds on one CPU thread and then alone on the GPU (`probe_config`). Once the
cluster is known, `decide` compares the two sides' throughput:

- CPUs: `CPUs // cpus_per_trial` trials at once, each at the one-thread seconds per round
  (a trial given more CPUs uses more threads; the one-thread figure leaves that gain out);
- GPU: `GPUs / AUTO_GPU_FRACTION` packed trials (four per GPU), no more than the CPUs can hold,
  since a GPU trial holds `cpus_per_trial` CPUs too, each at the seconds per round of one trial
  alone on the GPU, times `PACKING_EFFICIENCY`. Packed trials share the GPU, so k of them finish
  at most k times the rounds of one: the undiscounted figure is an upper bound, and the discount
  (0.5, not measured) keeps the choice of the GPU conservative.

The GPU is taken only when its side is strictly faster. The choice, both figures and the rule are
written to `<sweep>/gpu_choice.json`, which `--resume` reads instead of probing again. A probe that
fails (a CUDA error, or no CUDA on the driver) leaves the sweep on the CPUs and says why.
fl_core stays free of Ray: the probe uses only the engine.
"""
from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any, Callable

from fl_core.config import RunConfig
from fl_core.simulation import Simulation

from .folder import atomic_write
from .resources import AUTO_GPU_FRACTION

RECORD = "gpu_choice.json"
PACKING_EFFICIENCY = 0.5  # packed trials' throughput as a share of the linear upper bound (assumed)
PROBE_ROUNDS = 2  # the first is a warm-up, not counted
RULE = (f"GPU when GPUs/{AUTO_GPU_FRACTION:g} packed trials (at most CPUs//cpus_per_trial) at the alone-on-GPU "
        f"s/round x {PACKING_EFFICIENCY:g} finish more rounds/s than CPUs//cpus_per_trial trials at the "
        f"one-thread s/round")


class ProbeError(RuntimeError):
    """The probe could not measure the GPU (its message says why)."""


def probe_config(config: RunConfig, device: str, rounds: int = PROBE_ROUNDS, data: Any = None) -> float:
    """Seconds per round of `config` on `device` with one CPU thread, over `rounds` rounds of which
    the first (a warm-up) is not counted; `data`: the config's client data, if already loaded."""
    if rounds < 2:
        raise ValueError(f"rounds={rounds}: the probe needs a warm-up round and at least one measured round")
    sim = Simulation(config.replace(device=device, threads=1, rounds=rounds), data=data)
    cuda = sim.device.type == "cuda"
    if cuda:
        import torch
    sim.run_round()  # warm-up: kernels chosen, caches filled
    if cuda:
        torch.cuda.synchronize(sim.device)
    start = time.perf_counter()
    for _ in range(rounds - 1):
        sim.run_round()
    if cuda:
        torch.cuda.synchronize(sim.device)
    return (time.perf_counter() - start) / (rounds - 1)


def decide(cpu_s: float, gpu_s: float, cpus: float, gpus: float, cpus_per_trial: float,
           fraction: float = AUTO_GPU_FRACTION, efficiency: float = PACKING_EFFICIENCY) -> tuple[float, str]:
    """(GPUs per trial, the line that says why): `fraction` if packed GPU trials finish more rounds
    per second than the CPUs (the rule in this module's docstring), else 0."""
    cpu_slots = int(cpus // cpus_per_trial)
    gpu_slots = min(int(gpus / fraction), cpu_slots)
    cpu_rate = cpu_slots / max(cpu_s, 1e-9)
    gpu_rate = gpu_slots / max(gpu_s, 1e-9) * efficiency
    take_gpu = gpu_rate > cpu_rate
    choice = f"taking the GPU ({fraction:g} GPU per trial)" if take_gpu else "taking the CPUs (0 GPU per trial)"
    text = (f"[sweep] --gpus-per-trial auto: CPUs {cpu_slots} trials x {cpus_per_trial:g} CPU at {cpu_s:.3g} s/round "
            f"= {cpu_rate:.3g} rounds/s; GPU {gpu_slots} trials at {gpu_s:.3g} s/round x {efficiency:g} packing "
            f"= {gpu_rate:.3g} rounds/s; {choice}")
    return (fraction if take_gpu else 0.0), text


def measure_now(config: RunConfig, data: Any = None) -> Callable[[], tuple[float, float]]:
    """Probe `config` now, on one CPU thread and on the GPU; the returned callable gives the two
    seconds per round, or raises ProbeError saying why they could not be measured. Run before the
    sweep's MPS daemon starts, so that the driver's own CUDA context is not one of its clients."""
    import torch

    if not torch.cuda.is_available():
        return _failed("CUDA is not available to the driver, which runs the probe")
    try:
        figures = probe_config(config, "cpu", data=data), probe_config(config, "cuda", data=data)
        torch.cuda.empty_cache()
    except Exception as err:  # a CUDA error, out of memory, ...: the sweep runs on the CPUs
        return _failed(f"{type(err).__name__}: {err}")
    return lambda: figures


def _failed(reason: str) -> Callable[[], tuple[float, float]]:
    def fail() -> tuple[float, float]:
        raise ProbeError(reason)
    return fail


def load_choice(folder: Path) -> dict | None:
    """The choice recorded in `folder`, or None when there is none or it cannot be read."""
    try:
        record = json.loads((folder / RECORD).read_text())
        gpus = float(record["gpus_per_trial"])
    except (OSError, ValueError, TypeError, KeyError):
        return None
    return record if gpus >= 0 else None


def save_choice(folder: Path, record: dict) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    atomic_write(folder / RECORD, json.dumps(record, indent=1))


def auto_gpus(folder: Path, resume: bool, cluster: dict[str, float], cpus_per_trial: float,
              measured: Callable[[], tuple[float, float]] | None, say: Callable[[str], None] = print) -> float:
    """GPUs per trial for `--gpus-per-trial auto`: 0 on a cluster without GPUs (nothing said); on
    `--resume`, the choice recorded in `folder`; else decided from `measured()` (`measure_now`),
    said and recorded. A failed probe takes the CPUs, with the reason."""
    if cluster.get("GPU", 0) <= 0:
        return 0.0
    if resume and (record := load_choice(folder)) is not None:
        gpus = float(record["gpus_per_trial"])
        say(f"[sweep] --gpus-per-trial auto: {gpus:g} GPU per trial, the choice this sweep recorded in {RECORD}")
        return gpus
    try:
        if measured is None:
            raise ProbeError("the probe did not run")
        cpu_s, gpu_s = measured()
    except ProbeError as err:
        gpus = 0.0
        text = f"[sweep] --gpus-per-trial auto: the GPU probe failed ({err}); taking the CPUs (0 GPU per trial)"
        record = {"gpus_per_trial": gpus, "probe_error": str(err), "text": text}
    else:
        gpus, text = decide(cpu_s, gpu_s, cluster.get("CPU", 0.0), cluster["GPU"], cpus_per_trial)
        record = {"gpus_per_trial": gpus, "cpu_s_per_round": cpu_s, "gpu_s_per_round": gpu_s,
                  "cluster_cpus": cluster.get("CPU", 0.0), "cluster_gpus": cluster["GPU"],
                  "cpus_per_trial": cpus_per_trial, "fraction": AUTO_GPU_FRACTION,
                  "packing_efficiency": PACKING_EFFICIENCY, "rule": RULE, "text": text}
    say(text)
    save_choice(folder, record)
    return gpus
