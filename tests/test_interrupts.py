"""Ctrl-C (SIGINT) and SIGTERM stop a sweep cleanly at any moment, and --resume finds it.

Without Ray: which sweep `--resume` / `--resume NAME` picks and its errors, and trials.parquet
for Tune results that never reported (their config is None).
With Ray (slow): the sweep driver runs as a subprocess joined to the session's Ray cluster (its
temp files in the test's tmp folder) and gets a signal before Tune starts, with trials pending,
during a run, and while it writes the tables; each time it must exit with 128 + the signal
number, no traceback, trials.parquet listing every planned trial, and our resume command; the
resumed sweep then has every row exactly once.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pandas as pd
import pytest

from fl_core.results import summarize_trial
from sweeps.asha import rungs_path
from sweeps.fedselect_grid import STUDY
from sweeps.folder import SWEEP_FORMAT, sweep_folder
from sweeps.interrupts import Interrupted, Interrupts, exit_code
from sweeps.tune_record import restore_quietly
from sweeps.parquet_sink import read_rounds
from sweeps.study import build_parser, plan_sweep, run_study
from sweeps.trials import trials_table

from conftest import REPO
from sweep_helpers import STAGED, check_staged, direct_final_rows, final_rows, mlflow_runs, sweep_args

slow = pytest.mark.slow
CLIENTS = 3  # TINY_SWEEP


# ---------------------------------------------------------------------------- --resume without Ray
def _fake_sweep(results: Path, name: str, study: str | None, age: float = 0.0) -> Path:
    """A sweep folder holding only sweep.json (`study` None: written before it was recorded)."""
    folder = results / name
    folder.mkdir(parents=True)
    saved = {"sweep_format": SWEEP_FORMAT} | ({"study": study} if study else {})
    (folder / "sweep.json").write_text(json.dumps(saved))
    stamp = time.time() - age
    os.utime(folder / "sweep.json", (stamp, stamp))
    return folder


def _resolve(tmp_path: Path, *flags: str) -> Path:
    return sweep_folder(STUDY.name, build_parser(STUDY).parse_args(["--results", str(tmp_path), *flags]))


def test_resume_alone_finds_the_latest_sweep_of_the_study_whatever_its_name(tmp_path):
    _fake_sweep(tmp_path, "fedselect_grid-20250101-000000", None, age=300)  # old format: by its name
    _fake_sweep(tmp_path, "my-named-sweep", "fedselect_grid", age=200)
    assert _resolve(tmp_path, "--resume") == tmp_path / "my-named-sweep"
    _fake_sweep(tmp_path, "newer-but-baselines", "baselines", age=100)  # another study: never picked
    _fake_sweep(tmp_path, "fedselect_grid-lookalike", "ablation", age=50)  # its record beats its name
    (tmp_path / "not-a-sweep").mkdir()
    assert _resolve(tmp_path, "--resume") == tmp_path / "my-named-sweep"
    latest = _fake_sweep(tmp_path, "fedselect_grid-20250102-000000", None, age=10)
    assert _resolve(tmp_path, "--resume") == latest


def test_resume_name_and_name_resume_pick_that_sweep(tmp_path):
    _fake_sweep(tmp_path, "first", "fedselect_grid", age=100)
    _fake_sweep(tmp_path, "second", "fedselect_grid")
    assert _resolve(tmp_path, "--resume", "first") == tmp_path / "first"
    assert _resolve(tmp_path, "--name", "first", "--resume") == tmp_path / "first"
    assert _resolve(tmp_path, "--resume", "first", "--name", "first") == tmp_path / "first"
    assert _resolve(tmp_path, "--resume") == tmp_path / "second"


@pytest.mark.parametrize("flags,needle", [
    (["--resume"], "--resume: no fedselect_grid sweep under"),
    (["--resume", "missing"], "--resume missing: no sweep 'missing' in"),
    (["--resume", "theirs"], "'theirs' is a sweep of the baselines study, not of fedselect_grid; resume it with "
                             "python -m sweeps.run baselines --resume theirs"),
    (["--name", "theirs", "--resume"], "'theirs' is a sweep of the baselines study"),
    (["--resume", "a", "--name", "b"], "--resume a and --name b name two sweeps"),
])
def test_resume_errors_are_clear(tmp_path, capsys, flags, needle):
    _fake_sweep(tmp_path, "theirs", "baselines")
    assert run_study(STUDY, ["--results", str(tmp_path), *flags]) == 2
    err = capsys.readouterr().err
    assert needle in err and err.count("error:") == 1


def test_a_preset_sweep_resumes_by_name_without_its_preset_flag(tmp_path):
    """`--preset fmnist` sweeps belong to fedselect_grid_fmnist; `--resume NAME` continues them."""
    folder = _fake_sweep(tmp_path, "grid-fmnist", "fedselect_grid_fmnist")
    (folder / "study.toml").write_text((REPO / "studies" / "fedselect_grid_fmnist.toml").read_text())
    plan, _ = plan_sweep(STUDY, build_parser(STUDY).parse_args(["--results", str(tmp_path), "--resume",
                                                                "grid-fmnist"]))
    assert plan.folder == folder and plan.spec.name == "fedselect_grid_fmnist"


def test_a_sweep_of_another_study_names_the_command_that_resumes_it(tmp_path, capsys):
    _fake_sweep(tmp_path, "theirs", "dispfl_fmnist")
    assert run_study(STUDY, ["--results", str(tmp_path), "--resume", "theirs"]) == 2
    assert "resume it with python -m sweeps.run dispfl_fmnist --resume theirs" in capsys.readouterr().err


def test_missing_sweep_error_lists_the_sweeps_of_the_study(tmp_path, capsys):
    _fake_sweep(tmp_path, "mine", "fedselect_grid")
    assert run_study(STUDY, ["--results", str(tmp_path), "--resume", "mien"]) == 2
    assert "(sweeps of fedselect_grid there: mine)" in capsys.readouterr().err


def test_a_restore_hides_tunes_warning_per_unstarted_trial_but_not_errors(monkeypatch, caplog):
    import logging

    from ray import tune

    name = "ray.tune.analysis.experiment_analysis"
    logger = logging.getLogger(name)

    def restore(path, trainable, resume_errored):  # what Tune's restore logs for a sweep stopped early
        logger.warning("Failed to fetch metrics for 57 trial(s)")
        logger.error("a real problem")
        return ("restored", path, trainable, resume_errored)

    monkeypatch.setattr(tune.Tuner, "restore", staticmethod(restore))
    before = logger.level
    with caplog.at_level(logging.WARNING, logger=name):
        assert restore_quietly(Path("/x/tune"), "T") == ("restored", "/x/tune", "T", True)
        logged = [r.getMessage() for r in caplog.records if r.name == name]
    assert logged == ["a real problem"] and logger.level == before


def test_trials_table_lists_every_planned_trial_when_tune_results_have_no_config(tmp_path):
    """The reported crash: a PENDING trial's Result has config None (it never reported)."""
    args = build_parser(STUDY).parse_args(sweep_args(tmp_path, "table", "--pers-rate", "0.1", "0.25",
                                                     "--anchors", "fedavg"))
    plan, _ = plan_sweep(STUDY, args)
    pending = SimpleNamespace(config=None, metrics={}, error=None, path="nowhere")
    trials, rows = trials_table(plan, [(plan.stages[0], [pending, pending])], interrupted=True)
    assert rows == 0 and len(trials) == 3 and (trials.status == "NOT_STARTED").all()
    assert list(trials.config_hash) == [c.config_hash() for c in plan.configs]
    saved = pd.read_parquet(tmp_path / "table" / "trials.parquet")
    assert sorted(saved.algorithm) == ["fedavg", "fedselect", "fedselect"] and (saved.rounds_done == 0).all()
    assert list(saved.stage) == ["grid", "grid", "anchor"] and (saved.objective == "acc_mean").all()


