"""What a sweep prints while a stage runs: one short line now and then, for a person to read.

At `--verbose 1` (the default) each stage's Tune run prints, instead of Tune's status tables,
lines such as

    [sweep] stage tune (grid): 37/96 done, 2 running, 57 pending | 2m 14s elapsed, ETA 3m 40s

and a last one when the stage ends. Errored trials, trials a scheduler stopped early and paused
ones are named in parentheses when there are any. A line carries counts and times only: no metric
value and no "best" trial (a ranking of trials by their objective would, without a validation
split, be a ranking by test accuracy). `--verbose 2` prints Tune's own table instead
(`TuneTable`), without its "Current best trial" line; `--verbose 0`, nothing while trials run.

How often: every 30 s at first; once a tenth of the stage's elapsed time is longer, every tenth
of it, and at most every 5 minutes (`report_interval`). A 7-minute stage prints about 14 lines,
a 10-hour one about 150, where a line per interval of 30 s would print 1,200.

The ETA (`eta_seconds`) assumes that every trial still to come takes the mean wall time of the
trials that have finished (seen by the driver from the step Tune first ran them to the step they
ended; for trials that had ended before a resumed stage started, their own reported run time).
The work left is that mean for each pending trial plus, for each running trial, what is left of
the mean after its time so far (none once it has run longer); it runs on as many trials at once
as the stage has run at most so far. Before any trial has finished there is no estimate
(`ETA -`). Trials that errored are counted but do not enter the mean.

The line itself is built by pure functions (`progress_line`, `eta_seconds`, `format_duration`);
`StageProgress` is the Tune `ProgressReporter` that feeds them."""
from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from ray.tune import CLIReporter, ProgressReporter

from .plan import reached_last_round, run_config

FIRST_INTERVAL = 30.0    # seconds between lines at the start of a stage
LONGEST_INTERVAL = 300.0  # never quieter than one line per 5 minutes
ENDED = ("TERMINATED", "ERROR")


@dataclass(frozen=True)
class Counts:
    """A stage's trials by state. `total`: every trial the stage will run (created by Tune or not
    yet); `done`: those that ended, `errored` and `stopped` (early, by a scheduler) among them."""
    total: int
    done: int
    running: int = 0
    paused: int = 0
    errored: int = 0
    stopped: int = 0

    @property
    def pending(self) -> int:
        return max(self.total - self.done - self.running - self.paused, 0)


def format_duration(seconds: float) -> str:
    """`45s`, `3m 40s`, `2h 05m` (rounded to the second; hours drop the seconds)."""
    whole = max(int(round(seconds)), 0)
    hours, rest = divmod(whole, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours}h {minutes:02d}m"
    return f"{minutes}m {secs:02d}s" if minutes else f"{secs}s"


def eta_seconds(finished: Sequence[float], running: Sequence[float], pending: int, slots: int) -> float | None:
    """Seconds until the stage ends (see the module docstring): `finished`, the wall times of the
    trials that finished; `running`, how long each running trial has run; `pending`, the trials not
    started; `slots`, how many run at once. None before any trial finished."""
    if not finished:
        return None
    mean = sum(finished) / len(finished)
    left = pending * mean + sum(max(mean - ran, 0.0) for ran in running)
    return left / max(slots, 1)


def progress_line(stage: str, counts: Counts, elapsed: float, eta: float | None) -> str:
    """One line of a stage's progress: counts, elapsed time and, while trials remain, the ETA."""
    line = f"[sweep] stage {stage}: {counts.done}/{counts.total} done"
    if counts.running or counts.pending or counts.paused:
        line += f", {counts.running} running" + (f", {counts.paused} paused" if counts.paused else "")
        line += f", {counts.pending} pending"
    notes = [f"{n} {what}" for n, what in ((counts.errored, "errored"), (counts.stopped, "stopped early"))
             if n]
    if notes:
        line += f" ({', '.join(notes)})"
    line += f" | {format_duration(elapsed)} elapsed"
    if counts.done < counts.total:
        line += f", ETA {'-' if eta is None else format_duration(eta)}"
    return line


