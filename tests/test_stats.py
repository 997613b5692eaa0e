"""analysis.stats: confidence intervals, the paired difference of two cells over their common seeds
(a paired t-test over seeds from 5 common seeds; below that no test, no mark, a descriptive
interval), Benjamini-Hochberg within a table, the marks against a reference and the bold rule, the
false-positive rate of the marks under no true difference; then the same through the methods and
cost tables and summary.parquet (hand-made sweep folders, no Ray)."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import scipy.stats

from analysis import stats, tables
from analysis.cost import cost_table
from fl_core.results import write_parquet

from table_helpers import body_rows, write_sweep

SEEDS, CLIENTS = 5, 6
# per seed s and client k: 0.5 + 0.03 s + 0.02 k, and a small noise in [-0.008, 0.008]
BASE = 0.5 + 0.03 * np.arange(SEEDS)[:, None] + 0.02 * np.arange(CLIENTS)[None, :]
NOISE = 0.004 * ((np.arange(SEEDS)[:, None] * 7 + np.arange(CLIENTS)[None, :] * 3) % 5 - 2)
ALTERNATING = 0.003 * (-1.0) ** (np.arange(SEEDS)[:, None] + np.arange(CLIENTS)[None, :])  # sums to 0 per seed


def frames(cells: dict, seeds=range(3)) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(runs, finals) for stats.compare: cells (row, column) -> accuracies (seed x client)."""
    runs, finals = [], []
    for (row, column), values in cells.items():
        for seed, clients in zip(seeds, values):
            run = f"{row}/{column}/{seed}"
            runs.append({"row": row, "column": column, "seed": seed, "value": float(np.mean(clients)), "run": run})
            finals += [{"run": run, "client": k, "value": float(v)} for k, v in enumerate(clients)]
    return pd.DataFrame(runs), pd.DataFrame(finals)


# ----------------------------------------------------------------------------- the statistics

def test_mean_ci_is_scipys_t_interval():
    values = [0.61, 0.64, 0.70]
    expected = scipy.stats.t.interval(0.95, 2, loc=np.mean(values), scale=scipy.stats.sem(values))
    assert stats.mean_ci(values) == pytest.approx(expected)
    assert stats.mean_ci(values) == pytest.approx(tuple(scipy.stats.ttest_1samp(values, 0).confidence_interval()))
    assert all(np.isnan(stats.mean_ci([0.5])))                       # fewer than 2 seeds: NaN
    assert stats.mean_ci([0.5, 0.5, np.nan]) == (0.5, 0.5)


def test_five_seeds_mark_a_real_difference_and_not_identical_values():
    """5 seeds: the paired t-test over the per-seed means; B = A + 5 points (± noise), C = A, D = A − 5."""
    runs, finals = frames({("A", "x"): BASE, ("B", "x"): BASE + 0.05 + NOISE, ("C", "x"): BASE.copy(),
                           ("D", "x"): BASE - 0.05 + NOISE}, range(SEEDS))
    verdict = stats.compare(runs, finals, references=("A",))
    assert verdict.lookup("marks") == {("A", "x"): "", ("B", "x"): "▲", ("C", "x"): "", ("D", "x"): "▼"}
    tests = verdict.comparisons[verdict.comparisons["kind"] == "reference"].set_index("row")
    assert tests.loc["C", "p_value"] == 1.0 and tests.loc["C", "test"] == stats.T_TEST  # identical: p = 1
    assert (tests["seeds"] == SEEDS).all() and tests.loc["B", "p_adjusted"] < 0.05
    assert tests.loc["B", "diff"] == pytest.approx(0.05 + NOISE.mean())
    caption = verdict.caption()
    assert "paired t-test on the per-seed mean accuracies over 5 common seeds" in caption
    assert "fewer than 5" not in caption and "client" not in caption