def test_trials_table_writes_a_finished_trials_row_with_the_chance_it_was_judged_by(tmp_path):
    """A trial Tune reports as finished, its round rows on disk: its row carries the trainable's
    metrics (the chance among them) and the divergence verdict judged with that chance. (Passing
    `chance` twice once broke every sweep's end here, after all its trials had run.)"""
    from fl_core.results import write_parquet

    args = build_parser(STUDY).parse_args(sweep_args(tmp_path, "done", "--pers-rate", "0.1", "--anchors", "fedavg"))
    plan, _ = plan_sweep(STUDY, args)
    config = plan.configs[0]
    key, last = config.config_hash(), config.rounds
    rows = pd.DataFrame({"round": range(1, last + 1), "client": 0, "participated": True, "loss": 1.0,
                         "acc": [0.8] * (last - 1) + [0.05], "acc_val": 0.5, "acc_local": 0.8, "acc_global": 0.8,
                         "n_test": 10, "bytes_up": 0, "bytes_down": 0, "personal_fraction": 0.0, "config_hash": key})
    write_parquet(rows, tmp_path / "done" / "rounds" / f"{key}.parquet")
    done = SimpleNamespace(config={"trial": {"run": config.to_dict(), "stage": "grid"}}, error=None, path="p",
                           metrics={"round": last, "chance": 0.1, "time_total_s": 3.0, "kernels": "k"})
    trials, _ = trials_table(plan, [(plan.stages[0], [done])])
    row = trials.set_index("config_hash").loc[key]
    assert row["status"] == "COMPLETED" and row["chance"] == 0.1 and row["kernels"] == "k"
    assert row["diverged"] and row["diverged_why"].startswith("fell to chance: mean accuracy 0.050 after 0.800")