def report_interval(elapsed: float) -> float:
    """Seconds from one line to the next, `elapsed` seconds into a stage (module docstring)."""
    return min(max(FIRST_INTERVAL, elapsed / 10), LONGEST_INTERVAL)


class StageProgress(ProgressReporter):
    """Tune's progress reporter for one stage: a `progress_line` every `report_interval` and when
    the stage ends. Tune calls `should_report` at every step of its loop (verbose >= 1 only): each
    call notes when trials start and end, for the ETA. Picklable (Tune saves it with the stage's
    Tuner and a resumed stage unpickles it: `setup` starts it afresh)."""

    def __init__(self, stage: str, say: Callable[[str], None] | None = None,
                 clock: Callable[[], float] = time.time) -> None:
        self.stage, self.say, self.clock = stage, say or say_now, clock
        self.setup()

    def setup(self, start_time: float | None = None, total_samples: int | None = None, metric=None, mode=None,
              **kwargs) -> None:
        self._start = start_time or self.clock()
        self._last = self._start
        self._total = total_samples or 0
        self._began: dict[str, float] = {}    # trial id -> when the driver first saw it run
        self._took: dict[str, float] = {}     # trial id -> wall time of a finished trial
        self._early: dict[str, bool] = {}     # trial id -> it ended before its last round
        self._slots = 0

    def should_report(self, trials: list, done: bool = False) -> bool:
        now = self.clock()
        self._observe(trials, now)
        return done or now - self._last >= report_interval(now - self._start)

    def report(self, trials: list, done: bool, *sys_info: str) -> None:
        now = self.clock()
        self._last = now
        counts = self.counts(trials)
        running = [now - self._began.get(t.trial_id, now) for t in trials if t.status == "RUNNING"]
        eta = eta_seconds(list(self._took.values()), running, counts.pending + counts.paused, self._slots)
        self.say(progress_line(self.stage, counts, now - self._start, eta))

    def counts(self, trials: list) -> Counts:
        by_status = [t.status for t in trials]
        return Counts(total=max(self._total, len(trials)), done=sum(s in ENDED for s in by_status),
                      running=by_status.count("RUNNING"), paused=by_status.count("PAUSED"),
                      errored=by_status.count("ERROR"),
                      stopped=sum(self._early.get(t.trial_id, False) for t in trials if t.status == "TERMINATED"))

    def _observe(self, trials: list, now: float) -> None:
        running = 0
        for trial in trials:
            key = trial.trial_id
            if trial.status == "RUNNING":
                running += 1
                self._began.setdefault(key, now)
            elif trial.status == "TERMINATED" and key not in self._took:
                took = now - self._began[key] if key in self._began else (trial.last_result or {}).get("time_total_s")
                if took is not None:
                    self._took[key] = float(took)
                self._early[key] = stopped_early(trial)
        self._slots = max(self._slots, running)


def say_now(line: str) -> None:
    print(line, flush=True)


def stopped_early(trial) -> bool:
    """Whether a trial Tune ended did so before its last round (a scheduler stopped it)."""
    try:
        return bool(trial.last_result) and not reached_last_round(run_config(trial.config), trial.last_result)
    except (ValueError, TypeError, KeyError):  # a config that is not a validated run's: not ours to judge
        return False


class TuneTable(CLIReporter):
    """Tune's own progress table (`--verbose 2`), without its "Current best trial" line: the
    reporter is given no metric to rank by (the objective is test accuracy where a stage has no
    validation split)."""

    def setup(self, start_time: float | None = None, total_samples: int | None = None, metric=None, mode=None,
              **kwargs) -> None:
        super().setup(start_time=start_time, total_samples=total_samples, **kwargs)
