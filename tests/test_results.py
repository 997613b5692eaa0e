"""The one result schema (fl_core/results.py): statistics defined once, rows with labels."""
import math

import numpy as np
import pandas as pd
import pytest

from fl_core.config import RunConfig
from fl_core.results import (across_seeds, add_labels, client_mean, client_std, config_columns, divergence,
                             reported_round, summarize, summarize_round, weighted_mean)


def test_the_vectorised_summary_agrees_with_the_scalar_definitions():
    rng = np.random.default_rng(0)
    rows = []
    for trial in ("a", "b"):
        for rnd in (1, 2, 3):
            for k in range(5):
                acc = math.nan if (rnd == 1 or rng.random() < 0.2) else float(rng.random())
                rows.append({"config_hash": trial, "round": rnd, "client": k, "acc": acc,
                             "acc_local": acc, "acc_global": acc, "acc_val": math.nan, "loss": float(rng.random()),
                             "n_test": int(rng.integers(5, 50)), "personal_fraction": float(rng.random()),
                             "participated": True, "bytes_up": int(rng.integers(0, 1000)),
                             "bytes_down": int(rng.integers(0, 1000)), "round_seconds": 0.5, "toy_metric": float(k)})
    frame = pd.DataFrame(rows)
    summary = summarize(frame)
    assert len(summary) == 6
    for (trial, rnd), group in frame.groupby(["config_hash", "round"]):
        got = summary[(summary.config_hash == trial) & (summary["round"] == rnd)].iloc[0]
        for key, expected in [("acc_mean", client_mean(group.acc)), ("acc_std", client_std(group.acc)),
                              ("acc_weighted", weighted_mean(group.acc, group.n_test)),
                              ("busiest_mb", (group.bytes_up + group.bytes_down).max() / 1e6),
                              ("toy_metric_mean", 2.0)]:
            assert (math.isnan(expected) and math.isnan(got[key])) or got[key] == pytest.approx(expected), key
        earlier = frame[(frame.config_hash == trial) & (frame["round"] <= rnd)]
        assert got.mb_total == pytest.approx((earlier.bytes_up + earlier.bytes_down).sum() / 1e6)
    one = summarize_round(frame[(frame.config_hash == "a") & (frame["round"] == 2)], mb_before=1.0)
    assert (one["round"] == 2 and isinstance(one["participants"], int)
            and one["mb_total"] == pytest.approx(1.0 + one["mb_round"]))
    assert client_std([0.5, 0.7]) == pytest.approx(0.1)                  # ddof = 0 over clients
    assert across_seeds([0.5, 0.7]) == (pytest.approx(0.6), pytest.approx(math.sqrt(0.02)), 2)  # ddof = 1 over seeds
    assert across_seeds([0.5]) == (0.5, 0.0, 1)


def test_rows_carry_labels_and_only_the_knobs_that_apply():
    fedavg = config_columns(RunConfig(algorithm="fedavg", partition="dirichlet", dir_alpha=0.1))
    assert fedavg["method"] == "FedAvg" and fedavg["setting"] == "digits, Dir(0.1)"
    assert "pers_rate" not in fedavg and {"config_hash", "seed", "version"} <= set(fedavg)
    layer = config_columns(RunConfig(fedselect_variant="layer", layer_block="C"))
    assert layer["method"] == "FedSelect (layer C)" and layer["setting"] == "digits, 2 shards"
    # rows of engine v1 (every method's knobs, no labels) get the same labels
    v1 = pd.DataFrame([{**RunConfig(fedselect_variant="random").to_dict(), "ditto_lambda": 1.0, "ft_epochs": 1},
                       {**RunConfig(algorithm="fedavg_ft").to_dict(), "pers_rate": 0.0,
                        "fedselect_variant": "gradselect"}])
    labelled = add_labels(v1)
    assert labelled.method.tolist() == ["FedSelect (random)", "FedAvg+FT"]
    assert labelled.setting.tolist() == ["digits, 2 shards"] * 2


