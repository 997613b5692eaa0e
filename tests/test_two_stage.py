"""Two-stage studies (a [pretraining] table, sweeps/stages.py): planning without Ray (the pretrain
stage first, one pretraining per data setting and seed, every later trial naming its hash; bad
tables fail with one error naming the key), then a tiny FedL2P study end to end (digits, 4
clients, lenet_bn: FedAvg pretraining, FT and FedL2P after it) and its resume, which never runs
a finished pretraining again."""
from __future__ import annotations

import shutil
import tomllib
from pathlib import Path

import pandas as pd
import pytest
import torch

from fl_core.config import DATA_KNOBS, RunConfig
from sweeps.errors import SweepError
from sweeps.parquet_sink import read_rounds
from sweeps.spec import parse_spec, resolved, to_toml, with_overrides
from sweeps.stages import confirm_stage, plan_stages, pretraining_config
from sweeps.study import build_parser, describe, plan_sweep, run_study, study_of_file

BASE = {"name": "two", "seeds": [0, 1],
        "knobs": {"dataset": "digits", "partition": "dirichlet", "dir_alpha": [0.1, 0.5], "num_clients": 4,
                  "model": "lenet_bn", "val_fraction": 0.2, "rounds": 1, "lr": 0.05, "ft_epochs": 1},
        "pretraining": {"algorithm": "fedavg", "rounds": 2, "momentum": 0.5},
        "methods": [{"algorithm": "ft", "bn_mode": ["C", "G"]},
                    {"algorithm": "fedl2p", "rounds": 2, "meta_steps": 1}]}


def spec_of(**changes):
    raw = {k: (dict(v) if isinstance(v, dict) else v) for k, v in BASE.items()}
    for key, value in changes.items():
        table, _, knob = key.partition("__")
        if knob:
            raw[table][knob] = value
        else:
            raw[table] = value
    return parse_spec(raw, "two.toml")


# ---------------------------------------------------------------------------- planning
def test_a_searched_second_stage_gets_a_pretraining_for_the_search_seed_and_every_confirm_seed():
    knobs = {k: v for k, v in BASE["knobs"].items() if k != "lr"}     # tune searches ft's lr
    spec = resolved(spec_of(seeds=[0, 1, 2, 3, 4], search={"tune": ["ft"], "num_samples": 2, "seed": 9}, knobs=knobs,
                            methods=[{"algorithm": "ft", "bn_mode": "C"}, {"algorithm": "fedl2p", "fixed": True}]))
    pretrain, anchors, *selects = plan_stages(spec)
    assert (pretrain.kind, anchors.kind, [s.kind for s in selects]) == ("pretrain", "anchor", ["select", "select"])
    pretrained = {c.config_hash(): c for _, c in pretrain.configs}
    assert ({(c.dir_alpha, c.seed) for c in pretrained.values()}
            == {(a, s) for a in (0.1, 0.5) for s in (0, 1, 2, 3, 4, 9)})
    for _, c in [*anchors.configs, *(pair for s in selects for pair in s.configs)]:
        assert pretrained[c.pretrained].seed == c.seed and pretrained[c.pretrained].dir_alpha == c.dir_alpha
    assert {c.seed for s in selects for _, c in s.configs} == {9}
    winner = selects[0].configs[0][1].replace(lr=0.07)            # as a search would pick it
    confirm = confirm_stage(spec, [winner])
    assert [c.seed for _, c in confirm.configs] == [0, 1, 2, 3, 4]
    for _, c in confirm.configs:                                  # each seed starts from its own pretraining
        assert c.pretrained in pretrained and pretrained[c.pretrained].seed == c.seed and c.lr == 0.07


def test_the_pretrain_stage_comes_first_once_per_data_setting_and_seed_and_every_trial_names_its_own():
    pretrain, tune = plan_stages(resolved(spec_of()))
    assert (pretrain.name, pretrain.kind, tune.name, tune.kind) == ("tune-pretrain", "pretrain", "tune", "grid")
    firsts = [c for _, c in pretrain.configs]
    assert {k for k, _ in pretrain.configs} == {"pretrain"} and len(firsts) == 2 * 2   # Dir α x seeds
    assert {(c.dir_alpha, c.seed) for c in firsts} == {(a, s) for a in (0.1, 0.5) for s in (0, 1)}
    for c in firsts:  # the table's knobs, the trials' data and model, every other knob at its default
        assert (c.algorithm, c.rounds, c.momentum, c.model, c.pretrained) == ("fedavg", 2, 0.5, "lenet_bn", "")
        assert c.lr == RunConfig().lr and c.val_fraction == 0.2
    by_hash = {c.config_hash(): c for c in firsts}
    seconds = [c for _, c in tune.configs]
    assert len(seconds) == 2 * 2 * 3 and {c.algorithm for c in seconds} == {"ft", "fedl2p"}
    for c in seconds:
        pre = by_hash[c.pretrained]
        assert pre.config_hash() == pretraining_config(c, spec_of().pretraining).config_hash()
        assert all(getattr(pre, k) == getattr(c, k) for k in DATA_KNOBS) and pre.model == c.model
        assert c.lr == 0.05   # [knobs] set the second stage only


