"""The reproducible mode (fl_core/kernels.py): a run's rows are the same bits whatever kernels the
environment would otherwise select, and every row says which kernels ran."""
from __future__ import annotations

import os
import subprocess
import sys

import pandas as pd
import pytest

from fl_core import kernels

from conftest import NATIVE, REPO, run_one

needs_mode = pytest.mark.skipif(kernels.unavailable() is not None, reason=f"{kernels.unavailable()}")
suite_in_mode = pytest.mark.skipif(NATIVE or kernels.unavailable() is not None, reason="the suite runs native kernels")

RUN = ["--algorithm", "fedavg", "--dataset", "digits", "--partition", "dirichlet", "--dir-alpha", "0.1",
       "--num-clients", "4", "--rounds", "3", "--local-epochs", "2", "--seed", "1", "--threads", "1"]
# Settings that change the numbers without the mode (each measured to do so on an AVX-512 CPU; the
# first two on any x86-64 CPU with AVX2).
STEERED = ({"ATEN_CPU_CAPABILITY": "default"}, {"MKL_CBWR": "AUTO"},
           {"ONEDNN_MAX_CPU_ISA": "SSE41", "DNNL_MAX_CPU_ISA": "SSE41"},
           {"ATEN_CPU_CAPABILITY": "avx512", "MKL_ENABLE_INSTRUCTIONS": "AVX512", "ONEDNN_MAX_CPU_ISA": "ALL"})