def _signal_self(sig: int) -> None:
    os.kill(os.getpid(), sig)
    time.sleep(0.5)  # the handler runs here (a raising one ends the sleep)


def _mapped(pid: int, library: str) -> bool:
    try:
        return library in Path(f"/proc/{pid}/maps").read_text()
    except OSError:
        return False


@pytest.mark.parametrize("command", [["sweeps/fedselect_grid.py"], ["-m", "sweeps.run", "fedselect_grid"]])
def test_ctrl_c_while_a_sweep_script_imports_torch_is_one_line_and_exit_130(tmp_path, command):
    """Caught in the middle of `import torch` (its library mapped, the import not done: about 1.5 s
    here), a sweep command prints one line and exits 130, writing nothing."""
    argv = [sys.executable, *command, "--dry-run", "--results", str(tmp_path)]
    driver = subprocess.Popen(argv, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 30
    while not _mapped(driver.pid, "libtorch") and time.time() < deadline and driver.poll() is None:
        time.sleep(0.01)
    driver.send_signal(signal.SIGINT)
    out, err = driver.communicate(timeout=30)
    assert driver.returncode == 130, (out, err)
    assert err.strip() == "SIGINT while starting (imports, flags, planning): nothing was run or written"
    assert list(tmp_path.iterdir()) == []


def test_sigterm_at_a_sweep_scripts_first_line_is_one_line_and_exit_143(tmp_path):
    env = os.environ | {"SWEEPS_TEST_PAUSE": "imports", "PYTHONUNBUFFERED": "1"}
    driver = subprocess.Popen([sys.executable, "sweeps/fedselect_grid.py", "--dry-run"], cwd=REPO, env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert "paused before imports" in driver.stdout.readline()
    driver.send_signal(signal.SIGTERM)
    _, err = driver.communicate(timeout=30)
    assert driver.returncode == 143 and err.strip().startswith("SIGTERM while starting") and err.count("\n") <= 2


def test_a_signal_raises_waits_or_stops_tune_depending_on_where_the_driver_is():
    before = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1)}
    env = os.environ.get("TUNE_DISABLE_SIGINT_HANDLER")
    with Interrupts() as guard:  # raise: before Tune, and during the tables
        with pytest.raises(Interrupted) as stop:
            _signal_self(signal.SIGTERM)
        assert stop.value.signum == signal.SIGTERM and exit_code(stop.value.signum) == 143
    with Interrupts() as guard:  # hold: the block ends first, then the signal is raised
        done = []
        with pytest.raises(Interrupted) as stop:
            with guard.hold():
                _signal_self(signal.SIGINT)
                done.append("block")
        assert done == ["block"] and exit_code(stop.value.signum) == 130
    with Interrupts() as guard:  # tune, before Tune has installed its handler: stop at once
        with pytest.raises(Interrupted), guard.tune():
            assert os.environ["TUNE_DISABLE_SIGINT_HANDLER"] == "1"
            _signal_self(signal.SIGINT)
    asked = []
    with Interrupts() as guard:  # tune: the first asks Tune to stop (its SIGUSR1 handler), the second raises
        with guard.tune():
            signal.signal(signal.SIGUSR1, lambda sig, frame: asked.append(sig))  # as Tuner.fit does
            _signal_self(signal.SIGINT)
            assert asked == [signal.SIGINT] and guard.signum == signal.SIGINT
            with pytest.raises(Interrupted):
                _signal_self(signal.SIGINT)
    assert {sig: signal.getsignal(sig) for sig in before} == before
    assert os.environ.get("TUNE_DISABLE_SIGINT_HANDLER") == env


