"""`[search] tune`: every compared method searched in its declared space with the same budget on a
seed of its own, its selected configuration confirmed on the study's seeds. The spec checks run
without Ray; one end-to-end sweep on digits (slow) checks the budgets, that no confirm seed was
searched, and that selection never read a test column."""
from __future__ import annotations

import pandas as pd
import pytest

from analysis.common import chosen_trials, final_rows
from fl_core.config import RunConfig, search_space
from sweeps.errors import SweepError
from sweeps.run import main as run_main
from sweeps.spec import Range, parse_spec, resolved, to_toml
from sweeps.stages import best_completed, plan_stages

SEEDS = [0, 1, 2, 3, 4]
KNOBS = {"dataset": "digits", "partition": "dirichlet", "dir_alpha": 0.5, "num_clients": 3, "rounds": 2,
         "val_fraction": 0.2, "batch_size": 16}


def spec_of(search=None, methods=None, knobs=None, seeds=SEEDS):
    methods = methods or [{"algorithm": "fedselect"}, {"algorithm": "fedavg"}, {"algorithm": "local"}]
    return parse_spec({"name": "tuned", "seeds": seeds, "search": {"tune": "all", "num_samples": 2} | (search or {}),
                       "knobs": KNOBS | (knobs or {}), "methods": methods})


def test_every_method_gets_its_declared_space_and_the_same_budget_on_the_search_seed():
    spec = resolved(spec_of(methods=[{"algorithm": "fedselect", "pers_limit": 0.5}, {"algorithm": "fedavg"},
                                     {"algorithm": "ditto", "fixed": True}]))
    assert spec.search == "optuna"   # tune samples configurations
    stages = plan_stages(spec)
    assert [s.kind for s in stages] == ["anchor", "select", "select"]
    fedselect, fedavg = (s.domains for s in stages[1:])
    assert fedavg == {"lr": Range(0.01, 0.3, True)}               # FedAvg searched like everyone else
    assert fedselect == {"lr": Range(0.01, 0.3, True), "pers_rate": Range(0.05, 0.6)}  # its entry fixed pers_limit
    assert {c.seed for s in stages[1:] for _, c in s.configs} == {1000}
    assert [(c.algorithm, c.seed) for _, c in stages[0].configs] == [("ditto", s) for s in SEEDS]  # as declared
    assert stages[1].configs[0][1].pers_limit == 0.5
    again = parse_spec(__import__("tomllib").loads(to_toml(spec)), "again")   # the saved copy plans the same
    assert [(s.name, s.domains) for s in plan_stages(again)] == [(s.name, s.domains) for s in stages]


def test_declared_spaces_name_their_source():
    spaces = search_space("ditto")
    assert set(spaces) == {"lr", "ditto_lambda"} and spaces["ditto_lambda"].choices == (0.1, 1.0, 2.0)
    assert all(s.source for a in ("fedselect", "fedprox", "pfedme", "apfl") for s in search_space(a).values())


def test_fine_tuning_methods_search_their_fine_tuning_rate_over_fedl2ps_grid_and_fedl2p_its_meta_rates():
    def bounds(space):
        return space.low, space.high, space.log

    ft, fedl2p = search_space("ft"), search_space("fedl2p")
    assert list(ft) == ["lr"] and bounds(ft["lr"]) == bounds(fedl2p["lr"]) == (1e-5, 1.0, True)  # {1, ..., 1e-5}
    assert bounds(search_space("fedavg")["lr"]) == (0.01, 0.3, True)       # every other method: training rates
    assert [bounds(fedl2p[k]) for k in ("meta_lr_bn", "meta_lr_lr", "meta_lr_post")] == [
        (1e-3, 1e-1, True), (1e-3, 1e-1, True), (1e-4, 1e-2, True)]       # the paper's zeta up to 100 x


@pytest.mark.parametrize("change, needle", [
    ({"seeds": [0, 1, 2]}, "needs at least 5; got seeds = [0, 1, 2]"),
    ({"search": {"seed": 3}}, "[search] seed = 3: the search runs on a seed of its own"),
    ({"search": {"kind": "grid"}}, "kind = \"optuna\" (its default), not 'grid'"),
    ({"search": {"tune": ["fedprox"]}}, "tune names fedprox, which the study does not run"),
    ({"search": {"tune": "everything"}}, "'everything' is not an algorithm"),
    ({"knobs": {"lr": 0.05}}, "lr = 0.05 in [knobs], but [search] tune searches fedselect's lr"),
    ({"methods": [{"algorithm": "fedavg", "anchor": True}, {"algorithm": "local"}]}, "write `fixed = true`"),
])
def test_bad_tuned_studies_fail_with_one_error(change, needle):
    with pytest.raises(SweepError) as err:
        spec_of(**change)
    assert needle in str(err.value)


def test_selection_reads_the_objective_never_test_accuracy():
    a, b = RunConfig(val_fraction=0.2, rounds=2), RunConfig(val_fraction=0.2, rounds=2, lr=0.05)
    better_on_test = {"round": 2, "objective": 0.5, "acc_mean": 0.99}
    assert best_completed([(a, better_on_test), (b, {"round": 2, "objective": 0.6, "acc_mean": 0.1})]) == b
    diverged = {"round": 2, "objective": 0.9, "diverged": True}  # a search never selects a diverged run
    assert best_completed([(a, diverged), (b, {"round": 2, "objective": 0.6})]) == b


