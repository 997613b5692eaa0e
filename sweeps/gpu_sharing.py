"""How trials packed on one GPU share it (`--gpu-sharing auto | mps | time-slice`).

Each trial is its own process with its own CUDA context; without help the GPU runs one context at
a time (time-slicing), so trials packed with `--gpus-per-trial` below 1 take turns instead of
running together. NVIDIA's Multi-Process Service (MPS) lets such processes share the GPU at once:
a control daemon (`nvidia-cuda-mps-control -d`) starts a server that the CUDA clients connect to
when they first initialize CUDA. A client finds the daemon through the folder of its pipes
(`CUDA_MPS_PIPE_DIRECTORY`); one that finds none runs without MPS, as before.

`decide` says which mode a sweep runs and why (a pure function of the flags and the machine);
`MpsDaemon` starts this sweep's own daemon, with its pipe and log folders in a fresh temporary
folder, exports the folders to the driver's environment (which the Ray this sweep starts passes to
its workers), and stops the daemon and removes the folders on exit, whatever ends the sweep.
"""
from __future__ import annotations

import functools
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from .errors import SweepError
from .resources import AUTO_GPU_FRACTION

MODES = ("auto", "mps", "time-slice")
CONTROL = "nvidia-cuda-mps-control"
PIPE_ENV, LOG_ENV = "CUDA_MPS_PIPE_DIRECTORY", "CUDA_MPS_LOG_DIRECTORY"
DEFAULT_PIPE = "/tmp/nvidia-mps"  # where clients look for a daemon when PIPE_ENV is not set
LOG_TAIL = 20  # lines of the daemon's log shown when it does not start
ALLOWED = "use --gpu-sharing auto (MPS where it can run, else time-slicing) or time-slice"


@dataclass(frozen=True)
class Sharing:
    """The mode that runs: "mps", "time-slice", or "" when the trials use no GPU (nothing to share)."""

    mode: str
    reason: str
    own_daemon: bool = False  # mps through a daemon this sweep starts (else one that already runs)

    def text(self, pipe: str | None = None) -> str:
        """`mps (own daemon, pipes in /tmp/...)`, `time-slice (one trial per GPU)`, ..."""
        return f"{self.mode} ({self.reason}" + (f", pipes in {pipe}" if pipe else "") + ")"


def decide(requested: str, fraction: float, has_gpus: bool, own_ray: bool, control: str | None,
           running: str | None = None) -> Sharing:
    """Which mode runs and why. `fraction`: GPUs per trial; `own_ray`: this sweep starts its own Ray
    (its workers inherit the driver's environment; a joined cluster's do not, and a daemon started
    here would not serve its other nodes); `control`: the path of nvidia-cuda-mps-control or None;
    `running`: the pipe folder of an MPS daemon that already runs, if any. An explicit `mps` that
    cannot run raises SweepError naming what is missing."""
    if requested not in MODES:
        raise SweepError(f"--gpu-sharing {requested!r}: allowed are {', '.join(MODES)}")
    if fraction <= 0 or not has_gpus:
        if requested == "mps":
            why = "the Ray cluster has no GPU" if fraction > 0 else "--gpus-per-trial is 0, or auto chose the CPUs"
            raise SweepError(f"--gpu-sharing mps shares a GPU between packed trials, but the trials use no GPU "
                             f"({why}); {ALLOWED}")
        return Sharing("", "the trials use no GPU")
    if requested == "time-slice":
        return Sharing("time-slice", "--gpu-sharing time-slice")
    missing = None
    if fraction >= 1:
        missing = f"trials share no GPU with --gpus-per-trial {fraction:g}", "one trial per GPU"
    elif not own_ray:
        missing = ("this sweep joins a running Ray cluster, whose workers it cannot point at a daemon of its own",
                   "joined a running Ray cluster")
    elif running is None and control is None:
        missing = (f"{CONTROL} (NVIDIA's MPS, part of the driver) is not on PATH",
                   f"{CONTROL} not found on PATH")
    if missing is not None:
        if requested == "mps":
            raise SweepError(f"--gpu-sharing mps: {missing[0]}; {ALLOWED}")
        return Sharing("time-slice", missing[1])
    if running is not None:
        return Sharing("mps", f"the MPS daemon already serving {running}")
    return Sharing("mps", "own daemon", own_daemon=True)


def running_daemon() -> str | None:
    """The pipe folder of an MPS daemon that already serves this environment's clients (its control
    pipe exists), else None."""
    pipe = os.environ.get(PIPE_ENV) or DEFAULT_PIPE
    return pipe if (Path(pipe) / "control").exists() else None