def test_three_seeds_give_a_bootstrap_interval_and_no_mark():
    """The same cells over 3 seeds: no test, so no mark even for 5 points on every client; the
    difference's interval is the hierarchical bootstrap of the per-(seed, client) differences."""
    runs, finals = frames({("A", "x"): BASE[:3], ("B", "x"): BASE[:3] + 0.05 + NOISE[:3], ("C", "x"): BASE[:3].copy(),
                           ("D", "x"): BASE[:3] - 0.05 + NOISE[:3]})
    verdict = stats.compare(runs, finals, references=("A",))
    assert set(verdict.lookup("marks").values()) == {""}
    assert verdict.lookup("bold") == {("A", "x"): False, ("B", "x"): True, ("C", "x"): False, ("D", "x"): False}
    assert verdict.comparisons["p_value"].isna().all() and verdict.comparisons["p_adjusted"].isna().all()
    assert set(verdict.comparisons["test"]) == {""} and verdict.family == 0
    b = verdict.comparisons.set_index(["kind", "row"]).loc[("reference", "B")]
    per_client = 0.05 + NOISE[:3]                                    # B − A per (seed, client)
    assert b["diff"] == pytest.approx(per_client.mean()) and b["seeds"] == 3
    assert b["interval"] == "hierarchical bootstrap over 3 seeds"
    assert per_client.min() <= b["diff_low"] < b["diff"] < b["diff_high"] <= per_client.max()
    c = verdict.comparisons.set_index(["kind", "row"]).loc[("reference", "C")]
    assert (c["diff"], c["diff_low"], c["diff_high"]) == (0.0, 0.0, 0.0)     # identical cells: a point
    caption = verdict.caption()
    assert "Cells share fewer than 5 seeds (3 in common): no test and no mark" in caption
    assert "clients of one run are not independent samples" in caption and "t-test" not in caption


def test_t_test_over_five_seeds_on_the_seed_means():
    runs, finals = frames({("A", "x"): BASE, ("B", "x"): BASE + 0.05 + NOISE, ("C", "x"): BASE.copy()}, range(SEEDS))
    for given in (None, finals):                                     # 5 seeds: the t-test either way
        verdict = stats.compare(runs, given, references=("A",))
        assert verdict.lookup("marks") == {("A", "x"): "", ("B", "x"): "▲", ("C", "x"): ""}
        b = verdict.comparisons.set_index(["kind", "row"]).loc[("reference", "B")]
        expected = scipy.stats.ttest_rel((BASE + 0.05 + NOISE).mean(axis=1), BASE.mean(axis=1))
        assert b["test"] == stats.T_TEST and b["p_value"] == pytest.approx(expected.pvalue) and b["seeds"] == SEEDS
        assert (b["diff_low"], b["diff_high"]) == pytest.approx(tuple(expected.confidence_interval()))
        assert b["interval"] == "t over 5 seeds"
        caption = verdict.caption()
        assert "paired t-test on the per-seed mean accuracies over 5 common seeds" in caption
        assert "bootstrap" not in caption


def test_no_per_client_rows_and_few_seeds_means_a_t_interval_and_no_test():
    runs, _ = frames({("A", "x"): BASE[:3], ("B", "x"): BASE[:3] + 0.05 + NOISE[:3]})
    verdict = stats.compare(runs, None, references=("A",))
    assert verdict.lookup("marks") == {("A", "x"): "", ("B", "x"): ""}
    assert verdict.lookup("bold") == {("A", "x"): False, ("B", "x"): True}      # as printed
    assert verdict.comparisons["p_value"].isna().all()
    b = verdict.comparisons.set_index(["kind", "row"]).loc[("reference", "B")]
    per_seed = (0.05 + NOISE[:3]).mean(axis=1)
    t = scipy.stats.ttest_1samp(per_seed, 0.0).confidence_interval()
    assert b["interval"] == "t over 3 seeds" and (b["diff_low"], b["diff_high"]) == pytest.approx(tuple(t))
    assert "Cells share fewer than 5 seeds (3 in common): no test and no mark" in verdict.caption()
    one = stats.compare(frames({("A", "x"): BASE[:1], ("B", "x"): BASE[:1] + 0.05})[0], None, references=("A",))
    b = one.comparisons.set_index(["kind", "row"]).loc[("reference", "B")]
    assert b["diff"] == pytest.approx(0.05) and np.isnan(b["diff_low"]) and b["interval"] == ""  # 1 seed: no interval


