"""analysis.paired: statistics with the seed as the unit, against hand-computed cases, and the
false-positive rate of its test against the old client-level test under no true difference."""
from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
from scipy import stats as scipy_stats

from analysis.paired import MIN_SEEDS, detectable, difference, equivalence, holm, noninferior

# A − B per seed: 0.02, 0.02, −0.01, 0.04, 0.02: mean 0.018, sd √0.00032, standard error exactly 0.008
A = pd.Series([0.80, 0.82, 0.79, 0.85, 0.81], index=[0, 1, 2, 3, 4])
B = pd.Series([0.78, 0.80, 0.80, 0.81, 0.79], index=[0, 1, 2, 3, 4])
T_975_4, T_95_4 = 2.7764451051977987, 2.1318467863266495   # t quantiles, 4 degrees of freedom


def test_the_difference_is_over_common_seeds_with_its_t_interval_and_paired_t_test():
    d = difference(A, B)
    assert d.n == 5 and d.tested
    assert d.mean == pytest.approx(0.018, abs=1e-15)
    assert d.sd == pytest.approx(math.sqrt(0.00032), rel=1e-12)
    assert (d.ci_low, d.ci_high) == pytest.approx((0.018 - T_975_4 * 0.008, 0.018 + T_975_4 * 0.008), rel=1e-9)
    assert d.p == pytest.approx(2 * scipy_stats.t.sf(2.25, 4), rel=1e-9)  # t = 0.018 / 0.008
    assert d.p == pytest.approx(0.08765, abs=5e-5)
    shifted = difference(A.rename(index=lambda s: s + 3), B)  # seeds 3..7 against 0..4: two in common
    assert shifted.n == 2 and not shifted.tested and shifted.per_seed == pytest.approx((0.80 - 0.81, 0.82 - 0.79))


def test_below_five_seeds_there_is_an_interval_but_no_test_to_report():
    d = difference(A[:3], B[:3])
    assert d.n == 3 and MIN_SEEDS == 5 and not d.tested
    assert d.ci_low < d.mean < d.ci_high
    assert math.isnan(difference(A[:1], B[:1]).p) and difference(A[:0], B[:0]).n == 0


def test_a_constant_difference_is_a_point_interval():
    d = difference(B + 0.01, B)
    assert (d.ci_low, d.ci_high) == pytest.approx((0.01, 0.01)) and d.p == 0.0
    assert difference(B, B).p == 1.0


def test_equivalence_is_two_one_sided_tests_that_agree_with_the_90_percent_interval():
    d = difference(A, B)
    # margin 0.05: lower t = (0.018 + 0.05) / 0.008 = 8.5, upper t = (0.018 − 0.05) / 0.008 = −4
    assert equivalence(d, 0.05) == pytest.approx(scipy_stats.t.cdf(-4.0, 4), rel=1e-9)
    assert equivalence(d, 0.05) < 0.05
    # margin 0.03: upper t = −1.5, p ≈ 0.104: not equivalent; the 90 % interval reaches 0.035 > 0.03
    assert equivalence(d, 0.03) == pytest.approx(scipy_stats.t.cdf(-1.5, 4), rel=1e-9)
    assert equivalence(d, 0.03) > 0.05 and 0.018 + T_95_4 * 0.008 > 0.03
    with pytest.raises(ValueError, match="margin must be positive, got 0"):
        equivalence(d, 0)


def test_non_inferiority_is_one_sided_against_minus_the_margin():
    d = difference(A, B)
    assert noninferior(d, 0.01) == pytest.approx(scipy_stats.t.sf(3.5, 4), rel=1e-9)  # (0.018 + 0.01) / 0.008
    assert noninferior(d, 0.0) == pytest.approx(d.p / 2, rel=1e-9)                   # the one-sided t-test
    with pytest.raises(ValueError, match="must be >= 0, got -0.1"):
        noninferior(d, -0.1)


def test_holm_multiplies_the_k_th_smallest_by_m_minus_k_and_keeps_the_order():
    assert holm([0.01, 0.04, 0.03, math.nan]) == pytest.approx([0.03, 0.06, 0.06, math.nan], nan_ok=True)
    assert holm([0.5, 0.9]) == pytest.approx([1.0, 1.0])
    assert holm([]).size == 0


def test_the_detectable_difference_has_the_stated_power():
    delta = detectable(1.0, 5)
    assert 1.5 < delta < 1.7  # the one-sample t-test's classic 1.59 standard deviations at n = 5
    rng = np.random.default_rng(0)
    draws = rng.normal(delta, 1.0, size=(20000, 5))
    rejected = (scipy_stats.ttest_1samp(draws, 0.0, axis=1).pvalue < 0.05).mean()
    assert rejected == pytest.approx(0.8, abs=0.01)
    assert 2.8016 / 10 < detectable(1.0, 100) < 2.86 / 10  # (z₀.₉₇₅ + z₀.₈) / √n, a little more for t
    assert detectable(0.02, 5) == pytest.approx(0.02 * delta, rel=1e-9)
    assert math.isnan(detectable(1.0, 1)) and math.isnan(detectable(0.0, 5))


def simulated_runs(rng, trials: int, seeds: int, clients: int = 10) -> np.ndarray:
    """Two methods with no true difference, `trials` times: each run (method, seed) draws its own
    training noise, shared by all its clients, on top of the seed's partition (shared by both
    methods). Shape (trial, method, seed, client)."""
    partition = rng.normal(0.0, 0.05, size=(trials, 1, seeds, clients))   # the seed's clients, both methods
    run = rng.normal(0.0, 0.03, size=(trials, 2, seeds, 1))               # a run's noise, all its clients
    client = rng.normal(0.0, 0.01, size=(trials, 2, seeds, clients))      # per client and run
    return 0.8 + partition + run + client


def test_under_no_difference_the_seed_level_test_rejects_at_most_five_percent_and_the_client_test_far_more():
    trials = 4000
    acc = simulated_runs(np.random.default_rng(20261126), trials, seeds=5)
    per_seed = acc.mean(axis=3)                                            # (trial, method, seed)
    tests = [difference(pd.Series(t[0]), pd.Series(t[1])) for t in per_seed]
    ours = sum(d.tested and d.p < 0.05 for d in tests)
    assert not any(difference(pd.Series(t[0][:3]), pd.Series(t[1][:3])).tested for t in per_seed[:100])
    # the rate is 5 % by construction (an exact test); the simulation's estimate is not significantly above it
    assert scipy_stats.binomtest(int(ours), trials, 0.05, alternative="greater").pvalue > 0.05, ours / trials
    # the old rule below 5 seeds: Wilcoxon over the (client, seed) pairs of 3 seeds, as if independent
    pairs = (acc[:, 0, :3] - acc[:, 1, :3]).reshape(trials, -1)
    client_level = (scipy_stats.wilcoxon(pairs, axis=1).pvalue < 0.05).mean()
    assert client_level > 0.25, client_level