def test_the_resolved_file_keeps_the_pretraining_and_flags_set_the_second_stage_only(tmp_path):
    spec = resolved(spec_of())
    again = parse_spec(tomllib.loads(to_toml(spec)), "study.toml")
    assert again.pretraining == spec.pretraining and again.pretraining.knobs["lr"] == RunConfig().lr
    plan = [[c.config_hash() for _, c in s.configs] for s in plan_stages(spec)]
    assert [[c.config_hash() for _, c in s.configs] for s in plan_stages(again)] == plan
    flagged = with_overrides(spec, {"rounds": [3], "momentum": [0.9]})
    pretrain, tune = plan_stages(flagged)
    assert [c.config_hash() for _, c in pretrain.configs] == plan[0]          # the pretraining is the table's
    assert {(c.rounds, c.momentum) for _, c in tune.configs} == {(3, 0.9)}


def test_dry_run_shows_the_pretrain_stage_and_its_trials(tmp_path):
    path = tmp_path / "two.toml"
    path.write_text(to_toml(spec_of()))
    study = study_of_file(path)
    plan, _ = plan_sweep(study, build_parser(study).parse_args(["--results", str(tmp_path)]))
    text = describe(plan)
    assert "stage tune-pretrain: 4 trials" in text and "stage tune: 12 trials" in text and "pretraining: fedavg" in text
    first = plan.stages[0].configs[0][1].config_hash()
    assert text.count(first) == 1 + 3   # its own row and those of the three trials of its cell
    assert "pretrained" not in plan.knobs and not (tmp_path / plan.folder.name).exists()


@pytest.mark.parametrize("change, needle", [
    ({"pretraining__dataset": "mnist"}, r"\[pretraining\]: dataset is a data knob.*set dataset in \[knobs\]"),
    ({"pretraining__seed": 3}, r"\[pretraining\]: seed is a data knob"),
    ({"pretraining__val_fraction": 0.0}, r"\[pretraining\]: val_fraction is a data knob"),
    ({"pretraining__rounds": [2, 4]}, r"\[pretraining\]: rounds=\[2, 4\] is a list or a range.*no axes.*one value"),
    ({"pretraining__lr": {"low": 0.01, "high": 0.1}}, r"\[pretraining\]: lr=.* is a list or a range"),
    ({"pretraining__model": "lenet"}, r"\[pretraining\]: model: the pretraining trains the model of the trials"),
    ({"pretraining__bn_mode": "C"}, r"\[pretraining\]: bn_mode is not a knob of fedavg \(it is a knob of ft\)"),
    ({"pretraining__colour": 1}, r"\[pretraining\]: colour is not a knob of fedavg"),
    ({"pretraining__algorithm": "fedl2p"}, r"algorithm='fedl2p' personalizes a pretrained model itself"),
    ({"pretraining__algorithm": "nope"}, r"\[pretraining\]: algorithm='nope'; choose one of .*fedavg"),
    ({"pretraining": ["fedavg"]}, r"\[pretraining\]: expected a table"),
    ({"knobs__pretrained": "0123456789ab"}, r"\[knobs\]: pretrained='0123456789ab'.*leave pretrained out"),
])
def test_bad_pretraining_tables_fail_with_one_error_naming_the_key(change, needle):
    with pytest.raises(SweepError, match=needle):
        spec_of(**change)


def test_a_search_flag_on_a_pretraining_study_searches_its_second_stage():
    stages = plan_stages(resolved(with_overrides(spec_of(), {}, search="optuna")))
    assert [s.kind for s in stages] == ["pretrain"] + ["select"] * 4   # (Dir α) x (ft, fedl2p)
    assert stages[1].domains == {"bn_mode": ["C", "G"]}


