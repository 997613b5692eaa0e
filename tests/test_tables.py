"""analysis.tables: the paper's LaTeX tables from sweep results.

The first tests use hand-made trial frames, then a sweep folder written in the layout of engine v1
and small sweeps of round rows with a trial that stopped early (no Ray); the rest read a real
small baselines sweep (slow).
"""
from __future__ import annotations

import re

import numpy as np
import pandas as pd
import pytest

from analysis import tables
from analysis.load import load_rounds, load_trials, reported_rounds, unfinished
from analysis.stats import final_accuracies, load_final_accuracies
from fl_core.results import round_rows
from fl_core.simulation import Simulation
from sweeps import parquet_sink

from conftest import tiny
from sweep_helpers import V1_FINAL_ACC, write_v1_sweep
from table_helpers import FINISHED_LATEX, SWEEP_ACC, body_rows, header, trial, write_sweep

slow = pytest.mark.slow


# ----------------------------------------------------------------------------- hand-made frames

@pytest.fixture
def handmade() -> pd.DataFrame:
    rows = [trial("fedselect", s, a) for s, a in enumerate([0.80, 0.70, 0.75])]
    rows += [trial("fedselect", s, a, partition="dirichlet") for s, a in enumerate([0.60, 0.62, 0.64])]
    rows += [trial("fedavg", s, a) for s, a in enumerate([0.30, 0.40, 0.35])]
    rows += [trial("fedavg", s, a, partition="dirichlet") for s, a in enumerate([0.66, 0.70])]  # 2 seeds only
    rows += [trial("local", s, a) for s, a in enumerate([0.50, 0.55, 0.45])]                   # no dirichlet
    rows += [trial("local", 3, 0.99, status="ERROR"), trial("fedavg", 4, 0.99, status="TERMINATED")]
    return pd.DataFrame(rows)


def test_format_cell():
    assert tables.format_cell(0.8123, 0.0456, 3, 3) == "81.2 ± 4.6"
    assert tables.format_cell(0.8123, float("nan"), 1, 1) == "81.2"          # one seed: just the mean
    assert tables.format_cell(0.8123, 0.01, 2, 3, pm="$\\pm$") == "81.2 $\\pm$ 1.0 (n=2)"
    assert tables.format_cell(float("nan"), float("nan"), 0, 3) is None


def test_methods_table_numbers_missing_cell_and_counts(handmade):
    table = tables.methods_table(handmade, "drop")
    assert list(table.mean.index) == ["FedSelect", "FedAvg", "Local"]
    assert list(table.mean.columns) == ["synthetic, 3 shards", "synthetic, Dir(0.3)"]
    # drop: only finished trials count; the ERROR/TERMINATED 0.99s are left out, and the caption says so
    assert table.n.loc["Local", "synthetic, 3 shards"] == 3
    assert table.marked is None and "Left out: 2 runs that did not finish" in table.full_caption()
    assert table.n.loc["Local", "synthetic, Dir(0.3)"] == 0
    assert table.mean.loc["FedAvg", "synthetic, Dir(0.3)"] == pytest.approx(0.68)
    assert table.std.loc["FedSelect", "synthetic, 3 shards"] == pytest.approx(pd.Series([.8, .7, .75]).std())

    cells = table.cells()
    assert cells.loc["FedSelect", "synthetic, 3 shards"] == "75.0 ± 5.0"
    assert cells.loc["FedAvg", "synthetic, Dir(0.3)"] == "68.0 ± 2.8 (n=2)"   # differs from the usual 3
    assert cells.loc["Local", "synthetic, Dir(0.3)"] is None

    latex = tables.to_latex(table)
    rows = body_rows(latex)
    assert rows["Local"][1] == "--"                                          # missing, not 0
    assert "0.0" not in rows["Local"][1]
    assert rows["FedAvg"][1] == "\\bfseries 68.0 $\\pm$ 2.8 (n=2)"           # best of its column
    assert rows["FedSelect"][0].startswith("\\bfseries 75.0")
    assert "unless marked (n=k)" in latex
    assert "Local" in tables.preview(table) and "--" in tables.preview(table)


