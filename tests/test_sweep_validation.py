"""Study flags, trials and the Tune config flow, without Ray: bad input fails before any work
(one clear error, exit code 2); the flags come from the knob declarations; a method knob reaches
the trials of its own methods only; Tune gets validated flat configs and gives them back."""
import json
import subprocess
import sys

import pandas as pd
import pytest

from fl_core.config import COMMON_KNOBS, RunConfig, knob_owners
from sweeps.run import study_named
from sweeps.fedselect_grid import STUDY
from sweeps.plan import run_config
from sweeps.spec import load_spec
from sweeps.study import NOT_FLAGS, build_parser, plan_sweep, run_study

from conftest import REPO

ABLATION = study_named("ablation")
BASELINES = study_named("baselines")


def planned(study, argv, tmp_path="/tmp/never-written"):
    """The plan of a study's command line (nothing is written)."""
    args = build_parser(study).parse_args([*argv, "--results", str(tmp_path)])
    return plan_sweep(study, args)[0]


def configs_of(study, argv):
    return planned(study, argv).configs


@pytest.mark.parametrize("flags,needle", [
    (["--pers-rate", "0.1", "1.5"], "pers_rate=1.5 is outside the allowed range [0, 1]"),
    (["--pers-limit", "2"], "pers_limit=2.0 is outside the allowed range [0, 1]"),
    (["--dir-alpha", "0.5", "-1"], "dir_alpha=-1.0 is outside the allowed range (0, inf)"),
    (["--local-epochs", "0"], "local_epochs=0 is outside the allowed range [1, inf)"),
    (["--dataset", "imagenet"], "dataset='imagenet' is not allowed"),
    (["--anchors", "fedavg", "fedmagic"], "algorithm='fedmagic' is not allowed"),
    (["--pers-rate", "0.1:0.5"], "pers_rate=0.1:0.5: a range needs search kind = optuna"),
    (["--dir-alpha", "0.1:0.5", "--search", "optuna"], "data settings are never searched"),
    (["--scheduler", "asha"], "a search or scheduler selects by validation accuracy"),
    (["--search", "optuna", "--algorithms", "fedavg", "--anchors", "fedavg"],
     "fedavg is listed twice with the same knobs"),
    (["--search", "optuna", "--val-fraction", "0.1", "--algorithms", "fedavg", "--anchors"], None),
    (["--participation", "0"], "participation=0.0 is outside the allowed range (0, 1]"),
    (["--ditto-lambda", "2"], "--ditto-lambda is a knob of ditto, but this study runs no trial of ditto"),
    (["--pers-rate", "0.1", "0.1"], "same configuration twice"),
    (["--dataset", "mnist", "--data-root", "/nonexistent/data"], "/nonexistent/data"),
    (["--gpus-per-trial", "lots"], "--gpus-per-trial 'lots' is not a number or 'auto'"),
    (["--resume"], "--resume: no fedselect_grid sweep under"),
    (["--checkpoint-every", "0"], "--checkpoint-every 0 must be >= 1"),
])
def test_bad_values_fail_before_any_work(tmp_path, capsys, flags, needle):
    if needle is None:  # a valid command line: checked with --dry-run, which writes nothing
        assert run_study(STUDY, ["--results", str(tmp_path), *flags, "--dry-run"]) == 0
    else:
        assert run_study(STUDY, ["--results", str(tmp_path), *flags]) == 2
        err = capsys.readouterr().err
        assert needle in err and err.count("error:") == 1
    assert not any(tmp_path.iterdir())


def test_sweeps_of_engine_v1_are_not_resumed(tmp_path, capsys):
    (tmp_path / "old").mkdir()
    (tmp_path / "old" / "sweep.json").write_text(json.dumps({"rounds": 20, "resume": False}))  # no sweep_format
    assert run_study(STUDY, ["--results", str(tmp_path), "--resume", "--name", "old"]) == 2
    assert "old was written by an older version (sweep format 1, now 4)" in capsys.readouterr().err


