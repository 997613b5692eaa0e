"""analysis.search: the best configuration per data setting of a study with a selection stage
(Optuna search or ASHA), its LaTeX table, the search-history figure and the hooks in
analysis.tables / analysis.plots, on hand-made trials (no Ray)."""
from __future__ import annotations

import matplotlib.image
import numpy as np
import pandas as pd
import pytest

from analysis import common, search
from analysis.plots import build_plots
from analysis.tables import build_tables

from table_helpers import body_rows

ROUNDS = 5
DIR, SHARDS = "synthetic, Dir(0.1)", "synthetic, 3 shards"
# (pers_rate, pers_limit, status, validation accuracy) of each select trial, in start order. In
# Dir(0.1) the stopped trial has the highest value and must never be chosen; the best completed is
# p = 0.5, α = 0.7. The validation accuracy follows p closely and α hardly at all.
SELECT = {
    DIR: [(0.1, 0.5, "COMPLETED", 0.50), (0.9, 0.6, "STOPPED", 0.99), (0.5, 0.7, "COMPLETED", 0.80),
          (0.3, 0.9, "COMPLETED", 0.62), (0.2, 0.3, "STOPPED", 0.41), (0.45, 0.2, "COMPLETED", 0.78),
          (0.05, 0.8, "COMPLETED", 0.47), (0.35, 0.4, "COMPLETED", 0.69), (0.15, 0.6, "COMPLETED", 0.55),
          (0.25, 0.1, "COMPLETED", 0.60), (0.4, 0.5, "COMPLETED", 0.74), (0.5, 0.7, "ERROR", np.nan)],
    SHARDS: [(0.2, 0.4, "COMPLETED", 0.70), (0.6, 0.8, "COMPLETED", 0.75), (0.7, 0.2, "STOPPED", 0.90),
             (0.6, 0.5, "COMPLETED", 0.75)],   # a tie: the first started wins
}
BEST = {DIR: (0.5, 0.7), SHARDS: (0.6, 0.8)}
DATA = {DIR: {"partition": "dirichlet", "dir_alpha": 0.1, "shards_per_client": 2},
        SHARDS: {"partition": "shards", "dir_alpha": 0.5, "shards_per_client": 3}}


def row(setting, stage, seed, algorithm="fedselect", p=np.nan, a=np.nan, status="COMPLETED", val=np.nan,
        acc=0.5, done=ROUNDS, objective="acc_val_mean"):
    method = {"fedselect": "FedSelect", "fedavg": "FedAvg", "local": "Local"}[algorithm]
    return {"algorithm": algorithm, "dataset": "synthetic", **DATA[setting], "local_epochs": 1, "lr": 0.05,
            "rounds": ROUNDS, "pers_rate": p, "pers_limit": a, "seed": seed, "stage": stage, "objective": objective,
            "status": status, "rounds_done": done if status == "COMPLETED" else 2, "acc_mean": acc,
            "acc_val_mean": val, "method": method, "setting": setting, "mb_total": 1.0}


def study(objective="acc_val_mean", confirm=True) -> pd.DataFrame:
    """Select trials on seed 0, the best configuration confirmed on seeds 1 and 2, FedAvg and Local
    anchors on seeds 0-2; test accuracy differs by setting, seed and method."""
    rng = np.random.default_rng(0)
    rows = []
    for setting, trials in SELECT.items():
        for p, a, status, val in trials:
            rows.append(row(setting, "select", 0, p=p, a=a, status=status, val=val, acc=val - 0.05,
                            objective=objective))
        for seed in (1, 2) if confirm else ():
            rows.append(row(setting, "confirm", seed, p=BEST[setting][0], a=BEST[setting][1],
                            acc=rng.uniform(0.6, 0.9), val=rng.uniform(0.6, 0.9), objective=objective))
        for algorithm in ("fedavg", "local"):
            for seed in (0, 1, 2):
                rows.append(row(setting, "anchor", seed, algorithm, acc=rng.uniform(0.2, 0.6), objective=objective))
    frame = pd.DataFrame(rows)
    frame["started_at"] = np.arange(len(frame), dtype=float)
    frame["trial_id"] = [f"t{i:03d}" for i in range(len(frame))]
    frame["config_hash"] = [f"{i:012x}" for i in range(len(frame))]
    return frame


