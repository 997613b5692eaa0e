"""Study files (sweeps/spec.py) without Ray: every file of the project reads and plans; a file can
sweep any knob; bad files fail with one error naming the entry; the resolved spec written to a
sweep folder plans exactly the same trials; staged selection plans (sweeps/stages.py)."""
import pytest

from fl_core.config import RunConfig
from sweeps.run import study_named
from sweeps.run import main as run_main
from sweeps.spec import STUDIES, load_spec, parse_spec, resolved, save_spec, to_toml
from sweeps.stages import best_completed, confirm_stage, plan_stages
from sweeps.study import plan_sweep, build_parser, study_of_file

ABLATION = study_named("ablation")
BASELINES = study_named("baselines")
DISPFL = study_named("dispfl")
FEATURE_SHIFT = study_named("feature_shift")
FEDSELECT_GRID = study_named("fedselect_grid")


def plan_of(study, argv, tmp_path):
    return plan_sweep(study, build_parser(study).parse_args([*argv, "--results", str(tmp_path)]))[0]


def hashes(configs):
    return sorted(c.config_hash() for c in configs)


@pytest.mark.parametrize("path", sorted(STUDIES.glob("*.toml")), ids=lambda p: p.name)
def test_every_study_file_plans_and_its_resolved_copy_plans_the_same_trials(path, tmp_path):
    plan = plan_of(study_of_file(path), [], tmp_path)
    saved = save_spec(tmp_path / "sweep", plan.spec)
    again = plan_of(study_of_file(saved), [], tmp_path)
    assert hashes(again.configs) == hashes(plan.configs) and again.spec.knobs == plan.spec.knobs
    assert [s.domains for s in again.stages] == [s.domains for s in plan.stages]


def test_the_wrapper_scripts_are_their_files():
    for study in (FEDSELECT_GRID, BASELINES, ABLATION, FEATURE_SHIFT, DISPFL):
        assert study.spec.parent == STUDIES and load_spec(study.spec).name == study.name


def test_fedselect_grid_file_is_the_default_grid(tmp_path):
    """studies/fedselect_grid.toml = p {0.1, 0.25, 0.5} x α {0.5, 0.8} x Dir α {0.1, 0.5} x epochs {1, 2}
    on digits' papers' Dirichlet split, FedAvg and Local anchors per cell, seeds 0-2, built here by hand."""
    expected = []
    for dir_alpha in (0.1, 0.5):
        for epochs in (1, 2):
            for seed in (0, 1, 2):
                base = dict(dataset="digits", partition="dirichlet", dir_alpha=dir_alpha, local_epochs=epochs,
                            seed=seed)
                expected += [RunConfig(algorithm="fedselect", pers_rate=p, pers_limit=a, **base)
                             for p in (0.1, 0.25, 0.5) for a in (0.5, 0.8)]
                expected += [RunConfig(algorithm=m, **base) for m in ("fedavg", "local")]
    plan = plan_of(FEDSELECT_GRID, [], tmp_path)
    assert [c.config_hash() for c in plan.configs] == [c.config_hash() for c in expected]  # same trials, same order


def test_any_knob_is_an_axis_in_a_file_or_on_the_command_line(tmp_path):
    spec = tmp_path / "mine.toml"
    spec.write_text('name = "mine"\nseeds = [0]\n[knobs]\nlr = [0.05, 0.1]\nbatch_size = [16, 32]\n'
                    'momentum = 0.9\nweight_decay = [0.0, 0.0005]\nft_epochs = [1, 3]\n'
                    '[[methods]]\nalgorithm = "ditto"\nditto_lambda = [0.1, 1.0]\n'
                    '[[methods]]\nalgorithm = "fedavg_ft"\n')
    plan = plan_of(study_of_file(spec), [], tmp_path)
    ditto = [c for c in plan.configs if c.algorithm == "ditto"]
    ft = [c for c in plan.configs if c.algorithm == "fedavg_ft"]
    assert len(ditto) == 2 * 2 * 2 * 2 and len(ft) == 2 * 2 * 2 * 2           # ft_epochs: fedavg_ft's only
    assert {(c.lr, c.batch_size, c.weight_decay, c.ditto_lambda) for c in ditto} == {
        (lr, b, wd, lam) for lr in (0.05, 0.1) for b in (16, 32) for wd in (0.0, 0.0005) for lam in (0.1, 1.0)}
    assert {c.ft_epochs for c in ft} == {1, 3} and {c.momentum for c in plan.configs} == {0.9}
    flags = plan_of(study_of_file(spec), ["--lr", "0.2", "--ditto-lambda", "0.5", "--momentum", "0", "0.5"], tmp_path)
    assert {(c.lr, c.momentum) for c in flags.configs} == {(0.2, 0.0), (0.2, 0.5)}
    assert {c.ditto_lambda for c in flags.configs if c.algorithm == "ditto"} == {0.5}