@pytest.mark.parametrize("study", [STUDY, BASELINES, ABLATION], ids=lambda s: s.name)
def test_every_knob_is_a_flag_with_its_default_in_help(study):
    parser = build_parser(study)
    flags = {o for action in parser._actions for o in action.option_strings}
    knobs = set(COMMON_KNOBS) | set(knob_owners())
    expected = knobs - set(NOT_FLAGS)
    assert {k for k in expected if "--" + k.replace("_", "-") not in flags} == set()
    assert {"--dataset", "--partition", "--dir-alpha", "--local-epochs", "--seeds"} <= flags
    text = " ".join(build_parser(study).format_help().split())  # unwrapped
    for needle in ("--rounds ROUNDS [ROUNDS ...] communication rounds; in [1, inf) (default: 20)",
                   "--num-clients NUM_CLIENTS [NUM_CLIENTS ...] number of clients; in [1, inf) (default: 10)",
                   "(default: 0.1)", "--eval-every", "--lr-schedule"):
        assert needle in text, needle


def test_default_grid_is_32_trials_per_seed_over_3_seeds_and_anchors_carry_no_fedselect_knobs():
    configs = configs_of(STUDY, [])
    fedselect = [c for c in configs if c.algorithm == "fedselect"]
    anchors = [c for c in configs if c.algorithm != "fedselect"]
    assert len(configs) == 32 * 3 and len(fedselect) == 3 * 2 * 2 * 2 * 3 and len(anchors) == 2 * 2 * 2 * 3
    assert {c.seed for c in configs} == {0, 1, 2}
    assert not any(k in c.to_dict() for c in anchors for k in knob_owners())  # no fake p = α = 0
    assert {(c.pers_rate, c.pers_limit) for c in fedselect} == {(p, a) for p in (0.1, 0.25, 0.5) for a in (0.5, 0.8)}
    assert {(c.dir_alpha, c.local_epochs) for c in anchors} == {(c.dir_alpha, c.local_epochs) for c in fedselect}
    assert all(c.dataset == "digits" and c.partition == "dirichlet" and c.rounds == 20 for c in configs)


def test_method_knobs_apply_to_their_own_methods_only():
    configs = configs_of(BASELINES, ["--ft-epochs", "3", "--pers-limit", "0.5", "--lr", "0.05", "--seeds", "0"])
    listed = load_spec(BASELINES.spec).methods  # the FedSelect paper's Table 1, not every registered method
    assert len(configs) == len(listed) * 2                            # methods x (2 shards, Dir(0.1))
    for c in configs:
        owns = set(c.method.to_dict())
        assert ("ft_epochs" in owns) == (c.algorithm in ("fedavg_ft", "fedbabu"))
        assert c.lr == 0.05                                            # a common knob: every trial
    assert {c.ft_epochs for c in configs if c.algorithm in ("fedavg_ft", "fedbabu")} == {3}
    assert {(c.pers_rate, c.pers_limit) for c in configs if c.algorithm == "fedselect"} == {(0.25, 0.5)}
    assert {(c.partition, c.dir_alpha) for c in configs} == {("shards", 0.5), ("dirichlet", 0.1)}


def test_paper_preset_is_cifar10_resnet18():
    configs = configs_of(STUDY, ["--preset", "paper"])
    assert {(c.dataset, c.model, c.samples_per_client) for c in configs} == {("cifar10", "resnet18", 100)}
    assert len(configs) == (4 + 2) * 2 * 3 and {c.pers_limit for c in configs if c.algorithm == "fedselect"} == {
        0.2, 0.4, 0.6, 0.8}
    narrowed = configs_of(STUDY, ["--preset", "paper", "--pers-limit", "0.8", "--seeds", "0"])  # flags still apply
    assert {c.pers_limit for c in narrowed if c.algorithm == "fedselect"} == {0.8} and len(narrowed) == 3 * 2


def test_ablation_grid_has_each_variant_once_and_each_block_for_layer():
    configs = configs_of(ABLATION, ["--partition", "shards", "--pers-rate", "0.5", "--seeds", "0"])
    assert sorted(c.label() for c in configs) == [
        "FedSelect", "FedSelect (layer A)", "FedSelect (layer B)", "FedSelect (layer C)", "FedSelect (layer D)",
        "FedSelect (personalize least)", "FedSelect (random)"]
    assert {c.pers_rate for c in configs} == {0.5}