def confirmed(trials, setting):
    p, a = BEST[setting]
    mine = (trials["setting"] == setting) & (trials["pers_rate"] == p) & (trials["pers_limit"] == a)
    chosen_select = (trials["stage"] == "select") & (trials["status"] == "COMPLETED")
    return trials[mine & ((trials["stage"] == "confirm") | chosen_select)]


def test_selection_rows_and_searched_knobs():
    trials = study()
    select = common.selection_rows(trials)
    assert len(select) == sum(map(len, SELECT.values())) and (select["stage"] == "select").all()
    assert set(search.searched_knobs(select)) == {"pers_rate", "pers_limit"}
    assert common.selection_rows(trials.drop(columns="stage")).empty


def test_the_best_is_the_best_completed_trial_never_a_stopped_one():
    best = search.best_per_cell(study()).set_index("setting")
    assert list(best.index) == [SHARDS, DIR]  # the tables' order of data settings: shards first
    dirichlet = best.loc[DIR]
    assert (dirichlet["pers_rate"], dirichlet["pers_limit"]) == BEST[DIR]  # not the stopped p = 0.9 (0.99)
    assert dirichlet["objective"] == "acc_val_mean" and dirichlet["objective_value"] == pytest.approx(0.80)
    assert dirichlet["select_acc"] == pytest.approx(0.75)
    assert (dirichlet["trials"], dirichlet["completed"], dirichlet["stopped"]) == (12, 9, 2)
    assert (best.loc[SHARDS, "pers_rate"], best.loc[SHARDS, "pers_limit"]) == BEST[SHARDS]  # tie: first started


def test_confirmed_and_anchor_numbers_are_over_the_same_seeds():
    trials = study()
    best = search.best_per_cell(trials).set_index("setting")
    for setting in (DIR, SHARDS):
        runs = confirmed(trials, setting)
        assert sorted(runs["seed"]) == [0, 1, 2]
        assert best.loc[setting, "selected_mean"] == pytest.approx(np.mean(runs["acc_mean"]))
        assert best.loc[setting, "selected_std"] == pytest.approx(np.std(runs["acc_mean"], ddof=1))
        fedavg = trials[(trials["setting"] == setting) & (trials["method"] == "FedAvg")]["acc_mean"]
        assert best.loc[setting, "FedAvg_mean"] == pytest.approx(np.mean(fedavg))
        assert best.loc[setting, "FedAvg_std"] == pytest.approx(np.std(fedavg, ddof=1))
        assert not best.loc[setting, ["selected_marked", "FedAvg_marked", "Local_marked"]].any()
    latex = search.search_table_latex(best.reset_index(), "acc_val_mean")
    assert r"$^\dagger$" not in latex and "seeds 0--2" in latex


def test_a_missing_or_unfinished_anchor_seed_marks_its_value():
    trials = study()
    gone = (trials["setting"] == SHARDS) & (trials["method"] == "FedAvg") & (trials["seed"] == 2)
    late = (trials["setting"] == DIR) & (trials["method"] == "Local") & (trials["seed"] == 1)
    trials.loc[late, ["status", "rounds_done"]] = ["STOPPED", 3]
    best = search.best_per_cell(trials[~gone])
    indexed = best.set_index("setting")
    assert indexed.loc[SHARDS, "FedAvg_marked"] and indexed.loc[SHARDS, "FedAvg_n"] == 2
    assert indexed.loc[DIR, "Local_marked"] and not indexed.loc[DIR, "FedAvg_marked"]
    assert not indexed[["selected_marked"]].any().any()
    rows = body_rows(search.search_table_latex(best, "acc_val_mean"))
    assert rows[SHARDS][-2].endswith(r"$^\dagger$ (n=2)") and rows[DIR][-1].count(r"$^\dagger$") == 1
    latex = search.search_table_latex(best, "acc_val_mean")
    assert "FedAvg: seeds 0, 1 of 0--2" in latex and "round 3 of 5" in latex