def test_a_plain_search_study_also_keeps_its_search_seed_apart():
    with pytest.raises(SweepError, match="outside the study's seeds"):
        parse_spec({"name": "s", "seeds": [0, 1000], "search": {"kind": "optuna"}, "knobs": {"val_fraction": 0.1},
                    "methods": [{"algorithm": "fedavg", "lr": {"low": 0.01, "high": 0.1}}]})


@pytest.mark.slow
def test_tuned_study_end_to_end_on_digits(ray_cluster, tmp_path, capsys):
    study = tmp_path / "tuned.toml"
    study.write_text(to_toml(spec_of(search={"scheduler": "asha", "seed": 100},
                                     methods=[{"algorithm": "fedselect"}, {"algorithm": "fedavg"},
                                              {"algorithm": "local"}, {"algorithm": "ditto", "fixed": True}])))
    code = run_main([str(study), "--results", str(tmp_path), "--name", "t", "--verbose", "0"])
    out = capsys.readouterr().out
    assert code == 0
    assert ("tuned alike: fedavg, fedselect, local, each with 2 Optuna configurations under ASHA per data setting, "
            "on search seed 100 (never reported), by validation accuracy; confirmed on seeds 0, 1, 2, 3, 4; run as "
            "declared: ditto") in out
    trials = pd.read_parquet(tmp_path / "t" / "trials.parquet")
    select, confirm = trials[trials.stage == "select"], trials[trials.stage == "confirm"]
    assert select.groupby("algorithm").size().to_dict() == {"fedavg": 2, "fedselect": 2, "local": 2}  # equal budgets
    assert select.lr.between(0.01, 0.3).all() and select.pers_rate.dropna().between(0.05, 0.6).all()
    assert set(select.seed) == {100} and set(confirm.seed) == set(SEEDS)          # no confirm seed was searched
    assert confirm.groupby("algorithm").size().to_dict() == {"fedavg": 5, "fedselect": 5, "local": 5}
    assert (trials[trials.stage == "anchor"].algorithm == "ditto").all()
    for algorithm, rows in select.groupby("algorithm"):
        done = rows[rows.status == "COMPLETED"]
        best = done.sort_values(["acc_val_mean", "config_hash"], ascending=[False, True]).iloc[0]
        assert rows.loc[rows.selected, "config_hash"].tolist() == [best.config_hash]
        assert set(confirm.loc[confirm.algorithm == algorithm, "lr"]) == {best.lr}
    # selection never reads a test column: scrambling the select runs' test accuracies changes nothing
    scrambled = trials.copy()
    scrambled.loc[select.index, "acc_mean"] = 1.0 - scrambled.loc[select.index, "acc_mean"]
    chosen = [set(chosen_trials(final_rows(t)).config_hash) for t in (trials, scrambled)]
    assert chosen[0] == chosen[1] and not chosen[0] & set(select.config_hash)   # results: confirm runs only
    methods = (tmp_path / "t" / "tables" / "methods.md").read_text()
    assert ("Tuned alike on validation accuracy, 2 configurations per data setting on search seed 100 (never "
            "reported): FedSelect, FedAvg, Local. Run as declared (not tuned): Ditto.") in methods


def test_tune_on_the_command_line_tunes_the_files_anchors_too_unless_anchors_are_named():
    from sweeps.spec import load_spec, with_overrides

    spec = load_spec("studies/fedselect_optuna.toml")           # FedAvg and Local are its anchors
    tuned = with_overrides(spec, {}, tune=["all"], seeds=SEEDS)
    assert not any(m.anchor for m in tuned.methods) and tuned.search == "optuna"
    kept = with_overrides(spec, {}, tune=["all"], seeds=SEEDS, anchors=["local"])
    assert [(m.algorithm, m.anchor) for m in kept.methods] == [("fedselect", False), ("local", True)]


def test_a_list_in_knobs_is_a_setting_of_its_own_under_tune_never_a_search_dimension():
    spec = resolved(spec_of(methods=[{"algorithm": "fedavg"}, {"algorithm": "local"}],
                            knobs={"participation": [1.0, 0.5], "local_epochs": [1, 2]}))
    stages = plan_stages(spec)
    selects = [s for s in stages if s.kind == "select"]
    assert len(selects) == 2 * 2 * 2                      # (participation, epochs) x method, each searched apart
    assert all(s.domains == {"lr": Range(0.01, 0.3, True)} for s in selects)   # the axes are never searched
    assert {(c.participation, c.local_epochs) for s in selects for _, c in s.configs} == {
        (1.0, 1), (1.0, 2), (0.5, 1), (0.5, 2)}
    groups = [s.group for s in selects]
    assert len(set(groups)) == len(groups)
    assert "digits, Dir(0.5), c = 0.5, local_epochs = 2 / FedAvg" in groups
