"""The Fashion-MNIST studies (`--preset fmnist` of every study script, the files studies/*_fmnist.toml):
each plans exactly the trials its file says, 5 seeds, on fmnist / fmnist_c, in a sweep folder of its
own name; the digits defaults stay the scripts' defaults. No data is read and nothing is trained."""
import pytest

from fl_core.config import RunConfig
from sweeps import ablation, baselines, dispfl, feature_shift, fedselect_grid, perfedmask
from sweeps.spec import STUDIES
from sweeps.study import build_parser, plan_sweep

SEEDS = [0, 1, 2, 3, 4]


def plan_of(study, argv, tmp_path):
    return plan_sweep(study, build_parser(study).parse_args([*argv, "--results", str(tmp_path)]))[0]


# script -> (trials, datasets, {algorithm: trials}); the counts follow from each file's axes x 5 seeds
EXPECTED = {
    dispfl: (20, {"fmnist"}, {"dispfl": 5, "dpsgd": 5, "fedavg": 5, "local": 5}),
    fedselect_grid: (60, {"fmnist"}, {"fedselect": 40, "fedavg": 10, "local": 10}),
    baselines: (35, {"fmnist"}, None),
    ablation: (25, {"fmnist"}, {"fedselect": 25}),
    feature_shift: (80, {"fmnist_c"}, None),
    perfedmask: (50, {"fmnist"}, None),
}


@pytest.mark.parametrize("module", list(EXPECTED), ids=lambda m: m.__name__.split(".")[-1])
def test_fmnist_preset_plans_the_trials_its_file_says(module, tmp_path):
    total, datasets, per_algorithm = EXPECTED[module]
    plan = plan_of(module.STUDY, ["--preset", "fmnist"], tmp_path)
    stem = module.STUDY.spec.stem
    assert module.STUDY.presets["fmnist"] == STUDIES / f"{stem}_fmnist.toml"
    assert plan.folder.name.startswith(f"{stem}_fmnist-")  # its own sweeps and MLflow experiment
    assert len(plan.configs) == total and len({c.config_hash() for c in plan.configs}) == total
    assert {c.dataset for c in plan.configs} == datasets
    assert sorted({c.seed for c in plan.configs}) == SEEDS
    counts = {}
    for c in plan.configs:
        counts[c.algorithm] = counts.get(c.algorithm, 0) + 1
    assert all(n % len(SEEDS) == 0 for n in counts.values())  # every configuration on every seed
    if per_algorithm is not None:
        assert counts == per_algorithm
    default = plan_of(module.STUDY, [], tmp_path)  # no preset: the quick study, digits or MNIST, 3 seeds
    assert "fmnist" not in {c.dataset.removesuffix("_c") for c in default.configs}
    assert sorted({c.seed for c in default.configs}) == [0, 1, 2]


def test_fedselect_grid_fmnist_is_p_by_limit_on_two_dirichlet_settings(tmp_path):
    """Built by hand: p {0.1, 0.5} x α {0.5, 0.8} x Dir α {0.1, 0.5}, FedAvg and Local anchors, 10
    clients of 100 images, 2 local epochs, 60 rounds, seeds 0-4, in the file's order."""
    expected = []
    for dir_alpha in (0.1, 0.5):
        for seed in SEEDS:
            base = dict(dataset="fmnist", partition="dirichlet", dir_alpha=dir_alpha, num_clients=10,
                        samples_per_client=100, rounds=60, eval_every=3, local_epochs=2, seed=seed)
            expected += [RunConfig(algorithm="fedselect", pers_rate=p, pers_limit=a, **base)
                         for p in (0.1, 0.5) for a in (0.5, 0.8)]
            expected += [RunConfig(algorithm=m, **base) for m in ("fedavg", "local")]
    plan = plan_of(fedselect_grid.STUDY, ["--preset", "fmnist"], tmp_path)
    assert [c.config_hash() for c in plan.configs] == [c.config_hash() for c in expected]


def test_presets_are_the_sibling_files_and_flags_still_override(tmp_path):
    assert set(fedselect_grid.STUDY.presets) == {"default", "fmnist", "paper"}
    paper = plan_of(fedselect_grid.STUDY, ["--preset", "paper", "--seeds", "0"], tmp_path)
    assert {c.dataset for c in paper.configs} == {"cifar10"}
    quick = plan_of(dispfl.STUDY, ["--preset", "fmnist", "--seeds", "0", "--rounds", "4"], tmp_path)
    assert len(quick.configs) == 4 and {c.rounds for c in quick.configs} == {4}


def test_an_unknown_preset_is_one_error_naming_the_choices(capsys):
    with pytest.raises(SystemExit) as err:
        build_parser(dispfl.STUDY).parse_args(["--preset", "cifar"])
    assert err.value.code == 2
    assert "invalid choice: 'cifar' (choose from 'default', 'fmnist')" in capsys.readouterr().err


def test_the_pfl_baselines_preset_runs_every_new_method_beside_the_anchors_on_one_data_split(tmp_path):
    """studies/baselines_pfl.toml: Per-FedAvg (FO, HF), pFedMe, APFL, FedFomo, pFedHN, FedRoD,
    FedALA, SCAFFOLD and MOON with FedAvg, FedAvg+FT and Local, Fashion-MNIST Dir(0.3), 3 seeds:
    every method on the same clients (one data key per seed, FedFomo's validation split for all)."""
    plan = plan_of(baselines.STUDY, ["--preset", "pfl"], tmp_path)
    methods = {"fedavg", "fedavg_ft", "local", "perfedavg_fo", "perfedavg_hf", "pfedme", "apfl", "fedfomo", "pfedhn",
               "fedrod", "fedala", "scaffold", "moon"}
    assert {c.algorithm for c in plan.configs} == methods and len(plan.configs) == 3 * len(methods)
    assert {(c.dataset, c.partition, c.dir_alpha, c.val_fraction) for c in plan.configs} == {("fmnist", "dirichlet", 0.3, 0.2)}
    assert len({c.data_key() for c in plan.configs}) == 3  # one client split per seed, shared by all methods
    assert {c.lr for c in plan.configs if c.algorithm == "pfedme"} == {0.05}  # lr·λ = 0.75 < 1