@pytest.mark.parametrize("text,needle", [
    ('name = "x"\nfoo = 1\n[[methods]]\nalgorithm = "fedavg"\n', "unknown key(s) foo"),
    ('name = "x"\n[knobs]\nlearning_rate = 0.1\n[[methods]]\nalgorithm = "fedavg"\n', "unknown knob 'learning_rate'"),
    ('name = "x"\n[knobs]\nlocal_epoch = 2\n[[methods]]\nalgorithm = "fedavg"\n',
     "unknown knob 'local_epoch' (did you mean local_epochs?)"),
    ('name = "x"\nseed = [0]\n[[methods]]\nalgorithm = "fedavg"\n', "unknown key(s) seed (did you mean seeds?)"),
    ('name = "x"\n[knobs]\nlr = -1\n[[methods]]\nalgorithm = "fedavg"\n', "lr=-1.0 is outside the allowed range"),
    ('name = "x"\n[knobs]\nseed = 1\n[[methods]]\nalgorithm = "fedavg"\n', "use `seeds`"),
    ('name = "x"\n[[methods]]\nalgorithm = "fedavg"\ndataset = "mnist"\n', "cannot be set per method"),
    ('name = "x"\n[knobs]\nlr = {low = 0.1, high = 0.3}\n[[methods]]\nalgorithm = "fedavg"\n',
     "a range needs search kind = optuna"),
    ('name = "x"\n[search]\nkind = "optuna"\n[knobs]\nval_fraction = 0.1\ndir_alpha = {low = 0.1, high = 1}\n'
     '[[methods]]\nalgorithm = "fedavg"\n', "data settings are never searched"),
    ('name = "x"\n[search]\nkind = "optuna"\n[knobs]\nlr = {low = 0.1, high = 3.0}\nval_fraction = 0.1\n'
     '[[methods]]\nalgorithm = "fedavg"\n', None),
    ('name = "x"\n[search]\nkind = "optuna"\n[knobs]\npers_rate = {low = 0.1, high = 1.5}\nval_fraction = 0.1\n'
     '[[methods]]\nalgorithm = "fedselect"\n', "pers_rate=1.5 is outside the allowed range"),
    ('name = "x"\n[search]\nscheduler = "asha"\n[[methods]]\nalgorithm = "fedavg"\n', "no validation split"),
    ('name = "x"\n[knobs]\npers_rate = 0.1\n[[methods]]\nalgorithm = "fedavg"\n', "runs no trial of fedselect"),
    ('name = "x"\n[search]\nkind = "bayes"\n[[methods]]\nalgorithm = "fedavg"\n', "choose one of grid, optuna"),
    ('name = "x"\n', "no methods"),
    ('name = \n', "not valid TOML"),
])
def test_bad_study_files_fail_with_one_error_naming_the_entry(tmp_path, capsys, text, needle):
    path = tmp_path / "bad.toml"
    path.write_text(text)
    code = run_main([str(path), "--results", str(tmp_path / "out"), "--dry-run"])
    err = capsys.readouterr().err
    if needle is None:
        assert code == 0, err
    else:
        assert code == 2 and needle in err and err.count("error:") == 1, err
    assert not (tmp_path / "out").exists()


def test_missing_study_file_names_the_projects_studies(tmp_path, capsys):
    assert run_main([str(tmp_path / "nope.toml")]) == 2
    assert "fedselect_grid.toml" in capsys.readouterr().err