def chooser(requested: str, own_ray: bool) -> Callable[..., Sharing]:
    """`decide` with this machine's facts fixed once (before any daemon of ours runs): call it with
    `fraction` and `has_gpus`."""
    return functools.partial(decide, requested, own_ray=own_ray, control=shutil.which(CONTROL),
                             running=running_daemon())


def asked_fraction(gpus: float | str) -> float:
    """The GPUs per trial `--gpus-per-trial` asks for, before the cluster is known. For auto this is
    only an assumption (the GPU fraction auto takes when it takes the GPU), made before the probe
    decides (sweeps/probe.py); the decision is made again with the real fraction afterwards."""
    return AUTO_GPU_FRACTION if gpus == "auto" else float(gpus)


class MpsDaemon:
    """This sweep's own MPS control daemon (`with MpsDaemon(name):`). Its pipe and log folders are
    `<tmp>/mps/pipe` and `<tmp>/mps/log` in a fresh folder under the system's temporary folder,
    not the sweep folder: the daemon's pipes are UNIX sockets, whose paths must stay under about
    100 bytes, and a results folder can be deeper than that. `stop` may be called more than once."""

    def __init__(self, name: str, control: str = CONTROL) -> None:
        self.prefix = f"{name[:32]}-mps-"
        self.control = control
        self.root: Path | None = None
        self._saved: dict[str, str | None] = {}
        self._launched = False  # `-d` ran (a daemon may run): stop sends it `quit`

    @property
    def pipe(self) -> Path:
        return self._folders()[0]

    @property
    def log(self) -> Path:
        return self._folders()[1]

    def _folders(self) -> tuple[Path, Path]:
        if self.root is None:
            raise RuntimeError("the MPS daemon is not running")
        return self.root / "mps" / "pipe", self.root / "mps" / "log"

    def _env(self) -> dict[str, str]:
        return {PIPE_ENV: str(self.pipe), LOG_ENV: str(self.log)}

    def __enter__(self) -> MpsDaemon:
        try:
            self.start()
        except BaseException:  # an interrupt while it started: nothing is left behind
            self.stop()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def start(self) -> None:
        """Start the daemon with its own folders, check that it came up, export the folders."""
        self.root = Path(tempfile.mkdtemp(prefix=self.prefix))
        for folder in self._folders():
            folder.mkdir(parents=True)
        self._launched = True
        try:
            done = subprocess.run([self.control, "-d"], env=os.environ | self._env(), capture_output=True,
                                  text=True, timeout=60)
            failed = f"exit status {done.returncode}" if done.returncode != 0 else None
            said = (done.stdout + done.stderr).strip()
        except (OSError, subprocess.TimeoutExpired) as err:
            self._launched = not isinstance(err, OSError)  # OSError: it could not be run at all
            failed, said = str(err), ""
        if failed is not None:
            tail = self.log_tail()
            self.stop()
            raise SweepError(f"could not start NVIDIA's MPS daemon ({self.control} -d: {failed})"
                             + (f"; it said: {said}" if said else "")
                             + (f"; its log ends with:\n{tail}" if tail else "; it wrote no log")
                             + "\nrun without it with --gpu-sharing time-slice")
        self._saved = {key: os.environ.get(key) for key in self._env()}
        os.environ.update(self._env())  # the driver's environment: the workers of the Ray it starts inherit it

    def log_tail(self) -> str:
        """The last lines of the daemon's log files (empty when there are none)."""
        lines = [line for path in sorted(self.log.glob("*")) if path.is_file()
                 for line in path.read_text(errors="replace").splitlines()]
        return "\n".join(lines[-LOG_TAIL:])

    def stop(self) -> None:
        """Ask the daemon to quit (it stops its servers), restore the environment, remove the folders."""
        if self.root is None:
            return
        env, root = os.environ | self._env(), self.root
        try:
            if self._launched:
                subprocess.run([self.control], input="quit\n", env=env, capture_output=True, text=True,
                               timeout=60)
        except (OSError, subprocess.TimeoutExpired) as err:
            print(f"[sweep] could not stop the MPS daemon ({err}); stop it with: echo quit | "
                  f"{PIPE_ENV}={env[PIPE_ENV]} {self.control}", file=sys.stderr, flush=True)
        finally:
            for key, value in self._saved.items():
                if value is None:
                    os.environ.pop(key, None)
                else:
                    os.environ[key] = value
            self._saved, self.root, self._launched = {}, None, False
            shutil.rmtree(root, ignore_errors=True)


def daemon_for(sharing: Sharing, name: str) -> MpsDaemon | None:
    """The daemon this sweep starts for `sharing`, or None (no MPS, or a daemon that already runs)."""
    return MpsDaemon(name) if sharing.mode == "mps" and sharing.own_daemon else None
