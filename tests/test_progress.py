"""What a sweep prints while its trials run (sweeps/progress.py): the line built from counts and
times (no Ray), the Tune reporter that feeds it (fake trials and a fake clock), and a tiny sweep at
the default verbosity (a real Ray cluster; slow)."""
from __future__ import annotations

import pickle
import re
from types import SimpleNamespace

import pytest

from sweeps import progress
from sweeps.fedselect_grid import STUDY
from sweeps.progress import Counts, StageProgress, TuneTable, eta_seconds, format_duration, progress_line
from sweeps.study import run_study

from conftest import tiny
from sweep_helpers import sweep_args

LINE = re.compile(r"\[sweep\] stage (?P<stage>.+?): (?P<done>\d+)/(?P<total>\d+) done"
                  r"(?:, (?P<running>\d+) running, (?P<pending>\d+) pending)?(?: \((?P<notes>[^)]*)\))?"
                  r" \| (?P<elapsed>[0-9hms ]+) elapsed(?:, ETA (?P<eta>[0-9hms ]+|-))?$")


# ---------------------------------------------------------------------------- the line (pure)
@pytest.mark.parametrize("seconds,text", [(0, "0s"), (59.4, "59s"), (59.6, "1m 00s"), (134, "2m 14s"),
                                          (3599, "59m 59s"), (3600, "1h 00m"), (7530, "2h 05m"),
                                          (100 * 3600 + 61, "100h 01m"), (-3, "0s")])
def test_durations_read_as_seconds_minutes_or_hours(seconds, text):
    assert format_duration(seconds) == text


def test_eta_is_the_mean_finished_time_for_each_trial_left_spread_over_the_slots():
    # mean 90 s: 4 pending trials need 360 s, the running ones 90 - 30 = 60 s and none (100 > 90); 2 at once
    assert eta_seconds([60, 120], running=[30, 100], pending=4, slots=2) == pytest.approx((360 + 60) / 2)
    assert eta_seconds([50], running=[], pending=3, slots=3) == pytest.approx(50)
    assert eta_seconds([50], running=[], pending=3, slots=0) == pytest.approx(150)  # never divides by 0
    assert eta_seconds([], running=[10, 20], pending=5, slots=2) is None             # nothing finished yet


def test_the_line_counts_done_running_pending_and_times_without_any_metric():
    counts = Counts(total=96, done=37, running=2)
    assert counts.pending == 57
    assert progress_line("tune (grid)", counts, 134, 220) == \
        "[sweep] stage tune (grid): 37/96 done, 2 running, 57 pending | 2m 14s elapsed, ETA 3m 40s"
    assert progress_line("tune (grid)", Counts(total=96, done=0, running=4), 5, None) == \
        "[sweep] stage tune (grid): 0/96 done, 4 running, 92 pending | 5s elapsed, ETA -"
    line = progress_line("tune-select-0 (select)", Counts(total=8, done=5, running=1, errored=1, stopped=3),
                         4000, 4000)
    assert line == ("[sweep] stage tune-select-0 (select): 5/8 done, 1 running, 2 pending (1 errored, 3 stopped "
                    "early) | 1h 06m elapsed, ETA 1h 06m")
    assert progress_line("tune (grid)", Counts(total=6, done=3, running=1, paused=1), 10, 5) == \
        "[sweep] stage tune (grid): 3/6 done, 1 running, 1 paused, 1 pending | 10s elapsed, ETA 5s"
    final = progress_line("tune (grid)", Counts(total=96, done=96), 396, 0)
    assert final == "[sweep] stage tune (grid): 96/96 done | 6m 36s elapsed"   # no ETA once nothing is left
    for text in (line, final):
        assert LINE.match(text) and "best" not in text


def test_lines_come_every_30_s_then_a_tenth_of_the_elapsed_time_at_most_every_5_min():
    assert [progress.report_interval(t) for t in (0, 200, 300, 600, 2000, 3000, 36000)] == \
        [30, 30, 30, 60, 200, 300, 300]


# ---------------------------------------------------------------------------- the Tune reporter
class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def trial(key: str, status: str, round_: int | None = None, took: float | None = None, rounds: int = 3):
    result = {} if round_ is None else {"round": round_} | ({"time_total_s": took} if took is not None else {})
    return SimpleNamespace(trial_id=key, status=status, last_result=result,
                           config={"trial": {"run": tiny(rounds=rounds).to_dict()}})


