"""The PerFedMask study (studies/perfedmask.toml) end to end on a tiny setting: every method and
both participation rates complete, the devices' costs reach Parquet, and the cost table sets
accuracy before/after fine-tuning per c beside trainable parameters and FLOPs."""
from __future__ import annotations

import pandas as pd
import pytest

from analysis.cost import cost_table
from sweeps.run import study_named
from sweeps.parquet_sink import read_rounds
from sweeps.spec import load_spec
from sweeps.study import run_study

from conftest import SHARED_DATA

PERFEDMASK = study_named("perfedmask")

METHODS = ["fedavg_ft", "fedbabu", "fednova", "fedprox", "heterofl", "perfedmask", "splitmix"]


def test_the_study_file_is_the_posters_comparison():
    spec = load_spec(PERFEDMASK.spec)
    assert sorted({m.algorithm for m in spec.methods}) == METHODS
    assert list(spec.knobs["participation"]) == [1.0, 0.1] and tuple(spec.seeds) == (0, 1, 2)
    ablation = [m for m in spec.methods if "full_share" in m.knobs]
    assert len(ablation) == 1 and list(ablation[0].knobs["full_share"]) == [0.2, 0.4, 0.6, 0.8, 1.0]


@pytest.mark.slow
def test_perfedmask_study_runs_and_writes_the_cost_table(ray_cluster, tmp_path):
    flags = ["--dataset", "synthetic", "--num-clients", "8", "--samples-per-client", "none",
             "--test-samples-per-client", "none", "--rounds", "2", "--eval-every", "1", "--local-epochs", "1",
             "--participation", "1.0", "0.5", "--full-share", "0.25", "--ft-epochs", "1", "--score-width", "full",
             "--seeds", "0", "--results", str(tmp_path), "--name", "pm", "--verbose", "0"]
    assert run_study(PERFEDMASK, flags) == 0
    folder = tmp_path / "pm"
    trials = pd.read_parquet(folder / "trials.parquet")
    assert (trials.status == "COMPLETED").all() and len(trials) == 8 * 2  # flags override the file: ν = 0.25 at both c
    assert set(trials.setting) == {"synthetic, 3 shards", "synthetic, 3 shards, c = 0.5"}
    rounds = read_rounds(folder)
    assert rounds["trainable_params"].notna().any() and rounds["bwd_mflops"].gt(0).any()
    assert (folder / "tables" / "cost.tex").is_file()

    cells, bold, caption, summary = cost_table(folder, trials)
    assert list(cells.columns.get_level_values(0).unique()) == ["c = 1", "c = 0.5", "Cost"]
    own = ("c = 1", "After FT, own width")  # HeteroFL and Split-Mix scored at full width, their sub-models beside
    assert cells[own].notna().tolist() == [m in ("HeteroFL (full width)", "Split-Mix FL (full width)")
                                           for m in cells.index]
    assert '"full width": scored on the full-width model' in caption
    cells = cells.drop(columns=[c for c in cells.columns if c[1] == "After FT, own width"])
    cells.index = [m.replace(" (full width)", "") for m in cells.index]
    assert list(cells.index) == ["FedAvg+FT", "FedBABU", "FedProx", "FedNova", "HeteroFL", "Split-Mix FL",
                                 "PerFedMask", "PerFedMask (ν = 0.25)"]
    params = cells[("Cost", "Params (K)")].astype(float)
    # half the devices train at most 1/8 of the body: PerFedMask and HeteroFL train fewer parameters
    assert params["PerFedMask"] < params["FedBABU"] < params["FedAvg+FT"]
    assert params["HeteroFL"] < params["FedAvg+FT"] and params["PerFedMask (ν = 0.25)"] < params["PerFedMask"]
    assert params["Split-Mix FL"] < params["HeteroFL"]  # a 1/8 device trains one base; a full one all 8
    fwd, bwd = (cells[("Cost", h)].astype(float) for h in ("Fwd MFLOPs", "Bwd MFLOPs"))
    assert fwd["PerFedMask"] == fwd["FedBABU"] and bwd["PerFedMask"] < bwd["FedBABU"]
    assert cells.notna().all().all()
    # bold: after fine-tuning only, the best of each c and those not significantly worse (analysis.stats)
    after = [column for column in bold.columns if column[1] == "After FT"]
    assert bold[after].any().all() and not bold.drop(columns=after).to_numpy().any()
    assert "before and after fine-tuning" in caption and "significantly better/worse than FedAvg+FT" in caption
    assert set(summary["reference"]) == {"FedAvg+FT"} and len(summary) == 2 * 2 * len(cells)  # c x before/after


@pytest.mark.slow
@pytest.mark.skipif(not (SHARED_DATA / "FashionMNIST" / "raw").is_dir(),
                    reason=f"real Fashion-MNIST not found at {SHARED_DATA / 'FashionMNIST' / 'raw'}")
def test_the_fmnist_study_on_a_slice_tunes_every_method_and_reports_the_authors_round(ray_cluster, tmp_path):
    """studies/perfedmask_fmnist.toml on a slice of Fashion-MNIST (8 devices of 20 images, 4 rounds,
    2 configurations a method): every method is searched then confirmed on 5 seeds, each run reports
    its best-validation round before fine-tuning, the devices below full width of the full-model
    baselines run half the epochs, and the claims read the study file's margin."""
    from analysis.claims import check_claims

    flags = ["--preset", "fmnist", "--data-root", str(SHARED_DATA), "--num-clients", "8", "--samples-per-client",
             "20", "--test-samples-per-client", "20", "--rounds", "4", "--eval-every", "2", "--lr-milestones", "2,3",
             "--local-epochs", "2", "--ft-epochs", "1", "--num-samples", "2", "--results", str(tmp_path),
             "--name", "pmf", "--verbose", "0"]
    assert run_study(PERFEDMASK, flags) == 0
    folder = tmp_path / "pmf"
    trials = pd.read_parquet(folder / "trials.parquet")
    assert (trials.status.isin(["COMPLETED", "STOPPED"])).all()
    assert trials.groupby("method")["stage"].apply(lambda s: (s == "confirm").sum()).eq(5).all()
    assert set(trials.report_round) == {"best_val_global"} and trials.reported_round.isin([2, 4]).all()
    rounds = read_rounds(folder)
    limited = rounds[rounds["weak_epochs"].eq(0.5) & rounds["epochs_run"].notna()]
    assert set(limited.loc[limited.ratio < 1, "epochs_run"]) == {1}
    assert set(limited.loc[limited.ratio == 1, "epochs_run"]) == {2}
    rows = check_claims([folder])
    mine = rows[rows["paper"] == "PerFedMask"]
    assert len(mine) and set(mine["margin"].dropna()) == {0.01}
    # the cost table marks against FedAvg+FT under the label the devices' limits give it
    caption = cost_table(folder, trials)[2]
    assert "significantly better/worse than FedAvg+FT (weak ×0.5)" in caption and "not in this table" not in caption
