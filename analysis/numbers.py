"""How every table, caption and claim prints an accuracy: one formatter, so that a mean shown twice
on one page is shown alike.

Accuracies are fractions; they print as percentages with one decimal, rounded once by Python's
correctly rounded `format` (never numpy's `round`, which scales first and can land the other way
on a halfway value). Comparisons of "what the reader sees" (bold for the best printed value) use
`as_printed`, the same rounding as numbers."""
from __future__ import annotations

import math

import pandas as pd

MISSING = "--"


def pct(fraction: float | None, sign: bool = False) -> str:
    """A fraction as a percentage with one decimal, e.g. 0.8735 -> "87.3" (or "+87.3" with `sign`);
    MISSING for None or NaN."""
    if fraction is None or pd.isna(fraction):
        return MISSING
    return f"{100 * float(fraction):{'+' if sign else ''}.1f}"


def as_printed(values):
    """The percentages `pct` prints, as numbers (a float, Series or DataFrame; NaN stays NaN)."""
    def one(v):
        return math.nan if pd.isna(v) else float(pct(v))
    return values.map(one) if isinstance(values, (pd.DataFrame, pd.Series)) else one(values)