# ---------------------------------------------------------------------------- the driver, signalled
class Driver:
    """`sweeps/fedselect_grid.py` in its own process group, output to a log file."""

    def __init__(self, tmp_path: Path, name: str, argv: list[str], pause: str | None = None,
                 script: str = "sweeps/fedselect_grid.py") -> None:
        self.log = tmp_path / f"{name}.log"
        self.folder = tmp_path / name
        env = os.environ | {"PYTHONUNBUFFERED": "1"}
        if pause:
            env["SWEEPS_TEST_PAUSE"] = pause
        with open(self.log, "w") as out:
            self.proc = subprocess.Popen([sys.executable, script, *argv], cwd=REPO, env=env,
                                         stdout=out, stderr=subprocess.STDOUT, start_new_session=True)

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def wait_for(self, predicate, what: str, timeout: float = 240) -> None:
        deadline = time.time() + timeout
        while time.time() < deadline:
            if predicate():
                return
            if self.proc.poll() is not None:
                raise AssertionError(f"the driver exited ({self.proc.returncode}) before {what}:\n"
                                     f"{self.output()[-3000:]}")
            time.sleep(0.2)
        raise AssertionError(f"timed out waiting for {what}:\n{self.output()[-3000:]}")

    def ctrl_c(self) -> None:  # what a terminal does: SIGINT to the foreground process group
        os.killpg(self.proc.pid, signal.SIGINT)

    def finish(self, timeout: float = 180) -> int:
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"the driver did not stop:\n{self.output()[-3000:]}") from None

    def kill(self) -> None:
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait(timeout=30)


@pytest.fixture
def driver_factory():
    drivers: list[Driver] = []

    def start(*args, **kwargs) -> Driver:
        drivers.append(Driver(*args, **kwargs))
        return drivers[-1]

    yield start
    for driver in drivers:  # always: no driver outlives its test
        driver.kill()


def _without_ray_sigterm_noise(out: str) -> str:
    """The output without the blocks a trial worker prints when Ray's own SIGTERM handler raises
    SystemExit inside a weakref callback ("Exception ignored in ...": a worker being stopped, a
    race inside Ray, not a failure of the sweep). Any other traceback is kept."""
    kept, block = [], []
    for line in out.splitlines():
        if "(run_trial pid=" in line and ("Exception ignored in" in line or block):
            block.append(line)
            if "SystemExit" in line:
                kept += [] if any("sigterm_handler" in b for b in block) else block
                block = []
            continue
        kept += block + [line]
        block = []
    return "\n".join(kept + block)


def _stopped_cleanly(driver: Driver, code: int, tmp_path: Path, sig: str) -> pd.DataFrame:
    out = driver.output()
    assert code == {"SIGINT": 130, "SIGTERM": 143}[sig], out[-3000:]
    driver_side = _without_ray_sigterm_noise(out)
    assert "Traceback" not in driver_side and "Tuner.restore" not in out, out[-3000:]
    assert f"python sweeps/fedselect_grid.py --resume {driver.folder.name} --results {tmp_path}" in out
    assert json.loads((driver.folder / "sweep.json").read_text())["study"] == "fedselect_grid"
    return pd.read_parquet(driver.folder / "trials.parquet")


def _round_files(folder: Path) -> list[Path]:
    return list((folder / "rounds").glob("*.parquet")) if (folder / "rounds").exists() else []


def _complete(folder: Path, trials: int, rounds: int) -> pd.DataFrame:
    """The resumed sweep: every trial completed, every (trial, round, client) row once, compacted."""
    table = pd.read_parquet(folder / "trials.parquet")
    assert len(table) == trials and (table.status == "COMPLETED").all(), table[["config_hash", "status"]]
    rows = read_rounds(folder)
    assert len(rows) == trials * rounds * CLIENTS
    assert not rows.duplicated(["config_hash", "round", "client"]).any()
    assert sorted(p.name for p in (folder / "rounds").iterdir()) == sorted(f"{h}.parquet" for h in table.config_hash)
    return table