def test_tune_receives_validated_flat_configs_and_gives_them_back(tmp_path):
    from sweeps.plan import grid_space, progress_columns
    plan = planned(STUDY, ["--pers-rate", "0.25", "--pers-limit", "0.8", "--dir-alpha", "0.1", "--local-epochs", "1",
                           "--select-params", "all", "--seeds", "0"], tmp_path)
    (stage,) = plan.stages
    space, columns = grid_space(stage.configs, progress_columns(plan.configs, plan.named))
    trials = space["trial"]["grid_search"]
    assert [t["run"] for t in trials] == [c.to_dict() for c in plan.configs]
    assert [t["stage"] for t in trials] == ["grid", "anchor", "anchor"]
    back = [run_config({"trial": t}) for t in trials]
    assert [c.config_hash() for c in back] == [c.config_hash() for c in plan.configs]
    assert [t["show"]["p"] for t in trials] == [0.25, "-", "-"]       # anchors: no p, shown as "-"
    assert [c.label() for c in back] == ["FedSelect", "FedAvg", "Local"]
    assert back[0].select_params == "all" and "select_params" not in trials[1]["run"]
    assert columns["trial/show/α"] == "α" and not (tmp_path / plan.folder.name).exists()


def test_optuna_space_is_sampled_knobs_over_a_validated_base_one_search_per_data_setting(tmp_path):
    from sweeps.plan import search_space
    plan = planned(STUDY, ["--search", "optuna", "--pers-rate", "0.1:0.5", "--pers-limit", "0.5", "0.9",
                           "--lr", "0.01:0.3:log", "--partition", "dirichlet", "shards", "--val-fraction", "0.1",
                           "--local-epochs", "1"], tmp_path)
    selects = [s for s in plan.stages if s.kind == "select"]
    assert [s.group for s in selects] == ["digits, Dir(0.1) / FedSelect", "digits, Dir(0.5) / FedSelect",
                                          "digits, 2 shards / FedSelect"]    # the data are never searched
    assert all(s.searched and len(s.configs) == 1 and s.configs[0][1].seed == 1000 for s in selects)
    base = selects[2].configs[0][1]
    space, _ = search_space(base, selects[2].domains, {})
    assert space["run"] == base.to_dict() and space["stage"] == "select"
    assert set(space) == {"run", "stage", "pers_rate", "pers_limit", "lr"}
    assert (space["pers_rate"].lower, space["pers_rate"].upper) == (0.1, 0.5)
    assert space["pers_limit"].categories == [0.5, 0.9]
    assert "LogUniform" in type(space["lr"].sampler).__name__
    sampled = {"run": space["run"], "stage": "select", "pers_rate": 0.3, "pers_limit": 0.9, "lr": 0.05}
    config = run_config(sampled)
    assert (config.pers_rate, config.pers_limit, config.lr, config.partition) == (0.3, 0.9, 0.05, "shards")
    assert config.config_hash() == base.replace(pers_rate=0.3, pers_limit=0.9, lr=0.05).config_hash()
    assert [s.name for s in plan.stages] == ["tune-anchors", "tune-select-0", "tune-select-1", "tune-select-2"]


def test_launch_does_not_import_study():
    code = "import sys, sweeps.launch; print('sweeps.study' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_end_of_sweep_summary_gives_each_methods_chosen_configuration_per_setting_over_its_seeds():
    from sweeps.summary import best_per_setting
    done = pd.DataFrame({
        "setting": ["easy"] * 6 + ["hard"] * 3,
        "method": ["FedSelect", "FedSelect", "FedAvg", "FedAvg", "FedSelect", "FedSelect", "FedSelect", "FedSelect",
                   "FedAvg"],
        "pers_rate": [0.1, 0.1, None, None, 0.5, 0.5, 0.1, 0.1, None], "seed": [0, 1, 0, 1, 0, 1, 0, 1, 0],
        "acc_mean": [0.9, 0.8, 0.7, 0.96, 0.6, 0.7, 0.5, 0.3, 0.45], "mb_total": [1.0] * 9})
    best = best_per_setting(done, ["pers_rate"])  # no split: the declared p = 0.1 on easy (p = 0.5 not shown)
    # rows in the tables' order (setting, then method), never ranked by test accuracy: on "hard"
    # FedSelect stays first though FedAvg's mean is higher
    assert best[["setting", "method", "acc", "seeds"]].values.tolist() == [
        ["easy", "FedSelect", "0.8500 ± 0.0707", 2], ["easy", "FedAvg", "0.8300 ± 0.1838", 2],
        ["hard", "FedSelect", "0.4000 ± 0.1414", 2], ["hard", "FedAvg", "0.4500", 1]]
    backwards = done.iloc[::-1].assign(algorithm=done["method"].str.lower().iloc[::-1])
    ranked = best_per_setting(backwards, ["pers_rate"])   # with `algorithm`: the registry's order of methods
    assert ranked[["setting", "method"]].values.tolist() == [
        ["easy", "FedSelect"], ["easy", "FedAvg"], ["hard", "FedSelect"], ["hard", "FedAvg"]]


