"""The memory allocator a sweep's trial workers run with.

glibc's malloc keeps freed model-sized tensors as fragments it rarely reuses, so a trial's resident
size grows well past what it holds (10 ResNet-18 FedSelect clients, two rounds, 1 thread:
`python -m benchmarks.round_overhead --all` measures each allocator). gperftools' tcmalloc and
jemalloc (kept, never purged) reuse that memory: a lower peak for the same bits, as fast or
faster. The driver hands the workers the allocator through Ray's runtime environment
(`LD_PRELOAD`), which reaches workers of a cluster the driver joins too; the driver and a plain
`python -m fl_core` run keep the C library's malloc (`fl_core.training.tune_malloc`).

FL_CORE_ALLOCATOR chooses: `auto` (the default: tcmalloc where the system has it, Debian
`libtcmalloc-minimal4`, else the jemalloc that ships inside Ray's wheel), `tcmalloc`, `jemalloc`,
or `glibc` (none preloaded). The allocator changes where tensors live, never their values.
"""
from __future__ import annotations

import ctypes.util
import importlib.util
import os
import platform
from pathlib import Path

from .errors import SweepError

ENV = "FL_CORE_ALLOCATOR"
CHOICES = ("auto", "tcmalloc", "jemalloc", "glibc")
# jemalloc's default returns freed pages to the OS after 10 s, and faults them in again: 1.5x the
# wall time of a ResNet-18 round here. Never purging keeps its low peak at glibc's speed.
JEMALLOC_CONF = "dirty_decay_ms:-1,muzzy_decay_ms:-1"


def tcmalloc_path() -> str | None:
    """The system's tcmalloc (the minimal build: no heap profiler) as the dynamic loader names it,
    or None; LD_PRELOAD finds a bare soname where `find_library` found it."""
    return ctypes.util.find_library("tcmalloc_minimal")


def jemalloc_path() -> str | None:
    """The jemalloc inside Ray's wheel (Ray preloads it into its own servers), or None."""
    spec = importlib.util.find_spec("ray")
    if spec is None or spec.origin is None:
        return None
    path = Path(spec.origin).parent / "core" / "libjemalloc.so"
    return str(path) if path.exists() else None


def chosen() -> str:
    """FL_CORE_ALLOCATOR, checked."""
    choice = os.environ.get(ENV, "auto")
    if choice not in CHOICES:
        raise SweepError(f"{ENV}={choice!r} is not an allocator; allowed: {', '.join(CHOICES)}")
    return choice


def allocator_env(choice: str | None = None) -> tuple[str, dict[str, str]]:
    """(the allocator's name, the environment variables that make a new process use it)."""
    choice = chosen() if choice is None else choice
    if choice == "glibc" or platform.system() != "Linux":
        return "the C library's malloc", {}
    if choice in ("auto", "tcmalloc"):
        path = tcmalloc_path()
        if path is not None:
            return "tcmalloc", {"LD_PRELOAD": path}
        if choice == "tcmalloc":
            raise SweepError(f"{ENV}=tcmalloc, but no libtcmalloc_minimal is installed "
                             "(Debian: apt-get install libtcmalloc-minimal4); or choose auto, jemalloc or glibc")
    path = jemalloc_path()
    if path is None:
        if choice == "jemalloc":
            raise SweepError(f"{ENV}=jemalloc, but this Ray has no core/libjemalloc.so; choose auto, tcmalloc or glibc")
        return "the C library's malloc", {}
    return "jemalloc", {"LD_PRELOAD": path, "MALLOC_CONF": JEMALLOC_CONF}