@slow
def test_sigint_before_any_trial_started_then_resume_alone(ray_cluster, tmp_path, driver_factory):
    argv = sweep_args(tmp_path, "early", "--pers-rate", "0.25", "--anchors", "fedavg", "--address",
                      ray_cluster.address, rounds=2)
    driver = driver_factory(tmp_path, "early", argv, pause="start")  # Ray is up, data in it, Tune not started
    driver.wait_for(lambda: "test hook: paused before start" in driver.output(), "the driver to reach Tune")
    driver.ctrl_c()
    trials = _stopped_cleanly(driver, driver.finish(), tmp_path, "SIGINT")
    assert len(trials) == 2 and (trials.status == "NOT_STARTED").all() and (trials.rounds_done == 0).all()
    assert "0/2 trials completed (2 NOT_STARTED) stopped by SIGINT" in driver.output()
    assert not _round_files(driver.folder)

    assert run_study(STUDY, ["--resume", "--results", str(tmp_path), "--verbose", "0"]) == 0
    _complete(driver.folder, trials=2, rounds=2)


@slow
def test_sigint_with_trials_pending_then_resume_name(ray_cluster, tmp_path, driver_factory):
    argv = sweep_args(tmp_path, "pending", "--pers-rate", "0.1", "0.25", "0.5", "--anchors", "fedavg",
                      "--max-concurrent", "1", "--address", ray_cluster.address, rounds=6)
    driver = driver_factory(tmp_path, "pending", argv)
    driver.wait_for(lambda: _round_files(driver.folder), "the first round's rows")
    started = {p.name.split(".")[0].split("-r")[0] for p in _round_files(driver.folder)}  # trials with rows
    driver.ctrl_c()
    trials = _stopped_cleanly(driver, driver.finish(), tmp_path, "SIGINT")
    assert len(trials) == 4 and trials.config_hash.is_unique
    assert set(trials.status) <= {"COMPLETED", "INTERRUPTED", "NOT_STARTED"}
    assert (trials.status == "INTERRUPTED").sum() <= 1  # one at a time
    # one at a time: besides the trials that had rows when the Ctrl-C was sent, at most the next one
    # started before Tune stopped (when it came, not how fast this test saw the first rows)
    assert (trials.status == "NOT_STARTED").sum() >= len(trials) - len(started) - 1 >= 1, started
    assert (trials.loc[trials.status == "NOT_STARTED", "rounds_done"] == 0).all()
    rows = read_rounds(driver.folder)  # the rounds that ran are kept, once each
    assert len(rows) == trials.rounds_done.sum() * CLIENTS > 0
    assert not rows.duplicated(["config_hash", "round", "client"]).any()
    assert "stopped by SIGINT" in driver.output()
    _, sweeps, _ = mlflow_runs(tmp_path)
    assert [r.info.status for r in sweeps] == ["KILLED"]  # the sweep's MLflow run says it did not finish

    assert run_study(STUDY, ["--resume", "pending", "--results", str(tmp_path), "--verbose", "0"]) == 0
    table = _complete(driver.folder, trials=4, rounds=6)
    pd.testing.assert_frame_equal(final_rows(read_rounds(driver.folder)), direct_final_rows(table))
    _, sweeps, _ = mlflow_runs(tmp_path)
    assert [r.info.status for r in sweeps] == ["FINISHED"]


@slow
def test_sigterm_during_a_run_then_resume_alone_picks_it_among_other_sweeps(ray_cluster, tmp_path, driver_factory):
    argv = sweep_args(tmp_path, "term", "--pers-rate", "0.1", "0.5", "--anchors", "fedavg",
                      "--max-concurrent", "2", "--address", ray_cluster.address, rounds=6)
    driver = driver_factory(tmp_path, "term", argv)
    driver.wait_for(lambda: len(_round_files(driver.folder)) >= 2, "some rounds")
    driver.proc.send_signal(signal.SIGTERM)  # the driver only, as `kill PID` does
    trials = _stopped_cleanly(driver, driver.finish(), tmp_path, "SIGTERM")
    assert len(trials) == 3 and "stopped by SIGTERM" in driver.output()
    assert (trials.status != "COMPLETED").any(), "the sweep finished before it could be stopped"
    assert len(read_rounds(driver.folder)) == trials.rounds_done.sum() * CLIENTS

    # --resume alone: the latest sweep of this study, although its name is not fedselect_grid-...
    # and a sweep of another study was written after it
    other = tmp_path / "base"
    other.mkdir()
    (other / "sweep.json").write_text(json.dumps({"sweep_format": SWEEP_FORMAT, "study": "baselines"}))
    assert run_study(STUDY, ["--resume", "--results", str(tmp_path), "--verbose", "0"]) == 0
    _complete(driver.folder, trials=3, rounds=6)