def test_mlflow_run_names_tell_the_trials_apart_by_what_varies():
    from sweeps.mlflow_sink import run_names
    grid_configs = [RunConfig(partition="dirichlet", pers_rate=p, dir_alpha=d, seed=s)
                    for p in (0.1, 0.25) for d in (0.1, 0.5) for s in (0, 1)]
    others = [RunConfig(algorithm="fedavg", partition="dirichlet", dir_alpha=0.1),
              RunConfig(algorithm="ditto", ditto_lambda=0.1), RunConfig(algorithm="ditto", ditto_lambda=1.0),
              RunConfig(fedselect_variant="layer", layer_block="B")]
    names = run_names(grid_configs + others)
    assert len(set(names.values())) == len(names)
    by_config = {c.config_hash(): c for c in grid_configs + others}
    named = {names[h]: c for h, c in by_config.items()}
    assert named["FedSelect p=0.25 α=0.8 digits Dir(0.5) E1 s1"].seed == 1
    assert "FedAvg digits Dir(0.1) E1 s0" in named                        # an anchor: no fake p or α
    assert {"Ditto λ=0.1 digits 2 shards E1 s0", "Ditto λ=1 digits 2 shards E1 s0"} <= set(named)
    assert "FedSelect (layer B) p=0.25 α=0.8 digits 2 shards E1 s0" in named  # the label says the variant
    twins = run_names([RunConfig(dir_alpha=0.1), RunConfig(dir_alpha=0.5)])  # differ in a knob no name shows
    assert len(set(twins.values())) == 2 and all(len(n.split()[-1]) == 6 for n in twins.values())


def test_progress_table_shows_dataset_partition_and_seed_where_they_vary(tmp_path):
    from sweeps.plan import progress_columns
    crossed = planned(STUDY, ["--dataset", "digits", "synthetic", "--partition", "shards", "dirichlet"], tmp_path)
    assert {"data", "split", "seed"} <= set(progress_columns(crossed.configs, crossed.named).values())
    single = planned(STUDY, ["--seeds", "0"], tmp_path)
    assert not {"data", "split", "seed"} & set(progress_columns(single.configs, single.named).values())
    assert {"p", "α", "Dir α", "epochs"} <= set(progress_columns(single.configs, single.named).values())


@pytest.mark.parametrize("study", [STUDY, BASELINES, ABLATION], ids=lambda s: s.name)
def test_every_visible_flag_says_its_default(study):
    import argparse
    parser = build_parser(study)
    silent = [a.option_strings[0] for a in parser._actions
              if a.option_strings and a.dest != "help" and a.help != argparse.SUPPRESS
              and "default" not in (a.help or "")]
    assert silent == []


def test_the_printed_mlflow_command_is_this_environments():
    from pathlib import Path
    from sweeps.summary import mlflow_command
    beside = Path(sys.executable).parent / "mlflow"
    assert mlflow_command() == (str(beside) if beside.exists() else "mlflow")


def test_end_of_sweep_summary_keeps_local_epochs_apart_when_they_vary():
    from sweeps.summary import best_per_setting
    done = pd.DataFrame({"setting": ["easy"] * 4, "method": ["FedSelect", "FedSelect", "FedAvg", "FedAvg"],
                         "local_epochs": [1, 2, 1, 2], "seed": 0, "acc_mean": [0.6, 0.9, 0.5, 0.8], "mb_total": 1.0})
    best = best_per_setting(done, ["local_epochs"])
    assert best[["local_epochs", "method", "acc"]].values.tolist() == [
        [1, "FedSelect", "0.6000"], [1, "FedAvg", "0.5000"], [2, "FedSelect", "0.9000"], [2, "FedAvg", "0.8000"]]


def test_dir_alpha_is_swept_for_both_dirichlet_partitions_only():
    configs = configs_of(BASELINES, ["--algorithms", "fedavg", "--seeds", "0", "--dir-alpha", "0.1", "0.5",
                                           "--partition", "shards", "dirichlet", "dirichlet_class"])
    settings = {(c.partition, c.dir_alpha) for c in configs}
    assert settings == {("shards", RunConfig().dir_alpha), ("dirichlet", 0.1), ("dirichlet", 0.5),
                        ("dirichlet_class", 0.1), ("dirichlet_class", 0.5)}
