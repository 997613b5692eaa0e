"""Are two sweeps' results the same? Every round row of every trial, compared to the last bit.

For an optimisation that must not change results: run the same sweep before and after it and
compare the two folders. Rows are matched on (config_hash, round, client); the columns that
measure time or where and when a trial ran (seconds, timestamps, node, trial ids, sweep name,
the package version) are left out; every other column must be equal (NaN equals NaN). Prints
the number of rows and columns compared and each column that differs with its largest absolute
difference; exits 1 when anything differs or a row is missing on one side.

    .venv/bin/python -m benchmarks.compare_sweeps results/before results/after
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import pandas as pd


from sweeps.parquet_sink import read_rounds

KEY = ["config_hash", "round", "client"]
CIRCUMSTANTIAL = {"seconds", "round_seconds", "wall_seconds", "started_at", "reported_at", "sweep", "trial_id",
                  "node_id", "version", "data_from_driver", "gpus_assigned", "device"}


def differences(a: pd.DataFrame, b: pd.DataFrame) -> tuple[int, list[str], list[str]]:
    """(rows compared, columns compared, one line per difference)."""
    problems = []
    merged = a.merge(b, on=KEY, how="outer", suffixes=("_a", "_b"), indicator=True)
    for side, label in (("left_only", "only in the first"), ("right_only", "only in the second")):
        count = int((merged["_merge"] == side).sum())
        if count:
            problems.append(f"{count} rows {label}")
    both = merged[merged["_merge"] == "both"]
    columns = sorted(c for c in (set(a.columns) & set(b.columns)) - set(KEY) - CIRCUMSTANTIAL
                     if not c.endswith("_seconds"))  # measured times (round_seconds, hypergrad_seconds, ...)
    for column in columns:
        left, right = both[f"{column}_a"], both[f"{column}_b"]
        same = (left == right) | (left.isna() & right.isna())
        if not same.all():
            try:
                gap = float(np.nanmax(np.abs(left[~same].astype(float).to_numpy()
                                             - right[~same].astype(float).to_numpy())))
                problems.append(f"{column}: {int((~same).sum())} rows differ, largest |difference| {gap:.3g}")
            except (TypeError, ValueError):
                problems.append(f"{column}: {int((~same).sum())} rows differ")
    return len(both), columns, problems


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("first", type=Path)
    parser.add_argument("second", type=Path)
    opts = parser.parse_args()
    rows, columns, problems = differences(read_rounds(opts.first), read_rounds(opts.second))
    print(f"{rows} round rows x {len(columns)} columns compared")
    for line in problems:
        print("  " + line)
    print("identical" if not problems else "DIFFERENT")
    sys.exit(1 if problems else 0)


if __name__ == "__main__":
    main()
