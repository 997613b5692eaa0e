"""One formatter for every printed accuracy (analysis/numbers.py): tables, claims and convergence
print the same mean the same way, and "the best as printed" compares what `pct` prints."""
from __future__ import annotations

import math

import numpy as np
import pandas as pd

from analysis import claims, paired
from analysis.numbers import MISSING, as_printed, pct
from analysis.render import format_cell


def test_pct_prints_one_decimal_once_rounded_and_missing_values_as_a_dash():
    assert pct(0.87349) == "87.3" and pct(0.87351) == "87.4" and pct(0.012, sign=True) == "+1.2"
    assert pct(-0.0071, sign=True) == "-0.7" and pct(np.float32(0.5)) == "50.0"
    assert pct(math.nan) == pct(None) == pct(pd.NA) == MISSING


def test_the_same_mean_prints_alike_in_a_table_cell_and_a_claim():
    rng = np.random.default_rng(0)
    for _ in range(300):
        a, b = (pd.Series(rng.random(5)) for _ in range(2))
        d = paired.difference(a, b)
        cell_a = format_cell(a.mean(), a.std(), 5, 5)
        assert cell_a == f"{pct(a.mean())} ± {pct(a.std())}"
        assert claims.versus(a, b, d)["ours"] == f"{cell_a.split(' ± ')[0]} vs {pct(b.mean())}"  # the claim row's
        assert claims.interval(d) == (f"{pct(d.mean, sign=True)} "
                                      f"[{pct(d.ci_low, sign=True)}, {pct(d.ci_high, sign=True)}]")


def test_as_printed_is_what_pct_prints_as_numbers():
    frame = pd.DataFrame({"a": [0.87349, math.nan], "b": [0.5, 0.123456]})
    assert as_printed(frame).equals(pd.DataFrame({"a": [87.3, math.nan], "b": [50.0, 12.3]}))
    assert as_printed(frame["b"]).tolist() == [50.0, 12.3] and as_printed(0.87351) == 87.4