def test_a_cell_with_two_configurations_shows_the_chosen_one_and_says_so(handmade):
    """Two learning rates of FedAvg on one setting: never pooled into one mean over 6 runs, and
    never chosen by test accuracy: without a validation split the declared one (the first of the
    grid, lr 0.02, whether it scores worse or better), with one the better validation accuracy."""
    finished = handmade[handmade["status"] == "COMPLETED"]  # 3 seeds of each learning rate: a tie
    rows = finished.assign(lr=0.1, config_hash=[f"h{i}" for i in range(len(finished))])
    for other, mean in (([0.10, 0.12, 0.11], 0.11), ([0.90, 0.92, 0.91], 0.91)):
        runs = pd.DataFrame([trial("fedavg", s, a) | {"lr": 0.02, "config_hash": f"w{s}"} for s, a in enumerate(other)])
        table = tables.methods_table(pd.concat([rows, runs], ignore_index=True), "drop")
        assert table.n.loc["FedAvg", "synthetic, 3 shards"] == 3
        assert table.mean.loc["FedAvg", "synthetic, 3 shards"] == pytest.approx(mean)  # lr 0.02's seeds only
        assert table.mean.loc["FedSelect", "synthetic, 3 shards"] == pytest.approx(0.75)  # one configuration
        assert ("FedAvg in synthetic, 3 shards: at lr = 0.02, chosen among its 2 configurations as the declared one"
                in table.full_caption())
    validated = pd.concat([rows.assign(acc_val_mean=0.5), runs.assign(acc_val_mean=0.4)], ignore_index=True)
    table = tables.methods_table(validated, "drop")
    assert table.mean.loc["FedAvg", "synthetic, 3 shards"] == pytest.approx(0.35)  # lr 0.1: better on validation
    assert "at lr = 0.1, chosen among its 2 configurations as the best mean validation accuracy" in table.full_caption()


def test_uniform_seed_counts_go_in_the_caption(handmade):
    table = tables.methods_table(handmade[(handmade["partition"] == "shards") & (handmade["status"] == "COMPLETED")])
    assert "3 seeds per cell)" in table.full_caption()
    assert "(n=" not in tables.to_latex(table).split("\\midrule")[1]


def test_ties_are_all_bold_and_nan_is_never_best():
    frame = pd.DataFrame([trial("fedselect", 0, 0.5), trial("fedavg", 0, 0.50004), trial("local", 0, 0.2),
                          trial("local", 0, 0.9, partition="dirichlet")])
    best = tables.methods_table(frame).best_mask()
    assert best["synthetic, 3 shards"].tolist() == [True, True, False]
    assert best["synthetic, Dir(0.3)"].tolist() == [False, False, True]


def test_combined_sweeps_at_other_local_epochs_keep_every_method_and_say_so():
    # two sweeps combined: FedAvg only at 1 epoch, FedSelect and Local only at 2 (the most common)
    rows = [trial("fedavg", s, 0.5) for s in range(3)] + [trial("fedselect", s, 0.7, epochs=2) for s in range(2)]
    rows += [trial("local", s, 0.6, epochs=2) for s in range(2)]
    table = tables.methods_table(pd.DataFrame(rows))
    assert set(table.mean.index) == {"FedAvg", "FedSelect", "Local"}
    assert "Local epochs = 2 (FedAvg at 1: never run at 2)." in table.full_caption()


def test_limit_table_uses_the_most_common_p_and_epochs():
    rows = [trial(pers_rate=0.25, pers_limit=a, seed=s, acc=a / 2) for a in (0.2, 0.5, 0.8) for s in (0, 1)]
    rows += [trial(pers_rate=0.5, pers_limit=0.5, seed=0, acc=0.99)]                 # a rarer p: left out
    rows += [trial(variant="random", pers_limit=0.5, seed=0, acc=0.98)]             # not gradselect
    rows += [trial("fedavg", acc=0.97)]
    table = tables.limit_table(pd.DataFrame(rows))
    assert list(table.mean.index) == ["0.2", "0.5", "0.8"]
    assert table.mean["synthetic, 3 shards"].tolist() == pytest.approx([0.1, 0.25, 0.4])
    assert "p = 0.25" in table.caption and "local epochs = 1" in table.caption
    assert "$\\alpha$ &" in tables.to_latex(table)


def test_ablation_and_grid_tables():
    rows = [trial(variant=v, block=b, seed=s, acc=0.1 * i + 0.01 * s)
            for i, (v, b) in enumerate([("gradselect", None), ("layer", "A"), ("random", None)]) for s in (0, 1)]
    rows += [trial(pers_rate=p, pers_limit=a, seed=0, acc=p * a) for p in (0.1, 0.5) for a in (0.3, 0.9)]
    frame = pd.DataFrame(rows)
    ablation = tables.ablation_table(frame)
    assert list(ablation.mean.index) == ["FedSelect", "FedSelect (layer A)", "FedSelect (random)"]
    grids = tables.grid_tables(frame)
    assert list(grids) == ["grid_synthetic_3_shards_e1"]
    grid = grids["grid_synthetic_3_shards_e1"]
    assert list(grid.mean.index) == ["0.1", "0.25", "0.5"]
    assert list(grid.mean.columns) == ["α = 0.3", "α = 0.8", "α = 0.9"]
    assert grid.n.loc["0.1", "α = 0.8"] == 0
    assert grid.best_mask().to_numpy().sum() == 1 and grid.best_mask().loc["0.5", "α = 0.9"]