def test_bold_never_on_a_significantly_worse_cell_and_kept_on_a_tie():
    best = BASE + 0.1
    runs, finals = frames({("best", "x"): best, ("tie", "x"): best + ALTERNATING,
                           ("worse", "x"): best - 0.01 + NOISE / 4}, range(SEEDS))  # 1 point below on every seed
    apart = frames({("apart, lower", "x"): best - 0.03, ("apart, same", "x"): best}, seeds=range(10, 10 + SEEDS))
    runs, finals = pd.concat([runs, apart[0]]), pd.concat([finals, apart[1]])   # no seed shared with the best
    verdict = stats.compare(runs, finals)
    assert verdict.lookup("bold") == {("best", "x"): True, ("tie", "x"): True, ("worse", "x"): False,
                                      ("apart, lower", "x"): False, ("apart, same", "x"): True}
    worse = verdict.comparisons[verdict.comparisons["direction"] < 0]
    assert list(worse["row"]) == ["worse"] and not any(verdict.lookup("bold")[(r, c)] for r, c in
                                                         zip(worse["row"], worse["column"]))
    caption = verdict.caption()
    assert "Bold: the best of its column and every cell not significantly worse than it" in caption
    assert "Other pairs of cells share fewer than 5 seeds (0 in common): no test and no mark" in caption

    # best="table": a column's own best that is significantly worse than the table's best is not bold
    low = frames({("best", "y"): BASE + NOISE}, range(SEEDS))
    both = stats.compare(pd.concat([runs, low[0]]), pd.concat([finals, low[1]]), best="table")
    assert not both.lookup("bold")[("best", "y")] and both.lookup("bold")[("best", "x")]
    assert stats.compare(pd.concat([runs, low[0]]), pd.concat([finals, low[1]])).lookup("bold")[("best", "y")]


def test_below_five_seeds_bold_is_the_printed_best_value():
    """3 seeds: no test against the best, so a cell below the best on every client is bold exactly
    when it prints the best value (0.04 points below: yes; 1 point below: no)."""
    best = BASE[:3] + 0.1                                             # 68.0 %
    runs, finals = frames({("best", "x"): best, ("close", "x"): best - 0.0004, ("worse", "x"): best - 0.01})
    verdict = stats.compare(runs, finals)
    assert verdict.lookup("bold") == {("best", "x"): True, ("close", "x"): True, ("worse", "x"): False}
    assert (verdict.comparisons["direction"] == 0).all() and verdict.comparisons["p_value"].isna().all()
    assert "Bold: the best of its column and every cell that prints its value." in verdict.caption()


def test_a_pair_tested_for_a_mark_and_for_bold_gets_one_adjusted_p():
    """The reference L is also the best; X is 0.6 points below it. With one Benjamini-Hochberg
    family per purpose, X's test against L survived among the marks (lenient: many clear
    differences against A) but not among the comparisons with the best: X was marked ▽ and bold
    (as FedPer was in the first Fashion-MNIST baselines table). One family over the distinct pairs
    gives the pair one adjusted p."""
    wobble = np.array([1, -1, 2, -2, 0.5])[:, None]                     # per seed
    cells = {("A", "x"): BASE - 0.2, ("L", "x"): BASE + 0.02, ("X", "x"): BASE + 0.014 + 0.002 * wobble}
    cells |= {(f"M{i}", "x"): BASE + 0.019 + 0.004 * (-1) ** i * np.roll(wobble, i, axis=0) for i in range(8)}
    runs, finals = frames(cells, seeds=range(SEEDS))
    verdict = stats.compare(runs, finals, references=("A", "L"))
    c = verdict.comparisons
    assert set(c.loc[c["kind"] == "best", "against"]) == {"L / x"}
    against_l = c[c["against"] == "L"].set_index("row")["p_adjusted"]
    against_best = c[c["kind"] == "best"].set_index("row")["p_adjusted"]
    assert (against_l == against_best.loc[against_l.index]).all()      # one p per pair
    assert verdict.family == 2 * (len(cells) - 1) - 1                   # vs A and vs L; A-L once
    marks, bold = verdict.lookup("marks"), verdict.lookup("bold")
    assert marks[("X", "x")] == "▲▽" and not bold[("X", "x")]
    assert all(not ("▽" in m and bold[key]) for key, m in marks.items())


def test_an_unknown_or_missing_reference_gives_no_marks_and_says_so():
    runs, finals = frames({("A", "x"): BASE, ("B", "x"): BASE + 0.05 + NOISE,
                           ("B", "y"): BASE + 0.05, ("C", "y"): BASE}, range(SEEDS))
    unknown = stats.compare(runs, finals, references=("Nope",))
    assert set(unknown.lookup("marks").values()) == {""}
    assert "▲/▼: significantly better/worse than Nope, in the same column (Nope is not in this table: no marks " \
           "against it)." in unknown.caption()
    missing = stats.compare(runs, finals, references=("A",))            # A has no cell in column y
    assert missing.lookup("marks") == {("A", "x"): "", ("B", "x"): "▲", ("B", "y"): "", ("C", "y"): ""}
    assert "A is missing from 1 column(s): no marks there" in missing.caption()
    assert missing.summary("t").set_index(["row", "column"]).loc[("B", "y"), "marked"] == ""