@pytest.mark.parametrize("objective", ["acc_val_mean", "acc_mean"])
def test_the_caption_names_what_was_selected_on(objective):
    trials = study(objective=objective)
    latex = search.search_table_latex(search.best_per_cell(trials), objective)
    assert objective.replace("_", r"\_") in latex and "seed 0" in latex and "final round" in latex
    if objective == "acc_mean":
        assert "test accuracy" in latex and "optimistic" in latex
    else:
        assert "validation accuracy" in latex and "optimistic" not in latex


def test_without_confirmation_runs_only_the_selection_is_shown():
    best = search.best_per_cell(study(confirm=False))
    assert "selected_mean" not in best and "FedAvg_mean" not in best
    assert "no confirmation runs" in search.search_table_latex(best, "acc_val_mean")


def test_importance_with_two_searched_knobs_and_why_not_otherwise():
    select = common.selection_rows(study())
    dirichlet = select[select["setting"] == DIR]
    shares, why = search.param_importances(dirichlet, ["pers_rate", "pers_limit"], "acc_val_mean")
    assert why == "" and set(shares) == {"pers_rate", "pers_limit"}
    assert sum(shares.values()) == pytest.approx(1.0) and shares["pers_rate"] > shares["pers_limit"]
    assert search.param_importances(dirichlet, ["pers_rate"], "acc_val_mean")[0] == {}
    shares, why = search.param_importances(dirichlet.iloc[:1], ["pers_rate", "pers_limit"], "acc_val_mean")
    assert shares == {} and "1 completed trial" in why


def _written(path):
    assert path.exists() and path.stat().st_size > 0
    if path.suffix == ".png":
        assert matplotlib.image.imread(path)[..., :3].std() > 0.01


def test_build_search_outputs_and_the_hooks(tmp_path, capsys):
    sweep = tmp_path / "search"
    sweep.mkdir()
    trials = study()
    trials.to_parquet(sweep / "trials.parquet", index=False)
    paths = search.build_search_outputs(sweep)
    assert [p.relative_to(sweep).as_posix() for p in paths] == \
        ["tables/search_best.tex", "figures/search_history.png", "figures/search_history.pdf"]
    for path in paths:
        _written(path)

    tables = build_tables([sweep], out=tmp_path / "tables")
    assert set(tables) == {"search_best", "methods"}  # no float-keyed grid, limit or ablation tables
    methods = body_rows(tables["methods"].read_text())
    runs = confirmed(trials, DIR)["acc_mean"]   # FedSelect = the chosen configuration's three seeds
    dir_column = 1  # columns: shards, then Dir(0.1)
    assert methods["FedSelect"][dir_column].replace(r"\bfseries ", "") == \
        f"{100 * runs.mean():.1f} $\\pm$ {100 * runs.std(ddof=1):.1f}"

    figures = build_plots([sweep], tmp_path / "figures")
    assert {p.name for p in figures} >= {"search_history.png", "search_history.pdf"}
    assert not any(p.name.startswith("final_acc_vs_knobs") for p in figures)


def test_a_plain_grid_has_no_search_outputs(tmp_path):
    sweep = tmp_path / "grid"
    sweep.mkdir()
    study().assign(stage="grid").to_parquet(sweep / "trials.parquet", index=False)
    assert search.build_search_outputs(sweep) == []


def test_local_epochs_crossed_with_the_search_are_a_cell_axis_not_a_knob():
    one, two = study(), study().assign(local_epochs=2)
    two["config_hash"] = "e2" + two["config_hash"].str[2:]
    trials = pd.concat([one, two], ignore_index=True)
    best = search.best_per_cell(trials)
    assert search.cell_columns(trials) == ["setting", "local_epochs"] and len(best) == 4
    assert set(search.searched_knobs(common.selection_rows(trials), ["setting", "local_epochs"])) == \
        {"pers_rate", "pers_limit"}
    assert (best["selected_n"] == 3).all() and not best["FedAvg_marked"].any()
    rows = body_rows(search.search_table_latex(best, "acc_val_mean"))
    assert set(rows) == {f"{s}, E{e}" for s in (DIR, SHARDS) for e in (1, 2)}


