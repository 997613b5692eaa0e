"""`--gpu-sharing`: which mode runs (sweeps/gpu_sharing.py `decide`), and this sweep's own MPS
daemon started, exported and stopped, with a fake `nvidia-cuda-mps-control` first on PATH (no GPU
needed): it records each call's arguments, pipe and log folders and stdin, keeps a marker file
while "running" (from `-d` to `quit`), and fails to start when FAKE_MPS_FAIL is set.

With Ray (slow): a sweep that starts its own Ray with one logical GPU (RAY_OVERRIDE_RESOURCES) and
packs two trials on it starts the fake daemon before Ray, says so, stops it on Ctrl-C, and on
--resume starts it again, runs to the end and names the mode in its summary."""
from __future__ import annotations

import os
import signal
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from sweeps import gpu_sharing
from sweeps.errors import SweepError
from sweeps.fedselect_grid import STUDY
from sweeps.gpu_sharing import LOG_ENV, PIPE_ENV, MpsDaemon, Sharing, decide
from sweeps.study import build_parser, run_study

from conftest import REPO
from sweep_helpers import sweep_args

FAKE = """#!/bin/sh
if [ "$1" = "-d" ]; then
  echo "start $CUDA_MPS_PIPE_DIRECTORY $CUDA_MPS_LOG_DIRECTORY" >> "$FAKE_MPS_RECORD"
  echo "control daemon starting" >> "$CUDA_MPS_LOG_DIRECTORY/control.log"
  if [ -n "$FAKE_MPS_FAIL" ]; then echo "$FAKE_MPS_FAIL" >> "$CUDA_MPS_LOG_DIRECTORY/control.log"; exit 3; fi
  touch "$FAKE_MPS_RECORD.running"
  exit 0
fi
read -r line
echo "$line $CUDA_MPS_PIPE_DIRECTORY" >> "$FAKE_MPS_RECORD"
if [ "$line" = quit ]; then rm -f "$FAKE_MPS_RECORD.running"; fi
"""