def test_the_reporter_times_trials_itself_counts_early_stops_and_reports_on_its_interval():
    clock, said = Clock(), []
    reporter = StageProgress("tune (grid)", say=said.append, clock=clock)
    reporter.setup(start_time=clock.now, total_samples=5)
    a, b, c = trial("a", "RUNNING"), trial("b", "RUNNING"), trial("c", "PENDING")
    clock.now += 1
    assert not reporter.should_report([a, b, c])                   # 1 s in: too soon
    a.status, a.last_result = "TERMINATED", {"round": 3}              # a ran from 1001 to 1011: 10 s
    clock.now += 10
    assert not reporter.should_report([a, b, c])
    clock.now += 20                                                   # 31 s in
    assert reporter.should_report([a, b, c])
    reporter.report([a, b, c], False)
    # 1 of 5 done (the 5th not created yet: pending); b ran 30 s > 10: done soon; 3 pending x 10 s on 2 slots
    assert said == ["[sweep] stage tune (grid): 1/5 done, 1 running, 3 pending | 31s elapsed, ETA 15s"]
    assert not reporter.should_report([a, b, c])                      # the next one 30 s later
    b.status, b.last_result = "TERMINATED", {"round": 2}              # stopped by the scheduler at round 2
    c.status, d, e = "ERROR", trial("d", "TERMINATED", 3, took=50.0), trial("e", "TERMINATED", 3, took=20.0)
    clock.now += 9
    assert reporter.should_report([a, b, c, d, e], done=True)        # the last line comes at once
    reporter.report([a, b, c, d, e], True)
    assert said[-1] == "[sweep] stage tune (grid): 5/5 done (1 errored, 1 stopped early) | 40s elapsed"


def test_the_reporter_survives_tunes_pickle_and_starts_afresh():
    clock, said = Clock(), []
    reporter = StageProgress("tune (grid)")
    reporter.setup(start_time=clock.now, total_samples=2)
    reporter.should_report([trial("a", "RUNNING")])
    again = pickle.loads(pickle.dumps(reporter))                     # a resumed stage unpickles it, then setup
    again.say, again.clock = said.append, clock
    again.setup(start_time=clock.now + 100, total_samples=2)
    clock.now += 130                                                  # a finished before the resume: its own time
    again.should_report([trial("a", "TERMINATED", 3, took=40.0), trial("b", "PENDING")])
    again.report([trial("a", "TERMINATED", 3, took=40.0), trial("b", "PENDING")], False)
    assert said == ["[sweep] stage tune (grid): 1/2 done, 0 running, 1 pending | 30s elapsed, ETA 40s"]


def test_tunes_table_at_verbose_2_has_no_metric_to_name_a_best_trial():
    """Tune's CLIReporter keeps the stage's metric and prints "Current best trial" by it; ours drops
    it (Tune refuses a second metric on a reporter that kept one, so a kept one would raise here)."""
    table = TuneTable(metric_columns={"objective": "objective"})
    table.setup(start_time=0.0, total_samples=2, metric="objective", mode="max")
    table.set_search_properties(metric="objective", mode="max")      # accepted: it had none
    from ray.tune import CLIReporter
    kept = CLIReporter(metric_columns={"objective": "objective"})
    kept.setup(start_time=0.0, total_samples=2, metric="objective", mode="max")
    with pytest.raises(ValueError):
        kept.set_search_properties(metric="objective", mode="max")


# ---------------------------------------------------------------------------- a sweep (Ray)
@pytest.mark.slow
def test_a_sweep_at_the_default_verbosity_prints_our_lines_only(ray_cluster, tmp_path, capfd, monkeypatch):
    monkeypatch.setattr(progress, "FIRST_INTERVAL", 1.0)  # lines every second: a tiny sweep shows a few
    argv = sweep_args(tmp_path, "quiet", "--pers-rate", "0.25", "0.5", "--anchors", "fedavg", "--verbose", "1",
                      "--max-concurrent", "2", rounds=3)
    assert run_study(STUDY, argv) == 0
    out, err = capfd.readouterr()
    print(out)  # for a reader of the test's log
    lines = [m for m in map(LINE.match, out.splitlines()) if m]
    assert lines, out
    assert all(m["stage"] == "tune (grid)" and int(m["total"]) == 3 for m in lines)
    for m in lines[:-1]:
        assert int(m["done"]) + int(m["running"]) + int(m["pending"]) == 3 and m["eta"]
    done = [int(m["done"]) for m in lines]
    assert done == sorted(done) and lines[-1]["done"] == "3" and lines[-1]["eta"] is None
    assert lines[-1].group(0).startswith("[sweep] stage tune (grid): 3/3 done |")
    text = out + err
    assert "Current best trial" not in text and "best" not in text.lower()
    assert "+---" not in text and "╭" not in text and "Trial status" not in text and "Number of trials" not in text
