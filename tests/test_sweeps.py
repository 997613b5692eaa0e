"""The sweep platform: its Parquet sink (compaction, readers; no Ray), then Ray Tune end to end on
a real local Ray cluster (started once per session; marked slow).

Every sweep here must reproduce, number for number, what fl_core computes alone without Ray."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest

from fl_core.results import round_rows, summarize_trial
from fl_core.simulation import Simulation
from fl_core import result_files
from sweeps import parquet_sink as sink
from sweeps.fedselect_grid import STUDY
from sweeps.parquet_sink import read_rounds, read_sweep
from sweeps.study import run_study

from conftest import REPO, run_one, tiny
from sweep_helpers import STAGED, check_staged, direct_final_rows, final_rows, mlflow_runs, sweep_args

slow = pytest.mark.slow


# ---------------------------------------------------------------------------- Parquet sink (no Ray)
@pytest.fixture(scope="module")
def trial_rounds():
    """The round rows of two tiny real runs (FedSelect, and LotteryFL with its own metric columns)."""
    runs = {}
    for config in (tiny(rounds=3), tiny(algorithm="lotteryfl", rounds=3)):
        sim = Simulation(config)
        runs[config.config_hash()] = [pd.DataFrame(round_rows(r, config, sim.model_name, sweep="s", trial_id="t"))
                                      for r in sim.run()]
    return runs


def _journal(folder, runs, upto=None):
    for key, frames in runs.items():
        for frame in frames[:upto]:
            sink.write_round(folder, key, int(frame["round"].iloc[0]), frame)


def test_compaction_one_file_per_trial_same_rows(tmp_path, trial_rounds):
    _journal(tmp_path, trial_rounds)
    before = read_rounds(tmp_path)
    assert len(before) == 2 * 3 * 4 and len(list((tmp_path / "rounds").iterdir())) == 6
    for key in trial_rounds:
        assert sink.compact_trial(tmp_path, key, 3) == sink.trial_path(tmp_path, key)
    assert sorted(p.name for p in (tmp_path / "rounds").iterdir()) == sorted(f"{k}.parquet" for k in trial_rounds)
    after = read_rounds(tmp_path)
    pd.testing.assert_frame_equal(after, before)
    assert not after.duplicated(["config_hash", "round", "client"]).any()
    # the two methods wrote different columns: the union, null where a method has none
    lottery = after[after["algorithm"] == "lotteryfl"]
    fedselect = after[after["algorithm"] == "fedselect"]
    assert lottery["lottery_sparsity"].notna().all() and fedselect["lottery_sparsity"].isna().all()
    assert fedselect["pers_rate"].eq(0.3).all() and lottery["pers_rate"].isna().all()
    # idempotent: compacting again changes nothing
    for key in trial_rounds:
        sink.compact_trial(tmp_path, key, 3)
    pd.testing.assert_frame_equal(read_rounds(tmp_path), before)


def test_compaction_is_repaired_after_a_crash_at_any_point(tmp_path, trial_rounds):
    key = next(iter(trial_rounds))
    frames = trial_rounds[key]
    _journal(tmp_path, {key: frames})
    expected = read_rounds(tmp_path)
    # crash after the compacted file was renamed into place, before the journal was deleted
    sink.write_parquet(pd.concat(frames, ignore_index=True), sink.trial_path(tmp_path, key))
    # ... and a stale journal file of that hash with wrong numbers: ignored by readers
    sink.write_round(tmp_path, key, 2, frames[1].assign(acc=-1.0))
    # ... and a round write cut short by a SIGKILL: its temp file, never read
    (tmp_path / "rounds" / f".{key}-r0003.parquet.0f3c.tmp").write_bytes(b"partial")
    pd.testing.assert_frame_equal(read_rounds(tmp_path), expected)
    assert sink.compact_trial(tmp_path, key, 3) is not None        # the resume path cleans up both
    assert [p.name for p in (tmp_path / "rounds").iterdir()] == [f"{key}.parquet"]
    pd.testing.assert_frame_equal(read_rounds(tmp_path), expected)
    # a leftover temp file (crash during a write) is never read
    (tmp_path / "rounds" / f".{key}.parquet.abc.tmp").write_bytes(b"partial")
    pd.testing.assert_frame_equal(read_rounds(tmp_path), expected)


def test_incomplete_journal_is_not_compacted(tmp_path, trial_rounds):
    key = next(iter(trial_rounds))
    _journal(tmp_path, {key: trial_rounds[key]}, upto=2)
    assert sink.compact_trial(tmp_path, key, 3) is None
    assert len(sink.journal_files(tmp_path, key)) == 2 and not sink.trial_path(tmp_path, key).exists()
    assert sorted(read_rounds(tmp_path)["round"].unique()) == [1, 2]


def test_read_sweep_joins_status_and_selects_columns(tmp_path, trial_rounds):
    _journal(tmp_path, trial_rounds)
    first = next(iter(trial_rounds))
    sink.compact_trial(tmp_path, first, 3)
    sink.write_parquet(pd.DataFrame({"config_hash": list(trial_rounds), "status": ["COMPLETED", "STOPPED"],
                                     "wall_seconds": [1.0, 2.0]}), tmp_path / "trials.parquet")
    tidy = read_sweep(tmp_path, columns=["acc"])
    assert list(tidy.columns) == ["config_hash", "round", "client", "acc", "status", "wall_seconds"]
    assert len(tidy) == 24 and set(tidy.loc[tidy.config_hash == first, "status"]) == {"COMPLETED"}
    assert sink.read_trial(tmp_path, first)["round"].tolist() == [1] * 4 + [2] * 4 + [3] * 4
    # files given out of order: the reader sorts (it only skips sorting rows that already are)
    files = [f for fs in sink.round_sources(tmp_path).values() for f in fs]
    shuffled = sink.read_files(files[::-1], sort=sink.SORT_KEYS)
    pd.testing.assert_frame_equal(shuffled, read_rounds(tmp_path), check_like=True)  # column order may differ
    assert not result_files.is_sorted(pa.Table.from_pandas(shuffled[::-1]), sink.SORT_KEYS)
    # the per-round summaries of a trial (fl_core's one definition) from its rows
    history = summarize_trial(sink.read_trial(tmp_path, first))
    acc = np.array([f["acc"].to_numpy() for f in trial_rounds[first]])
    np.testing.assert_allclose([h["acc_mean"] for h in history], acc.mean(axis=1))
    np.testing.assert_allclose([h["acc_std"] for h in history], acc.std(axis=1, ddof=0))


# ---------------------------------------------------------------------------- Ray Tune end to end


def run(argv) -> int:
    return run_study(STUDY, argv)


@slow
@pytest.mark.parametrize("val_fraction", [0.0, 0.25])
def test_tunes_metric_is_validation_accuracy_when_a_validation_split_exists(tmp_path, outside_tune, val_fraction):
    """What Tune, Optuna and ASHA maximise (`objective`): the mean validation accuracy when the
    trial has a validation split, test accuracy (reported as acc_mean either way) only without."""
    run_one(tmp_path / "s", {"val_fraction": val_fraction})
    for report in outside_tune:
        summary = report["summary"]
        assert report["acc_mean"] == summary["acc_mean"]
        assert report["objective"] == (summary["acc_val_mean"] if val_fraction else summary["acc_mean"])
    if val_fraction:  # the two differ somewhere, so the test tells them apart
        assert any(r["objective"] != r["acc_mean"] for r in outside_tune)


def test_sweep_end_to_end_parquet_mlflow_and_exact_metrics(ray_cluster, tmp_path):
    assert run(sweep_args(tmp_path, "e2e", "--pers-rate", "0.25", "0.5", "--anchors", "fedavg", "local",
                          "--seeds", "0", "--eval-every", "2", rounds=3)) == 0
    folder = tmp_path / "e2e"
    trials = pd.read_parquet(folder / "trials.parquet")
    assert len(trials) == 4 and (trials.status == "COMPLETED").all()
    assert sorted(trials.algorithm) == ["fedavg", "fedselect", "fedselect", "local"]
    assert sorted(trials.method) == ["FedAvg", "FedSelect", "FedSelect", "Local"]
    assert set(trials.setting) == {"synthetic, 3 shards"} and (trials.rounds_done == 3).all()
    assert trials.version.notna().all() and trials.config_hash.is_unique and (trials.seed == 0).all()
    assert trials.loc[trials.algorithm != "fedselect", "pers_rate"].isna().all()   # anchors: no p
    # one compacted file per trial, no journal files left
    assert sorted(p.name for p in (folder / "rounds").iterdir()) == sorted(f"{h}.parquet" for h in trials.config_hash)
    rounds = read_rounds(folder)
    assert len(rounds) == 4 * 3 * 3  # trials x rounds x clients
    assert not rounds.duplicated(["config_hash", "round", "client"]).any()
    assert {"sweep", "trial_id", "config_hash", "seed", "version", "method", "setting"} <= set(rounds.columns)
    assert rounds.loc[rounds["round"] == 1, "acc"].isna().all() and rounds.loc[rounds["round"] > 1, "acc"].notna().all()
    tidy = read_sweep(folder)
    assert len(tidy) == len(rounds) and (tidy.status == "COMPLETED").all()
    pd.testing.assert_frame_equal(final_rows(rounds), direct_final_rows(trials))
    for _, trial in trials.iterrows():  # trials.parquet holds fl_core's summary of the final round
        final = summarize_trial(rounds[rounds.config_hash == trial.config_hash])[-1]
        assert trial.acc_mean == pytest.approx(final["acc_mean"]) and trial.mb_total == pytest.approx(final["mb_total"])
    assert (trials.threads == 1).all() and (trials.device == "cpu").all()
    assert (folder / "tables" / "methods.tex").stat().st_size > 0  # the sweep ends with its table
    assert (folder / "figures" / "accuracy_vs_round.png").stat().st_size > 0  # ... and its figures
    masks = pd.read_parquet(next((folder / "masks").glob("*.parquet")))
    assert set(masks.client) == {0, 1, 2} and (masks.tensor.str.endswith("weight")).all()
    # one schema: the folder read by pandas alone (the first file's schema) has every column and row
    whole = pd.read_parquet(folder / "rounds")
    assert set(whole.columns) == set(rounds.columns) and len(whole) == len(rounds)
    assert whole.loc[whole.algorithm == "fedavg", "pers_rate"].isna().all()
    assert len(list((folder / "masks").glob("*.parquet"))) == 2  # the two FedSelect trials only
    assert trials.data_from_driver.all()  # loaded once on the driver, not re-read by the trials

    client, parents, children = mlflow_runs(tmp_path)
    assert len(parents) == 1 and parents[0].info.status == "FINISHED"
    assert len(children) == 4
    experiment = client.get_experiment(parents[0].info.experiment_id)
    assert experiment.tags["mlflow.experimentKind"] == "custom_model_development"  # opens on the runs table
    by_hash = trials.set_index("config_hash")
    for child in children:
        trial = by_hash.loc[child.data.tags["config_hash"]]
        assert child.data.tags["parent_run"] == parents[0].info.run_id and child.data.tags["sweep"] == "e2e"
        assert "mlflow.parentRunId" not in child.data.tags  # top-level: visible in the runs table and charts
        knobs = f" p={trial.pers_rate:g} α=0.8" if trial.algorithm == "fedselect" else ""
        assert child.info.run_name == f"{trial.method}{knobs} synthetic 3 shards E1 s0"
        params = child.data.params
        assert params["rounds"] == "3" and ("pers_rate" in params) == (trial.algorithm == "fedselect")
        assert not {"device", "threads", "data_root", "download", "ft_epochs"} & set(params)
        # round 1 was not evaluated (eval_every 2): no NaN accuracy logged, traffic every round
        assert sorted(m.step for m in client.get_metric_history(child.info.run_id, "acc_mean")) == [2, 3]
        assert sorted(m.step for m in client.get_metric_history(child.info.run_id, "mb_total")) == [1, 2, 3]
        assert client.get_metric_history(child.info.run_id, "acc_mean")[-1].value == pytest.approx(trial.acc_mean)
        artifacts = {a.path for a in client.list_artifacts(child.info.run_id)}
        assert {"final_client_accuracy.csv", "label_histograms.json"} <= artifacts
        if params["algorithm"] == "fedselect":
            assert "fedselect_masks.npz" in artifacts


@slow
def test_crashed_trial_is_retried_from_its_checkpoint_with_identical_results(ray_cluster, tmp_path):
    assert run(sweep_args(tmp_path, "crash", "--pers-rate", "0.25", "--anchors", "--inject-crash-at-round", "2",
                          "--max-failures", "1", rounds=4)) == 0
    folder = tmp_path / "crash"
    assert len(list((folder / "injected-crashes").iterdir())) == 1  # it did crash once
    trials = pd.read_parquet(folder / "trials.parquet")
    assert trials.status.tolist() == ["COMPLETED"] and trials.resumed_from_round.tolist() == [2]
    rounds = read_rounds(folder)
    assert len(rounds) == 4 * 3 and not rounds.duplicated(["config_hash", "round", "client"]).any()
    pd.testing.assert_frame_equal(final_rows(rounds), direct_final_rows(trials))
    client, _, children = mlflow_runs(tmp_path)
    assert len(children) == 1  # the retry continued its own run
    assert [m.step for m in client.get_metric_history(children[0].info.run_id, "acc_mean")] == [1, 2, 3, 4]
    assert [p.name for p in (folder / "rounds").iterdir()] == [f"{trials.config_hash[0]}.parquet"]


def _wait_for(predicate, timeout: float, what: str):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if predicate():
            return
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


@slow
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGKILL])
def test_interrupted_sweep_resumes_without_missing_or_duplicated_rows(ray_cluster, tmp_path, sig):
    name = f"interrupt-{sig.name}"
    argv = sweep_args(tmp_path, name, "--pers-rate", "0.1", "0.25", "0.5", "--anchors", "fedavg",
                      "--max-concurrent", "1", "--address", ray_cluster.address, rounds=8)
    env = os.environ | {"PYTHONUNBUFFERED": "1"}
    driver = subprocess.Popen([sys.executable, "sweeps/fedselect_grid.py", *argv], cwd=REPO, env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    folder = tmp_path / name

    def rounds_written() -> int:  # journal files are one round each, a compacted file all 8
        return sum(8 if len(files) == 1 and "-r" not in files[0].name else len(files)
                   for files in sink.round_sources(folder).values())

    _wait_for(lambda: rounds_written() >= 12, 120, "some rounds")
    driver.send_signal(sig)
    driver.wait(timeout=120)
    assert rounds_written() < 4 * 8, "the sweep finished before it could be interrupted"

    assert run(["--resume", "--name", name, "--results", str(tmp_path), "--verbose", "0"]) == 0
    trials = pd.read_parquet(folder / "trials.parquet")
    assert len(trials) == 4 and (trials.status == "COMPLETED").all()
    rounds = read_rounds(folder)
    assert len(rounds) == 4 * 8 * 3
    assert not rounds.duplicated(["config_hash", "round", "client"]).any()
    left = sorted(p.name for p in (folder / "rounds").iterdir() if "-r" in p.name)
    assert not left, f"every trial compacted, its journal and temp files gone: {left}"
    pd.testing.assert_frame_equal(final_rows(rounds), direct_final_rows(trials))
    client, parents, children = mlflow_runs(tmp_path)
    assert len(parents) == 1 and len(children) == 4  # resumed trials kept their runs
    for child in children:
        steps = [m.step for m in client.get_metric_history(child.info.run_id, "acc_mean")]
        assert sorted(steps) == list(range(1, 9)), steps


@slow
def test_four_quarter_gpu_trials_run_at_once_on_one_logical_gpu(ray_cluster, tmp_path):
    assert ray_cluster.cluster_resources().get("GPU") == 1
    assert run(sweep_args(tmp_path, "pack", "--pers-rate", "0.1", "0.25", "0.5", "0.75", "--anchors",
                          "--gpus-per-trial", "0.25", "--cpus-per-trial", "1", rounds=8)) == 0
    trials = pd.read_parquet(tmp_path / "pack" / "trials.parquet")
    assert len(trials) == 4 and (trials.gpus_assigned == 1).all()
    # All four were running at the same moment: the last to start started before the first ended.
    assert trials.started_at.max() < trials.reported_at.min()


@slow
@pytest.mark.parametrize("flags,needle", [
    (["--gpus-per-trial", "2"], "--gpus-per-trial 2 but the Ray cluster has 1 GPUs"),
    (["--gpus-per-trial", "1.5"], "whole GPUs"),
    (["--cpus-per-trial", "64"], "--cpus-per-trial 64 but the Ray cluster has 4 CPUs"),
])
def test_impossible_resource_requests_fail_fast(ray_cluster, tmp_path, capsys, flags, needle):
    start = time.time()
    assert run(sweep_args(tmp_path, "impossible", *flags)) == 2
    assert time.time() - start < 30
    assert needle in capsys.readouterr().err
    assert not (tmp_path / "impossible" / "sweep.json").exists()


@slow
def test_optuna_with_asha_searches_each_data_setting_on_validation_and_confirms_the_best(ray_cluster, tmp_path):
    argv = sweep_args(tmp_path, "optuna", *STAGED, "--search", "optuna", "--num-samples", "3", "--scheduler", "asha",
                      "--pers-rate", "0.1:0.5", "--pers-limit", "0.5", "0.9", rounds=4)
    assert run(argv) == 0
    trials = check_staged(tmp_path / "optuna", rounds=4, samples=3)
    select = trials[trials.stage == "select"]
    assert select.pers_rate.between(0.1, 0.5).all() and set(select.pers_limit) <= {0.5, 0.9}
    assert select.pers_rate.nunique() == 6  # sampled, independently per data setting: not a grid
    spec = (tmp_path / "optuna" / "study.toml").read_text()
    assert 'kind = "optuna"' in spec and "pers_rate = {low = 0.1, high = 0.5, log = false}" in spec


def _asha_replay(stage: pd.DataFrame, rows: pd.DataFrame, rounds: int) -> dict[str, tuple[str, int]]:
    """What Ray's ASHA, with the sweep's knobs (sweeps/launch.py), decides for the trials of a select
    stage run one at a time, fed their objectives from their rows in the order they started:
    config hash -> (status, rounds done). ("MISSING", r): the rows stop at round r before a decision."""
    from types import SimpleNamespace

    from ray.tune.schedulers import ASHAScheduler

    asha = ASHAScheduler(time_attr="round", metric="objective", mode="max", max_t=rounds,
                         grace_period=max(1, rounds // 4), reduction_factor=2)
    outcome = {}
    for trial in stage.sort_values("started_at").itertuples():
        ref = SimpleNamespace(trial_id=trial.config_hash)
        asha.on_trial_add(None, ref)
        history = {s["round"]: s["acc_val_mean"] for s in summarize_trial(rows[rows.config_hash == trial.config_hash])}
        for rnd in range(1, rounds + 1):
            if rnd not in history:
                outcome[trial.config_hash] = ("MISSING", rnd - 1)
                break
            action = asha.on_trial_result(None, ref, {"round": rnd, "objective": history[rnd]})
            if rnd == rounds:
                outcome[trial.config_hash] = ("COMPLETED", rnd)
            elif action == "STOP":
                outcome[trial.config_hash] = ("STOPPED", rnd)
                break
    return outcome


@slow
def test_asha_grid_schedules_each_data_setting_apart_and_anchors_run_to_the_end(ray_cluster, tmp_path):
    # one trial at a time: ASHA must stop the trials that fall below its cutoff at a rung, and they must be
    # STOPPED there, not COMPLETED (Tune marks them `done`). Which ones it stops depends on the order the
    # trials start in, which Tune does not promise: the decisions are checked against Ray's ASHA fed the
    # trials' objectives in the order they did start (`started_at`), and the hopeless lr = 1e-4 trials,
    # below every lr = 0.3 trial at round 1 on the synthetic data of seed 0 (searched here; 1 and 2 confirm),
    # against ASHA's cutoff there
    argv = sweep_args(tmp_path, "asha", *STAGED, "--scheduler", "asha", "--pers-rate", "0.1", "0.5", "--lr", "0.3",
                      "0.0001", "--pers-limit", "0.5", "--max-concurrent", "1", "--search-seed", "0", "--seeds", "1",
                      "2", rounds=4)
    assert run(argv) == 0
    trials = check_staged(tmp_path / "asha", rounds=4, samples=4, anchors=2 * 2 * 2, search_seed=0, seeds=(1, 2))
    select = trials[trials.stage == "select"]
    assert sorted(select.pers_rate) == [0.1] * 4 + [0.5] * 4
    rows = read_rounds(tmp_path / "asha")
    for _, stage in select.groupby("setting"):
        ran = stage.sort_values("started_at")
        assert (ran.started_at.iloc[1:].to_numpy() >= ran.reported_at.iloc[:-1].to_numpy()).all()  # one at a time
        recorded = {t.config_hash: (t.status, t.rounds_done) for t in stage.itertuples()}
        assert _asha_replay(stage, rows, rounds=4) == recorded
        first = {t.config_hash: summarize_trial(rows[rows.config_hash == t.config_hash])[0]["acc_val_mean"]
                 for t in stage.itertuples()}
        good, bad = (ran[ran.lr == lr].config_hash for lr in (0.3, 0.0001))
        assert max(first[h] for h in bad) < min(first[h] for h in good)  # hopeless from round 1
        # ASHA's cutoff at round 1 (the median of the results recorded there, rf = 2) is above a lr = 1e-4
        # trial when at least as many lr = 0.3 as lr = 1e-4 trials (itself included) have reached it
        for k, trial in enumerate(ran.itertuples()):
            before = ran.iloc[: k + 1]
            if trial.lr == 0.0001 and (before.lr == 0.3).sum() >= (before.lr == 0.0001).sum():
                assert (trial.status, trial.rounds_done) == ("STOPPED", 1), trial.config_hash
    assert (trials[trials.stage == "confirm"].lr == 0.3).all()
    _, _, runs = mlflow_runs(tmp_path)
    stopped = {r.data.tags["config_hash"] for r in runs if r.data.tags.get("stopped_early") == "true"}
    assert stopped == set(select[select.status == "STOPPED"].config_hash)
    assert {r.info.status for r in runs if r.data.tags["config_hash"] in stopped} == {"KILLED"}


@slow
def test_unreachable_tracking_server_warns_and_parquet_stays_complete(ray_cluster, tmp_path, capfd):
    assert run(sweep_args(tmp_path, "nomlflow", "--pers-rate", "0.25", "--anchors",
                          "--tracking-uri", "http://127.0.0.1:9")) == 0
    assert "WARNING: MLflow at http://127.0.0.1:9 failed" in capfd.readouterr().err
    assert len(read_rounds(tmp_path / "nomlflow")) == 2 * 3


@slow
def test_baselines_and_ablation_studies_run_on_the_shared_machinery(ray_cluster, tmp_path):
    from sweeps import ablation
    from sweeps.run import study_named
    from sweeps.spec import load_spec
    baselines = study_named("baselines")
    # the methods the study file lists (the FedSelect paper's Table 1), not every registered method
    listed = [m.algorithm for m in load_spec(baselines.spec).methods]
    tiny = ["--dataset", "synthetic", "--num-clients", "3", "--shards-per-client", "3", "--batch-size", "16",
            "--partition", "shards", "--rounds", "2", "--results", str(tmp_path), "--seeds", "0", "--verbose", "0"]
    assert run_study(baselines, tiny + ["--name", "base", "--ft-epochs", "2"]) == 0
    assert run_study(ablation.STUDY, tiny + ["--name", "abl", "--blocks", "B"]) == 0
    base = pd.read_parquet(tmp_path / "base" / "trials.parquet")
    assert sorted(base.algorithm) == sorted(listed) and (base.status == "COMPLETED").all()
    abl = pd.read_parquet(tmp_path / "abl" / "trials.parquet")
    assert sorted(abl.fedselect_variant) == ["gradselect", "layer", "personalize_least", "random"]
    assert sorted(abl.method) == ["FedSelect", "FedSelect (layer B)", "FedSelect (personalize least)",
                                  "FedSelect (random)"]
    assert base.set_index("algorithm").ft_epochs.dropna().to_dict() == {"fedavg_ft": 2, "fedbabu": 2}
    rounds = read_rounds(tmp_path / "base")
    assert len(rounds) == len(listed) * 2 * 3
    # LotteryFL's own per-client metrics reached Parquet (and nobody else's rows carry them)
    lottery = rounds.algorithm == "lotteryfl"
    assert (rounds.loc[lottery, "lottery_sparsity"].notna().all()
            and rounds.loc[~lottery, "lottery_sparsity"].isna().all())
    for experiment, n in (("baselines", len(listed)), ("ablation", 4)):
        _, parents, children = mlflow_runs(tmp_path, experiment)
        assert len(parents) == 1 and len(children) == n
