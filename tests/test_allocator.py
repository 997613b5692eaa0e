"""The trial workers' allocator (sweeps/allocator.py): chosen by FL_CORE_ALLOCATOR, one clear error
for a bad or missing choice, and the same bits under every allocator."""
import os
import subprocess
import sys
from pathlib import Path

import pytest

from sweeps import allocator
from sweeps.errors import SweepError

REPO = Path(__file__).resolve().parents[1]


def test_a_bad_choice_is_one_error_naming_it_and_the_choices(monkeypatch):
    monkeypatch.setenv(allocator.ENV, "mimalloc")
    with pytest.raises(SweepError, match=r"FL_CORE_ALLOCATOR='mimalloc' is not an allocator; allowed: auto, "
                                         r"tcmalloc, jemalloc, glibc"):
        allocator.allocator_env()


@pytest.mark.skipif(sys.platform != "linux", reason="LD_PRELOAD is Linux's")
def test_auto_prefers_tcmalloc_then_rays_jemalloc_and_glibc_preloads_nothing(monkeypatch):
    monkeypatch.setattr(allocator, "tcmalloc_path", lambda: "/lib/libtcmalloc_minimal.so.4")
    assert allocator.allocator_env("auto") == ("tcmalloc", {"LD_PRELOAD": "/lib/libtcmalloc_minimal.so.4"})
    assert allocator.allocator_env("glibc") == ("the C library's malloc", {})
    monkeypatch.setattr(allocator, "tcmalloc_path", lambda: None)
    name, env = allocator.allocator_env("auto")
    assert name == "jemalloc" and env["LD_PRELOAD"].endswith("ray/core/libjemalloc.so")  # inside Ray's wheel
    assert env["MALLOC_CONF"] == allocator.JEMALLOC_CONF and Path(env["LD_PRELOAD"]).exists()
    with pytest.raises(SweepError, match="no libtcmalloc_minimal is installed .*apt-get install libtcmalloc-minimal4"):
        allocator.allocator_env("tcmalloc")
    monkeypatch.setattr(allocator, "jemalloc_path", lambda: None)
    assert allocator.allocator_env("auto") == ("the C library's malloc", {})
    with pytest.raises(SweepError, match="no core/libjemalloc.so"):
        allocator.allocator_env("jemalloc")


RUN = """
import hashlib, sys
sys.path.insert(0, "tests")
from conftest import tiny
from fl_core.simulation import Simulation
sim = Simulation(tiny(algorithm="fedselect", rounds=3, participation=0.5, val_fraction=0.25))
h = hashlib.sha256()
for r in sim.run():
    h.update(repr([(c.acc, c.loss) for c in r.clients]).encode())
for c in sim.clients:
    for n, t in sorted(c.state.items()):
        h.update(t.numpy().tobytes())
maps = open("/proc/self/maps").read()
print(h.hexdigest(), [lib for lib in ("tcmalloc", "jemalloc") if lib in maps])
"""


@pytest.mark.skipif(sys.platform != "linux", reason="LD_PRELOAD is Linux's")
def test_every_allocator_gives_the_same_bits():
    """A short FedSelect run in a fresh process under each available allocator: the library is
    loaded, and accuracies, losses and final client states hash alike."""
    runs = {}
    for choice in ("glibc", "jemalloc", "tcmalloc"):
        if choice == "tcmalloc" and allocator.tcmalloc_path() is None:
            continue
        _, env = allocator.allocator_env(choice)
        out = subprocess.run([sys.executable, "-c", RUN], cwd=REPO, env=os.environ | env, capture_output=True,
                             text=True, check=True).stdout.split(maxsplit=1)
        runs[choice] = out
    assert runs["glibc"][1].strip() == "[]" and runs["jemalloc"][1].strip() == "['jemalloc']"
    assert "tcmalloc" not in runs or runs["tcmalloc"][1].strip() == "['tcmalloc']"
    assert len({digest for digest, _ in runs.values()}) == 1, runs