def test_rows_carry_the_method_facts_and_older_rows_get_them_when_read(tmp_path):
    """What analysis needs of a method is in its rows (it never imports the methods): which model
    is scored, whether rounds go through a server, whether it communicates. Files written before
    these columns existed get them from the registry when read, also when only one is asked for."""
    from fl_core.result_files import read_files

    facts = {name: {k: config_columns(RunConfig(algorithm=name))[k]
                    for k in ("evaluated_model", "has_server", "communicates")}
             for name in ("fedavg", "fedselect", "dispfl", "local")}
    assert facts["fedavg"] == {"evaluated_model": "after the broadcast", "has_server": True, "communicates": True}
    assert facts["fedselect"]["evaluated_model"] == "after local training" and facts["fedselect"]["has_server"]
    assert facts["dispfl"]["has_server"] is False and facts["dispfl"]["communicates"] is True
    assert facts["local"] == {**facts["local"], "has_server": False, "communicates": False}
    knobs = {name: config_columns(RunConfig(algorithm=name))["method_knobs"]
             for name in ("fedavg", "fedselect", "ditto")}
    assert knobs["fedavg"] == "" and knobs["ditto"] == "ditto_lambda"
    assert {"pers_rate", "pers_limit"} <= set(knobs["fedselect"].split())
    new = pd.DataFrame([{"algorithm": name, "acc": 0.5} | facts[name] for name in ("fedavg", "dispfl")])
    old = pd.DataFrame([{"algorithm": name, "acc": 0.5} for name in ("local", "fedselect", "ext.mod:Gone")])
    new.to_parquet(tmp_path / "new.parquet")
    old.to_parquet(tmp_path / "old.parquet")
    both = read_files([tmp_path / "new.parquet", tmp_path / "old.parquet"])
    for name, fact in facts.items():
        assert both.loc[both.algorithm == name, list(fact)].iloc[0].to_dict() == fact, name
    assert both.loc[both.algorithm == "ext.mod:Gone", "has_server"].isna().all()  # unknown, never guessed
    assert set(both.loc[both.algorithm == "fedselect", "method_knobs"].iloc[0].split()) >= {"pers_rate", "pers_limit"}
    only = read_files([tmp_path / "old.parquet"], columns=["has_server"])
    assert list(only.columns) == ["has_server"] and only["has_server"].tolist()[:2] == [False, True]


def test_setting_labels_tell_the_two_dirichlet_schemes_apart():
    from fl_core.results import setting_label
    base = {"dataset": "mnist", "shards_per_client": 2, "dir_alpha": 0.1}
    labels = {p: setting_label(base | {"partition": p}) for p in ("shards", "dirichlet", "dirichlet_class", "iid")}
    assert labels == {"shards": "mnist, 2 shards", "dirichlet": "mnist, Dir(0.1)",
                      "dirichlet_class": "mnist, Dir(0.1) by class", "iid": "mnist, iid"}


def test_every_method_says_which_model_its_accuracy_measures():
    from fl_core.algorithms import ALGORITHMS, get_algorithm
    said = {a: get_algorithm(a).evaluated_model() for a in ALGORITHMS}
    assert all(said.values())
    assert said["fedselect"] == "after local training" and said["fedavg"] == "after the broadcast"


def _rounds(loss, acc, val):
    """One client per round: its training loss, test and validation accuracy."""
    n = len(loss)
    return pd.DataFrame({"round": range(1, n + 1), "client": 0, "participated": True, "loss": loss, "acc": acc,
                         "acc_val": val, "acc_local": acc, "acc_global": acc, "n_test": 10, "bytes_up": 0,
                         "bytes_down": 0, "personal_fraction": 0.0})


