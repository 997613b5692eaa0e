"""A finished sweep's Parquet files read whole by the readers researchers use: pandas,
pyarrow.dataset, Polars and DuckDB. Methods write different columns (their knobs, their metrics);
`unify_schema` gives every file its folder's union schema, so no reader drops a column or a row
whatever the file order. A folder that is not a sweep is one clear error."""
from __future__ import annotations

import duckdb
import pandas as pd
import polars as pl
import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest

from fl_core.results import round_rows, write_parquet
from fl_core.simulation import Simulation
from sweeps.parquet_sink import read_rounds, read_sweep, trial_path, unify_schema

from conftest import tiny

METHODS = {"fedselect": {}, "fedavg": {}, "fednova": {"local_epochs_min": 1, "local_epochs": 2}, "local": {}}


@pytest.fixture
def sweep(tmp_path):
    """A sweep folder with one compacted rounds file per method (each its own columns), written
    in an order where the first file has the fewest columns."""
    folder = tmp_path / "mixed"
    for algorithm, knobs in sorted(METHODS.items(), key=lambda item: item[0] != "local"):
        config = tiny(algorithm=algorithm, rounds=2, **knobs)
        sim = Simulation(config)
        rows = [row for result in sim.run() for row in round_rows(result, config, sim.model_name, sweep="mixed")]
        write_parquet(pd.DataFrame(rows), trial_path(folder, config.config_hash()))
    return folder


def test_before_unifying_the_folder_reads_differ_by_reader(sweep):
    union = set(read_rounds(sweep).columns)
    first = set(pq.read_schema(sorted((sweep / "rounds").glob("*.parquet"))[0]).names)
    assert first < union  # the premise: files differ, so a reader taking one file's schema drops columns
    with pytest.raises(Exception):  # Polars refuses files with columns outside the first file's
        pl.read_parquet(str(sweep / "rounds" / "*.parquet"))


def test_after_unifying_every_reader_gets_every_column_and_row(sweep):
    expected = read_rounds(sweep)
    assert unify_schema(sweep) > 0
    files = sorted((sweep / "rounds").glob("*.parquet"))
    assert len({pq.read_schema(f).remove_metadata() for f in files}) == 1
    columns, rows = set(expected.columns), len(expected)
    pandas_frame = pd.read_parquet(sweep / "rounds")
    arrow_table = ds.dataset(sweep / "rounds").to_table()
    polars_frame = pl.read_parquet(str(sweep / "rounds" / "*.parquet"))
    duck = duckdb.sql(f"select * from read_parquet('{sweep / 'rounds'}/*.parquet')").df()
    for name, got in (("pandas", pandas_frame), ("pyarrow", arrow_table.to_pandas()),
                      ("polars", polars_frame.to_pandas()), ("duckdb", duck)):
        assert set(got.columns) == columns and len(got) == rows, name
    nova = pandas_frame[pandas_frame.algorithm == "fednova"]
    assert nova["nova_a"].notna().all() and pandas_frame.loc[pandas_frame.algorithm != "fednova", "nova_a"].isna().all()
    assert pandas_frame.loc[pandas_frame.algorithm == "fedselect", "pers_rate"].eq(0.3).all()
    again = read_rounds(sweep)  # the platform's own reader gives the same rows as before
    pd.testing.assert_frame_equal(again[expected.columns], expected, check_dtype=False)
    assert unify_schema(sweep) == 0  # nothing left to rewrite


def test_a_folder_that_is_not_a_sweep_is_one_clear_error(sweep):
    with pytest.raises(ValueError, match="is not a sweep folder .* sweeps in it: mixed"):
        read_sweep(sweep.parent)
    with pytest.raises(ValueError, match="no sweep below it either"):
        read_sweep(sweep / "rounds")


def test_a_damaged_file_is_left_as_it_is_and_the_rest_unified(sweep):
    files = sorted((sweep / "rounds").glob("*.parquet"))
    damaged = files[-1]
    damaged.write_bytes(damaged.read_bytes()[:100])  # a copy cut short
    assert unify_schema(sweep) > 0
    assert damaged.stat().st_size == 100
    assert len({pq.read_schema(f).remove_metadata() for f in files[:-1]}) == 1