def test_final_rows_keep_only_the_chosen_select_run():
    trials = study()
    final = common.final_rows(trials)
    kept = final[final["stage"] == "select"]
    # one select run per setting: the chosen configuration's seed 0 (not the failed repeat of p = 0.5, α = 0.7)
    assert sorted(zip(kept["setting"], kept["pers_rate"], kept["pers_limit"], kept["status"])) == \
        [(SHARDS, *BEST[SHARDS], "COMPLETED"), (DIR, *BEST[DIR], "COMPLETED")]
    assert len(final) == len(trials) - len(common.selection_rows(trials)) + 2
    assert len(common.final_rows(trials.drop(columns="stage"))) == len(trials)  # no stages: every row


def test_a_cell_whose_select_trials_all_stopped_has_no_choice(tmp_path):
    trials = study()
    stopped = (trials["setting"] == SHARDS) & (trials["stage"] == "select")
    trials.loc[stopped, ["status", "rounds_done"]] = ["STOPPED", 2]
    best = search.best_per_cell(trials).set_index("setting")
    assert pd.isna(best.loc[SHARDS, "method"]) and best.loc[SHARDS, "stopped"] == 4
    assert best.loc[DIR, "method"] == "FedSelect"
    latex = search.search_table_latex(best.reset_index(), "acc_val_mean")
    assert f"No completed selection trial: {SHARDS}." in latex and r"$^\dagger$" not in latex
    assert [p.name for p in search.plot_search(trials, tmp_path)] == ["search_history.png", "search_history.pdf"]


def test_a_tuned_study_gets_one_row_per_method_searched_in_a_setting():
    """Under `tune` every method has its own select stage: its best is chosen among its own trials
    (FedAvg's lr 0.2 here, though a FedSelect trial has a higher validation accuracy)."""
    trials = study()
    fedavg = [row(SHARDS, "select", 0, "fedavg", val=v, acc=v - 0.05) | {"lr": lr}
              for lr, v in ((0.01, 0.60), (0.2, 0.72), (0.05, 0.65))]
    fedavg = pd.DataFrame(fedavg).assign(started_at=1000.0 + np.arange(3), trial_id=["f0", "f1", "f2"],
                                         config_hash=["fa0", "fa1", "fa2"])
    best = search.best_per_cell(pd.concat([trials, fedavg], ignore_index=True))
    shards = best[best["setting"] == SHARDS].set_index("method")
    assert sorted(shards.index) == ["FedAvg", "FedSelect"]
    assert shards.at["FedAvg", "lr"] == 0.2 and shards.at["FedAvg", "trials"] == 3
    assert (shards.at["FedSelect", "pers_rate"], shards.at["FedSelect", "pers_limit"]) == BEST[SHARDS]
    assert shards.at["FedSelect", "trials"] == len(SELECT[SHARDS])
    assert list(best[best["setting"] == DIR]["method"]) == ["FedSelect"]  # one method searched there
    page = search.search_table_markdown(best, "acc_val_mean")
    assert f"| {SHARDS} | FedSelect |" in page and "|  | FedAvg |" in page   # the setting's label once
    table = page.split("\n\n")[1]                                                  # after its caption
    assert table.startswith("| data setting | method |") and table.count("\n| ") == len(best)  # a row per method


def test_the_markdown_twin_is_written_beside_the_latex_and_bolds_nothing_without_a_row_to_compare(tmp_path):
    trials = study()
    only = trials[trials["stage"] != "anchor"]  # the selected configuration alone in each row
    search.write_search_table(only, tmp_path, markdown=True)
    page = (tmp_path / "search_best.md").read_text()
    assert (tmp_path / "search_best.tex").is_file() and "**" not in page and "best of each row" not in page
    search.write_search_table(trials, tmp_path, markdown=True)
    assert "**" in (tmp_path / "search_best.md").read_text()   # beside the anchors the best is bold