def test_two_references_get_their_own_marks():
    runs, finals = frames({("A", "x"): BASE, ("L", "x"): BASE + 0.1, ("B", "x"): BASE + 0.05 + NOISE}, range(SEEDS))
    verdict = stats.compare(runs, finals, references=("A", "L"))
    assert verdict.lookup("marks") == {("A", "x"): "▽", ("L", "x"): "▲", ("B", "x"): "▲▽"}
    assert "▲/▼: significantly better/worse than A, △/▽: than L, in the same column" in verdict.caption()
    with pytest.raises(ValueError):
        stats.compare(runs, finals, references=("A", "L", "B"))


# ----------------------------------------------------------------------------- the marks' false positives

def simulated_tables(rng, tables: int, seeds: int, settings: int = 2, clients: int = 10, shift: float = 0.0):
    """Accuracies (table, setting, method, seed, client) of methods A and B with no true difference
    (B + `shift`): a seed's effect and its partition's per-client effect, shared by both methods,
    a run's training noise shared by its clients, and per-client noise; clients of one run are
    correlated, seeds independent."""
    shared, own = (tables, settings, 1, seeds), (tables, settings, 2, seeds)
    acc = 0.7 + rng.normal(0, 0.05, shared + (1,)) + rng.normal(0, 0.05, shared + (clients,)) \
        + rng.normal(0, 0.02, own + (1,)) + rng.normal(0, 0.01, own + (clients,))
    acc[:, :, 1] += shift
    return acc


