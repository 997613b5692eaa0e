"""Paired comparisons with the seed as the unit: the difference of two methods, its 95 % confidence
interval, superiority, non-inferiority and equivalence tests, Holm's correction, and the smallest
difference a study could have detected.

Two runs with the same seed share the data partition and the initial model, so a comparison of
methods A and B is one number per common seed: A's mean accuracy over clients minus B's. The
clients of one run are not independent samples (they share the model and the seed's partition):
a test over (client, seed) pairs rejects far more often than its nominal level under no true
difference (`tests/test_paired.py` simulates it), so every statistic here is over seeds.

- `difference(a, b)`: the mean paired difference, its t interval (`scipy.stats.t.interval`) and
  the two-sided paired t-test (`scipy.stats.ttest_1samp` of the differences), from 2 common seeds;
  a *test* is only reported (`Difference.tested`) from `MIN_SEEDS` seeds: below that its power is
  too small to say anything and its normality cannot be judged, so tables print no mark;
- `equivalence(d, margin)`: two one-sided t-tests (TOST): equivalent within ±margin when both
  reject, i.e. the 90 % interval lies inside (−margin, +margin);
- `noninferior(d, margin)`: the one-sided t-test of difference > −margin;
- `outside(d, margin)`: the test that the difference lies beyond ±margin (refutes equivalence);
- `hierarchical_bootstrap(d)`: a percentile interval of the paired difference from per-(seed,
  client) differences A − B, resampling seeds, then clients within each drawn seed: descriptive
  only (an interval for 2-4 seeds where per-client accuracies are known), never a test or a mark;
- `holm(p)`: Holm's step-down adjustment within one family (a paper's claims);
- `detectable(sd, n)`: the smallest true difference the two-sided paired t-test at level `ALPHA`
  finds with probability `POWER` over n seeds whose differences vary with standard deviation sd
  (noncentral t, `scipy.stats.nct`): what "inconclusive" could have seen.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd
from scipy import optimize
from scipy import stats as scipy_stats

ALPHA = 0.05
CONFIDENCE = 0.95
POWER = 0.8
MIN_SEEDS = 5
BOOTSTRAP_RESAMPLES = 10_000  # default: the ends move by under 1 % of the width between generator seeds
BOOTSTRAP_CHUNK = 1_000       # resamples drawn at once (bounds the memory of many clients per seed)


@dataclass(frozen=True)
class Difference:
    """A minus B over their common seeds: mean, 95 % CI, two-sided p (NaN below 2 seeds), n seeds,
    sd of the per-seed differences, and the per-seed differences themselves."""
    mean: float
    ci_low: float
    ci_high: float
    p: float
    n: int
    sd: float
    per_seed: tuple[float, ...]

    @property
    def tested(self) -> bool:
        """Whether the test may be reported (a mark, a verdict): MIN_SEEDS common seeds or more."""
        return self.n >= MIN_SEEDS and math.isfinite(self.p)


def differences(a: pd.Series, b: pd.Series) -> np.ndarray:
    """A − B per common seed (both indexed by seed, one value each), in seed order."""
    common = a.index.intersection(b.index).sort_values()
    return np.asarray(a[common], dtype=float) - np.asarray(b[common], dtype=float)


def difference(a: pd.Series, b: pd.Series, confidence: float = CONFIDENCE) -> Difference:
    """The paired difference of the module docstring; a, b: per-seed values indexed by seed."""
    d = differences(a, b)
    n = int(d.size)
    if n == 0:
        return Difference(math.nan, math.nan, math.nan, math.nan, 0, math.nan, ())
    mean = float(d.mean())
    if n < 2:
        return Difference(mean, math.nan, math.nan, math.nan, n, math.nan, tuple(d))
    sd = float(d.std(ddof=1))
    if sd == 0.0:  # every seed differs by the same amount: the interval is that point
        return Difference(mean, mean, mean, 1.0 if mean == 0 else 0.0, n, 0.0, tuple(d))
    low, high = scipy_stats.t.interval(confidence, n - 1, loc=mean, scale=sd / math.sqrt(n))
    p = float(scipy_stats.ttest_1samp(d, 0.0).pvalue)
    return Difference(mean, float(low), float(high), p, n, sd, tuple(d))


def client_differences(a: pd.Series, b: pd.Series) -> pd.Series:
    """A − B per common (seed, client): a and b indexed by (seed, client), one value each."""
    common = a.index.intersection(b.index).sort_values()
    return pd.Series(np.asarray(a[common], dtype=float) - np.asarray(b[common], dtype=float), index=common)


def bootstrap_means(d: pd.Series, resamples: int = BOOTSTRAP_RESAMPLES, seed: int = 0) -> np.ndarray:
    """`resamples` draws of the hierarchical bootstrap of the mean difference: each draws as many
    seeds as `d` has (the first index level), with replacement, then for every drawn seed as many
    of its clients as it has, with replacement, and takes the mean over the drawn seeds of the
    mean of their drawn clients. A seed drawn twice gets two independent client draws.
    Deterministic given `seed` (`numpy.random.default_rng`)."""
    groups = [np.asarray(part, dtype=float) for _, part in d.groupby(level=0, sort=True)]
    if not groups:
        raise ValueError("no (seed, client) differences to resample")
    counts = np.array([g.size for g in groups])
    widest = int(counts.max())
    padded = np.zeros((len(groups), widest))
    for i, g in enumerate(groups):
        padded[i, :g.size] = g
    rng, out = np.random.default_rng(seed), np.empty(resamples)
    for start in range(0, resamples, BOOTSTRAP_CHUNK):
        size = min(BOOTSTRAP_CHUNK, resamples - start)
        drawn = rng.integers(len(groups), size=(size, len(groups)))               # the seeds of each draw
        n = counts[drawn][..., None]                                               # their client counts
        picks = (rng.random((size, len(groups), widest)) * n).astype(int)          # uniform in 0..n-1
        used = np.arange(widest) < n                                               # n draws per seed
        values = np.where(used, padded[drawn[..., None], picks], 0.0)
        out[start:start + size] = (values.sum(axis=2) / n[..., 0]).mean(axis=1)
    return out


def hierarchical_bootstrap(d: pd.Series, confidence: float = CONFIDENCE, resamples: int = BOOTSTRAP_RESAMPLES,
                           seed: int = 0) -> tuple[float, float]:
    """The percentile interval (`confidence`) of `bootstrap_means` of the per-(seed, client)
    differences `d`; NaN for none, the point itself when they are all equal. Descriptive: with
    2-4 seeds it shows how far the clients and seeds spread the difference, it tests nothing."""
    values = np.asarray(d, dtype=float)
    if values.size == 0:
        return math.nan, math.nan
    if np.all(values == values[0]):
        return float(values[0]), float(values[0])
    tail = (1 - confidence) / 2
    low, high = np.quantile(bootstrap_means(d, resamples, seed), [tail, 1 - tail])
    return float(low), float(high)


def _one_sided(d: Difference, shift: float, alternative: str) -> float:
    """p of the one-sided t-test of mean − shift (greater / less than zero)."""
    if d.n < 2:
        return math.nan
    if d.sd == 0.0:
        above = d.mean - shift > 0
        return 0.0 if above == (alternative == "greater") and d.mean != shift else 1.0
    return float(scipy_stats.ttest_1samp(np.asarray(d.per_seed) - shift, 0.0, alternative=alternative).pvalue)


def equivalence(d: Difference, margin: float) -> float:
    """TOST p-value for |true difference| < margin: the larger of the two one-sided p-values."""
    if margin <= 0:
        raise ValueError(f"an equivalence margin must be positive, got {margin}")
    return max(_one_sided(d, -margin, "greater"), _one_sided(d, margin, "less"))


def outside(d: Difference, margin: float) -> float:
    """p-value of the test that the true difference lies beyond ±margin, on the side of the
    observed mean: the one-sided t-test of mean > margin (or < −margin), doubled because the side
    is chosen after seeing the data (capped at 1). What refutes an equivalence claim: a difference
    that is significant but inside the margin does not."""
    if margin <= 0:
        raise ValueError(f"an equivalence margin must be positive, got {margin}")
    if d.n < 2:
        return math.nan
    one = _one_sided(d, margin, "greater") if d.mean >= 0 else _one_sided(d, -margin, "less")
    return min(1.0, 2.0 * one)


def noninferior(d: Difference, margin: float) -> float:
    """p-value of the one-sided test that A is not worse than B by margin or more (difference > −margin)."""
    if margin < 0:
        raise ValueError(f"a non-inferiority margin must be >= 0, got {margin}")
    return _one_sided(d, -margin, "greater")


def holm(pvalues) -> np.ndarray:
    """Holm's step-down adjusted p-values (NaN stays NaN and is not counted in the family)."""
    p = np.asarray(pvalues, dtype=float)
    out = np.full(p.shape, math.nan)
    finite = np.flatnonzero(np.isfinite(p))
    order = finite[np.argsort(p[finite], kind="stable")]
    m, running = len(order), 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (m - rank) * p[i]))
        out[i] = running
    return out


def detectable(sd: float, n: int, alpha: float = ALPHA, power: float = POWER) -> float:
    """The smallest true mean difference (in the units of sd) that a two-sided paired t-test at
    `alpha` over n seeds detects with probability `power`; NaN below 2 seeds or without spread."""
    if n < 2 or not math.isfinite(sd) or sd <= 0:
        return math.nan
    df, critical = n - 1, scipy_stats.t.ppf(1 - alpha / 2, n - 1)

    def shortfall(delta: float) -> float:
        nc = delta * math.sqrt(n) / sd
        wrong_side = scipy_stats.nct.cdf(-critical, df, nc)  # NaN where it underflows (large nc): 0
        return scipy_stats.nct.sf(critical, df, nc) + (wrong_side if math.isfinite(wrong_side) else 0.0) - power

    high = sd
    while shortfall(high) < 0:
        high *= 2
    return float(optimize.brentq(shortfall, 1e-9 * sd, high, xtol=1e-12 * sd))
