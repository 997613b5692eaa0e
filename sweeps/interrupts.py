"""Ctrl-C (SIGINT) and SIGTERM in the sweep driver: stop cleanly at any moment.

What a signal does depends on where the driver is (`Interrupts.mode`):
  raise  before Tune runs (data, Ray start) and while tables and figures are written: the signal
         becomes `Interrupted`, which unwinds to `sweeps.launch`; the launcher then writes
         trials.parquet, prints what finished and our resume command;
  tune   while `Tuner.fit` runs: the first signal asks Tune to stop the way its own Ctrl-C does
         (it saves its experiment state, stops the trials, and `fit` returns); a second one
         stops at once (`Interrupted`), without waiting for Tune's last snapshot;
  hold   while Ray starts or stops and while the results are written: the signal is noted and
         acted on when that work is done (a half-started Ray or a half-written file helps nobody).
SIGTERM is treated as SIGINT. Exit status: 128 + the signal number (130 for SIGINT, 143 for
SIGTERM), as a shell reports a process ended by that signal.

Tune's own messages about the interrupt (the `Tuner.restore(...)` hint, which is not how a
study is resumed) are dropped; the launcher prints `python sweeps/<study>.py --resume <name>`.

Test hook: with SWEEPS_TEST_PAUSE=<point> in the environment, `pause_for_tests(point)` prints a
line and sleeps, so that a test can send a signal at a known point ("start": Ray is up, Tune not
started; "tables": every trial has finished, the tables are next; "imports": a sweep script has
just started, before its imports).
"""
from __future__ import annotations

import logging
import os
import signal
import sys
import threading
import time
from contextlib import contextmanager
from typing import Iterator

SIGNALS = (signal.SIGINT, signal.SIGTERM)
TEST_PAUSE = "SWEEPS_TEST_PAUSE"
# Tune's log lines (logger ray.tune.tune) that describe its own interrupt handling.
TUNE_INTERRUPT_LINES = ("Stop signal received", "Experiment has been interrupted", "Trials did not complete")


class Interrupted(BaseException):
    """A signal asked the driver to stop (a BaseException, like KeyboardInterrupt, so that
    `except Exception` blocks on the way do not swallow it)."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def signal_name(signum: int) -> str:
    return signal.Signals(signum).name


def exit_code(signum: int) -> int:
    return 128 + int(signum)


class Interrupts:
    """Signal handlers for the duration of a sweep (`with Interrupts() as guard:`)."""

    def __init__(self) -> None:
        self.signum: int | None = None   # the first signal received
        self.mode = "raise"
        self.raised = False              # `Interrupted` has been raised once (later signals are noted only)
        self._pending = False            # a signal arrived in hold mode
        self._asked_tune = False
        self._previous: dict[int, object] = {}

    def __enter__(self) -> Interrupts:
        if threading.current_thread() is threading.main_thread():  # signal.signal works there only
            for sig in SIGNALS:
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def reinstall(self) -> None:
        """After `ray.init`: Ray's core worker installs a C handler for SIGTERM (a crash report that
        ends the process with status 1) over ours."""
        for sig in self._previous:
            signal.signal(sig, self._handle)

    def __exit__(self, *exc) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)

    def _handle(self, signum: int, frame) -> None:
        first = self.signum is None
        if first:
            self.signum = signum
        if self.mode == "tune" and not self._asked_tune:
            stop = signal.getsignal(signal.SIGUSR1)  # Tune registers its stop handler on SIGUSR1 too
            if callable(stop) and stop != self._handle:
                self._asked_tune = True
                print(f"\n[sweep] {signal_name(signum)}: stopping the running trials (their rounds so far are "
                      f"kept); again to stop at once", file=sys.stderr, flush=True)
                stop(signal.SIGINT, frame)
                return
        if self.mode == "hold" or self.raised:
            self._pending = True
            print(f"\n[sweep] {signal_name(signum)}: {'stopping' if first else 'already stopping'}, writing what "
                  f"finished first", file=sys.stderr, flush=True)
            return
        self.raised = True
        raise Interrupted(self.signum)

    @contextmanager
    def hold(self, then_raise: bool = True) -> Iterator[None]:
        """Signals wait until the block is done; then (`then_raise`) one that came is raised."""
        before, self.mode = self.mode, "hold"
        try:
            yield
        finally:
            self.mode = before
        if then_raise and self._pending and not self.raised:
            self.raised = True
            raise Interrupted(self.signum)

    @contextmanager
    def tune(self) -> Iterator[None]:
        """While `Tuner.fit` runs: a signal stops Tune gracefully; Tune's own messages are dropped."""
        saved_env = os.environ.get("TUNE_DISABLE_SIGINT_HANDLER")
        os.environ["TUNE_DISABLE_SIGINT_HANDLER"] = "1"  # SIGINT stays ours; Tune still listens on SIGUSR1
        tune_log = logging.getLogger("ray.tune.tune")
        log_filter = _DropInterruptLines(self)
        tune_log.addFilter(log_filter)
        # Until Tune installs its handler, none (not a stale one of an earlier fit in this process).
        usr1 = signal.signal(signal.SIGUSR1, signal.SIG_IGN) if self._previous else None
        before, self.mode = self.mode, "tune"
        try:
            yield
        finally:
            self.mode = before
            if usr1 is not None:
                signal.signal(signal.SIGUSR1, usr1)
            tune_log.removeFilter(log_filter)
            if saved_env is None:
                os.environ.pop("TUNE_DISABLE_SIGINT_HANDLER", None)
            else:
                os.environ["TUNE_DISABLE_SIGINT_HANDLER"] = saved_env


class _DropInterruptLines(logging.Filter):
    def __init__(self, guard: Interrupts) -> None:
        super().__init__()
        self.guard = guard

    def filter(self, record: logging.LogRecord) -> bool:
        if self.guard.signum is None:
            return True
        return not str(record.msg).startswith(TUNE_INTERRUPT_LINES)


def while_starting() -> None:
    """Until `Interrupts` takes over (sweeps.launch): Ctrl-C or SIGTERM while Python imports torch
    and Ray, parses the flags or plans the trials ends the process at once, with one line and the
    signal's exit status. Nothing has been written by then. Each sweep script calls this first."""
    def stop(signum: int, frame) -> None:
        sys.stderr.write(f"\n{signal_name(signum)} while starting (imports, flags, planning): nothing was run or "
                         f"written\n")
        sys.stderr.flush()
        os._exit(exit_code(signum))

    for signum in SIGNALS:
        signal.signal(signum, stop)
    pause_for_tests("imports")


def pause_for_tests(point: str) -> None:
    """Test hook: sleep at `point` when SWEEPS_TEST_PAUSE names it (see the module docstring)."""
    if os.environ.get(TEST_PAUSE) == point:
        end = time.monotonic() + float(os.environ.get("SWEEPS_TEST_PAUSE_SECONDS", "300"))
        print(f"[sweep] test hook: paused before {point}", flush=True)
        # Short sleeps: a signal that lands after the print but before a sleep starts (no EINTR to
        # wake it) is still handled within 50 ms, at the loop's next turn, not after the whole pause.
        while time.monotonic() < end:
            time.sleep(0.05)
