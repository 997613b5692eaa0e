"""analysis.plots: pure computations, a sweep of engine v1 (no Ray), and the results of a real
(tiny) FedSelect grid sweep run in-process on Ray (slow)."""
from __future__ import annotations

import shutil

import matplotlib.image
import numpy as np
import pandas as pd
import pytest

from analysis.load import load_rounds, load_trials
from analysis.common import method_curves, trial_curves
from analysis.plots import build_plots, iou_matrix, main, plot_mask_churn

from sweep_helpers import V1_FINAL_ACC, write_v1_sweep

slow = pytest.mark.slow

FIGURES = ["accuracy_vs_round", "personal_fraction_communication", "mask_iou", "final_acc_vs_knobs"]


@pytest.fixture(scope="module")
def grid_results(ray_cluster, tmp_path_factory):
    from sweeps import fedselect_grid
    from sweeps.study import run_study

    tmp = tmp_path_factory.mktemp("plots_results")
    run_study(fedselect_grid.STUDY, ["--dataset", "synthetic", "--num-clients", "3", "--shards-per-client", "3",
                                     "--batch-size", "16", "--rounds", "3", "--pers-rate", "0.25", "0.5",
                                     "--pers-limit", "0.8", "--dir-alpha", "0.5", "--local-epochs", "1",
                                     "--seeds", "0", "--results", str(tmp), "--name", "grid", "--verbose", "0"])
    return tmp


def test_mask_churn_is_drawn_per_setting_from_the_chosen_trials_and_only_where_masks_move(tmp_path):
    trials = pd.DataFrame([{"config_hash": f"h{seed}", "setting": "s", "method": "DisPFL", "seed": seed,
                            "acc_mean": 0.8, "status": "COMPLETED", "lr": 0.1} for seed in (0, 1)])
    rounds = pd.DataFrame([{"config_hash": f"h{seed}", "round": r, "client": c, "mask_churn": 0.2 / r}
                           for seed in (0, 1) for r in (1, 2, 3) for c in (0, 1)])
    paths = plot_mask_churn(rounds, trials, tmp_path)
    assert [p.name for p in paths if p.suffix == ".png"] == ["mask_churn.png"]
    assert matplotlib.image.imread(paths[0] if paths[0].suffix == ".png" else paths[1]).shape[0] > 100
    assert plot_mask_churn(rounds.assign(mask_churn=np.nan), trials, tmp_path / "none") == []
    assert plot_mask_churn(rounds.drop(columns="mask_churn"), trials, tmp_path / "none") == []


def test_iou_matrix_by_hand():
    a = np.array([True, True, False, False])
    b = np.array([True, False, True, False])
    # intersection {0}, union {0, 1, 2}
    expected = np.array([[1.0, 1 / 3], [1 / 3, 1.0]])
    np.testing.assert_allclose(iou_matrix([a, b]), expected)


def test_iou_matrix_empty_masks_are_identical():
    empty = np.zeros(5, dtype=bool)
    full = np.ones(5, dtype=bool)
    np.testing.assert_allclose(iou_matrix([empty, empty, full]),
                               [[1.0, 1.0, 0.0], [1.0, 1.0, 0.0], [0.0, 0.0, 1.0]])


def test_iou_matrix_symmetric_with_unit_diagonal():
    rng = np.random.default_rng(0)
    masks = [rng.random(50) < p for p in (0.1, 0.5, 0.9, 0.0)]
    matrix = iou_matrix(masks)
    np.testing.assert_allclose(matrix, matrix.T)
    np.testing.assert_allclose(np.diag(matrix), 1.0)
    assert ((matrix >= 0) & (matrix <= 1)).all()


def _check_written(paths, out, names):
    assert {p.name for p in paths} == {f"{n}.{ext}" for n in names for ext in ("png", "pdf")}
    for path in paths:
        assert path.parent == out and path.stat().st_size > 0
        if path.suffix == ".png":
            image = matplotlib.image.imread(path)
            assert image.ndim == 3 and image.shape[0] > 100 and image.shape[1] > 100
            assert image[..., :3].std() > 0.01  # not a blank canvas
        else:
            assert path.read_bytes().startswith(b"%PDF")