def test_auto_selection(handmade):
    assert tables.supported(tables.counted(handmade)) == ["methods"]
    grid = pd.DataFrame([trial(pers_rate=p, pers_limit=a) for p in (0.1, 0.5) for a in (0.3, 0.9)]
                        + [trial(variant="random")])
    assert tables.supported(tables.counted(grid)) == ["limit", "ablation", "grid"]
    with pytest.raises(tables.TableError):
        tables.make_tables(handmade, "nonsense")
    failed = handmade.assign(status="ERROR")
    with pytest.raises(tables.TableError):
        tables.make_tables(failed, unfinished="drop")
    marked = tables.make_tables(failed)["methods"]                 # mark (the default): every cell daggered
    assert marked.marked.to_numpy().sum() == (marked.n > 0).to_numpy().sum() == 5


# ----------------------------------------------------------------------------- sweeps of engine v1

def test_v1_sweep_loads_with_labels_and_makes_its_table(tmp_path):
    written = write_v1_sweep(tmp_path / "old")
    rounds = load_rounds(tmp_path)                                   # a results folder holding the sweep
    assert len(rounds) == len(written) == 6 * 2 * 3
    assert (set(rounds["method"]) == {"FedSelect", "FedAvg", "Local"}
            and set(rounds["setting"]) == {"synthetic, 3 shards"})
    trials = load_trials(tmp_path / "old")
    assert len(trials) == 6 and "version" not in trials and trials["method"].notna().all()
    table = tables.methods_table(trials)
    assert list(table.mean.index) == ["FedSelect", "FedAvg", "Local"]
    column = "synthetic, 3 shards"
    assert table.mean.loc["FedSelect", column] == pytest.approx(0.85)       # seeds: 0.8 and 0.9
    assert table.std.loc["FedSelect", column] == pytest.approx(np.std([0.8, 0.9], ddof=1))
    assert table.cells().loc["FedSelect", column] == "85.0 ± 7.1"
    assert "FedSelect at p = 0.25, α = 0.8" in table.full_caption()    # anchors' fake p = 0 is not FedSelect's


def test_unfinished_v1_sweep_rebuilds_its_trials_from_rounds(tmp_path):
    write_v1_sweep(tmp_path / "old", with_trials=False)
    trials = load_trials(tmp_path / "old").set_index("config_hash")
    assert len(trials) == 6 and set(trials["status"]) == {"INCOMPLETE"} and (trials["rounds_done"] == 2).all()
    for n, ((algorithm, seed), final) in enumerate(V1_FINAL_ACC.items()):
        trial = trials.loc[f"{n:012x}"]                               # keeps the hash its rows carry
        assert (trial["algorithm"], trial["seed"]) == (algorithm, seed)
        assert trial["acc_mean"] == pytest.approx(np.mean(final))
        assert trial["acc_std"] == pytest.approx(np.std(final))        # over clients: ddof 0
        assert trial["mb_total"] == pytest.approx(2 * 3 * 2000 / 1e6)
        assert ("pers_rate" in trial and not pd.isna(trial["pers_rate"])) == (algorithm == "fedselect")
    assert tables.methods_table(trials.reset_index()).cells().loc["FedAvg", "synthetic, 3 shards"] == "45.0 ± 7.1"


def test_v1_and_v2_sweeps_load_together(tmp_path):
    """A results folder with an old sweep and a new one (rows of fl_core.results, compacted)."""
    write_v1_sweep(tmp_path / "old")
    config = tiny(algorithm="lotteryfl", num_clients=3, rounds=2)
    sim = Simulation(config)
    key = config.config_hash()
    for result in sim.run():
        rows = pd.DataFrame(round_rows(result, config, sim.model_name, sweep="new"))
        parquet_sink.write_round(tmp_path / "new", key, result.round, rows)
    parquet_sink.compact_trial(tmp_path / "new", key, 2)
    rounds = load_rounds(tmp_path)
    assert len(rounds) == 6 * 2 * 3 + 2 * 3
    new = rounds[rounds["config_hash"] == key]
    assert set(new["method"]) == {"LotteryFL"} and new["lottery_sparsity"].notna().all()
    assert rounds.loc[rounds["config_hash"] != key, "lottery_sparsity"].isna().all()
    trials = load_trials(tmp_path)
    assert set(trials["status"]) == {"COMPLETED", "INCOMPLETE"} and len(trials) == 7
    assert trials.loc[trials["config_hash"] == key, "version"].notna().all()


# ----------------------------------------------------------------------------- unfinished trials

def test_unfinished_trials_are_marked_by_default(handmade):
    table = tables.methods_table(handmade)                         # the ERROR and TERMINATED trials enter, marked
    assert table.n.loc["Local", "synthetic, 3 shards"] == 4
    cells = table.cells()
    assert cells.loc["Local", "synthetic, 3 shards"] == "62.3 ± 24.8† (n=4)"
    assert cells.loc["FedSelect", "synthetic, 3 shards"] == "75.0 ± 5.0"     # finished trials only: no mark
    assert "† = includes runs that did not finish" in table.full_caption()
    assert "round unknown for 2 runs" in table.full_caption()      # these frames carry no round columns


