"""The reproducible mode: the same numbers on any x86-64 CPU with AVX2.

torch chooses its CPU kernels at run time for the CPU it finds, and each choice rounds differently:
ATen's vectorised operations (AVX-512 or AVX2), oneDNN's convolutions (AVX-512 or AVX2 code) and
MKL's BLAS code branch (linear layers). Training amplifies one rounding difference into another
accuracy: the same FedAvg run (digits, Dir(0.1), 10 clients, 20 rounds, 2 epochs, seed 1, 1 thread)
ends at 0.6377 on an AVX-512 CPU by default and at 0.6075 with ATen and oneDNN held to AVX2.

The mode pins every choice to one that every x86-64 CPU with AVX2 (and FMA) offers:

    ATEN_CPU_CAPABILITY=avx2     ATen's vectorised kernels
    ONEDNN_MAX_CPU_ISA=AVX2      oneDNN: no AVX-512 code
    MKL_CBWR=COMPATIBLE          MKL's conditional numerical reproducibility, on the branch MKL
                                 documents as giving the same results on Intel and other vendors'
                                 CPUs (its AVX2 branch promises that across Intel CPUs only)

and removes the variables that would override them (`OVERRIDES`). Each library reads its variable
once, when torch first uses it, so the pins must be in the environment before torch loads: every
sweep script and `python -m fl_core` call `pin_from_argv` before their imports (`--no-reproducible`
opts out), a sweep's Ray workers inherit the pins or get them through Ray's runtime environment,
and the tests' conftest.py pins before it imports torch. `in_effect()` reads back what the process
really runs (ATen's capability, MKL's branch) and `require` refuses a run that asked for the mode
but was loaded without it. Nothing here imports torch at module level.

On a CUDA device the mode asks for run-to-run identical numbers on that GPU (`settle_cuda`, called
by the engine when it puts a run on the GPU): torch's deterministic algorithms (cuBLAS with a fixed
workspace, `CUBLAS_WORKSPACE_CONFIG`, which `pin` sets before CUDA loads), cuDNN without autotuning,
and TF32 off (full float32 in matrix products and convolutions, as on the CPU). An operation with no
deterministic CUDA kernel warns rather than stops the run (`warn_only`), as the mode cannot know
every method's operations in advance.

Not pinned, so not the same across machines: other architectures (an ARM CPU has other kernels
and another BLAS: the mode is reported as unavailable there and nothing is pinned), x86-64 CPUs
without AVX2, GPU models against each other or against the CPU, other versions of torch or numpy,
and another number of threads per run.
"""
from __future__ import annotations

import ctypes
import os
import platform
from collections.abc import MutableMapping
from pathlib import Path