def one_run(tmp_path, name: str, extra_env: dict[str, str], *flags: str) -> pd.DataFrame:
    """`python -m fl_core` in a fresh process, started from a plain environment plus `extra_env`."""
    env = {k: v for k, v in os.environ.items() if k not in kernels.PINS and k not in kernels.OVERRIDES}
    out = tmp_path / name
    done = subprocess.run([sys.executable, "-m", "fl_core", *RUN, *flags, "--results", str(out)], cwd=REPO,
                          env=env | extra_env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    return pd.read_parquet(out / "rounds.parquet")


def numbers(rows: pd.DataFrame) -> pd.DataFrame:
    """Every column but wall-clock seconds and the kernels' description."""
    return rows.drop(columns=[c for c in rows.columns if c.endswith("seconds") or c in ("kernels", "cpu_isa")])


@needs_mode
@pytest.mark.slow
def test_the_mode_gives_the_same_rows_whatever_the_environment_selects_and_records_its_kernels(tmp_path):
    plain = one_run(tmp_path, "plain", {})
    assert set(plain.kernels) == {"aten=AVX2 mkl=COMPATIBLE onednn=AVX2"}
    assert set(plain.cpu_isa) == {kernels.machine_isa()}
    for k, env in enumerate(STEERED):
        steered = one_run(tmp_path, f"steered{k}", env)
        pd.testing.assert_frame_equal(numbers(steered), numbers(plain), check_exact=True, obj=str(env))
        assert set(steered.kernels) == set(plain.kernels)
    # the same settings without the mode: other kernels, other numbers (so the check above has teeth)
    native = one_run(tmp_path, "native", STEERED[0], kernels.OPT_OUT)
    assert set(native.kernels) == {"aten=DEFAULT mkl=unpinned onednn=native"}
    assert not numbers(native).equals(numbers(plain))
    assert (native.acc != plain.acc).any() or (native.loss != plain.loss).any()


def test_pin_sets_the_three_variables_and_removes_what_would_override_them(monkeypatch):
    monkeypatch.setattr(kernels, "unavailable", lambda: None)
    env = {"DNNL_MAX_CPU_ISA": "AVX512_CORE", "MKL_ENABLE_INSTRUCTIONS": "AVX512", "ATEN_CPU_CAPABILITY": "default",
           "ONEDNN_DEFAULT_FPMATH_MODE": "BF16", "HOME": "/root"}
    assert kernels.pin(env) is None
    assert env == {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2", "MKL_CBWR": "COMPATIBLE",
                   "CUBLAS_WORKSPACE_CONFIG": ":4096:8", "HOME": "/root"}


def test_on_another_architecture_nothing_is_pinned_and_the_reason_is_given(monkeypatch):
    monkeypatch.setattr(kernels.platform, "machine", lambda: "aarch64")
    env = {"ATEN_CPU_CAPABILITY": "sve256"}
    reason = kernels.pin(env)
    assert reason == "the CPU is aarch64, not x86-64: its kernels differ from x86-64's and are not pinned"
    assert env == {"ATEN_CPU_CAPABILITY": "sve256", "CUBLAS_WORKSPACE_CONFIG": ":4096:8"}  # a GPU's pin still holds
    monkeypatch.setattr(kernels.platform, "machine", lambda: "x86_64")
    monkeypatch.setattr(kernels, "cpu_flags", lambda: {"sse2", "avx"})
    assert kernels.unavailable() == "the CPU has no AVX2/FMA, the instruction sets the pinned kernels use"
    assert kernels.require(True).startswith("aten=")  # nothing to pin: the run goes on, its row says what ran


@needs_mode
def test_a_process_that_loaded_its_kernels_before_the_pins_is_refused_with_the_way_out(tmp_path):
    code = ("import torch; torch.ones(3).sum(); "  # the first operation fixes ATen's kernels
            "from fl_core import kernels; kernels.pin(); kernels.require(True)")
    env = {k: v for k, v in os.environ.items() if k not in kernels.PINS} | {"ATEN_CPU_CAPABILITY": "default"}
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 1
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("fl_core.kernels.KernelError: the reproducible mode needs ATEN_CPU_CAPABILITY=avx2, "
                           "ONEDNN_MAX_CPU_ISA=AVX2, MKL_CBWR=COMPATIBLE in the environment before torch loads, "
                           "but this process runs aten=DEFAULT")
    assert last.endswith(f"or pass {kernels.OPT_OUT} for the CPU's own kernels")


@suite_in_mode
def test_the_suite_itself_runs_in_the_mode():
    """conftest.py pins before torch loads: every pinned number in the tests rounds the same way on
    any x86-64 CPU with AVX2."""
    assert kernels.in_effect() == {"aten": "AVX2", "mkl": "COMPATIBLE", "onednn": "AVX2"}
    assert kernels.require(True) == "aten=AVX2 mkl=COMPATIBLE onednn=AVX2"


@suite_in_mode
def test_a_trial_reports_its_kernels_and_refuses_to_run_without_the_pins(tmp_path, outside_tune, monkeypatch):
    from sweeps.trials import TRIAL_INFO

    run_one(tmp_path / "sweep", {"rounds": 1})
    assert outside_tune[-1]["kernels"] == "aten=AVX2 mkl=COMPATIBLE onednn=AVX2"
    assert outside_tune[-1]["cpu_isa"] == kernels.machine_isa() and {"kernels", "cpu_isa"} <= set(TRIAL_INFO)
    monkeypatch.setattr(kernels, "in_effect", lambda: {"aten": "AVX512", "mkl": "unpinned", "onednn": "native"})
    with pytest.raises(kernels.KernelError, match="but this process runs aten=AVX512 mkl=unpinned onednn=native"):
        run_one(tmp_path / "other", {"rounds": 1})


def test_a_cuda_run_in_the_reproducible_mode_is_deterministic_and_without_tf32():
    """settle_cuda, run in a fresh process (it sets process-wide torch flags): on a CUDA device under
    the mode's pin it turns on deterministic algorithms and turns off cuDNN autotuning and TF32;
    on the CPU, or without the pin (--no-reproducible), it changes nothing."""
    code = ("import torch; from fl_core import kernels\n"
            "print(kernels.settle_cuda(torch.device('cpu')), torch.are_deterministic_algorithms_enabled())\n"
            "print(kernels.settle_cuda(torch.device('cuda')), torch.are_deterministic_algorithms_enabled(),\n"
            "      torch.is_deterministic_algorithms_warn_only_enabled(), torch.backends.cudnn.benchmark,\n"
            "      torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32)")
    env = {k: v for k, v in os.environ.items() if k not in kernels.CUDA_PINS}
    pinned = subprocess.run([sys.executable, "-c", code], env=env | kernels.CUDA_PINS, cwd=REPO,
                            capture_output=True, text=True, check=True).stdout.splitlines()
    assert pinned == ["cuda=default False", "cuda=deterministic True True False False False"]
    off = subprocess.run([sys.executable, "-c", code], env=env, cwd=REPO, capture_output=True, text=True, check=True)
    assert off.stdout.splitlines()[1] == "cuda=default False False False True False"


def test_a_cluster_job_carries_the_pins_to_workers_it_did_not_start(monkeypatch):
    from argparse import Namespace

    from sweeps.launch import worker_env

    cluster, local = Namespace(address="auto", reproducible=True), Namespace(address=None, reproducible=True)
    assert worker_env(local, {}) is None     # workers inherit the driver's
    assert worker_env(Namespace(address="auto", reproducible=False), {}) is None
    monkeypatch.setattr(kernels, "unavailable", lambda: None)
    assert worker_env(cluster, {}) == {"env_vars": kernels.CUDA_PINS | kernels.PINS}
    monkeypatch.setattr(kernels, "unavailable", lambda: "the CPU is aarch64")
    assert worker_env(cluster, {}) == {"env_vars": kernels.CUDA_PINS}
    preload = {"LD_PRELOAD": "/lib/x.so"}  # the allocator travels to local and joined clusters alike
    assert worker_env(local, preload) == {"env_vars": preload}
    assert worker_env(cluster, preload) == {"env_vars": preload | kernels.CUDA_PINS}