def test_a_cell_never_mixes_rounds_silently():
    """Finished seeds at round 20 and one stopped at round 7 of 20 share a cell only under a mark."""
    def at(algorithm, seed, acc, done=20):
        return trial(algorithm, seed, acc, status="COMPLETED" if done == 20 else "STOPPED") | \
            {"rounds": 20, "rounds_done": done}

    frame = pd.DataFrame([at("fedavg", 0, 0.8), at("fedavg", 1, 0.4, done=7), at("fedavg", 2, 0.6),
                          at("local", 0, 0.4), at("local", 1, 0.5), at("local", 2, 0.6),
                          at("fedselect", 0, 0.2), at("fedselect", 1, 0.3), at("fedselect", 2, 0.4)])
    marked = tables.methods_table(frame)
    assert marked.cells().loc["FedAvg", "synthetic, 3 shards"] == "60.0 ± 20.0†"
    assert marked.cells().loc["Local", "synthetic, 3 shards"] == "50.0 ± 10.0"
    assert marked.full_caption().endswith("each at the last round it reached: round 7 of 20.")
    latex = tables.to_latex(marked)
    assert body_rows(latex)["FedAvg"] == ["\\bfseries 60.0 $\\pm$ 20.0$^\\dagger$"]
    assert "$^\\dagger$ = includes runs that did not finish" in latex
    dropped = tables.methods_table(frame, "drop")
    assert dropped.cells().loc["FedAvg", "synthetic, 3 shards"] == "70.0 ± 14.1 (n=2)"
    assert dropped.full_caption().endswith("Left out: 1 run that did not finish (reached round 7 of 20).")
    assert "†" not in tables.preview(dropped) and "dagger" not in tables.to_latex(dropped)


def test_which_trials_are_unfinished():
    frame = pd.DataFrame({"status": ["COMPLETED", "COMPLETED", "INCOMPLETE", "INCOMPLETE", "STOPPED", "ERROR"],
                          "rounds_done": [5, 3, 5, 3, 5, np.nan], "rounds": [5, 5, 5, 5, 5, 5]})
    assert unfinished(frame).tolist() == [False, True, False, True, True, True]
    assert unfinished(frame[["status"]]).tolist() == [False, False, False, False, True, True]
    # the same run in two sweeps: its finished copy is the one that counts
    twice = pd.DataFrame([trial("fedavg", 0, 0.8) | {"config_hash": "a", "rounds": 5, "rounds_done": 5},
                          trial("fedavg", 0, 0.3, status="STOPPED") | {"config_hash": "a", "rounds": 5,
                                                                       "rounds_done": 2}])
    assert tables.counted(twice)["acc_mean"].tolist() == [0.8]
    with pytest.raises(tables.TableError):
        tables.counted(twice, "sometimes")


def test_finished_sweep_prints_as_before_in_both_modes(tmp_path):
    trials = load_trials(write_sweep(tmp_path / "done"))
    assert set(trials["status"]) == {"COMPLETED"} and (trials["rounds_done"] == 5).all()
    for mode in tables.UNFINISHED:
        table = tables.make_tables(trials, "methods", mode)["methods"]
        assert tables.to_latex(table) == FINISHED_LATEX
        assert table.marked is None and table.footnote == ""


# FedSelect and FedAvg over 5 seeds, FedSelect 40 points above on every client (39 on odd seeds); Local one seed
FIVE_SEEDS = {("local", 0): [0.7, 0.7, 0.7]} | {
    (algorithm, s): [v + 0.02 * s + (0.01 * (s % 2) if algorithm == "fedavg" else 0.0) for v in final]
    for s in range(5) for algorithm, final in (("fedselect", [0.9, 0.8, 0.7]), ("fedavg", [0.5, 0.4, 0.3]))}


