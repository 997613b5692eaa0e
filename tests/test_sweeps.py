"""The Ray Tune platform end to end, on a real local Ray cluster (started once per session).

Every sweep here must reproduce, number for number, what fl_core computes alone without Ray."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pandas as pd
import pytest

from sweeps.fedselect_grid import STUDY
from sweeps.parquet_sink import read_rounds, read_sweep
from sweeps.study import run_study

from conftest import REPO
from sweep_helpers import direct_final_rows, final_rows, mlflow_runs, sweep_args

pytestmark = pytest.mark.slow


def run(argv) -> int:
    return run_study(STUDY, argv)


def test_sweep_end_to_end_parquet_mlflow_and_exact_metrics(ray_cluster, tmp_path):
    assert run(sweep_args(tmp_path, "e2e", "--pers-rate", "0.25", "0.5", "--anchors", "fedavg", "local",
                          "--seeds", "0", rounds=3)) == 0
    folder = tmp_path / "e2e"
    trials = pd.read_parquet(folder / "trials.parquet")
    assert len(trials) == 4 and (trials.status == "COMPLETED").all()
    assert sorted(trials.algorithm) == ["fedavg", "fedselect", "fedselect", "local"]
    rounds = read_rounds(folder)
    assert len(rounds) == 4 * 3 * 3  # trials x rounds x clients
    assert not rounds.duplicated(["config_hash", "round", "client"]).any()
    assert {"sweep", "trial_id", "config_hash", "seed", "version"} <= set(rounds.columns)
    tidy = read_sweep(folder)
    assert len(tidy) == len(rounds) and (tidy.status == "COMPLETED").all()
    pd.testing.assert_frame_equal(final_rows(rounds), direct_final_rows(trials))
    assert (trials.threads == 1).all() and (trials.device == "cpu").all()
    assert (folder / "tables" / "methods.tex").stat().st_size > 0  # the sweep ends with its table
    assert (folder / "figures" / "accuracy_vs_round.png").stat().st_size > 0  # ... and its figures
    masks = pd.read_parquet(next((folder / "masks").glob("*.parquet")))
    assert set(masks.client) == {0, 1, 2} and (masks.tensor.str.endswith("weight")).all()
    assert len(list((folder / "masks").glob("*.parquet"))) == 2  # the two FedSelect trials only
    assert trials.data_from_driver.all()  # loaded once on the driver, not re-read by the trials

    client, parents, children = mlflow_runs(tmp_path)
    assert len(parents) == 1 and parents[0].info.status == "FINISHED"
    assert len(children) == 4
    for child in children:
        assert child.data.tags["mlflow.parentRunId"] == parents[0].info.run_id
        assert child.data.tags["config_hash"] in set(trials.config_hash)
        assert child.data.params["rounds"] == "3" and "pers_rate" in child.data.params
        history = client.get_metric_history(child.info.run_id, "acc_mean")
        assert sorted(m.step for m in history) == [1, 2, 3]
        artifacts = {a.path for a in client.list_artifacts(child.info.run_id)}
        assert {"final_client_accuracy.csv", "label_histograms.json"} <= artifacts
        if child.data.params["algorithm"] == "fedselect":
            assert "fedselect_masks.npz" in artifacts


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


def _wait_for(predicate, timeout: float, what: str):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if predicate():
            return
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGKILL])
def test_interrupted_sweep_resumes_without_missing_or_duplicated_rows(ray_cluster, tmp_path, sig):
    name = f"interrupt-{sig.name}"
    argv = sweep_args(tmp_path, name, "--pers-rate", "0.1", "0.25", "0.5", "--anchors", "fedavg",
                      "--max-concurrent", "1", "--address", ray_cluster.address, rounds=8)
    env = os.environ | {"PYTHONUNBUFFERED": "1"}
    driver = subprocess.Popen([sys.executable, "sweeps/fedselect_grid.py", *argv], cwd=REPO, env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    rounds_dir = tmp_path / name / "rounds"
    _wait_for(lambda: rounds_dir.exists() and len(list(rounds_dir.glob("*.parquet"))) >= 12, 120, "some rounds")
    driver.send_signal(sig)
    driver.wait(timeout=120)
    written = len(list(rounds_dir.glob("*.parquet")))
    assert written < 4 * 8, "the sweep finished before it could be interrupted"

    assert run(["--resume", "--name", name, "--results", str(tmp_path), "--verbose", "0"]) == 0
    folder = tmp_path / name
    trials = pd.read_parquet(folder / "trials.parquet")
    assert len(trials) == 4 and (trials.status == "COMPLETED").all()
    rounds = read_rounds(folder)
    assert len(rounds) == 4 * 8 * 3
    assert not rounds.duplicated(["config_hash", "round", "client"]).any()
    pd.testing.assert_frame_equal(final_rows(rounds), direct_final_rows(trials))
    client, parents, children = mlflow_runs(tmp_path)
    assert len(parents) == 1 and len(children) == 4  # resumed trials kept their runs
    for child in children:
        steps = [m.step for m in client.get_metric_history(child.info.run_id, "acc_mean")]
        assert sorted(steps) == list(range(1, 9)), steps


def test_four_quarter_gpu_trials_run_at_once_on_one_logical_gpu(ray_cluster, tmp_path):
    assert ray_cluster.cluster_resources().get("GPU") == 1
    assert run(sweep_args(tmp_path, "pack", "--pers-rate", "0.1", "0.25", "0.5", "0.75", "--anchors",
                          "--gpus-per-trial", "0.25", "--cpus-per-trial", "1", rounds=8)) == 0
    trials = pd.read_parquet(tmp_path / "pack" / "trials.parquet")
    assert len(trials) == 4 and (trials.gpus_assigned == 1).all()
    # All four were running at the same moment: the last to start started before the first ended.
    assert trials.started_at.max() < trials.reported_at.min()


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


def test_optuna_search_with_asha(ray_cluster, tmp_path):
    assert run(sweep_args(tmp_path, "optuna", "--pers-rate", "0.1", "0.5", "--pers-limit", "0.5", "0.9",
                          "--search", "optuna", "--num-samples", "3", "--scheduler", "asha", rounds=4)) in (0, 1)
    trials = pd.read_parquet(tmp_path / "optuna" / "trials.parquet")
    assert len(trials) == 3 and set(trials.status) <= {"COMPLETED", "STOPPED"}
    assert trials.pers_rate.between(0.1, 0.5).all() and trials.pers_limit.between(0.5, 0.9).all()
    assert trials.pers_rate.nunique() == 3  # sampled, not a grid
    rounds = read_rounds(tmp_path / "optuna")
    assert len(rounds) == int(trials.rounds_done.sum()) * 3


def test_unreachable_tracking_server_warns_and_parquet_stays_complete(ray_cluster, tmp_path, capfd):
    assert run(sweep_args(tmp_path, "nomlflow", "--pers-rate", "0.25", "--anchors",
                          "--tracking-uri", "http://127.0.0.1:9")) == 0
    assert "WARNING: MLflow at http://127.0.0.1:9 failed" in capfd.readouterr().err
    assert len(read_rounds(tmp_path / "nomlflow")) == 2 * 3


def test_baselines_and_ablation_studies_run_on_the_shared_machinery(ray_cluster, tmp_path):
    from fl_core.config import ALGORITHMS
    from sweeps import ablation, baselines
    tiny = ["--dataset", "synthetic", "--num-clients", "3", "--shards-per-client", "3", "--batch-size", "16",
            "--partition", "shards", "--rounds", "2", "--results", str(tmp_path), "--verbose", "0"]
    assert run_study(baselines.STUDY, tiny + ["--name", "base"]) == 0
    assert run_study(ablation.STUDY, tiny + ["--name", "abl", "--blocks", "B"]) == 0
    base = pd.read_parquet(tmp_path / "base" / "trials.parquet")
    assert sorted(base.algorithm) == sorted(ALGORITHMS) and (base.status == "COMPLETED").all()
    abl = pd.read_parquet(tmp_path / "abl" / "trials.parquet")
    assert sorted(abl.fedselect_variant) == ["gradselect", "layer", "personalize_least", "random"]
    assert len(read_rounds(tmp_path / "base")) == len(ALGORITHMS) * 2 * 3
    for experiment, n in (("baselines", len(ALGORITHMS)), ("ablation", 4)):
        _, parents, children = mlflow_runs(tmp_path, experiment)
        assert len(parents) == 1 and len(children) == n
