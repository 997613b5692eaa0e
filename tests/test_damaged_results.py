"""Damaged result files are loud, never silent (issue 25): analysis stops with one line naming the
file, `--resume` sets damaged files aside and runs their trials again, a trial whose state cannot
be restored starts over. The sweep-level test runs on the session's Ray cluster."""
from __future__ import annotations

import errno
import logging
import os

import pandas as pd
import pytest
import torch

import sweeps.trainable as trainable
from conftest import run_one
from analysis import tables
from benchmarks.compare_sweeps import differences
from conftest import tiny
from sweep_helpers import mlflow_runs, sweep_args
from sweeps import damage, parquet_sink
from sweeps.fedselect_grid import STUDY
from sweeps.parquet_sink import DamagedFile, read_files, read_rounds, read_trial
from sweeps.study import run_study
from table_helpers import write_sweep


def truncate(path, keep: float = 0.5) -> None:
    data = path.read_bytes()
    path.write_bytes(data[:int(len(data) * keep)])


def finished_sweep(folder):
    write_sweep(folder)
    keys = sorted(parquet_sink.round_sources(folder))
    for key in keys:
        parquet_sink.compact_trial(folder, key, 5)
    return keys


def test_analysis_names_a_damaged_rounds_file_in_one_line_and_exits_2(tmp_path, capsys):
    folder = tmp_path / "s"
    keys = finished_sweep(folder)
    truncate(parquet_sink.trial_path(folder, keys[0]))
    assert tables.main([str(folder)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert f"damaged results file {parquet_sink.trial_path(folder, keys[0])}" in err
    assert "Parquet magic bytes not found" in err and "--resume" in err
    with pytest.raises(DamagedFile) as caught:
        read_rounds(folder)
    assert [p for p, _ in caught.value.files] == [parquet_sink.trial_path(folder, keys[0])]


def test_a_damaged_trials_file_says_delete_it_and_analysis_then_rebuilds_it(tmp_path, capsys):
    folder = tmp_path / "s"
    finished_sweep(folder)
    (folder / "trials.parquet").write_bytes(b"PAR1 not parquet")
    assert tables.main([str(folder)]) == 2
    err = capsys.readouterr().err
    assert "trials.parquet" in err and "delete it" in err and err.count("\n") == 1
    (folder / "trials.parquet").unlink()
    assert tables.main([str(folder)]) == 0  # trials rebuilt from the rows


def test_a_schema_clash_between_readable_files_is_not_called_damage(tmp_path):
    pd.DataFrame({"x": [1, 2]}).to_parquet(tmp_path / "a.parquet")
    pd.DataFrame({"x": [[1.0], [2.0]]}).to_parquet(tmp_path / "b.parquet")
    with pytest.raises(ValueError, match="do not share one schema") as caught:
        read_files([tmp_path / "a.parquet", tmp_path / "b.parquet"])
    assert not isinstance(caught.value, DamagedFile)


def test_set_aside_moves_every_file_of_a_damaged_trial_and_nothing_else(tmp_path):
    folder = tmp_path / "s"
    good, bad = finished_sweep(folder)[:2]
    for key in (good, bad):
        (folder / "state").mkdir(exist_ok=True)
        torch.save({"w": torch.ones(3)}, folder / "state" / f"{key}.pt")
        parquet_sink.write_clients(folder, key, [{"client": 0, "label": 1, "count": 3}])
    truncate(folder / "state" / f"{bad}.pt", 0.7)
    lines = []
    found = damage.set_aside(folder, say=lines.append)
    assert [(d.path.name, d.config_hash) for d in found] == [(f"{bad}.pt", bad)]
    assert len(lines) == 1 and f"state/{bad}.pt" in lines[0] and f"trial {bad} runs again" in lines[0]
    assert damage.trial_files(folder, bad) == []  # rows, clients and state all moved
    moved = sorted(str(p.relative_to(folder)).split("/", 2)[2] for p in (folder / "damaged").rglob("*.p*"))
    assert moved == [f"clients/{bad}.parquet", f"rounds/{bad}.parquet", f"state/{bad}.pt"]
    assert len(damage.trial_files(folder, good)) == 3 and damage.scan(folder) == []


def test_behind_counts_journal_rounds_without_gaps(tmp_path):
    folder = tmp_path / "s"
    rows = pd.DataFrame({"config_hash": ["a"], "round": [1], "client": [0]})
    for key, rounds in {"a": [1, 2, 3], "b": [1, 3], "c": []}.items():
        for rnd in rounds:
            parquet_sink.write_round(folder, key, rnd, rows.assign(config_hash=key, round=rnd))
    parquet_sink.write_round(folder, "d", 1, rows.assign(config_hash="d"))
    parquet_sink.compact_trial(folder, "d", 1)
    assert damage.rounds_on_disk(folder) == {"a": 3, "b": 1, "d": -1}
    assert damage.behind(folder, [("a", 3, 5), ("b", 3, 3), ("c", 2, 3), ("d", 1, 1)]) == {"b": 3, "c": 2}


def test_a_trial_whose_state_cannot_be_restored_starts_over_with_the_same_rows(tmp_path, outside_tune, caplog):
    folder = tmp_path / "s"
    key = run_one(folder)
    rows = read_trial(folder, key)
    torch.save({"not": "a simulation state"}, trainable.state_path(folder, key))  # opens, cannot be restored
    outside_tune.clear()
    with caplog.at_level(logging.WARNING):
        run_one(folder)
    assert [r["round"] for r in outside_tune] == [1, 2, 3]  # ran again from round 1
    assert "cannot be restored" in caplog.text and key in caplog.text
    rows_again = read_trial(folder, key)
    count, _, problems = differences(rows, rows_again)
    assert count == len(rows) == 3 * 4 and problems == []
    assert len(list((folder / "damaged").rglob(f"{key}.pt"))) == 1


def test_a_finished_trial_keeps_a_record_not_its_clients_models_and_a_resume_reports_it_again(tmp_path, outside_tune):
    """The state of a finished trial is pruned to its last report once its rows and masks are
    written: a second run reports that round again without training, and a record whose rows went
    missing runs the trial again from round 1, to the same rows."""
    folder = tmp_path / "s"
    key = run_one(folder)
    saved, rows = trainable.state_path(folder, key), read_trial(folder, key)
    record = torch.load(saved, weights_only=True)
    assert record["finished"] and record["masks"] and "clients" not in record and saved.stat().st_size < 4096
    last, stamp = outside_tune[-1], parquet_sink.trial_path(folder, key).stat().st_mtime_ns
    outside_tune.clear()
    run_one(folder)
    assert [(r["round"], r["acc_mean"], r["reported_at"]) for r in outside_tune] == [
        (last["round"], last["acc_mean"], last["reported_at"])]               # the same report, made again
    assert parquet_sink.trial_path(folder, key).stat().st_mtime_ns == stamp
    parquet_sink.trial_path(folder, key).unlink()
    outside_tune.clear()
    run_one(folder)
    assert [r["round"] for r in outside_tune] == [1, 2, 3]
    count, _, problems = differences(rows, read_trial(folder, key))
    assert count == len(rows) and problems == []


def test_a_repair_run_stops_after_the_round_it_is_given(tmp_path, outside_tune):
    folder = tmp_path / "s"
    key = run_one(folder, stop_after=2)
    assert [r["round"] for r in outside_tune] == [1, 2] and not outside_tune[-1]["done"]
    assert sorted(parquet_sink.journal_files(folder, key)) == [1, 2]
    assert not parquet_sink.trial_path(folder, key).exists()
    assert torch.load(trainable.state_path(folder, key), weights_only=True)["completed"] == 2


def run(argv):
    return run_study(STUDY, argv)


def test_resume_sets_damaged_files_aside_and_runs_their_trials_again(ray_cluster, tmp_path, capsys):
    assert run(sweep_args(tmp_path, "dmg", "--pers-rate", "0.1", "0.25", "0.5", "--anchors", rounds=3)) == 0
    folder = tmp_path / "dmg"
    before = read_rounds(folder)
    trials = pd.read_parquet(folder / "trials.parquet")
    cut, lost, gone = sorted(trials.config_hash)
    truncate(parquet_sink.trial_path(folder, cut))                    # rows damaged
    truncate(trainable.state_path(folder, lost), 0.8)                # state damaged, rows fine
    parquet_sink.trial_path(folder, gone).unlink()                   # rows deleted by hand
    (folder / "trials.parquet").write_bytes(b"garbage")
    capsys.readouterr()

    assert run(["--resume", "--name", "dmg", "--results", str(tmp_path), "--verbose", "0"]) == 0
    out = capsys.readouterr().out
    assert f"damaged: rounds/{cut}.parquet" in out and f"damaged: state/{lost}.pt" in out
    assert "damaged: trials.parquet" in out and "trial(s) ended but their rows are not all on disk" in out
    count, columns, problems = differences(before, read_rounds(folder))
    assert count == len(before) == 3 * 3 * 3 and problems == [] and "acc" in columns
    trials = pd.read_parquet(folder / "trials.parquet")
    assert len(trials) == 3 and (trials.status == "COMPLETED").all() and (trials.rounds_done == 3).all()
    assert sorted(p.name for p in (folder / "rounds").iterdir()) == sorted(f"{h}.parquet" for h in trials.config_hash)
    client, parents, children = mlflow_runs(tmp_path)
    assert len(parents) == 1 and len(children) == 3
    for child in children:
        assert child.info.status == "FINISHED"
        assert sorted(m.step for m in client.get_metric_history(child.info.run_id, "acc_mean")) == [1, 2, 3]

    # Tune's own record damaged: set aside, the stage starts again, its finished trials only report
    newest = sorted((folder / "tune").glob("experiment_state-*.json"))[-1]
    truncate(newest, 0.3)
    assert run(["--resume", "--name", "dmg", "--results", str(tmp_path), "--verbose", "0"]) == 0
    assert "damaged: Tune's record of tune cannot be restored (JSONDecodeError" in capsys.readouterr().out
    assert len(list((folder / "damaged").glob("*/tune"))) == 1
    count, _, problems = differences(before, read_rounds(folder))
    assert count == len(before) and problems == []
    assert (pd.read_parquet(folder / "trials.parquet").status == "COMPLETED").all()
    client, parents, children = mlflow_runs(tmp_path)
    assert len(children) == 3 and all(c.info.status == "FINISHED" for c in children)


def no_space(path):
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))


