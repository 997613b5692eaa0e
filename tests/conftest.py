"""Shared fixtures: tiny runs on the synthetic source (8x8, 10 classes) so that tests take seconds."""
from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from types import SimpleNamespace

import pytest

from fl_core import kernels

# The reproducible mode for the suite and every process it starts, before torch loads. An audit of
# which tests depend on rounding runs them with the CPU's own kernels: FL_TEST_KERNELS=native.
NATIVE = os.environ.get("FL_TEST_KERNELS") == "native"
if not NATIVE:
    kernels.pin()

import torch  # noqa: E402

from fl_core.config import RunConfig  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
SHARED_DATA = REPO.parent / "shared" / "data"


def pytest_report_header(config) -> str:
    """The kernels the suite runs and the CPU's instruction sets: pinned numbers in the tests hold
    on any x86-64 CPU with AVX2 because of the first (fl_core/kernels.py)."""
    reason = "FL_TEST_KERNELS=native" if NATIVE else kernels.unavailable()
    mode = f"not pinned: {reason}" if reason else "reproducible mode"
    return f"kernels: {kernels.describe()} ({mode}); CPU: {kernels.machine_isa()}"


HEAVY_FIXTURES = ("ray_cluster", "site")   # a Ray cluster, a built site: such a test is slow wherever it is


@pytest.hookimpl(tryfirst=True)   # before `-m "not slow"` deselects
def pytest_collection_modifyitems(config, items):
    """A test that starts Ray or builds the site is marked slow (the quick run leaves it to
    `bash scripts/test.sh --all` and CI). Tests marked `pinned_rounding` pin the bits of
    multi-step training, which other kernels round otherwise: skipped where the suite does not
    run the reproducible mode."""
    for item in items:
        if any(f in getattr(item, "fixturenames", ()) for f in HEAVY_FIXTURES):
            item.add_marker(pytest.mark.slow)
    reason = "FL_TEST_KERNELS=native" if NATIVE else kernels.unavailable()
    if reason:
        skip = pytest.mark.skip(reason=f"pins the reproducible mode's rounding; the kernels are not pinned: {reason}")
        for item in items:
            if "pinned_rounding" in item.keywords:
                item.add_marker(skip)


@pytest.fixture(autouse=True)
def _native_audit(monkeypatch):
    """FL_TEST_KERNELS=native: a run this process starts (the CLI's main, a trial called directly)
    goes on with the CPU's own kernels where it would refuse them, since the audit compares numbers."""
    if NATIVE:
        import fl_core.__main__ as cli

        for owner in (kernels, cli):
            monkeypatch.setattr(owner, "require", lambda reproducible: kernels.describe())
    yield


def tiny(**overrides) -> RunConfig:
    """A FedSelect run small enough for unit tests (4 clients, synthetic data, 3 rounds)."""
    base = dict(algorithm="fedselect", dataset="synthetic", num_clients=4, partition="shards",
                shards_per_client=3, rounds=3, batch_size=16, lr=0.05, threads=1)
    if overrides.get("algorithm", "fedselect") == "fedselect":
        base |= dict(pers_rate=0.3, pers_limit=0.6)
    return RunConfig(**(base | overrides))


def _comparable(value):
    """NaN never equals itself; compare it as a marker instead."""
    if isinstance(value, float) and value != value:
        return "nan"
    if isinstance(value, dict):
        return {k: _comparable(v) for k, v in value.items()}
    return value


def metrics(results):
    """Every number of every round except wall-clock seconds (the `seconds` field and a method's
    `*_seconds` metrics; NaN compared as equal)."""
    def timeless(row):
        row = {k: v for k, v in row.items() if k != "seconds"}
        row["metrics"] = {k: v for k, v in row["metrics"].items() if not k.endswith("seconds")}
        return row
    return [[_comparable(timeless(dataclasses.asdict(c))) for c in r.clients] for r in results]


def restore_mid_run(config: RunConfig, folder: Path, at: int = 2):
    """Run `config` straight through, and again saving after `at` rounds and restoring into a fresh
    Simulation. Asserts both give the same numbers and states; returns (straight, resumed, results)."""
    from fl_core.simulation import Simulation

    straight = Simulation(config)
    expected = list(straight.run())
    first = Simulation(config)
    head = [first.run_round() for _ in range(at)]
    first.save(folder / "state.pt")
    del first
    resumed = Simulation(config)
    resumed.restore(folder / "state.pt")
    assert resumed.completed == at
    tail = list(resumed.run())
    assert [r.round for r in tail] == list(range(at + 1, config.rounds + 1))
    assert metrics(head + tail) == metrics(expected)
    for a, b in zip(straight.clients, resumed.clients):
        assert all(torch.equal(t, b.state[n]) for n, t in a.state.items())
        assert (a.mask is None) == (b.mask is None)
        if a.mask is not None:
            assert all(torch.equal(m, b.mask[n]) for n, m in a.mask.items())
        assert same(a.extra.to_dict(), b.extra.to_dict()), a.extra  # its method's own client state, value by value
    return straight, resumed, expected


def same(a, b) -> bool:
    """Equal nested states: tensors bit for bit, containers element by element, NaN equal to NaN."""
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.shape == b.shape and torch.equal(a, b)
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return isinstance(b, (list, tuple)) and len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    return a == b or (a != a and b != b)


@pytest.fixture(autouse=True)
def _deterministic_threads():
    torch.set_num_threads(1)
    yield


@pytest.fixture(scope="session")
def ray_cluster(tmp_path_factory):
    """One local Ray cluster for the whole session: 4 logical CPUs and 1 logical GPU (so that
    fractional GPU packing can be tested on a machine without one). Its temp files stay in the
    test's tmp folder. Yields its address (for subprocess drivers) and `cluster_resources`."""
    import ray

    temp = tmp_path_factory.mktemp("ray")
    os.environ["RAY_TMPDIR"] = str(temp)
    os.environ.setdefault("RAY_AIR_NEW_OUTPUT", "0")
    ray.init(num_cpus=4, num_gpus=1, _temp_dir=str(temp), include_dashboard=False, logging_level="WARNING",
             configure_logging=True)
    yield SimpleNamespace(address=ray.get_runtime_context().gcs_address, cluster_resources=ray.cluster_resources)
    ray.shutdown()


@pytest.fixture
def outside_tune(monkeypatch):
    """`run_trial` called directly: Tune's and Ray's per-trial calls answered here; the reports."""
    import sweeps.trainable as trainable

    reports = []
    context = type("Context", (), {"get_trial_id": lambda self: "t0", "get_node_id": lambda self: "node"})()
    monkeypatch.setattr(trainable.tune, "get_context", lambda: context)
    monkeypatch.setattr(trainable.tune, "report", reports.append)
    monkeypatch.setattr(trainable.ray, "get_gpu_ids", lambda: [])
    monkeypatch.setattr(trainable.ray, "get_runtime_context", lambda: context)
    return reports


def run_one(folder, knobs: dict | None = None, **trial):
    """`sweeps.trainable.run_trial` on `tiny(**knobs)` in the sweep folder `folder` (with `outside_tune`);
    `trial`: extra keys of the trial's Tune config (stop_after). Returns the config hash."""
    import sweeps.trainable as trainable
    from sweeps.resources import TrialResources

    knobs = knobs or {}
    config = {"trial": {"run": tiny(**knobs).to_dict(), "stage": "grid"} | trial}
    trainable.run_trial(config, data_refs={}, sweep_dir=str(folder), sweep=folder.name,
                        resources=TrialResources(cpus=1, gpus=0))
    return tiny(**knobs).config_hash()