def test_v1_sweep_curves_and_figures(tmp_path, capsys):
    write_v1_sweep(tmp_path / "old")
    stats = method_curves(load_rounds(tmp_path), load_trials(tmp_path)).set_index(["method", "round"])
    # per round: mean over clients per seed, then mean and std (ddof 1) over the two seeds
    for algorithm, method in (("fedselect", "FedSelect"), ("fedavg", "FedAvg"), ("local", "Local")):
        finals = [np.mean(V1_FINAL_ACC[(algorithm, seed)]) for seed in (0, 1)]
        assert stats.loc[(method, 2), "acc_mean_mean"] == pytest.approx(np.mean(finals))
        assert stats.loc[(method, 2), "acc_mean_std"] == pytest.approx(np.std(finals, ddof=1))
        assert stats.loc[(method, 1), "acc_mean_mean"] == pytest.approx(np.mean(finals) - 0.1)
        assert stats.loc[(method, 2), "mb_total_mean"] == pytest.approx(2 * 3 * 2000 / 1e6)
    out = tmp_path / "figures"
    paths = build_plots([tmp_path / "old"], out)
    _check_written(paths, out, ["accuracy_vs_round", "personal_fraction_communication", "mask_iou"])
    assert "skipping final accuracy vs knobs" in capsys.readouterr().out


def test_unevaluated_rounds_have_no_accuracy_point():
    rows = pd.DataFrame({"config_hash": "a", "round": [1, 1, 2, 2], "client": [0, 1, 0, 1],
                         "acc": [np.nan, np.nan, 0.5, 0.7], "acc_local": np.nan, "acc_global": np.nan, "loss": 0.1,
                         "personal_fraction": 0.0, "bytes_up": 10, "bytes_down": 5, "n_test": 1})
    curves = trial_curves(rows)
    assert np.isnan(curves["acc_mean"].iloc[0]) and curves["acc_mean"].iloc[1] == pytest.approx(0.6)
    assert curves["mb_total"].tolist() == pytest.approx([30e-6, 60e-6])


@slow
def test_build_plots_writes_every_figure(grid_results, tmp_path):
    out = tmp_path / "figures"
    paths = build_plots([grid_results], out)
    _check_written(paths, out, FIGURES)


@slow
def test_cli_default_out_is_first_path_figures(grid_results, capsys):
    main([str(grid_results)])
    printed = capsys.readouterr().out.split()
    assert f"{grid_results / 'figures' / 'mask_iou.png'}" in printed
    assert (grid_results / "figures" / "accuracy_vs_round.pdf").stat().st_size > 0


@slow
def test_cumulative_communication_matches_pandas(grid_results):
    rounds = load_rounds([grid_results])
    curves = trial_curves(rounds)
    last = curves[curves["round"] == curves.groupby("config_hash")["round"].transform("max")].set_index("config_hash")
    expected = (rounds["bytes_up"] + rounds["bytes_down"]).groupby(rounds["config_hash"]).sum() / 1e6
    assert len(expected) >= 2 and (expected > 0).any()
    np.testing.assert_allclose(last["mb_total"].sort_index(), expected.sort_index())
    assert (last["round"] == 3).all()
    final = rounds[rounds["round"] == 3].groupby("config_hash")["acc"].mean()   # mean over clients
    np.testing.assert_allclose(last["acc_mean"].sort_index(), final.sort_index())


@slow
def test_missing_masks_skip_heatmap(grid_results, tmp_path, capsys):
    copy = tmp_path / "grid"
    shutil.copytree(grid_results / "grid", copy, ignore=shutil.ignore_patterns("masks", "figures"))
    out = tmp_path / "figures"
    paths = build_plots([copy], out)
    assert "skipping mask IoU heatmap" in capsys.readouterr().out
    _check_written(paths, out, [f for f in FIGURES if f != "mask_iou"])


def test_a_curves_legend_names_the_configuration_the_tables_report():
    """The figures draw each method at `chosen_trials`' configuration and say which: the knobs its
    search varied, at the chosen values (the committed Table 1 rerun: FedSelect's p and α from
    its search_best table)."""
    from analysis.common import chosen_labels, chosen_trials
    from analysis.load import load_trials
    from conftest import REPO

    trials = load_trials(sorted((REPO / "docs" / "results" / "baselines-fmnist" / "data").iterdir()))
    labels = chosen_labels(trials)
    fedselect = chosen_trials(trials).query("method == 'FedSelect'").iloc[0]
    assert labels[("fmnist, 5 shards", "FedSelect")] == (f"FedSelect (lr = {fedselect.lr:.3g}, "
                                                         f"p = {fedselect.pers_rate:.3g}, "
                                                         f"α = {fedselect.pers_limit:.3g})")
    assert "p = 0.53" in labels[("fmnist, 5 shards", "FedSelect")]   # the page's search_best: p = 0.53, α = 0.36
    assert labels[("fmnist, 5 shards", "FedAvg")].startswith("FedAvg (lr = ")
