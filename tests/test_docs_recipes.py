"""The docs' code that reads a sweep's results runs as printed against a real small sweep and gives
what its text says: every ```python block of docs/index.md's "Files of a sweep" and of
docs/schema.md, executed in order in one namespace from a folder whose results/ holds the sweep
(no name typed: `latest_sweep` finds it). The sweep varies the local epochs and runs FedAvg and
Local beside FedSelect, the two ways a careless groupby pools or drops runs."""
from __future__ import annotations

import re

import pandas as pd
import pytest

from fl_core.result_files import latest_sweep, sweep_folders
from sweeps.fedselect_grid import STUDY
from sweeps.study import run_study

from conftest import REPO

SEEDS, EPOCHS, P = (0, 1), (1, 2), (0.1, 0.5)
SMALL = ["--dataset", "synthetic", "--num-clients", "3", "--partition", "shards", "--shards-per-client", "3",
         "--batch-size", "16", "--rounds", "2", "--pers-rate", *map(str, P), "--pers-limit", "0.5",
         "--local-epochs", *map(str, EPOCHS), "--seeds", *map(str, SEEDS), "--verbose", "0"]


def python_blocks(page: str, after: str | None = None) -> list[str]:
    text = (REPO / "docs" / page).read_text()
    if after is not None:
        text = text[text.index(after):]
    return re.findall(r"```python\n(.*?)```", text, re.S)


@pytest.fixture(scope="module")
def results_cwd(ray_cluster, tmp_path_factory):
    """A results/ folder holding an older sweep and the small grid sweep, run last."""
    root = tmp_path_factory.mktemp("recipes")
    (root / "results" / "older").mkdir(parents=True)
    (root / "results" / "older" / "trials.parquet").write_bytes(b"")  # a sweep folder written before
    assert run_study(STUDY, [*SMALL, "--results", str(root / "results")]) == 0
    return root


@pytest.mark.slow
def test_getting_starteds_recipe_gives_one_row_per_configuration_with_every_seed(results_cwd, monkeypatch):
    monkeypatch.chdir(results_cwd)
    blocks = python_blocks("index.md", after="## Files of a sweep")
    assert len(blocks) == 2 and "latest_sweep(" in blocks[0] and "dropna=False" in blocks[0]
    namespace: dict = {"print": lambda *a, **k: None}
    for block in blocks:
        exec(block, namespace)  # noqa: S102 - the page's own code, as a reader runs it
    folder, cells, trials = namespace["folder"], namespace["cells"], namespace["trials"]
    assert folder.name.startswith("fedselect_grid-") and folder == latest_sweep("results")
    assert [p.name for p in sweep_folders("results")][0] == "older"       # the newest, not the first
    # one row per configuration: per epochs, 2 FedSelect configurations, FedAvg and Local, each over every seed
    assert len(cells) == len(EPOCHS) * (len(P) + 2) and (cells["count"] == len(SEEDS)).all()
    methods = cells.reset_index().groupby("local_epochs")["method"].apply(sorted).to_dict()
    assert methods == {e: ["FedAvg", "FedSelect", "FedSelect", "Local"] for e in EPOCHS}
    by_config = trials.groupby(["local_epochs", "method", "pers_rate"], dropna=False).acc_mean.mean()
    assert cells["mean"].to_numpy() == pytest.approx(by_config.to_numpy())
    # without dropna=False the anchors vanish: the pitfall the text names is real
    assert len(trials.groupby(namespace["configs"]).acc_mean.mean()) == len(EPOCHS) * len(P)
    per_trial, reported = namespace["per_trial"], trials.set_index("config_hash").acc_mean
    assert per_trial.to_numpy() == pytest.approx(reported.loc[per_trial.index].to_numpy())


@pytest.mark.slow
def test_schema_pages_readers_read_every_row(results_cwd, monkeypatch):
    monkeypatch.chdir(results_cwd)
    blocks = python_blocks("schema.md")
    assert len(blocks) == 2
    namespace: dict = {}
    for block in blocks:
        exec(block, namespace)  # noqa: S102
    df, few, rows, same = namespace["df"], namespace["few"], namespace["rows"], namespace["same"]
    trials = pd.read_parquet(namespace["folder"] / "trials.parquet")
    expected = len(trials) * 2 * 3   # trials x rounds x clients
    assert len(df) == len(few) == len(rows) == same.height == expected
    assert {"acc", "method", "setting", "round"} <= set(few.columns) < set(df.columns)
    per_method = namespace["per_method"]
    assert sorted(per_method["method"]) == ["FedAvg", "FedSelect", "Local"]