PINS = {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2", "MKL_CBWR": "COMPATIBLE"}
# Variables that change the kernels (or their precision) besides the pins: removed in the mode.
OVERRIDES = ("DNNL_MAX_CPU_ISA", "ONEDNN_CPU_ISA_HINTS", "DNNL_CPU_ISA_HINTS", "MKL_ENABLE_INSTRUCTIONS",
             "ONEDNN_DEFAULT_FPMATH_MODE", "DNNL_DEFAULT_FPMATH_MODE", "MKL_DEBUG_CPU_TYPE")
# cuBLAS's deterministic mode: a fixed workspace per handle (CUDA's documented setting), read when cuBLAS loads
CUDA_PINS = {"CUBLAS_WORKSPACE_CONFIG": ":4096:8"}
OPT_OUT = "--no-reproducible"
# MKL's branch codes (mkl.h: MKL_CBWR_BRANCH_OFF, MKL_CBWR_AUTO, MKL_CBWR_COMPATIBLE, ...).
MKL_BRANCHES = {0: "off", 1: "unpinned", 2: "AUTO", 3: "COMPATIBLE", 4: "SSE2", 6: "SSSE3", 7: "SSE4_1",
                8: "SSE4_2", 9: "AVX", 10: "AVX2", 12: "AVX512", 14: "AVX512_E1"}


class KernelError(RuntimeError):
    """The reproducible mode was asked for but this process does not run the pinned kernels."""


def cpu_flags() -> set[str] | None:
    """The CPU's instruction-set flags (Linux's /proc/cpuinfo), or None where they cannot be read."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return None
    for line in text.splitlines():
        if line.startswith("flags"):
            return set(line.split(":", 1)[1].split())
    return None


def unavailable() -> str | None:
    """Why the mode cannot pin the kernels on this machine (None: it can)."""
    arch = platform.machine().lower()
    if arch not in ("x86_64", "amd64"):
        return f"the CPU is {arch}, not x86-64: its kernels differ from x86-64's and are not pinned"
    flags = cpu_flags()
    if flags is None:
        return "the CPU's instruction sets cannot be read (no /proc/cpuinfo)"
    if not {"avx2", "fma"} <= flags:
        return "the CPU has no AVX2/FMA, the instruction sets the pinned kernels use"
    return None


def pin(environ: MutableMapping[str, str] | None = None) -> str | None:
    """Put the pins into `environ` (default: this process's environment) and remove the overrides.
    Returns None, or why nothing was pinned (`unavailable`)."""
    environ = os.environ if environ is None else environ
    environ.update(CUDA_PINS)  # a GPU's determinism does not depend on the CPU
    reason = unavailable()
    if reason is None:
        for name in OVERRIDES:
            environ.pop(name, None)
        environ.update(PINS)
    return reason


def pin_from_argv(argv: list[str]) -> str | None:
    """The first call of a command: pin unless `--no-reproducible` is among its arguments (then the
    environment is left as it is: torch chooses for the CPU, or as the variables there say)."""
    return None if OPT_OUT in argv else pin()


def mkl_branch() -> str:
    """The MKL code branch this process runs ('unpinned' without MKL_CBWR; 'none' without MKL)."""
    import torch

    if not torch.backends.mkl.is_available():
        return "none"
    try:
        lib = ctypes.CDLL(str(Path(torch.__file__).parent / "lib" / "libtorch_cpu.so"))
        code = lib.mkl_serv_cbwr_get(1)  # 1 = MKL_CBWR_BRANCH
    except (OSError, AttributeError):  # another build or platform: MKL's service symbols not exported
        return "unknown"
    return MKL_BRANCHES.get(code, f"code {code}")


def in_effect() -> dict[str, str]:
    """What this process runs: ATen's CPU capability, MKL's branch, oneDNN's ISA cap (as set)."""
    import torch

    return {"aten": torch.backends.cpu.get_cpu_capability(), "mkl": mkl_branch(),
            "onednn": os.environ.get("ONEDNN_MAX_CPU_ISA", "native")}


def describe(state: dict[str, str] | None = None) -> str:
    """One line for rows and messages, e.g. 'aten=AVX2 mkl=COMPATIBLE onednn=AVX2'."""
    state = in_effect() if state is None else state
    return " ".join(f"{k}={v}" for k, v in state.items())


def machine_isa() -> str:
    """The instruction sets this CPU offers that decide kernel choices, e.g. 'x86_64 avx2 avx512f'."""
    flags = cpu_flags() or set()
    offered = [f for f in ("avx2", "fma", "avx512f", "avx512_bf16", "amx_tile") if f in flags]
    return " ".join([platform.machine()] + offered)


def slow_bf16(device) -> str | None:
    """Why bfloat16 autocast (`precision=bf16`) would run emulated on `device`, several times slower
    than float32 (`benchmarks/parity/fedselect.py --precision bf16`), or None: a CPU without
    bfloat16 arithmetic (AVX-512 BF16 or AMX), or one held to AVX2 by the reproducible mode."""
    if getattr(device, "type", str(device)) != "cpu":
        return None
    flags = cpu_flags() or set()
    if not flags & {"avx512_bf16", "amx_bf16"}:
        return f"this CPU ({machine_isa()}) has no bfloat16 arithmetic (AVX-512 BF16 or AMX)"
    if in_effect()["onednn"] == PINS["ONEDNN_MAX_CPU_ISA"]:
        return "the reproducible mode holds oneDNN to AVX2 (run with --no-reproducible)"
    return None


def pinned(state: dict[str, str]) -> bool:
    """Whether `state` (from `in_effect`) is the reproducible mode's."""
    return (state["aten"] == "AVX2" and state["mkl"] in ("COMPATIBLE", "none")
            and state["onednn"] == PINS["ONEDNN_MAX_CPU_ISA"])


def cuda_pinned(environ: MutableMapping[str, str] | None = None) -> bool:
    """Whether this process was started in the reproducible mode as far as a GPU is concerned."""
    environ = os.environ if environ is None else environ
    return all(environ.get(k) == v for k, v in CUDA_PINS.items())


def settle_cuda(device) -> str:
    """For a run on a CUDA `device` in the reproducible mode (`cuda_pinned`): deterministic
    algorithms, no cuDNN autotuning, no TF32. Returns what it set, e.g. 'cuda=deterministic', or
    'cuda=default' (not a CUDA device, or the mode is off: torch's own choices stay)."""
    import torch

    if getattr(device, "type", str(device)) != "cuda" or not cuda_pinned():
        return "cuda=default"
    torch.use_deterministic_algorithms(True, warn_only=True)
    torch.backends.cudnn.benchmark = False
    torch.backends.cudnn.deterministic = True
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    return "cuda=deterministic"


def require(reproducible: bool) -> str:
    """`describe()` of this process's kernels; raises KernelError when the mode was asked for, the
    machine supports it, and the kernels are not the pinned ones (torch was loaded before the pins)."""
    state = in_effect()
    if reproducible and unavailable() is None and not pinned(state):
        raise KernelError(
            f"the reproducible mode needs {', '.join(f'{k}={v}' for k, v in PINS.items())} in the environment "
            f"before torch loads, but this process runs {describe(state)}; start it from the command line "
            f"(sweep scripts and `python -m fl_core` set them), export them before starting Python, or pass "
            f"{OPT_OUT} for the CPU's own kernels")
    return describe(state)