@slow
def test_sigint_while_writing_tables_then_resume_writes_them(ray_cluster, tmp_path, driver_factory):
    argv = sweep_args(tmp_path, "tables", "--pers-rate", "0.25", "--anchors", "fedavg", "--address",
                      ray_cluster.address, rounds=2)
    driver = driver_factory(tmp_path, "tables", argv, pause="tables")  # every trial done, tables next
    driver.wait_for(lambda: "test hook: paused before tables" in driver.output(), "the final tables", timeout=300)
    driver.ctrl_c()
    trials = _stopped_cleanly(driver, driver.finish(), tmp_path, "SIGINT")
    assert len(trials) == 2 and (trials.status == "COMPLETED").all()
    assert "SIGINT while writing the tables and figures" in driver.output()
    assert "2/2 trials completed" in driver.output()
    assert not (driver.folder / "tables" / "methods.tex").exists()

    assert run_study(STUDY, ["--resume", "tables", "--results", str(tmp_path), "--verbose", "0"]) == 0
    _complete(driver.folder, trials=2, rounds=2)
    assert (driver.folder / "tables" / "methods.tex").stat().st_size > 0


def _check_rungs(saved: dict, stage_trials: pd.DataFrame, rows: pd.DataFrame) -> None:
    """The ASHA record of a finished select stage (sweeps/asha.py) against its trials' rows: it judged
    exactly the stage's trials, each up to the round it stopped or completed at, and recorded each
    once per milestone it reached, with that round's objective, and nowhere else."""
    assert set(saved["judged"]) == set(stage_trials.trial_id), (saved["judged"], list(stage_trials.trial_id))
    (rungs,) = saved["rungs"]  # one bracket
    for trial in stage_trials.itertuples():
        assert saved["judged"][trial.trial_id] == trial.rounds_done, trial.trial_id
        history = {s["round"]: s["acc_val_mean"] for s in summarize_trial(rows[rows.config_hash == trial.config_hash])}
        for milestone, recorded in rungs:
            if milestone <= trial.rounds_done:
                assert recorded[trial.trial_id] == pytest.approx(history[milestone]), (trial.trial_id, milestone)
            else:
                assert trial.trial_id not in recorded, (trial.trial_id, milestone)
    assert all(set(recorded) <= set(stage_trials.trial_id) for _, recorded in rungs)  # no trial of another run
    assert saved["num_stopped"] == (stage_trials.status == "STOPPED").sum()


