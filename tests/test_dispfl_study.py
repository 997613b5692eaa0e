"""The DisPFL study (studies/dispfl.toml) end to end on a tiny setting: every method completes,
DisPFL's masks and metrics reach Parquet, and the traffic table and figures are written."""
from __future__ import annotations

import pandas as pd
import pytest

from sweeps.run import study_named
from sweeps.parquet_sink import read_rounds
from sweeps.spec import load_spec
from sweeps.study import run_study

DISPFL = study_named("dispfl")


@pytest.mark.slow
def test_dispfl_study_runs_with_its_anchors_and_writes_the_traffic_outputs(ray_cluster, tmp_path):
    spec = load_spec(DISPFL.spec)
    assert {m.algorithm for m in spec.methods if m.anchor} == {"dpsgd", "fedavg", "fedselect", "local", "ditto"}
    flags = ["--dataset", "synthetic", "--num-clients", "6", "--num-neighbours", "2", "--rounds", "2",
             "--local-epochs", "1", "--density", "0.5", "--topology", "random", "--regrowth", "random",
             "--seeds", "0", "--results", str(tmp_path), "--name", "dp", "--verbose", "0"]
    assert run_study(DISPFL, flags) == 0
    folder = tmp_path / "dp"
    trials = pd.read_parquet(folder / "trials.parquet")
    assert sorted(trials.algorithm) == ["dispfl", "ditto", "dpsgd", "fedavg", "fedselect", "local"]
    assert (trials.status == "COMPLETED").all()
    rounds = read_rounds(folder)
    sparse = rounds[rounds.algorithm == "dispfl"]
    assert sparse["mask_density"].between(0.45, 0.55).all() and sparse["density"].eq(0.5).all()
    assert sparse["train_gflops"].gt(0).all()
    # DisPFL sends about half of what D-PSGD sends over the same kind of graph (plus mask bits)
    sent = rounds.groupby("algorithm").bytes_up.sum()
    assert 0.4 < sent["dispfl"] / sent["dpsgd"] < 0.7
    masks = pd.read_parquet(next((folder / "masks").glob("*.parquet")))
    assert masks.client.nunique() == 6
    assert (folder / "tables" / "traffic.tex").is_file()
    assert (folder / "figures" / "accuracy_vs_busiest_traffic.png").is_file()
    assert (folder / "figures" / "mask_hamming.png").is_file()
    assert (folder / "figures" / "mask_churn.png").is_file()  # does the masks' churn flatten?
