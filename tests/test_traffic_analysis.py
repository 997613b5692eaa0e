"""analysis.traffic: busiest-node traffic, its figure and table, and DisPFL's mask Hamming distances,
on a small hand-made sweep folder (FedAvg with a server, DisPFL and Local without; no Ray)."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from analysis import tables
from analysis.common import TableError
from analysis.load import find_sweeps, load_masks, load_rounds, load_trials
from analysis.plots import build_plots
from analysis.traffic import (_pick_dispfl_trial, build_traffic_outputs, busiest_node_mb, hamming_matrix,
                              traffic_curves, trial_hamming)
from fl_core.results import write_parquet

from sweep_helpers import write_v1_sweep
from latex_check import check_latex
from table_helpers import body_rows

ROUNDS = 3
SETTING = "synthetic, 3 shards"
# Per trial: (algorithm, method, seed, lr, final acc_mean, status, rounds written,
#             per round the MB each of the 3 clients sent + received).
TRIALS = {
    "fedavg0": ("fedavg", "FedAvg", 0, 0.1, 0.5, "COMPLETED", 3, [[3, 3, 3]] * 3),
    "fedavg1": ("fedavg", "FedAvg", 1, 0.1, 0.6, "COMPLETED", 3, [[3, 3, 3]] * 3),
    # the busiest client changes: max of cumulative 5, 5, 9; sum of per-round maxima 5, 9, 13
    "dispfl0": ("dispfl", "DisPFL", 0, 0.1, 0.7, "COMPLETED", 3, [[5, 1, 0], [0, 4, 3], [0, 4, 3]]),
    "dispfl1": ("dispfl", "DisPFL", 1, 0.1, 0.8, "COMPLETED", 3, [[1, 1, 1]] * 3),
    "dispflstop": ("dispfl", "DisPFL", 2, 0.1, 0.99, "STOPPED", 2, [[1, 1, 1]] * 2),   # unfinished
    "dispfllow": ("dispfl", "DisPFL", 0, 0.05, 0.1, "COMPLETED", 3, [[2, 2, 2]] * 3),  # a worse configuration
    "local0": ("local", "Local", 0, 0.1, 0.4, "COMPLETED", 3, [[0, 0, 0]] * 3),
}
KNOBS = {"dataset": "synthetic", "partition": "shards", "shards_per_client": 3, "dir_alpha": 0.5,
         "num_clients": 3, "local_epochs": 1, "rounds": ROUNDS, "setting": SETTING}
# DisPFL's final masks of the trial the heatmap shows (dispfl1): client -> (fc.weight, fc.bias).
MASKS = {0: ([1, 0, 1, 1], [0, 0]), 1: ([1, 0, 1, 1], [1, 1]), 2: ([0, 1, 0, 0], [0, 0])}
# differing entries / 6 entries: clients 0-1 differ in the bias (2), 0-2 in the weight (4), 1-2 in all (6)
HAMMING = np.array([[0, 2 / 6, 4 / 6], [2 / 6, 0, 1], [4 / 6, 1, 0]])


def _mask_rows(trial, masks):
    return [{"config_hash": trial, "client": k, "tensor": name, "shape": [len(bits)], "numel": len(bits),
             "bits": np.packbits(np.array(bits, dtype=bool)).tobytes()}
            for k, tensors in masks.items() for name, bits in zip(("fc.weight", "fc.bias"), tensors)]


def write_sweep(folder):
    trials = []
    for key, (algorithm, method, seed, lr, acc, status, done, traffic) in TRIALS.items():
        config = KNOBS | {"algorithm": algorithm, "method": method, "seed": seed, "lr": lr, "config_hash": key}
        rows = [config | {"round": rnd, "client": k, "acc": np.nan if rnd == 2 else acc - 0.1 * (ROUNDS - rnd),
                          "acc_local": acc, "acc_global": acc, "loss": 0.5, "n_train": 40, "n_test": 10,
                          "personal_fraction": 0.0, "participated": True,
                          "bytes_up": mb * 400_000, "bytes_down": mb * 600_000}
                for rnd, per_client in enumerate(traffic, start=1) for k, mb in enumerate(per_client)]
        write_parquet(pd.DataFrame(rows), folder / "rounds" / f"{key}.parquet")
        trials.append(config | {"status": status, "rounds_done": done, "acc_mean": acc})
        hists = [[4, 0, 1], [3, 1, 0], [0, 2, 5]]
        write_parquet(pd.DataFrame([config | {"client": k, "train_label_hist": h} for k, h in enumerate(hists)]),
                      folder / "clients" / f"{key}.parquet")
    write_parquet(pd.DataFrame(trials), folder / "trials.parquet")
    write_parquet(pd.DataFrame(_mask_rows("dispfl1", MASKS)), folder / "masks" / "dispfl1.parquet")
    other = {k: ([1, 1, 1, 1], [k % 2, 1]) for k in range(3)}  # the best accuracy, but unfinished
    write_parquet(pd.DataFrame(_mask_rows("dispflstop", other)), folder / "masks" / "dispflstop.parquet")
    return folder


@pytest.fixture
def sweep(tmp_path):
    return write_sweep(tmp_path / "traffic")


def test_busiest_node_server_sums_clients_serverless_takes_max_of_cumulative(sweep):
    load = busiest_node_mb(load_rounds(sweep)).set_index(["config_hash", "round"])["busiest_node_mb"]

    def series(key):
        return load.loc[key].tolist()

    assert series("fedavg0") == pytest.approx([9, 18, 27])     # the server: 3 clients x 3 MB per round
    assert series("dispfl0") == pytest.approx([5, 5, 9])       # max_k of cumulative, not 5, 9, 13
    assert series("dispfl1") == pytest.approx([1, 2, 3])
    assert series("dispflstop") == pytest.approx([1, 2])
    assert series("local0") == pytest.approx([0, 0, 0])
    assert list(load.index.get_level_values("round")[:3]) == [1, 2, 3]


def test_busiest_node_counts_missing_clients_as_silent():
    rows = pd.DataFrame({"config_hash": "a", "algorithm": "dpsgd", "has_server": False, "round": [1, 1, 2],
                         "client": [0, 1, 1],
                         "bytes_up": [3e6, 1e6, 1e6], "bytes_down": [0.0, 0.0, 2e6]})
    assert busiest_node_mb(rows)["busiest_node_mb"].tolist() == pytest.approx([3, 4])


def test_hamming_matrix_by_hand(sweep):
    masks = load_masks(sweep)
    ids, matrix = trial_hamming(masks, "dispfl1")
    assert ids == [0, 1, 2]
    np.testing.assert_allclose(matrix, HAMMING)
    np.testing.assert_allclose(matrix, matrix.T)
    assert (np.diag(matrix) == 0).all() and ((matrix >= 0) & (matrix <= 1)).all()
    np.testing.assert_allclose(hamming_matrix([np.array([True, False]), np.array([False, False])]),
                               [[0, 0.5], [0.5, 0]])
    # the best accuracy with masks is unfinished: the best finished DisPFL trial is shown
    assert _pick_dispfl_trial(masks, load_trials(sweep)) == "dispfl1"


def test_curves_are_means_over_seeds_of_the_best_configuration(sweep):
    trials = load_trials(sweep)
    finished = trials[trials["status"] == "COMPLETED"]
    curves = traffic_curves(load_rounds(sweep), finished).set_index(["method", "round"])
    assert curves.loc[("DisPFL", 3), "busiest_node_mb"] == pytest.approx((9 + 3) / 2)   # not the lr 0.05 trial
    assert curves.loc[("DisPFL", 3), "acc"] == pytest.approx((0.7 + 0.8) / 2)
    assert curves.loc[("DisPFL", 1), "acc"] == pytest.approx((0.7 + 0.8) / 2 - 0.2)
    assert np.isnan(curves.loc[("FedAvg", 2), "acc"])                                 # not evaluated
    assert curves.loc[("FedAvg", 2), "busiest_node_mb"] == pytest.approx(18)


def _names(paths):
    return {p.name for p in paths}


def test_figures_written_and_hooked_into_build_plots(sweep, tmp_path, capsys):
    out = tmp_path / "figures"
    paths = build_traffic_outputs(find_sweeps(sweep), load_trials(sweep), out)
    assert _names(paths) == {f"{n}.{e}" for n in ("accuracy_vs_busiest_traffic", "mask_hamming")
                             for e in ("png", "pdf")}
    assert all(p.exists() and p.stat().st_size > 0 for p in paths)
    everything = build_plots([sweep], tmp_path / "all")
    assert {"accuracy_vs_busiest_traffic.png", "mask_hamming.pdf", "accuracy_vs_round.png"} <= _names(everything)

    write_v1_sweep(tmp_path / "old")   # FedSelect, FedAvg, Local: nothing server-less that communicates
    assert build_traffic_outputs(find_sweeps(tmp_path / "old"), load_trials(tmp_path / "old"), out) == []
    printed = capsys.readouterr().out
    assert "skipping accuracy vs busiest-node traffic" in printed and "skipping mask Hamming heatmap" in printed


def test_traffic_table(sweep, tmp_path, capsys):
    out = tmp_path / "tables"
    assert tables.main([str(sweep), "--table", "traffic", "--out", str(out), "--markdown"]) == 0
    assert not (out / "methods.tex").exists()
    latex = (out / "traffic.tex").read_text()
    rows = body_rows(latex)
    assert list(rows) == ["FedAvg", "Local", "DisPFL"]           # the registry's order
    # 1-2 common seeds: no test against the best (DisPFL), so bold only where a cell prints the best
    # value; the reference, D-PSGD, did not run: no marks, and the caption says so
    assert rows["FedAvg"] == [r"55.0 $\pm$ 7.1", "27.0"]
    assert rows["Local"] == [r"40.0 (n=1)", "0.0"]
    assert rows["DisPFL"] == [r"\bfseries 75.0 $\pm$ 7.1", "6.0"]  # finished lr 0.1 seeds only: (9 + 3) / 2
    assert ("D-PSGD is not in this table: no marks against it" in latex
            and "blacktriangle" not in latex.split("\\midrule")[1].split("\\bottomrule")[0])
    assert "Left out: 1 run that did not finish (reached round 2 of 3)." in latex
    assert "Cells share fewer than 5 seeds (1--2 in common): no test and no mark" in latex
    assert "Busiest node (MB)" in latex and "synthetic, 3 shards" in latex
    check_latex(latex, tmp_path / "latex")
    markdown = (out / "traffic.md").read_text()
    assert "| DisPFL | **75.0 ± 7.1** | 6.0 |" in markdown
    assert "wrote" in capsys.readouterr().out

    auto = tables.build_tables([sweep], out=tmp_path / "auto")
    assert {"methods", "traffic"} <= set(auto)
    write_v1_sweep(tmp_path / "old")
    # v1 sweeps: the convergence check too
    assert set(tables.build_tables([tmp_path / "old"], out=tmp_path / "v1")) == {"methods", "convergence"}


def test_traffic_table_counts_a_diverged_run_and_names_the_reported_round(sweep, tmp_path):
    trials = pd.read_parquet(sweep / "trials.parquet")
    trials["diverged"] = trials["config_hash"] == "dispfl1"
    trials["report_round"], trials["reported_round"] = "best_val", 3
    trials.to_parquet(sweep / "trials.parquet", index=False)
    tables.build_tables([sweep], "traffic", out=tmp_path / "t")
    latex = (tmp_path / "t" / "traffic.tex").read_text()
    rows = body_rows(latex)
    assert rows["DisPFL"] == ["70.0 (1 of 2 seeds diverged)", "6.0"]       # not bold: seed 0 alone
    assert rows["FedAvg"] == [r"\bfseries 55.0 $\pm$ 7.1", "27.0"]
    assert "k of n seeds diverged" in latex and "Final personalized" not in latex
    assert ("Personalized accuracy (\\%) at each run's round with the best mean validation accuracy "
            "(report\\_round = best\\_val), mean $\\pm$ std over seeds") in latex
    summary = pd.read_parquet(tmp_path / "t" / "summary.parquet").set_index("row")
    assert summary.loc["DisPFL", "diverged"] == 1 and summary.loc["DisPFL", "n"] == 1


def test_a_method_whose_rows_do_not_say_whether_it_has_a_server_is_named_not_guessed():
    rows = pd.DataFrame({"config_hash": "a", "algorithm": "ext.mod:Gone", "round": [1], "client": [0],
                         "bytes_up": [1e6], "bytes_down": [0.0], "has_server": [None]})
    with pytest.raises(TableError, match=r"do not say whether ext\.mod:Gone has a server"):
        busiest_node_mb(rows)