@slow
def test_sigint_during_a_selection_stage_then_resume_finishes_every_stage(ray_cluster, tmp_path, driver_factory):
    """A staged sweep (ASHA per data setting) stopped while its first select stage runs, after ASHA
    judged a first round: the anchors stage is complete, the rest is listed; --resume restores that
    stage and runs the others, and the ASHA record of the stage holds every decision, before the
    interrupt and after it (Tune's restore once copied the record of the interrupt back over it)."""
    argv = sweep_args(tmp_path, "staged", *STAGED, "--scheduler", "asha", "--pers-rate", "0.1", "0.25", "0.5",
                      "--pers-limit", "0.5", "--max-concurrent", "1", "--address", ray_cluster.address, rounds=4)
    driver = driver_factory(tmp_path, "staged", argv)
    select = driver.folder / "tune-select-0"
    journal = driver.folder / "rounds"   # a running trial's rounds are journal files <hash>-r<round>.parquet
    # round 2 written: the driver acted on that trial's round 1 (sweeps/trainable.py), so ASHA has judged
    # (the anchors' journal files are gone: compacted when each anchor completed, before this stage began)
    driver.wait_for(lambda: select.exists() and any(journal.glob("*-r0002.parquet")), "the first select stage's rounds")
    driver.ctrl_c()
    trials = _stopped_cleanly(driver, driver.finish(), tmp_path, "SIGINT")
    anchors, chosen = trials[trials.stage == "anchor"], trials[trials.stage == "select"]
    assert len(anchors) == 4 and (anchors.status == "COMPLETED").all()
    first, last = chosen.setting.iloc[0], chosen.setting.iloc[-1]  # plan order: tune-select-0, tune-select-1
    assert len(chosen) == 6 and set(chosen[chosen.setting == last].status) == {"NOT_STARTED"}
    assert (chosen[chosen.setting == first].rounds_done > 0).any()
    assert not chosen.selected.any() and not (driver.folder / "tune-confirm").exists()  # no winner yet
    judged_before = json.loads(rungs_path(select).read_text())["judged"]
    assert judged_before and not (select / "asha_rungs.json").exists()  # the record is out of Tune's files

    assert run_study(STUDY, ["--resume", "--results", str(tmp_path), "--verbose", "0"]) == 0
    trials = check_staged(driver.folder, rounds=4, samples=3)
    # ASHA's rungs survived the interrupt (sweeps/asha.py): every round a trial of the interrupted stage
    # reported, before or after it, is recorded once, at its milestone, with that round's objective,
    # whichever trials Tune had started and ASHA had judged when the Ctrl-C came
    interrupted = trials[(trials.stage == "select") & (trials.setting == first)]
    assert len(interrupted) == 3 and set(judged_before) <= set(interrupted.trial_id)  # restored: same trial ids
    rows = read_rounds(driver.folder)
    _check_rungs(json.loads(rungs_path(select).read_text()), interrupted, rows)
    _check_rungs(json.loads(rungs_path(driver.folder / "tune-select-1").read_text()),
                 trials[(trials.stage == "select") & (trials.setting == last)], rows)


@slow
def test_sigint_once_a_stages_tuner_exists_before_tune_ran_then_resume_starts_it_again(ray_cluster, tmp_path,
                                                                                     driver_factory):
    """Stopped after a stage's Tuner was written (tuner.pkl) but before Tune saved any trial of it:
    Ray 2.60 cannot restore that record (it would start the stage again with empty trial configs),
    so --resume starts the stage as new."""
    argv = sweep_args(tmp_path, "unstarted", "--pers-rate", "0.25", "--anchors", "fedavg", "--address",
                      ray_cluster.address, rounds=2)
    driver = driver_factory(tmp_path, "unstarted", argv, pause="fit tune")
    driver.wait_for(lambda: "test hook: paused before fit tune" in driver.output(), "the stage's Tuner")
    assert (driver.folder / "tune" / "tuner.pkl").exists()
    driver.ctrl_c()
    trials = _stopped_cleanly(driver, driver.finish(), tmp_path, "SIGINT")
    assert len(trials) == 2 and (trials.status == "NOT_STARTED").all()

    assert run_study(STUDY, ["--resume", "unstarted", "--results", str(tmp_path), "--verbose", "0"]) == 0
    table = _complete(driver.folder, trials=2, rounds=2)
    assert table.trial_id.notna().all()


def test_a_tune_record_of_no_trial_is_not_restored(tmp_path):
    """`names_a_trial`: Tune's newest experiment state (the one its restore reads) must name a trial."""
    from sweeps.tune_record import names_a_trial

    record = tmp_path / "tune"
    record.mkdir()
    (record / "tuner.pkl").write_bytes(b"")
    assert not names_a_trial(record)  # stopped before Tune's first snapshot
    (record / "experiment_state-2026-01-01_00-00-00.json").write_text(json.dumps({"trial_data": [["{}", "{}"]]}))
    assert names_a_trial(record)
    (record / "experiment_state-2026-01-01_00-00-09.json").write_text(json.dumps({"trial_data": []}))
    assert not names_a_trial(record)  # the newest names none: stopped before Tune created one


def _asha_decisions(scheduler, results, trials, stopped: set) -> list[tuple[int, int, str]]:
    """Feed `results` (trial index, round, value) one at a time, as Tune does with one trial at a
    time; a trial in `stopped` (updated here) reports nothing more."""
    decisions = []
    for k, rnd, value in results:
        if k in stopped:
            continue
        action = scheduler.on_trial_result(None, trials[k], {"round": rnd, "objective": value})
        decisions.append((k, rnd, action))
        if action == "STOP":
            stopped.add(k)
    return decisions


