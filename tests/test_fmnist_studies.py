"""The Fashion-MNIST studies (`--preset fmnist` of every study, the files studies/*_fmnist.toml):
each plans exactly the trials its file says, 5 seeds, on fmnist / fmnist_c, in a sweep folder of its
own name; the digits defaults stay the scripts' defaults. No data is read and nothing is trained."""
import pytest

from sweeps.run import study_named
from sweeps.spec import STUDIES
from sweeps.study import build_parser, plan_sweep

BASELINES = study_named("baselines")
DISPFL = study_named("dispfl")
FEATURE_SHIFT = study_named("feature_shift")
FEDSELECT_GRID = study_named("fedselect_grid")
PERFEDMASK = study_named("perfedmask")
STUDY_OF = {name: study_named(name) for name in ("ablation", "baselines", "dispfl", "feature_shift", "fedselect_grid",
                                                 "perfedmask")}

SEEDS = [0, 1, 2, 3, 4]


def plan_of(study, argv, tmp_path):
    return plan_sweep(study, build_parser(study).parse_args([*argv, "--results", str(tmp_path)]))[0]


# Every Fashion-MNIST study is tuned (the fair protocol): study -> (datasets, select groups), each
# group searched with 8 configurations on search seed 1000 before its winner runs on 5 seeds
# (PerFedMask's two files: their own test below).
TUNED = {
    "fedselect_grid": ({"fmnist"}, [f"{s} / {m}" for s in ("fmnist, 5 shards", "fmnist, Dir(0.5)")
                                  for m in ("FedSelect", "FedAvg", "Local")]),
    "baselines": ({"fmnist"}, [f"fmnist, 5 shards / {m}" for m in ("FedSelect", "FedAvg", "Local", "FedAvg+FT",
                                                                   "FedRep", "LG-FedAvg", "FedPAC")]),
    "ablation": ({"fmnist"}, [f"fmnist, 5 shards / FedSelect{v}" for v in ("", " (personalize least)", " (random)",
                                                                         " (layer A)", " (layer D)")]),
    "dispfl": ({"fmnist"}, [f"fmnist, Dir(0.3) / {m}" for m in ("DisPFL", "D-PSGD", "FedAvg")]),
    "feature_shift": ({"fmnist_c"}, [f"fmnist_c, {s} / {m}" for s in ("a client per domain", "Dir(0.5) per domain")
                                   for m in ("FedSelect", "FedAvg", "Local", "FedBN")]),
}


def check_preset(name, plan, tmp_path):
    stem = STUDY_OF[name].spec.stem
    assert STUDY_OF[name].presets["fmnist"] == STUDIES / f"{stem}_fmnist.toml"
    assert plan.folder.name.startswith(f"{stem}_fmnist-")  # its own sweeps and MLflow experiment
    default = plan_of(STUDY_OF[name], [], tmp_path)  # no preset: the quick study, digits or MNIST, 3 seeds
    assert "fmnist" not in {c.dataset.removesuffix("_c") for c in default.configs}
    assert sorted({c.seed for c in default.configs}) == [0, 1, 2]


@pytest.mark.parametrize("name", list(TUNED))
def test_tuned_fmnist_preset_searches_every_method_alike(name, tmp_path):
    datasets, groups = TUNED[name]
    plan = plan_of(STUDY_OF[name], ["--preset", "fmnist"], tmp_path)
    check_preset(name, plan, tmp_path)
    assert plan.configs == [] and [s.kind for s in plan.stages] == ["select"] * len(groups)
    assert [s.group for s in plan.stages] == groups
    bases = [c for s in plan.stages for _, c in s.configs]
    assert {c.dataset for c in bases} == datasets and {c.seed for c in bases} == {1000}
    assert {c.val_fraction for c in bases} == {0.1} and plan.spec.seeds == tuple(SEEDS)
    assert plan.spec.num_samples == (6 if name == "dispfl" else 8) and plan.spec.scheduler == "asha"  # DisPFL: 2 h
    for stage, (_, config) in zip(plan.stages, (s.configs[0] for s in plan.stages)):
        fedselect = config.algorithm == "fedselect"
        assert set(stage.domains) == ({"lr", "pers_rate", "pers_limit"} if fedselect else {"lr"}), stage.group


def test_fedselect_grid_fmnist_settings_leave_local_room_and_fedavg_is_one_global_model(tmp_path):
    """5 classes of 20 images per client and Dir(0.5), 10 clients of 100 images, 2 local epochs, 60
    rounds; on fmnist_c FedAvg averages its BatchNorm statistics, FedBN does not."""
    plan = plan_of(FEDSELECT_GRID, ["--preset", "fmnist"], tmp_path)
    settings = {(c.partition, c.shards_per_client if c.partition == "shards" else c.dir_alpha, c.num_clients,
                 c.samples_per_client, c.local_epochs, c.rounds) for s in plan.stages for _, c in s.configs}
    assert settings == {("shards", 5, 10, 100, 2, 60), ("dirichlet", 0.5, 10, 100, 2, 60)}
    shift = plan_of(FEATURE_SHIFT, ["--preset", "fmnist"], tmp_path)
    where = {c.algorithm: c.bn_statistics() for s in shift.stages for _, c in s.configs}
    assert where == {"fedselect": "local", "fedavg": "global", "local": "local", "fedbn": "local"}
    assert {c.model for s in shift.stages for _, c in s.configs} == {"lenet_bn"}