@pytest.mark.parametrize("with_trials", [True, False], ids=["trials.parquet", "rows only"])
def test_unfinished_sweep_marks_its_cells(tmp_path, capsys, with_trials):
    """Local (one seed) stopped at round 3 of 5: by its status, or, without trials.parquet (a
    crashed sweep), by its last round against its configured `rounds`."""
    sweep = write_sweep(tmp_path / "s", stopped={("local", 0): 3}, with_trials=with_trials, acc=FIVE_SEEDS)
    trials = load_trials(sweep)
    assert set(trials["status"]) == ({"COMPLETED", "STOPPED"} if with_trials else {"INCOMPLETE"})
    assert unfinished(trials).sum() == 1

    assert tables.main([str(sweep), "--table", "methods", "--out", str(tmp_path / "t")]) == 0
    latex = (tmp_path / "t" / "methods.tex").read_text()
    rows = body_rows(latex)
    # FedSelect against FedAvg: a paired t-test over their 5 seeds, marked; Local shares one seed with
    # each: no test, no mark, and not bold as it prints less than the best
    assert rows["Local"] == ["60.0$^\\dagger$ (n=1)"]                    # its round-3 accuracy, marked
    assert rows["FedSelect"] == ["\\bfseries 84.0 $\\pm$ 3.2$^{\\blacktriangle}$"]
    assert rows["FedAvg"] == ["44.4 $\\pm$ 3.2"]                          # significantly worse than the best
    assert "paired t-test on the per-seed mean accuracies over 5 common seeds" in latex
    assert "Other pairs of cells share fewer than 5 seeds (1 in common): no test and no mark" in latex
    assert latex.count("$^\\dagger$") == 2                             # the cell and the caption
    assert ("$^\\dagger$ = includes runs that did not finish (stopped early, failed or still running), "
            "each at the last round it reached: round 3 of 5.\\par}") in latex
    out = capsys.readouterr().out
    assert "60.0† (n=1)" in out and "† = includes runs that did not finish" in out

    assert tables.main([str(sweep), "--table", "methods", "--out", str(tmp_path / "d"), "--unfinished", "drop"]) == 0
    dropped = (tmp_path / "d" / "methods.tex").read_text()
    # without Local, FedSelect against FedAvg is the one pair of cells tested: marked, and FedAvg,
    # significantly worse than the best, is not bold
    assert body_rows(dropped) == {"FedSelect": ["\\bfseries 84.0 $\\pm$ 3.2$^{\\blacktriangle}$"],
                                  "FedAvg": ["44.4 $\\pm$ 3.2"], "Local": ["--"]}  # the cell is left empty
    assert "over the table's 1 distinct pair of cells tested" in dropped and "fewer than 5" not in dropped
    assert "dagger" not in dropped and "Left out: 1 run that did not finish (reached round 3 of 5).\\par}" in dropped


def test_cli_explains_the_unfinished_option(capsys):
    with pytest.raises(SystemExit):
        tables.main(["--help"])
    help_text = " ".join(capsys.readouterr().out.split())
    assert "--unfinished {mark,drop}" in help_text and "did not finish" in help_text and "(default)" in help_text


# ----------------------------------------------------------------------------- a real small sweep

@pytest.fixture(scope="module")
def results(ray_cluster, tmp_path_factory):
    """A real baselines sweep: FedSelect, FedAvg and Local on 2 data settings, 2 seeds."""
    from sweeps.run import study_named
    from sweeps.study import run_study

    tmp = tmp_path_factory.mktemp("tables")
    code = run_study(study_named("baselines"), [
        "--dataset", "synthetic", "--num-clients", "3", "--shards-per-client", "3", "--batch-size", "16",
        "--rounds", "2", "--partition", "shards", "dirichlet", "--dir-alpha", "0.3", "--local-epochs", "1",
        "--algorithms", "fedselect", "fedavg", "local", "--seeds", "0", "1", "--results", str(tmp),
        "--name", "base", "--verbose", "0"])
    assert code == 0
    return tmp / "base"


@slow
def test_methods_table_from_a_real_sweep(results, tmp_path):
    written = tables.build_tables([results], out=tmp_path)
    # one algorithm set, no α/p/variant spread; 2 seeds: the convergence check too
    assert list(written) == ["methods", "convergence"]
    assert "configurations converged" in written["convergence"].read_text()
    latex = written["methods"].read_text()
    for rule in ("\\toprule", "\\midrule", "\\bottomrule"):
        assert latex.count(rule) == 1

    trials = load_trials(results)
    trials = trials[trials["status"] == "COMPLETED"]
    expected = trials.groupby(["method", "setting"])["acc_mean"].agg(["mean", "std", "count"])  # std: ddof 1
    settings = ["synthetic, 3 shards", "synthetic, Dir(0.3)"]                    # shards first

    assert header(latex) == ["Method", *settings]
    assert sorted(trials["setting"].unique()) == sorted(settings)
    rows = body_rows(latex)
    assert sorted(rows) == ["FedAvg", "FedSelect", "Local"]   # one row per method
    assert "2 seeds per cell" in latex and (expected["count"] == 2).all()

    summary = pd.read_parquet(tmp_path / "summary.parquet").groupby(["row", "column"])["bold"].first()
    for setting_index, setting in enumerate(settings):
        column = expected.xs(setting, level="setting")
        for method, cells in rows.items():
            mean, std = column.loc[method, "mean"], column.loc[method, "std"]
            text = f"{100 * mean:.1f} $\\pm$ {100 * std:.1f}"
            cell = re.sub(r"\$\^\{\\\w+\}\$", "", cells[setting_index])   # without its significance marks
            assert cell.removeprefix("\\bfseries ") == text
            is_best = round(100 * mean, 1) == round(100 * column["mean"].max(), 1)  # best as printed: always bold
            assert (cell.startswith("\\bfseries") == summary[(method, setting)]
                    and (summary[(method, setting)] or not is_best))