# ---------------------------------------------------------------------------- end to end
TINY = """name = "two_stage"
seeds = [0, 1]

[knobs]
dataset = "digits"
partition = "dirichlet"
num_clients = 4
model = "lenet_bn"
val_fraction = 0.2
rounds = 1
ft_epochs = 1

[pretraining]
algorithm = "fedavg"
rounds = 2

[[methods]]
algorithm = "ft"
bn_mode = ["C", "G"]

[[methods]]
algorithm = "fedl2p"
rounds = 2
meta_steps = 1
"""


def _stamp(path: Path) -> tuple[int, int]:
    stat = path.stat()
    return stat.st_ino, stat.st_mtime_ns


def _reports(tune_dir: Path) -> int:
    """Results Tune recorded in an experiment (one line per report of every trial it ran)."""
    return sum(len(p.read_text().splitlines()) for p in tune_dir.glob("*/result.json"))


@pytest.mark.slow
def test_a_two_stage_study_pretrains_once_and_a_resume_never_pretrains_again(ray_cluster, tmp_path):
    path = tmp_path / "two_stage.toml"
    path.write_text(TINY)
    study = study_of_file(path)
    flags = ["--results", str(tmp_path), "--name", "ts", "--verbose", "0", "--max-concurrent", "2"]  # 2 cores
    assert run_study(study, flags) == 0
    folder = tmp_path / "ts"
    trials = pd.read_parquet(folder / "trials.parquet")
    assert (trials.status == "COMPLETED").all() and len(trials) == 2 + 2 * 3
    first, second = trials[trials.stage == "pretrain"], trials[trials.stage != "pretrain"]
    assert (first.algorithm == "fedavg").all() and sorted(first.seed) == [0, 1] and (first.rounds_done == 2).all()
    pretrained = set(first.config_hash)
    assert {p.stem for p in (folder / "checkpoints").glob("*.pt")} == pretrained
    assert set(second.pretrained) == pretrained and set(second.stage) == {"grid"}
    rows = read_rounds(folder)
    later = rows[rows.config_hash.isin(second.config_hash)]
    assert set(later.pretrained) == pretrained and later.config_hash.nunique() == 6
    for seed, rows_of_seed in second.groupby("seed"):  # every trial starts from its own seed's pretraining
        assert set(rows_of_seed.pretrained) == set(first.loc[first.seed == seed, "config_hash"])

    # resume after losing the second stage: Tune skips the finished pretrain stage, nothing is rewritten
    checkpoints = {h: folder / "checkpoints" / f"{h}.pt" for h in pretrained}
    outputs = [*checkpoints.values(), *(folder / "state" / f"{h}.pt" for h in pretrained),
               *(folder / "rounds" / f"{h}.parquet" for h in pretrained)]
    before, reports = {p: _stamp(p) for p in outputs}, _reports(folder / "tune-pretrain")
    shutil.rmtree(folder / "tune")
    for key in second.config_hash:
        for lost in (folder / "state" / f"{key}.pt", folder / "rounds" / f"{key}.parquet"):
            lost.unlink()
    resume = ["--resume", "ts", "--results", str(tmp_path), "--verbose", "0"]
    assert run_study(study, resume) == 0
    assert {p: _stamp(p) for p in outputs} == before and _reports(folder / "tune-pretrain") == reports
    again = pd.read_parquet(folder / "trials.parquet")
    assert (again.status == "COMPLETED").all() and len(again) == 8
    assert set(read_rounds(folder).config_hash) == set(trials.config_hash)

    # Tune's record of the pretrain stage lost too (a driver killed before its snapshot): the trials
    # start, find their final state and return; a missing model is written again, the same model
    kept, redone = sorted(pretrained)
    model = torch.load(checkpoints[redone], weights_only=True)["state"]
    checkpoints[redone].unlink()
    shutil.rmtree(folder / "tune-pretrain")
    assert run_study(study, resume) == 0
    assert _stamp(checkpoints[kept]) == before[checkpoints[kept]]
    assert all(_stamp(p) == before[p] for p in outputs if p.parent.name != "checkpoints")
    rewritten = torch.load(checkpoints[redone], weights_only=True)["state"]
    assert rewritten.keys() == model.keys() and all(torch.equal(rewritten[k], model[k]) for k in model)
    assert (pd.read_parquet(folder / "trials.parquet").status == "COMPLETED").all()