def test_presets_are_the_sibling_files_and_flags_still_override(tmp_path):
    assert set(FEDSELECT_GRID.presets) == {"default", "fmnist", "paper"}
    paper = plan_of(FEDSELECT_GRID, ["--preset", "paper", "--seeds", "0"], tmp_path)
    assert {c.dataset for c in paper.configs} == {"cifar10"}
    assert set(PERFEDMASK.presets) == {"default", "fmnist", "fmnist_c1"}
    quick = plan_of(PERFEDMASK, ["--preset", "fmnist", "--rounds", "4", "--lr-milestones", "2,3"], tmp_path)
    assert {c.rounds for s in quick.stages for _, c in s.configs} == {4}


def test_dispfl_fmnist_prunes_a_model_with_spare_capacity_over_ten_neighbours(tmp_path):
    plan = plan_of(DISPFL, ["--preset", "fmnist"], tmp_path)
    configs = [c for s in plan.stages for _, c in s.configs]
    assert {(c.model, c.model_width, c.rounds) for c in configs} == {("lenet", 2.0, 40)}
    assert {c.num_neighbours for c in configs if c.algorithm != "fedavg"} == {10}
    from fl_core.models import build_model
    sparse = next(c for c in configs if c.algorithm == "dispfl")
    assert sparse.density == 0.5
    model = build_model(sparse.model, (1, 28, 28), 10, width=sparse.model_width)  # Fashion-MNIST's images
    # at half density the pruned model still holds about twice a dense LeNet's parameters
    assert 0.5 * sum(p.numel() for p in model.parameters()) > 1.9 * 107786


def test_an_unknown_preset_is_one_error_naming_the_choices(capsys):
    with pytest.raises(SystemExit) as err:
        build_parser(DISPFL).parse_args(["--preset", "cifar"])
    assert err.value.code == 2
    assert "invalid choice: 'cifar' (choose from 'default', 'fmnist')" in capsys.readouterr().err


def test_the_pfl_baselines_preset_runs_every_new_method_beside_the_anchors_on_one_data_split(tmp_path):
    """studies/baselines_pfl.toml: Per-FedAvg (FO, HF), pFedMe, APFL, FedFomo, pFedHN, FedRoD,
    FedALA, SCAFFOLD and MOON with FedAvg, FedAvg+FT and Local, Fashion-MNIST Dir(0.3), 3 seeds:
    every method on the same clients (one data key per seed, FedFomo's validation split for all)."""
    plan = plan_of(BASELINES, ["--preset", "pfl"], tmp_path)
    methods = {"fedavg", "fedavg_ft", "local", "perfedavg_fo", "perfedavg_hf", "pfedme", "apfl", "fedfomo", "pfedhn",
               "fedrod", "fedala", "scaffold", "moon"}
    assert {c.algorithm for c in plan.configs} == methods and len(plan.configs) == 3 * len(methods)
    assert ({(c.dataset, c.partition, c.dir_alpha, c.val_fraction) for c in plan.configs}
            == {("fmnist", "dirichlet", 0.3, 0.2)})
    assert len({c.data_key() for c in plan.configs}) == 3  # one client split per seed, shared by all methods
    assert {c.lr for c in plan.configs if c.algorithm == "pfedme"} == {0.05}  # lr·λ = 0.75 < 1


PERFEDMASK_METHODS = ["PerFedMask", "FedBABU (weak ×0.5)", "FedProx (weak ×0.5)", "FedNova (weak ×0.5)",
                      "HeteroFL (full width)", "FedAvg+FT (weak ×0.5)"]


@pytest.mark.parametrize("preset, c, rounds, milestones",
                         [("fmnist", 0.1, 50, "25,38"), ("fmnist_c1", 1.0, 20, "10,15")])
def test_perfedmask_fmnist_presets_run_the_authors_protocol_tuned_alike(preset, c, rounds, milestones, tmp_path):
    """100 devices, 10 a round at c = 0.1 (every one at c = 1), the devices' limits for every full-model
    baseline, the lr times 0.1 at 50 % and 75 % of the rounds (both trimmed for time: 50 and 20 rounds),
    one momentum buffer per round, the round whose global model validates best, HeteroFL scored at full
    width; every method tuned alike."""
    plan = plan_of(PERFEDMASK, ["--preset", preset], tmp_path)
    assert plan.folder.name.startswith("perfedmask_fmnist")
    assert [s.group.split(" / ")[1] for s in plan.stages] == PERFEDMASK_METHODS
    assert plan.spec.report_round == "best_val_global" and plan.spec.margin == 0.01
    assert plan.spec.num_samples == 4 and plan.spec.scheduler == "asha" and plan.spec.seeds == tuple(SEEDS)
    bases = {s.group.split(" / ")[1]: s.configs[0][1] for s in plan.stages}
    assert {(b.num_clients, b.participation, b.rounds, b.lr_milestones, b.local_epochs) for b in bases.values()} == {
        (100, c, rounds, milestones, 4)}
    assert {(b.lr_schedule, b.lr_decay, b.momentum_scope, b.batch_size, b.val_fraction) for b in bases.values()} == {
        ("multistep", 0.1, "round", 50, 0.1)}
    limited = {m for m, b in bases.items() if getattr(b.method, "weak_epochs", None) == 0.5}
    assert limited == {m for m in PERFEDMASK_METHODS if "weak" in m}
    assert bases["FedNova (weak ×0.5)"].method.nova_form == "lr"
    assert bases["HeteroFL (full width)"].method.score_width == "full"
    assert {k for s in plan.stages for k in s.domains} == {"lr", "mu"}