@slow
def test_missing_setting_renders_as_missing(results):
    trials = load_trials(results)
    drop = (trials["algorithm"] == "local") & (trials["partition"] == "dirichlet")
    latex = tables.to_latex(tables.methods_table(trials[~drop]))
    settings = header(latex)[1:]
    assert body_rows(latex)["Local"][settings.index("synthetic, Dir(0.3)")] == "--"


@slow
def test_cli_table_choice_default_out_and_bad_path(results, tmp_path, capsys):
    assert tables.main([str(results), "--table", "methods", "--out", str(tmp_path / "t")]) == 0
    out = capsys.readouterr().out
    assert "FedSelect" in out and "±" in out and str(tmp_path / "t" / "methods.tex") in out
    assert sorted(p.name for p in (tmp_path / "t").iterdir()) == ["methods.tex", "summary.parquet"]

    assert tables.main([str(results), "--table", "limit", "--out", str(tmp_path / "l")]) == 0
    assert sorted(p.name for p in (tmp_path / "l").iterdir()) == ["limit.tex", "summary.parquet"]
    assert tables.main([str(results), "--table", "grid", "--out", str(tmp_path / "g")]) == 0
    assert len(list((tmp_path / "g").glob("grid_*.tex"))) == 2          # one per data setting

    assert tables.main([str(results)]) == 0
    assert (results / "tables" / "methods.tex").exists()

    assert tables.main([str(tmp_path / "nowhere")]) == 2
    err = capsys.readouterr().err
    assert err.count("error:") == 1 and "nowhere" in err
    with pytest.raises(SystemExit) as exit_:
        tables.main([str(results), "--table", "bogus"])
    assert exit_.value.code == 2


def test_markdown_table_has_the_cells_of_the_latex_one(tmp_path, capsys):
    folder = write_sweep(tmp_path / "done")
    table = tables.make_tables(load_trials(folder), "methods")["methods"]
    table.finals = load_final_accuracies([folder], table.runs["run"])  # as build_tables does
    text = tables.to_markdown(table)
    lines = text.splitlines()
    assert lines[0].startswith("Methods by data setting.") and lines[1] == ""          # the caption above it
    assert lines[2].startswith("| Method |") and lines[3].startswith("|---|")
    cells = table.cells()
    best = table.best_mask()
    for row in cells.index:
        line = next(line for line in lines if line.startswith(f"| {row} |"))
        for col in cells.columns:
            shown = f"**{cells.loc[row, col]}**" if best.loc[row, col] else cells.loc[row, col]
            assert f"| {shown} " in line + " "
    caption, _, note = text.strip().split("\n\n")   # the caption above the table, the note under it
    assert " ".join([caption, note]) == table.full_caption()
    assert tables.main([str(folder), "--table", "methods", "--markdown", "--out", str(tmp_path / "t")]) == 0
    assert (tmp_path / "t" / "methods.md").read_text() == text and text in capsys.readouterr().out
    # written again without --markdown: the twin would be stale, so it goes, and the user is told
    assert tables.main([str(folder), "--table", "methods", "--out", str(tmp_path / "t")]) == 0
    assert (tmp_path / "t" / "methods.tex").exists() and not (tmp_path / "t" / "methods.md").exists()
    assert "removed" in capsys.readouterr().out


def test_methods_caption_states_the_thread_count_when_recorded(tmp_path):
    trials = load_trials(write_sweep(tmp_path / "done"))
    assert "Torch threads" not in tables.make_tables(trials, "methods")["methods"].full_caption()
    trials["threads"] = 1.0
    assert "Torch threads per run: 1." in tables.make_tables(trials, "methods")["methods"].full_caption()


def test_a_sweep_without_fedselect_still_gets_its_methods_table(tmp_path):
    trials = load_trials(write_sweep(tmp_path / "done"))
    others = trials[trials["algorithm"] != "fedselect"].dropna(axis=1, how="all")
    assert "pers_limit" not in others
    assert tables.supported(others) == ["methods"]
    assert list(tables.make_tables(others)) == ["methods"]


# ----------------------------------------------------------------------------- diverged runs, the round reported

def diverged_sweep(folder, acc_of_diverged: float, flag: bool = True):
    """FIVE_SEEDS' sweep, FedSelect's seed 2 scoring `acc_of_diverged` on every client and, with
    `flag`, marked diverged in trials.parquet (as fl_core.results.trial_row marks it)."""
    acc = FIVE_SEEDS | {("fedselect", 2): [acc_of_diverged] * 3}
    sweep = write_sweep(folder, acc=acc)
    trials = pd.read_parquet(sweep / "trials.parquet")
    lost = (trials["algorithm"] == "fedselect") & (trials["seed"] == 2) & flag
    trials["diverged"], trials["diverged_why"] = lost, np.where(lost, "training loss inf at round 4", "")
    trials.to_parquet(sweep / "trials.parquet", index=False)
    return sweep


