"""benchmarks/compare_sweeps.py: two sweeps' round rows compared to the last bit, timing left out."""
import numpy as np
import pandas as pd

from benchmarks.compare_sweeps import differences


def rows(**changes):
    frame = pd.DataFrame({"config_hash": ["a", "a", "b"], "round": [1, 2, 1], "client": [0, 0, 0],
                          "acc": [0.5, 0.75, np.nan], "method": ["FedAvg"] * 3, "seconds": [1.0, 2.0, 3.0]})
    for column, (i, value) in changes.items():
        frame.loc[i, column] = value
    return frame


def test_identical_rows_differ_only_in_timing():
    count, columns, problems = differences(rows(), rows(seconds=(0, 9.0)))
    assert (count, columns, problems) == (3, ["acc", "method"], [])  # NaN equals NaN; seconds not compared


def test_a_changed_value_and_a_missing_row_are_reported():
    _, _, problems = differences(rows(acc=(1, 0.75 + 1e-12)), rows().iloc[:2])
    assert problems == ["1 rows only in the first", "acc: 1 rows differ, largest |difference| 1e-12"]