def test_a_trial_reports_its_last_or_its_best_validation_round():
    from fl_core.results import summarize_trial, trial_row

    rounds = _rounds([1.0, 0.8, 0.7], [0.50, 0.70, 0.60], [0.40, 0.75, 0.75])
    last, best = (trial_row(RunConfig(rounds=3), rounds, report_round=rule) for rule in ("last", "best_val"))
    assert (last["acc_mean"], last["reported_round"], last["report_round"]) == (0.60, 3, "last")
    assert (best["acc_mean"], best["reported_round"]) == (0.70, 2)   # the earliest of equal validation accuracies
    assert best["rounds_done"] == 3 and not best["diverged"]
    with pytest.raises(ValueError, match="report_round='best'; choose one of last, best_val"):
        reported_round(summarize_trial(rounds), "best")


def test_best_val_global_reports_the_round_the_model_before_fine_tuning_validates_best():
    from fl_core.results import summarize_trial, trial_row

    rounds = _rounds([1.0, 0.8, 0.7], [0.50, 0.70, 0.60], [0.40, 0.75, 0.80])
    rounds["acc_val_global"] = [0.30, 0.35, 0.20]  # the un-tuned model peaks at round 2, the tuned one at 3
    by_tuned, by_global = (trial_row(RunConfig(rounds=3), rounds, report_round=rule)
                           for rule in ("best_val", "best_val_global"))
    assert (by_tuned["acc_mean"], by_tuned["reported_round"]) == (0.60, 3)
    assert (by_global["acc_mean"], by_global["reported_round"], by_global["acc_val_global_mean"]) == (0.70, 2, 0.35)
    assert reported_round(summarize_trial(rounds.drop(columns="acc_val_global")), "best_val_global")["round"] == 3


@pytest.mark.parametrize("loss, acc, chance, why", [
    ([1.0, float("inf"), 0.5], [0.5, 0.6, 0.6], None, "training loss inf at round 2"),
    ([1.0, float("nan"), float("nan")], [0.5, 0.1, 0.1], None, "training loss nan at round 2"),
    ([float("nan"), 1.0, 0.9], [0.1, 0.5, 0.6], None, ""),                    # NaN before any training: no update
    ([1.0, 0.5, 0.4], [0.50, 0.60, 0.12], 0.1, "fell to chance: mean accuracy 0.120 after 0.600 (chance 0.100)"),
    ([1.0, 0.5, 0.4], [0.15, 0.18, 0.12], 0.1, ""),                          # never learned: not a collapse
    ([1.0, 0.5, 0.4], [0.50, 0.12, 0.60], 0.1, ""),                          # a dip it recovered from
])
def test_divergence_is_a_lost_loss_or_a_fall_to_chance_after_learning(loss, acc, chance, why):
    from fl_core.results import summarize_trial

    rounds = _rounds(loss, acc, acc)
    assert divergence(rounds, summarize_trial(rounds), chance) == why


def test_a_fine_tuning_that_ends_at_chance_from_a_learned_model_has_diverged():
    """A method scored once, at its last round (FedL2P, FT), has no earlier peak: its model before
    fine-tuning (`acc_global`) is what it had learned. FedL2P's Table-1 rerun ended one seed at 5 %
    (chance 10 %) from a pretrained model far above chance, and it was averaged in as a result."""
    from fl_core.results import summarize_trial

    rounds = _rounds([1.0], [0.05], [0.05]).assign(acc_global=0.80, acc_local=0.80)
    assert divergence(rounds, summarize_trial(rounds), 0.1) == \
        "fell to chance: mean accuracy 0.050 after 0.800 (chance 0.100)"
    started_low = rounds.assign(acc_global=0.15, acc_local=0.15)  # never learned: no collapse
    assert divergence(started_low, summarize_trial(started_low), 0.1) == ""
    poor = rounds.assign(acc=0.63)  # a poor run is a result, not a divergence
    assert divergence(poor, summarize_trial(poor), 0.1) == ""