@pytest.mark.parametrize("acc_of_diverged", [0.99, 0.05], ids=["high", "low"])
def test_a_diverged_seed_is_counted_left_out_of_the_mean_and_the_tests_and_never_bold(tmp_path, acc_of_diverged):
    """FedSelect is 40 points above FedAvg on each of 5 seeds: marked ▲ and bold. One of its seeds
    diverged (scoring high or low, which must not matter): its cell is the mean of the other 4,
    says "1 of 5 seeds diverged", pairs with FedAvg over 4 common seeds (no test, no mark) and,
    though still the highest, is not bold."""
    control = diverged_sweep(tmp_path / "control", acc_of_diverged, flag=False)  # not flagged: a number
    tables.build_tables([control], "methods", out=tmp_path / "c")
    counted_in = body_rows((tmp_path / "c" / "methods.tex").read_text())["FedSelect"][0]
    assert "diverged" not in counted_in
    if acc_of_diverged > 0.5:                                               # still 5 seeds above FedAvg
        assert counted_in.startswith("\\bfseries ") and counted_in.endswith("$^{\\blacktriangle}$")

    sweep = diverged_sweep(tmp_path / "s", acc_of_diverged)
    tables.build_tables([sweep], "methods", out=tmp_path / "t", markdown=True)
    latex, markdown = (tmp_path / "t" / "methods.tex").read_text(), (tmp_path / "t" / "methods.md").read_text()
    others = [np.mean([v + 0.02 * s for v in (0.9, 0.8, 0.7)]) for s in (0, 1, 3, 4)]
    cell = f"{100 * np.mean(others):.1f} $\\pm$ {100 * np.std(others, ddof=1):.1f} (1 of 5 seeds diverged)"
    assert body_rows(latex)["FedSelect"] == [cell]                          # no mark, no bold
    assert "| " + cell.replace("$\\pm$", "±") + " |" in markdown
    assert body_rows(latex)["FedAvg"] == ["44.4 $\\pm$ 3.2"]                 # its 5 seeds: n as usual
    assert "5 seeds per cell" in latex and "(n=4)" not in latex
    for text in (latex, markdown):
        assert "k of n seeds diverged: runs whose training loss was lost or whose accuracy fell to chance after " \
               "learning" in text and "left out of the mean and the tests" in text
    assert "t-test" not in latex                                           # no pair shares 5 clean seeds
    summary = pd.read_parquet(tmp_path / "t" / "summary.parquet").set_index(["row", "reference"])
    assert summary["diverged"].groupby("row").first().to_dict() == {"FedSelect": 1, "FedAvg": 0, "Local": 0}
    against = summary.loc[("FedSelect", "FedAvg")]
    assert against["seeds"] == 4 and against["test"] == "" and against["marked"] == "" and not against["bold"]
    assert against["n"] == 4 and against["mean"] == pytest.approx(np.mean(others))


def test_a_cell_whose_seeds_all_diverged_says_so_and_nothing_else():
    rows = [trial("fedavg", s, 0.9) | {"diverged": True} for s in range(3)]
    rows += [trial("fedselect", s, 0.5 + 0.01 * s) | {"diverged": False} for s in range(3)]
    rows += [trial("local", s, 0.4) for s in range(3)]                       # an older sweep's rows: no flag
    table = tables.methods_table(pd.DataFrame(rows).astype({"diverged": object}))
    cells, bold = table.cells(), table.best_mask()
    assert cells.loc["FedAvg", "synthetic, 3 shards"] == "3 of 3 seeds diverged"
    assert table.n.loc["FedAvg", "synthetic, 3 shards"] == 0 and not bold.loc["FedAvg", "synthetic, 3 shards"]
    assert (cells.loc["FedSelect", "synthetic, 3 shards"] == "51.0 ± 1.0"
            and bold.loc["FedSelect", "synthetic, 3 shards"])
    assert "k of n seeds diverged" in table.full_caption() and "3 seeds per cell)" in table.full_caption()
    assert tables.format_cell(0.5, 0.01, 4, 5, diverged=1) == "50.0 ± 1.0 (1 of 5 seeds diverged)"
    assert tables.format_cell(0.5, 0.01, 4, 5) == "50.0 ± 1.0 (n=4)"
    assert "diverged" not in tables.methods_table(pd.DataFrame(rows[3:])).full_caption()