def table_frames(acc: np.ndarray) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(runs, finals) of one simulated table (setting, method, seed, client) for stats.compare."""
    settings, methods, seeds, clients = acc.shape
    keys = pd.MultiIndex.from_product([range(settings), ["A", "B"], range(seeds)], names=["column", "row", "seed"])
    runs = keys.to_frame(index=False).assign(value=acc.mean(axis=3).ravel(), run=np.arange(len(keys)))
    finals = pd.DataFrame({"run": np.repeat(runs["run"], clients), "client": np.tile(np.arange(clients), len(keys)),
                           "value": acc.ravel()})
    return runs, finals


def marked_tables(acc: np.ndarray) -> int:
    """How many of the simulated tables get at least one mark against A."""
    return sum(any(stats.compare(*table_frames(table), references=("A",)).lookup("marks").values()) for table in acc)


def test_marks_are_false_in_at_most_five_percent_of_tables_under_no_difference():
    """200 tables of 2 data settings x methods A, B x 5 seeds x 10 clients, no true difference:
    each table's marks (paired t-test over seeds, Benjamini-Hochberg over its 2 tests) are wrong
    in 5 % of tables by construction (the t-test is exact here; BH over independent tests keeps
    the chance of any rejection at 5 % when none is true). Measured: 11 of 200 tables (5.5 %; a
    binomial test against 5 % gives p = 0.4). The Monte-Carlo allowance is 3 binomial standard
    errors, 3 * sqrt(0.05 * 0.95 / 200) = 0.046. The old test over (client, seed) pairs marked
    far more (tests/test_paired.py simulates it)."""
    acc = simulated_tables(np.random.default_rng(38), 200, seeds=5)
    rate = marked_tables(acc) / len(acc)
    assert rate <= 0.05 + 3 * np.sqrt(0.05 * 0.95 / len(acc)), rate


def test_three_seeds_never_give_a_mark_not_even_for_a_true_difference():
    rng = np.random.default_rng(5)
    for shift in (0.0, 0.05):                                         # 5 points: clear on every client
        assert marked_tables(simulated_tables(rng, 10, seeds=3, shift=shift)) == 0


# ----------------------------------------------------------------------------- through the tables

def methods_sweep(folder, seeds: int):
    """FedAvg, FedSelect = FedAvg + 5 points (± noise) and Local = FedAvg exactly, 6 clients."""
    acc = {}
    for s in range(seeds):
        acc |= {("fedavg", s): list(BASE[s]), ("fedselect", s): list(BASE[s] + 0.05 + NOISE[s]),
                ("local", s): list(BASE[s])}
    return write_sweep(folder, rounds=2, acc=acc)


def test_methods_table_marks_fedselect_against_fedavg_and_local(tmp_path):
    folder = methods_sweep(tmp_path / "sweep", SEEDS)
    out = tmp_path / "tables"
    assert set(tables.build_tables([folder], out=out, markdown=True)) == {"methods", "convergence"}
    latex = (out / "methods.tex").read_text()
    rows = body_rows(latex)
    assert rows["FedSelect"][0].startswith("\\bfseries ") and \
        rows["FedSelect"][0].endswith("$^{\\blacktriangle}$$^{\\vartriangle}$")
    assert "\\bfseries" not in rows["FedAvg"][0] + rows["Local"][0]               # significantly worse
    assert "triangle" not in rows["FedAvg"][0] + rows["Local"][0]                 # identical: p = 1
    assert "paired t-test on the per-seed mean accuracies over 5 common seeds" in latex
    assert "$^{\\blacktriangle}$/$^{\\blacktriangledown}$: significantly better/worse than FedAvg, " \
           "$^{\\vartriangle}$/$^{\\triangledown}$: than Local" in latex
    assert "Benjamini--Hochberg over the table's 3 distinct pairs of cells tested" in latex
    assert "▲△** |" in (out / "methods.md").read_text()

    summary = pd.read_parquet(out / stats.SUMMARY)
    assert list(summary.columns) == list(stats.SUMMARY_COLUMNS) and len(summary) == 3 * 2  # cells x references
    found = summary.set_index(["row", "reference"])
    better = found.loc[("FedSelect", "FedAvg")]
    assert better["marked"] == "better" and better["p_adjusted"] < 0.05 and better["seeds"] == SEEDS
    assert better["test"] == stats.T_TEST and better["interval"] == "t over 5 seeds"
    assert better["diff"] == pytest.approx(0.05 + NOISE.mean())
    assert better["diff_low"] < better["diff"] < better["diff_high"]
    assert found.loc[("Local", "FedAvg"), "p_value"] == 1.0 and found.loc[("Local", "FedAvg"), "marked"] == ""
    assert found.loc[("Local", "FedAvg"), "diff"] == 0.0
    itself = found.loc[("FedAvg", "FedAvg")]                                      # not tested against itself
    assert np.isnan(itself["p_value"]) and np.isnan(itself["diff"]) and itself["seeds"] == 0 and itself["test"] == ""
    assert summary.groupby("row")["bold"].first().to_dict() == {"FedAvg": False, "FedSelect": True, "Local": False}
    assert not [p for p in out.iterdir() if p.name.startswith(".")]               # written atomically: no temp left


def test_methods_table_with_three_seeds_has_no_marks_and_bootstrap_intervals(tmp_path):
    folder = methods_sweep(tmp_path / "sweep", 3)
    out = tmp_path / "tables"
    tables.build_tables([folder], out=out, markdown=True)
    latex = (out / "methods.tex").read_text()
    rows = body_rows(latex)
    assert "triangle" not in "".join(cell for cells in rows.values() for cell in cells)
    assert rows["FedSelect"][0].startswith("\\bfseries ")                      # prints the best value
    assert "\\bfseries" not in rows["FedAvg"][0] + rows["Local"][0]               # print less
    assert "Cells share fewer than 5 seeds (3 in common): no test and no mark" in latex and "t-test" not in latex
    summary = pd.read_parquet(out / stats.SUMMARY).set_index(["row", "reference"])
    assert set(summary["marked"]) == {""} and summary["p_value"].isna().all() and set(summary["test"]) == {""}
    better = summary.loc[("FedSelect", "FedAvg")]
    assert better["interval"] == "hierarchical bootstrap over 3 seeds" and better["seeds"] == 3
    per_client = 0.05 + NOISE[:3]
    assert per_client.min() <= better["diff_low"] < better["diff_high"] <= per_client.max()


def test_summary_ci_is_scipys_t_interval_for_the_seed_values(tmp_path):
    values = [0.61, 0.64, 0.70]                                                   # FedAvg's seeds, every client alike
    acc = {("fedavg", s): [v] * 3 for s, v in enumerate(values)} | {("local", s): [0.5] * 3 for s in range(3)}
    tables.build_tables([write_sweep(tmp_path / "sweep", rounds=2, acc=acc)], out=tmp_path / "t")
    summary = pd.read_parquet(tmp_path / "t" / stats.SUMMARY)
    row = summary[(summary["row"] == "FedAvg") & (summary["reference"] == "Local")].iloc[0]
    low, high = scipy.stats.t.interval(0.95, len(values) - 1, loc=np.mean(values), scale=scipy.stats.sem(values))
    assert (row["ci_low"], row["ci_high"]) == pytest.approx((low, high)) and row["n"] == 3
    assert row["mean"] == pytest.approx(np.mean(values)) and row["std"] == pytest.approx(np.std(values, ddof=1))
    # against Local (0.5 everywhere): clients alike within a seed, so the bootstrap is over the 3 seed differences
    assert row["diff"] == pytest.approx(np.mean(values) - 0.5) and row["seeds"] == 3
    assert row["interval"] == "hierarchical bootstrap over 3 seeds"
    assert 0.11 - 1e-9 <= row["diff_low"] < row["diff"] < row["diff_high"] <= 0.20 + 1e-9


def write_cost_sweep(folder):
    """FedAvg+FT and PerFedMask, 5 seeds x 6 devices, c = 1: before fine-tuning alike, after
    fine-tuning PerFedMask 10 points (± noise) above."""
    knobs = {"dataset": "synthetic", "partition": "shards", "shards_per_client": 3, "dir_alpha": 0.5,
             "num_clients": CLIENTS, "local_epochs": 1, "rounds": 2, "participation": 1.0, "lr": 0.1,
             "setting": "synthetic, 3 shards"}
    trials = []
    for algorithm, method, gain in (("fedavg_ft", "FedAvg+FT", 0.0), ("perfedmask", "PerFedMask", 0.1)):
        for s in range(SEEDS):
            key = f"{algorithm}{s}"
            config = knobs | {"algorithm": algorithm, "method": method, "seed": s, "config_hash": key}
            after = BASE[s] + gain + (NOISE[s] if gain else 0)
            rows = [config | {"round": rnd, "client": k, "acc": after[k], "acc_global": BASE[s, k], "pool": "seen",
                              "trainable_params": 1000.0, "fwd_mflops": 1.0, "bwd_mflops": 2.0}
                    for rnd in (1, 2) for k in range(CLIENTS)]
            write_parquet(pd.DataFrame(rows), folder / "rounds" / f"{key}.parquet")
            trials.append(config | {"status": "COMPLETED", "rounds_done": 2, "acc_mean": after.mean(),
                                    "acc_global_mean": BASE[s].mean(), "trainable_params_mean": 1000.0})
    write_parquet(pd.DataFrame(trials), folder / "trials.parquet")
    return folder


def test_cost_table_marks_against_fedavg_ft_and_bolds_after_fine_tuning_only(tmp_path):
    folder = write_cost_sweep(tmp_path / "cost")
    cells, bold, caption, summary = cost_table(folder, pd.read_parquet(folder / "trials.parquet"))
    assert cells.loc["PerFedMask", ("c = 1", "After FT")].endswith("▲")
    assert not cells.loc["PerFedMask", ("c = 1", "Before FT")].endswith(("▲", "▼"))  # identical before FT
    assert bold[("c = 1", "After FT")].to_dict() == {"FedAvg+FT": False, "PerFedMask": True}
    assert not bold[("c = 1", "Before FT")].any()
    assert "significantly better/worse than FedAvg+FT" in caption and "Bold, after fine-tuning:" in caption
    marked = summary.set_index(["row", "column"])["marked"]
    assert marked[("PerFedMask", "synthetic, 3 shards / c = 1 / After FT")] == "better"
    assert marked[("PerFedMask", "synthetic, 3 shards / c = 1 / Before FT")] == ""
    written = tables.build_tables([folder], which="cost", out=tmp_path / "t")
    assert "$^{\\blacktriangle}$" in written["cost"].read_text()
    assert set(pd.read_parquet(tmp_path / "t" / stats.SUMMARY)["table"]) == {"cost"}


def test_cost_table_leaves_a_diverged_seed_out_of_its_cell_and_its_tests(tmp_path):
    """PerFedMask's seed 4 diverged: its cells count it, pair with FedAvg+FT over 4 seeds (no mark)
    and are never bold, though still the best after fine-tuning."""
    folder = write_cost_sweep(tmp_path / "cost")
    trials = pd.read_parquet(folder / "trials.parquet")
    trials["diverged"] = (trials["method"] == "PerFedMask") & (trials["seed"] == 4)
    cells, bold, caption, summary = cost_table(folder, trials)
    after = 100 * (BASE[:4] + 0.1 + NOISE[:4]).mean(axis=1)
    assert cells.loc["PerFedMask", ("c = 1", "After FT")] == \
        f"{after.mean():.1f} ± {after.std(ddof=1):.1f} (1 of 5 seeds diverged)"
    assert not bold.loc["PerFedMask"].any() and bold.loc["FedAvg+FT", ("c = 1", "After FT")]
    assert "k of n seeds diverged" in caption
    found = summary.set_index(["row", "column"]).loc[("PerFedMask", "synthetic, 3 shards / c = 1 / After FT")]
    assert (found["diverged"], found["n"], found["seeds"], found["marked"]) == (1, 4, 4, "")


# ----------------------------------------------------------------------------- the end of a sweep

def test_end_of_sweep_summary_has_the_95_ci_over_seeds():
    from sweeps.summary import best_per_setting

    values = [0.61, 0.64, 0.70]
    done = pd.DataFrame({"setting": ["easy"] * 4, "method": ["FedAvg"] * 3 + ["Local"], "seed": [0, 1, 2, 0],
                         "acc_mean": [*values, 0.5], "mb_total": 1.0})
    best = best_per_setting(done, []).set_index("method")
    low, high = scipy.stats.t.interval(0.95, 2, loc=np.mean(values), scale=scipy.stats.sem(values))
    assert best.loc["FedAvg", "95% CI"] == f"[{low:.4f}, {high:.4f}]"
    assert best.loc["Local", "95% CI"] == "-"                                     # one seed: no interval


@pytest.mark.parametrize("lost", [0.99, 0.05], ids=["high", "low"])
def test_end_of_sweep_summary_leaves_diverged_runs_out_of_the_mean_and_counts_them(lost):
    from sweeps.summary import best_per_setting

    done = pd.DataFrame({"setting": ["easy"] * 6, "method": ["FedAvg"] * 4 + ["Local"] * 2, "seed": [0, 1, 2, 3, 0, 1],
                         "acc_mean": [0.61, 0.64, 0.70, lost, 0.5, 0.3], "mb_total": 1.0,
                         "diverged": [False, False, False, True, True, True]})
    best = best_per_setting(done, []).set_index("method")
    assert best.loc["FedAvg", "acc"] == f"{np.mean([0.61, 0.64, 0.70]):.4f} ± {np.std([0.61, 0.64, 0.70], ddof=1):.4f}"
    assert (best.loc["FedAvg", "seeds"], best.loc["FedAvg", "diverged"]) == (3, 1)
    assert (best.loc["Local", "acc"], best.loc["Local", "seeds"], best.loc["Local", "diverged"]) == ("-", 0, 2)
    assert best_per_setting(done.drop(columns="diverged"), []).set_index("method").loc["FedAvg", "seeds"] == 4


def test_the_tables_go_to_the_sweeps_mlflow_run(tmp_path):
    from mlflow import MlflowClient

    from sweeps.mlflow_sink import default_tracking_uri, log_sweep_tables

    uri = default_tracking_uri(tmp_path)
    client = MlflowClient(tracking_uri=uri)
    experiment = client.create_experiment("study", artifact_location=(tmp_path / "mlartifacts").as_uri())
    run = client.create_run(experiment, tags={"sweep": "s1", "role": "sweep"}).info.run_id
    folder = tmp_path / "s1" / "tables"
    folder.mkdir(parents=True)
    (folder / "methods.tex").write_text("table")
    write_parquet(pd.DataFrame({"table": ["methods"]}), folder / stats.SUMMARY)
    assert log_sweep_tables(uri, "study", "s1", folder)
    assert (sorted(a.path for a in client.list_artifacts(run, "tables"))
            == ["tables/methods.tex", "tables/summary.parquet"])
    assert not log_sweep_tables(uri, "study", "another sweep", folder)            # no such run: nothing logged
    assert not log_sweep_tables(uri, "study", "s1", tmp_path / "nowhere")