def test_a_trial_that_meets_a_full_disk_keeps_its_rounds_and_resumes_to_the_same_rows(tmp_path, outside_tune,
                                                                                      monkeypatch):
    straight = read_trial(tmp_path / "straight", run_one(tmp_path / "straight"))
    folder = tmp_path / "s"
    real = parquet_sink.write_round
    monkeypatch.setattr(parquet_sink, "write_round",
                        lambda f, key, rnd, rows: no_space(parquet_sink.round_path(f, key, rnd)) if rnd == 2
                        else real(f, key, rnd, rows))
    with pytest.raises(OSError, match="No space left"):
        run_one(folder)
    key = tiny().config_hash()
    assert sorted(parquet_sink.journal_files(folder, key)) == [1]  # round 1 kept, nothing half-written
    assert torch.load(trainable.state_path(folder, key), weights_only=True)["completed"] == 1
    monkeypatch.setattr(parquet_sink, "write_round", real)  # the space is back
    outside_tune.clear()
    run_one(folder)
    assert [r["round"] for r in outside_tune] == [2, 3]
    count, _, problems = differences(straight, read_trial(folder, key))
    assert count == 3 * 4 and problems == []


def test_a_sweep_refuses_a_results_path_that_is_a_file_before_anything_runs(tmp_path, capsys):
    (tmp_path / "taken").write_text("not a folder")
    assert run(sweep_args(tmp_path / "taken" / "deeper", "x")) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"{tmp_path / 'taken'} is a file, not a folder" in err


def test_a_full_disk_at_the_sweeps_end_is_one_error_and_resume_writes_what_was_missing(ray_cluster, tmp_path,
                                                                                       capsys, monkeypatch):
    import sweeps.trials
    real = sweeps.trials.write_parquet
    monkeypatch.setattr(sweeps.trials, "write_parquet", lambda frame, path: no_space(path))
    assert run(sweep_args(tmp_path, "full", "--pers-rate", "0.1", "--anchors", rounds=2)) == 2
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and "trials.parquet: No space left on device" in lines[0] and "--resume full" in lines[0]
    folder = tmp_path / "full"
    rows = read_rounds(folder)
    assert len(rows) == 2 * 3 and not (folder / "trials.parquet").exists()
    monkeypatch.setattr(sweeps.trials, "write_parquet", real)
    assert run(["--resume", "--name", "full", "--results", str(tmp_path), "--verbose", "0"]) == 0
    trials = pd.read_parquet(folder / "trials.parquet")
    assert trials.status.tolist() == ["COMPLETED"]
    count, _, problems = differences(rows, read_rounds(folder))
    assert count == 6 and problems == []
