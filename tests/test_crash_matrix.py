"""The crash matrix on its small case (benchmarks/crash_matrix.py): a grid sweep SIGKILLed twice at
seeded moments (its driver's process group, or a trial's Ray worker) and resumed each time ends
with the rows, trial statuses and MLflow runs of an uninterrupted run. Each driver starts its own
local Ray, as a user's does (slow: about a minute)."""
from __future__ import annotations

import random

import pytest

from benchmarks.crash_matrix import kinds, run_kind


@pytest.mark.slow
def test_a_grid_killed_twice_and_resumed_equals_the_uninterrupted_run(tmp_path):
    row = run_kind(kinds(tmp_path)["grid"], kills=2, rng=random.Random(0), work=tmp_path)
    assert row["finished"] and row["kills"] >= 1 and row["starts"] >= 2, row
    assert row["differences"] == 0, row["detail"]
    assert row["rows"] == 4 * 20 * 3 and row["columns"] > 40   # 4 trials x 20 rounds x 3 clients, every result column
    assert row["trials"] == row["mlflow_trial_runs"] == 4
    assert row["mlflow_duplicates"] == 0 and row["mlflow_running"] == 0 and row["mlflow_sweep_runs"] == 1