def best_val_sweep(folder, rules=("best_val",), fedavg: int = 3):
    """`write_sweep`'s finished sweep (5 rounds; round r scores 0.05 * (5 - r) below the last),
    its trials reporting round 3 (FedAvg's: round `fedavg`) as a "best_val" study writes them
    (`rules` cycled over the trials: a mixed sweep)."""
    sweep = write_sweep(folder)
    trials = pd.read_parquet(sweep / "trials.parquet")
    trials["report_round"] = [rules[i % len(rules)] for i in range(len(trials))]
    best = trials["report_round"] == "best_val"
    trials.loc[best, "reported_round"] = np.where(trials.loc[best, "algorithm"] == "fedavg", fedavg, 3)
    trials.loc[best, "acc_mean"] -= 0.05 * (5 - trials.loc[best, "reported_round"])
    trials.to_parquet(sweep / "trials.parquet", index=False)
    return sweep


def test_a_best_val_sweep_names_its_round_and_takes_the_clients_at_it(tmp_path):
    """FedSelect reports round 3, FedAvg its last (5): their per-client differences, which the
    2-seed bootstrap interval resamples, are 0.3 at the reported rounds (0.4 at the last ones)."""
    sweep = best_val_sweep(tmp_path / "best", fedavg=5)
    tables.build_tables([sweep], "methods", out=tmp_path / "t")
    latex = (tmp_path / "t" / "methods.tex").read_text()
    assert ("Personalized accuracy (\\%) at each run's round with the best mean validation accuracy "
            "(report\\_round = best\\_val), mean $\\pm$ std over seeds") in latex
    assert "Final personalized" not in latex and "final round" not in latex
    assert body_rows(latex)["FedSelect"] == ["\\bfseries 75.0 $\\pm$ 7.1"]  # round 3: 10 points below the last
    summary = pd.read_parquet(tmp_path / "t" / "summary.parquet").set_index(["row", "reference"])
    against = summary.loc[("FedSelect", "FedAvg")]
    assert against["interval"] == "hierarchical bootstrap over 2 seeds"
    assert (against["diff"], against["diff_low"], against["diff_high"]) == pytest.approx((0.3, 0.3, 0.3))

    trials = load_trials(sweep)
    runs = trials.set_index("config_hash")
    at = load_final_accuracies([sweep], runs.index, reported_rounds(trials)).set_index(["run", "client"])["value"]
    last = load_final_accuracies([sweep], runs.index).set_index(["run", "client"])["value"]
    for n, ((algorithm, seed), final) in enumerate(SWEEP_ACC.items()):
        for k, value in enumerate(final):
            assert at[(f"{n:012x}", k)] == pytest.approx(value - (0 if algorithm == "fedavg" else 0.1))  # round 3
            assert last[(f"{n:012x}", k)] == pytest.approx(value)           # an older sweep's rule: the last


def test_a_sweep_mixing_rules_says_both_and_last_alone_keeps_the_final_wording(tmp_path):
    mixed = load_trials(best_val_sweep(tmp_path / "mixed", rules=("last", "best_val")))
    caption = tables.make_tables(mixed, "methods")["methods"].full_caption()
    assert ("Personalized accuracy (%) at the final round (report_round = last) or at each run's round with the "
            "best mean validation accuracy (report_round = best_val)") in caption
    assert reported_rounds(mixed) == {h: 3 for h in mixed.loc[mixed["report_round"] == "best_val", "config_hash"]}
    last = load_trials(best_val_sweep(tmp_path / "last", rules=("last",)))
    assert tables.make_tables(last, "methods")["methods"].full_caption().startswith(
        "Methods by data setting. Final personalized accuracy (%)")
    assert reported_rounds(last) == {}


def test_final_accuracies_take_the_reported_round_of_the_seen_clients_only():
    rows = pd.DataFrame({"config_hash": ["a"] * 4 + ["b"] * 2, "round": [1, 2, 3, 3, 1, 2],
                         "client": [0, 0, 0, 1, 0, 0],
                         "pool": ["seen", "seen", "seen", "unseen", "seen", "seen"],
                         "acc": [0.5, 0.9, 0.6, 0.3, 0.4, 0.45]})
    seen = final_accuracies(rows, reported={"a": 2}).set_index("run")["value"]
    assert seen.to_dict() == {"a": 0.9, "b": 0.45}                           # b: not in the map, its last round
    unseen = final_accuracies(rows, pool="unseen", reported={"a": 2})
    assert unseen["value"].tolist() == [0.3]                                  # scored after the last round only


def test_a_tuned_ablation_study_gets_its_variants_table_marked_against_gradselect():
    from conftest import REPO

    trials = load_trials(REPO / "docs" / "results" / "ablation-fmnist" / "data" / "ablation-fmnist")
    made = tables.make_tables(trials)
    assert list(made) == ["ablation"]  # one algorithm: no methods table against absent FedAvg and Local
    table = made["ablation"]
    assert "each variant at the configuration its search chose" in table.full_caption()
    assert "significantly better/worse than FedSelect" in table.full_caption()
    assert set(table.mean.index) == {"FedSelect", "FedSelect (layer A)", "FedSelect (layer D)",
                                     "FedSelect (personalize least)", "FedSelect (random)"}