@pytest.fixture
def fake_mps(tmp_path, monkeypatch) -> Path:
    """The fake control program first on PATH; returns the file it records its calls in."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    program = bin_dir / gpu_sharing.CONTROL
    program.write_text(FAKE)
    program.chmod(program.stat().st_mode | stat.S_IXUSR)
    record = tmp_path / "mps-calls.txt"
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_MPS_RECORD", str(record))
    monkeypatch.delenv(PIPE_ENV, raising=False)
    monkeypatch.delenv(LOG_ENV, raising=False)
    return record


def calls(record: Path) -> list[list[str]]:
    return [line.split() for line in record.read_text().splitlines()] if record.exists() else []


# ---------------------------------------------------------------------------- the decision
CONTROL = "/usr/bin/nvidia-cuda-mps-control"
OWN = dict(has_gpus=True, own_ray=True, control=CONTROL)


@pytest.mark.parametrize("requested,fraction,facts,expected", [
    ("auto", 0.25, {}, Sharing("mps", "own daemon", own_daemon=True)),
    ("mps", 0.5, {}, Sharing("mps", "own daemon", own_daemon=True)),
    ("time-slice", 0.25, {}, Sharing("time-slice", "--gpu-sharing time-slice")),
    ("auto", 1.0, {}, Sharing("time-slice", "one trial per GPU")),
    ("auto", 2.0, {}, Sharing("time-slice", "one trial per GPU")),
    ("auto", 0.25, {"own_ray": False}, Sharing("time-slice", "joined a running Ray cluster")),
    ("auto", 0.25, {"control": None}, Sharing("time-slice", "nvidia-cuda-mps-control not found on PATH")),
    ("auto", 0.0, {}, Sharing("", "the trials use no GPU")),
    ("auto", 0.25, {"has_gpus": False}, Sharing("", "the trials use no GPU")),
    ("time-slice", 0.0, {}, Sharing("", "the trials use no GPU")),
    ("auto", 0.25, {"running": "/tmp/nvidia-mps"}, Sharing("mps", "the MPS daemon already serving /tmp/nvidia-mps")),
    ("mps", 0.25, {"running": "/tmp/nvidia-mps", "control": None},
     Sharing("mps", "the MPS daemon already serving /tmp/nvidia-mps")),
    ("auto", 0.25, {"running": "/tmp/nvidia-mps", "own_ray": False},
     Sharing("time-slice", "joined a running Ray cluster")),
])
def test_which_mode_runs_and_why(requested, fraction, facts, expected):
    assert decide(requested, fraction, **(OWN | facts)) == expected


@pytest.mark.parametrize("fraction,facts,needle", [
    (0.0, {}, "the trials use no GPU (--gpus-per-trial is 0, or auto chose the CPUs)"),
    (0.25, {"has_gpus": False}, "the trials use no GPU (the Ray cluster has no GPU)"),
    (1.0, {}, "trials share no GPU with --gpus-per-trial 1"),
    (0.25, {"own_ray": False}, "joins a running Ray cluster"),
    (0.25, {"control": None}, "nvidia-cuda-mps-control (NVIDIA's MPS, part of the driver) is not on PATH"),
])
def test_mps_that_cannot_run_is_one_error_naming_what_is_missing(fraction, facts, needle):
    with pytest.raises(SweepError) as err:
        decide("mps", fraction, **(OWN | facts))
    assert needle in str(err.value)
    assert "use --gpu-sharing auto (MPS where it can run, else time-slicing) or time-slice" in str(err.value)


def test_an_unknown_mode_is_refused_by_the_flag_and_by_decide(capsys):
    with pytest.raises(SystemExit) as stop:
        build_parser(STUDY).parse_args(["--gpu-sharing", "fast"])
    assert stop.value.code == 2
    assert "--gpu-sharing: invalid choice: 'fast' (choose from 'auto', 'mps', 'time-slice')" in capsys.readouterr().err
    assert build_parser(STUDY).parse_args([]).gpu_sharing == "auto"
    with pytest.raises(SweepError, match="'fast': allowed are auto, mps, time-slice"):
        decide("fast", 0.25, **OWN)


def test_the_machine_facts_are_read_once_from_path_and_the_environment(fake_mps, tmp_path, monkeypatch):
    assert gpu_sharing.chooser("auto", own_ray=True)(0.25, has_gpus=True).own_daemon
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    assert gpu_sharing.chooser("auto", own_ray=True)(0.25, has_gpus=True).mode == "time-slice"
    serving = tmp_path / "serving"
    serving.mkdir()
    (serving / "control").touch()  # a daemon's control pipe: one already serves this environment
    monkeypatch.setenv(PIPE_ENV, str(serving))
    assert gpu_sharing.running_daemon() == str(serving)
    assert gpu_sharing.chooser("auto", own_ray=True)(0.25, has_gpus=True).reason == f"the MPS daemon already " \
                                                                                     f"serving {serving}"
    assert gpu_sharing.asked_fraction("auto") == 0.25 and gpu_sharing.asked_fraction(1.0) == 1.0


# ---------------------------------------------------------------------------- the daemon
def test_the_sweep_daemon_runs_in_its_own_folders_is_exported_and_stopped(fake_mps):
    daemon = MpsDaemon("mysweep-20250101-000000")
    with daemon:
        pipe, log = daemon.pipe, daemon.log
        root = daemon.root
        assert root.name.startswith("mysweep-20250101-000000-mps-") and pipe == root / "mps" / "pipe"
        assert len(str(pipe / "control")) < 100  # a UNIX socket's path limit
        assert calls(fake_mps) == [["start", str(pipe), str(log)]]
        assert Path(f"{fake_mps}.running").exists()
        assert os.environ[PIPE_ENV] == str(pipe) and os.environ[LOG_ENV] == str(log)
    assert calls(fake_mps)[-1] == ["quit", str(pipe)]
    assert not Path(f"{fake_mps}.running").exists() and not root.exists()
    assert PIPE_ENV not in os.environ and LOG_ENV not in os.environ
    daemon.stop()  # again: nothing more happens
    assert len(calls(fake_mps)) == 2


def test_ctrl_c_in_the_sweep_stops_the_daemon_and_restores_the_environment(fake_mps, monkeypatch):
    monkeypatch.setenv(PIPE_ENV, "/somewhere/else")  # the user's own setting comes back afterwards
    with pytest.raises(KeyboardInterrupt):
        with MpsDaemon("sweep") as daemon:
            root, pipe = daemon.root, daemon.pipe
            assert os.environ[PIPE_ENV] == str(pipe)
            raise KeyboardInterrupt
    assert calls(fake_mps)[-1] == ["quit", str(pipe)]
    assert not Path(f"{fake_mps}.running").exists() and not root.exists()
    assert os.environ[PIPE_ENV] == "/somewhere/else" and LOG_ENV not in os.environ


def test_a_daemon_that_does_not_start_is_one_error_with_its_log(fake_mps, monkeypatch):
    monkeypatch.setenv("FAKE_MPS_FAIL", "cannot open /dev/nvidiactl")
    daemon = MpsDaemon("sweep")
    with pytest.raises(SweepError) as err:
        with daemon:
            raise AssertionError("the body must not run")
    text = str(err.value)
    assert "could not start NVIDIA's MPS daemon (nvidia-cuda-mps-control -d: exit status 3)" in text
    assert "its log ends with:\ncontrol daemon starting\ncannot open /dev/nvidiactl" in text
    assert "--gpu-sharing time-slice" in text
    assert daemon.root is None and PIPE_ENV not in os.environ
    started = calls(fake_mps)[0][1]
    assert not Path(started).exists() and calls(fake_mps)[-1] == ["quit", started]


def test_a_missing_program_is_one_error(tmp_path):
    with pytest.raises(SweepError, match="could not start NVIDIA's MPS daemon"):
        MpsDaemon("sweep", control=str(tmp_path / "absent")).start()
    assert not list(Path(gpu_sharing.tempfile.gettempdir()).glob("sweep-mps-*"))


# ---------------------------------------------------------------------------- the sweep, before Ray
@pytest.mark.parametrize("flags,needle", [
    (["--gpus-per-trial", "0"], "--gpu-sharing mps shares a GPU between packed trials, but the trials use no GPU"),
    (["--gpus-per-trial", "0.5", "--address", "auto"], "--gpu-sharing mps: this sweep joins a running Ray cluster"),
])
def test_an_impossible_mps_stops_the_sweep_before_data_or_ray(tmp_path, capsys, flags, needle):
    assert run_study(STUDY, sweep_args(tmp_path, "nompsa", "--gpu-sharing", "mps", *flags)) == 2
    assert needle in capsys.readouterr().err
    assert not (tmp_path / "nompsa" / "sweep.json").exists()


# ---------------------------------------------------------------------------- the sweep, with Ray
def _driver(ray_tmp: Path, argv: list[str], pause: str | None = None) -> subprocess.Popen:
    """The sweep as a subprocess starting its own Ray (one logical GPU, temp files in `ray_tmp`)."""
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "SWEEPS_TEST_PAUSE")} | {
        "PYTHONUNBUFFERED": "1", "RAY_OVERRIDE_RESOURCES": '{"GPU": 1}', "RAY_TMPDIR": str(ray_tmp)}
    if pause:
        env["SWEEPS_TEST_PAUSE"] = pause
    return subprocess.Popen([sys.executable, "sweeps/fedselect_grid.py", *argv], cwd=REPO, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)


@pytest.mark.slow
def test_packed_trials_on_its_own_ray_get_the_sweeps_daemon_until_ctrl_c_and_again_on_resume(tmp_path_factory,
                                                                                              tmp_path, fake_mps):
    ray_tmp = tmp_path_factory.mktemp("raymps")  # short: Ray's socket paths
    argv = sweep_args(tmp_path, "mps", "--pers-rate", "0.1", "0.5", "--anchors", "--gpus-per-trial", "0.5")
    driver = _driver(ray_tmp, argv, pause="start")
    lines = []
    for line in driver.stdout:  # until the pause: Ray runs, the daemon too
        lines.append(line)
        if "test hook: paused before start" in line:
            break
    out = "".join(lines)
    assert "[sweep] GPU sharing: mps (own daemon, pipes in " in out, out
    (start, pipe, _), = calls(fake_mps)
    assert start == "start" and f"pipes in {pipe})" in out and Path(pipe).is_dir()
    os.killpg(driver.pid, signal.SIGINT)
    rest, _ = driver.communicate(timeout=180)
    assert driver.returncode == 130, rest
    assert calls(fake_mps)[-1] == ["quit", pipe] and not Path(pipe).exists()
    assert not Path(f"{fake_mps}.running").exists()

    # resources come from the resuming command line (the default, auto, would decide again: here
    # the driver has no CUDA, so it would take the CPUs), hence the same request again
    resumed = _driver(ray_tmp, ["--resume", "mps", "--results", str(tmp_path), "--gpus-per-trial", "0.5"])
    out, _ = resumed.communicate(timeout=600)
    assert resumed.returncode == 0, out
    second = calls(fake_mps)[2]
    assert second[0] == "start" and second[1] != pipe and calls(fake_mps)[3] == ["quit", second[1]]
    assert not Path(second[1]).exists() and len(calls(fake_mps)) == 4
    assert "trials completed" in out and "; GPU sharing: mps (own daemon)\n" in out
