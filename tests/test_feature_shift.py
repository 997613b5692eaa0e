"""The feature-shift study (studies/feature_shift.toml) end to end on digits_c, and one short
FedSelect run on mnist_c (real MNIST under corruptions) that learns."""
from __future__ import annotations

import pandas as pd
import pytest

from conftest import SHARED_DATA
from fl_core.config import RunConfig
from fl_core.simulation import Simulation
from sweeps.run import study_named
from sweeps.spec import load_spec
from sweeps.study import run_study

FEATURE_SHIFT = study_named("feature_shift")


@pytest.mark.slow
def test_feature_shift_study_runs_every_method_on_both_domain_partitions(ray_cluster, tmp_path):
    listed = sorted(m.algorithm for m in load_spec(FEATURE_SHIFT.spec).methods)
    assert listed == sorted(["fedselect", "fedavg", "local", "fedavg_ft", "fedbn", "fedrep", "lg_fedavg", "ditto"])
    flags = ["--dataset", "digits_c", "--samples-per-client", "60", "--rounds", "2", "--seeds", "0",
             "--results", str(tmp_path), "--name", "fs", "--verbose", "0"]
    assert run_study(FEATURE_SHIFT, flags) == 0
    folder = tmp_path / "fs"
    trials = pd.read_parquet(folder / "trials.parquet")
    assert len(trials) == 2 * len(listed) and (trials.status == "COMPLETED").all()
    assert sorted(trials.setting.unique()) == ["digits_c, Dir(0.5) per domain", "digits_c, a client per domain"]
    assert sorted(trials.groupby("partition").num_clients.unique().map(tuple)) == [(4,), (8,)]
    clients = pd.concat(pd.read_parquet(p) for p in (folder / "clients").glob("*.parquet"))
    # every client holds one domain; one client per domain under `domain`, two under domain_dirichlet
    per_domain = clients.groupby(["config_hash", "partition"]).domain.value_counts().reset_index()
    assert set(per_domain.loc[per_domain.partition == "domain", "count"]) == {1}
    assert set(per_domain.loc[per_domain.partition == "domain_dirichlet", "count"]) == {2}
    assert (clients.pool == "seen").all()
    table = (folder / "tables" / "methods.tex").read_text()
    for name in ("FedSelect", "FedBN", "FedAvg", "Local", "Ditto", "LG-FedAvg", "FedRep", "FedAvg+FT"):
        assert name in table
    assert (folder / "figures" / "accuracy_vs_round.png").is_file()


@pytest.mark.skipif(not (SHARED_DATA / "MNIST" / "raw").is_dir(), reason="real MNIST not here")
def test_a_short_fedselect_run_on_mnist_c_learns():
    config = RunConfig(algorithm="fedselect", dataset="mnist_c", data_root=str(SHARED_DATA),
                       partition="domain_dirichlet", num_clients=8, dir_alpha=0.5, samples_per_client=200,
                       model="lenet_bn", rounds=4, local_epochs=2, lr=0.05, threads=1)
    results = list(Simulation(config).run())
    first, last = results[0].mean("acc"), results[-1].mean("acc")
    assert last > 0.6 and last > first + 0.05, (first, last)  # chance is 0.1