def test_dry_run_prints_stages_axes_and_data_settings_and_writes_nothing(tmp_path, capsys):
    assert run_main(["studies/fedselect_optuna.toml", "--results", str(tmp_path), "--dry-run",
                     "--seeds", "0", "1"]) == 0
    out = capsys.readouterr().out
    assert "data settings (2): digits, Dir(0.1); digits, Dir(0.5)" in out
    assert "stage tune-select-0 [digits, Dir(0.1) / FedSelect]: Optuna, 12 configurations on seed 1000, ASHA" in out
    assert "lr ~ log-uniform(0.02, 0.3)" in out and "stage tune-confirm" in out
    assert "confirmed on seeds 0, 1; run as declared: fedavg, local" in out
    assert f"{8 + 2 * 12 + 2 * 2} trials in all" in out
    assert not any(tmp_path.iterdir())


def test_selection_stages_anchors_apart_one_per_data_setting_on_the_search_seed():
    spec = resolved(parse_spec({"name": "s", "seeds": [3, 4, 5], "search": {"scheduler": "asha"},
                                "knobs": {"dir_alpha": [0.1, 0.5], "partition": "dirichlet", "val_fraction": 0.1},
                                "methods": [{"algorithm": "fedselect", "pers_rate": [0.1, 0.5]},
                                            {"algorithm": "fedavg", "anchor": True}]}))
    stages = plan_stages(spec)
    assert [s.name for s in stages] == ["tune-anchors", "tune-select-0", "tune-select-1"]
    assert {c.seed for _, c in stages[0].configs} == {3, 4, 5} and len(stages[0].configs) == 2 * 3
    for stage, alpha in zip(stages[1:], (0.1, 0.5)):
        assert {(c.seed, c.dir_alpha) for _, c in stage.configs} == {(1000, alpha)} and len(stage.configs) == 2
    a, b = (c for _, c in stages[1].configs)
    # Tune sets done on stopped trials too
    stopped_higher = [(a, {"round": 10, "done": True, "objective": 0.99}), (b, {"round": 20, "objective": 0.5})]
    assert best_completed(stopped_higher) == b                   # an early-stopped trial never wins
    assert best_completed([(a, {"round": 19, "objective": 0.9})]) is None
    tie = best_completed([(a, {"round": 20, "objective": 0.5}), (b, {"round": 20, "objective": 0.5})])
    assert tie.config_hash() == min(a.config_hash(), b.config_hash())
    confirm = confirm_stage(spec, [b])
    assert [(kind, c.seed) for kind, c in confirm.configs] == [("confirm", 3), ("confirm", 4), ("confirm", 5)]
    assert confirm.configs[0][1].replace(seed=1000).config_hash() == b.config_hash()


def test_resume_uses_the_saved_study_and_refuses_new_knobs(tmp_path, capsys):
    from sweeps.folder import save_args
    plan = plan_of(FEDSELECT_GRID, ["--seeds", "0", "--rounds", "3", "--name", "s"], tmp_path)
    save_args(plan.folder, plan.args, plan.study, to_toml(plan.spec))
    again = plan_of(FEDSELECT_GRID, ["--resume", "s"], tmp_path)   # the file's defaults are not re-read
    assert hashes(again.configs) == hashes(plan.configs) and {c.rounds for c in again.configs} == {3}
    assert run_main(["studies/fedselect_grid.toml", "--results", str(tmp_path), "--resume", "s", "--rounds", "5"]) == 2
    assert "--rounds cannot change it" in capsys.readouterr().err


def test_resume_keeps_the_kernels_the_sweep_started_with(tmp_path, capsys):
    """The kernels are chosen from the command line before torch loads: a resume that asks for the
    other mode is one error naming the flag, before anything runs."""
    from sweeps.folder import save_args
    for name, flags, other, said in (("pinned", [], ["--no-reproducible"], "ran in the reproducible mode; resume "
                                      "it without --no-reproducible"),
                                     ("native", ["--no-reproducible"], [], "ran with --no-reproducible; resume it "
                                      "with --no-reproducible too")):
        plan = plan_of(FEDSELECT_GRID, ["--seeds", "0", "--rounds", "3", "--name", name, *flags], tmp_path)
        assert plan.args.reproducible is not bool(flags)
        save_args(plan.folder, plan.args, plan.study, to_toml(plan.spec))
        assert plan_of(FEDSELECT_GRID, ["--resume", name, *flags], tmp_path).args.reproducible is not bool(flags)
        assert run_main(["studies/fedselect_grid.toml", "--results", str(tmp_path), "--resume", name, *other]) == 2
        assert capsys.readouterr().err.strip() == f"error: --resume: {name} {said}"