def test_a_sweep_written_under_an_earlier_rule_is_judged_again_from_its_round_rows(tmp_path, capsys):
    """fl_core.result_files.rejudged and `python -m sweeps.rejudge`: the verdicts in trials.parquet
    follow the current rule, from the kept round rows; a row's own `chance` wins over the flag's,
    and a trial without round rows keeps its verdict."""
    from fl_core.result_files import rejudged
    from fl_core.results import write_parquet
    from sweeps.rejudge import main

    collapsed = _rounds([1.0], [0.05], [0.05]).assign(acc_global=0.80, acc_local=0.80, config_hash="a")
    fine = _rounds([1.0], [0.70], [0.70]).assign(config_hash="b")
    rounds = pd.concat([collapsed, fine], ignore_index=True)
    trials = pd.DataFrame({"config_hash": ["a", "b", "c"], "algorithm": "fedl2p", "seed": [4, 0, 1],
                           "diverged": [False, True, True], "diverged_why": ["", "old rule", "no rows"]})
    after = rejudged(trials, rounds, chance=0.1)
    assert after["diverged"].tolist() == [True, False, True]
    assert after["diverged_why"].tolist() == [
        "fell to chance: mean accuracy 0.050 after 0.800 (chance 0.100)", "", "no rows"]
    assert not rejudged(trials.assign(chance=0.01), rounds, chance=0.1)["diverged"].iloc[0]  # 100 classes
    write_parquet(trials, tmp_path / "trials.parquet")
    for key, rows in rounds.groupby("config_hash"):
        write_parquet(rows, tmp_path / "rounds" / f"{key}.parquet")
    assert main([str(tmp_path), "--chance", "0.1", "--dry-run"]) == 0
    assert "a fedl2p seed 4: not diverged -> fell to chance" in capsys.readouterr().err
    assert not pd.read_parquet(tmp_path / "trials.parquet")["diverged"].iloc[0]  # a dry run writes nothing
    main([str(tmp_path), "--chance", "0.1"])
    assert pd.read_parquet(tmp_path / "trials.parquet")["diverged"].tolist() == [True, False, True]
    with pytest.raises(SystemExit):
        main([str(tmp_path), "--chance", "10"])
    assert "--chance 10.0: must be between 0 and 1" in capsys.readouterr().err


def test_a_client_a_round_did_not_sample_has_no_loss_and_has_not_diverged():
    """Under partial participation a client trains in some rounds only: its NaN loss in the others
    is no divergence (it flagged every run of a c = 0.1 study before, and selection then had no
    configuration left to confirm); a sampled client's NaN after a finite loss still is."""
    from fl_core.results import summarize_trial

    rounds = _rounds([1.0, float("nan"), 0.9], [0.5, 0.6, 0.6], [0.5, 0.6, 0.6])
    rounds["participated"] = [True, False, True]
    assert divergence(rounds, summarize_trial(rounds)) == ""
    rounds["participated"] = True
    assert divergence(rounds, summarize_trial(rounds)) == "training loss nan at round 2"


def test_a_round_whose_sampled_clients_train_nothing_is_no_divergence_to_the_scheduler(outside_tune, tmp_path):
    """The trainable's per-round `diverged` (what selection and the confirm stage read) follows the
    trial row's rule: a round whose one sampled device trains nothing (a PerFedMask device at 1/8
    of the model, no layer group within its budget) has no mean loss, which is no divergence; it
    used to be one, so a c = 0.1 search confirmed nothing."""
    from conftest import run_one
    from sweeps.parquet_sink import read_rounds

    knobs = {"algorithm": "perfedmask", "num_clients": 8, "rounds": 6, "participation": 0.125, "ft_epochs": 1}
    key = run_one(tmp_path / "sweep", knobs)
    rows = read_rounds(tmp_path / "sweep", trials=[key])
    sampled = rows[rows.participated]
    assert sampled.loss.isna().any() and sampled.loss.notna().any()   # rounds of both kinds happened
    assert [r["diverged"] for r in outside_tune] == [False] * 6