def test_asha_rungs_survive_a_restore_and_it_stops_what_an_uninterrupted_run_stops(tmp_path):
    """Tune restores a stage's scheduler from the copy pickled when the stage began (tuner.pkl).
    Ray's ASHA then starts with empty rungs; ours reads the rungs it saved after every decision."""
    import pickle
    import random

    from ray.tune.schedulers import ASHAScheduler

    from sweeps.asha import ResumableASHA

    knobs = dict(time_attr="round", max_t=8, grace_period=2, reduction_factor=2, metric="objective", mode="max")
    rng = random.Random(3)
    trials = [SimpleNamespace(trial_id=f"t{k}") for k in range(8)]
    results = [(k, rnd, rng.random() + 0.05 * rnd) for k in range(8) for rnd in range(1, 9)]
    cut = 4 * 8 + 3  # the driver stops while the fifth trial is in round 3
    outcomes = {}
    for name, make in [("ours", lambda: ResumableASHA(tmp_path / "rungs.json", **knobs)),
                       ("ray", lambda: ASHAScheduler(**knobs))]:
        straight = make()
        for trial in trials:
            straight.on_trial_add(None, trial)
        expected = _asha_decisions(straight, results, trials, set())
        (tmp_path / "rungs.json").unlink(missing_ok=True)
        first = make()
        saved = pickle.dumps(first)  # tuner.pkl: the scheduler as the stage created it
        for trial in trials:
            first.on_trial_add(None, trial)
        stopped: set[int] = set()
        before = _asha_decisions(first, results[:cut], trials, stopped)
        restored = pickle.loads(saved)  # Tuner.restore
        for trial in trials:
            restored.on_trial_add(None, trial)
        after = _asha_decisions(restored, results[cut:], trials, stopped)
        outcomes[name] = (expected, before + after)
        if name == "ours":  # a report repeated by a trial resumed from an older state: passed over
            k, rnd, _ = outcomes[name][1][-1]
            rungs = restored.rungs()
            assert restored.on_trial_result(None, trials[k], {"round": rnd, "objective": -1.0}) == "CONTINUE"
            assert restored.rungs() == rungs
    assert outcomes["ours"][0] == outcomes["ours"][1]
    assert outcomes["ray"][0] != outcomes["ray"][1]  # what the saved rungs fix
    assert sum(action == "STOP" for *_, action in outcomes["ours"][0]) >= 3


def test_asha_keeps_its_record_apart_from_tunes_files_and_an_older_sweeps_record_moves_there(tmp_path):
    """A restored Tune copies the top-level .json and .pkl files of a stage's folder to its staging
    folder and back over them at every snapshot: the record lives in a folder of its own.
    A scheduler pickled with the first version's name reads that record and writes the new one."""
    import pickle

    from sweeps.asha import LEGACY_NAME, ResumableASHA

    knobs = dict(time_attr="round", max_t=4, grace_period=1, reduction_factor=2, metric="objective", mode="max")
    stage = tmp_path / "tune-select-0"
    assert rungs_path(stage).parent.parent == stage and not rungs_path(stage).parent.name.endswith((".json", ".pkl"))
    old = ResumableASHA(stage / LEGACY_NAME, **knobs)
    pickled = pickle.dumps(old)  # tuner.pkl of a sweep started before
    first, second = SimpleNamespace(trial_id="t0"), SimpleNamespace(trial_id="t1")
    old.on_trial_add(None, first)
    assert old.on_trial_result(None, first, {"round": 1, "objective": 0.5}) == "CONTINUE"
    restored = pickle.loads(pickled)
    assert restored.rungs_file == str(rungs_path(stage)) and restored.judged == {"t0": 1}
    restored.on_trial_add(None, second)
    assert restored.on_trial_result(None, second, {"round": 1, "objective": 0.1}) == "STOP"
    saved = json.loads(rungs_path(stage).read_text())
    assert saved["judged"] == {"t0": 1, "t1": 1} and saved["rungs"][0][-1] == [1, {"t0": 0.5, "t1": 0.1}]
    again = pickle.loads(pickled)  # a second resume reads the new record, not the old one
    assert again.judged == {"t0": 1, "t1": 1} and again._num_stopped == 1
