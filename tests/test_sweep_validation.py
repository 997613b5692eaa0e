"""Bad sweep input fails before Ray starts: one clear error, exit code 2."""
import pytest

from sweeps.fedselect_grid import STUDY, grid
from sweeps.study import build_parser, run_study


@pytest.mark.parametrize("flags,needle", [
    (["--pers-rate", "0.1", "1.5"], "pers_rate=1.5 is outside the allowed range [0, 1]"),
    (["--pers-limit", "2"], "pers_limit=2.0 is outside the allowed range [0, 1]"),
    (["--dir-alpha", "0.5", "-1"], "dir_alpha=-1.0 must be > 0"),
    (["--local-epochs", "0"], "local_epochs=0 must be an integer >= 1"),
    (["--dataset", "imagenet"], "dataset='imagenet' is not allowed"),
    (["--pers-rate", "0.1", "0.1"], "same configuration twice"),
    (["--dataset", "mnist", "--data-root", "/nonexistent/data"], "/nonexistent/data"),
    (["--gpus-per-trial", "lots"], "--gpus-per-trial 'lots' is not a number or 'auto'"),
    (["--resume"], "--resume: no fedselect_grid sweep under"),
    (["--checkpoint-every", "0"], "--checkpoint-every 0 must be >= 1"),
])
def test_bad_values_fail_before_any_work(tmp_path, capsys, flags, needle):
    assert run_study(STUDY, ["--results", str(tmp_path), *flags]) == 2
    err = capsys.readouterr().err
    assert needle in err and err.count("error:") == 1
    assert not any(tmp_path.glob("*/sweep.json"))


def test_default_grid_is_the_product_of_the_axes_plus_anchors():
    args = build_parser(STUDY).parse_args([])
    trials = grid(args)
    fedselect = [t for t in trials if t["algorithm"] == "fedselect"]
    assert len(fedselect) == 3 * 2 * 2 * 2
    anchors = [t for t in trials if t["algorithm"] != "fedselect"]
    assert len(anchors) == 2 * 2 * 2
    assert {(t["dir_alpha"], t["local_epochs"]) for t in anchors} == {(t["dir_alpha"], t["local_epochs"]) for t in fedselect}
    assert all(t["dataset"] == "digits" and t["partition"] == "dirichlet" for t in trials)


def test_paper_preset_is_cifar10_resnet18():
    args = build_parser(STUDY).parse_args(["--preset", "paper"])
    trials = grid(args)
    assert {t["dataset"] for t in trials} == {"cifar10"} and {t["model"] for t in trials} == {"resnet18"}
    assert {t["samples_per_client"] for t in trials} == {100}


def test_baselines_grid_is_every_method_on_every_split():
    from fl_core.config import ALGORITHMS
    from sweeps import baselines
    trials = baselines.grid(build_parser(baselines.STUDY).parse_args(["--seeds", "0", "1"]))
    assert len(trials) == len(ALGORITHMS) * 2 * 2  # methods x (2 shards, Dir 0.1) x seeds
    assert {(t["partition"], t["dir_alpha"]) for t in trials} == {("shards", 0.5), ("dirichlet", 0.1)}
    assert {t["algorithm"] for t in trials} == set(ALGORITHMS)


def test_ablation_grid_has_each_variant_once_and_each_block_for_layer():
    from sweeps import ablation
    trials = ablation.grid(build_parser(ablation.STUDY).parse_args(["--partition", "shards"]))
    keys = sorted((t["fedselect_variant"], t["layer_block"]) for t in trials)
    assert keys == [("gradselect", "A"), ("layer", "A"), ("layer", "B"), ("layer", "C"), ("layer", "D"),
                    ("personalize_least", "A"), ("random", "A")]


def test_grid_only_studies_refuse_optuna(tmp_path, capsys):
    from sweeps import ablation
    assert run_study(ablation.STUDY, ["--results", str(tmp_path), "--search", "optuna"]) == 2
    assert "the ablation study is a grid only" in capsys.readouterr().err
