"""analysis.paired: statistics with the seed as the unit, against hand-computed cases, the
hierarchical bootstrap against an enumeration of all its resamples, and the false-positive rate of
its test against the old client-level test under no true difference."""
from __future__ import annotations

import itertools
import math
from collections import Counter

import numpy as np
import pandas as pd
import pytest
from scipy import stats as scipy_stats

from analysis.paired import (BOOTSTRAP_RESAMPLES, MIN_SEEDS, bootstrap_means, client_differences, detectable,
                             difference, equivalence, hierarchical_bootstrap, holm, noninferior, outside)

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


def per_client(values: dict) -> pd.Series:
    """seed -> the differences of its clients, as a Series indexed by (seed, client)."""
    keys = [(seed, k) for seed, clients in values.items() for k in range(len(clients))]
    return pd.Series([v for clients in values.values() for v in clients],
                     index=pd.MultiIndex.from_tuples(keys, names=["seed", "client"]), dtype=float)


def test_client_differences_pair_by_seed_and_client():
    a = pd.Series([0.8, 0.7, 0.9, 0.5], index=pd.MultiIndex.from_tuples([(0, 0), (0, 1), (1, 0), (2, 5)]))
    b = pd.Series([0.95, 0.3, 0.75, 0.7], index=pd.MultiIndex.from_tuples([(1, 0), (1, 1), (0, 0), (0, 1)]))
    d = client_differences(a, b)
    assert list(d.index) == [(0, 0), (0, 1), (1, 0)] and d.to_numpy() == pytest.approx([0.05, 0.0, -0.05])


def test_one_client_per_seed_is_a_plain_bootstrap_of_the_seed_differences():
    # 2 seeds: a draw is (a, a), (a, b), (b, a) or (b, b): mean a, (a + b) / 2 or b with chances 1/4, 1/2, 1/4,
    # so the 2.5 % and 97.5 % percentiles are a and b themselves
    assert hierarchical_bootstrap(per_client({0: [0.01], 1: [0.05]})) == pytest.approx((0.01, 0.05))
    seeds = {0: [0.0], 1: [1.0], 2: [10.0], 3: [100.0]}            # each draw's mean tells its seeds apart
    draws = bootstrap_means(per_client(seeds), 20_000, seed=3)
    totals = 4 * draws                                              # b + 10 c + 100 d: draws of seeds 1, 2, 3
    assert np.allclose(totals, np.round(totals))                    # the only client of each drawn seed
    counts = [(t % 10, t // 10 % 10, t // 100) for t in np.round(totals).astype(int)]
    assert all(sum(c) <= 4 for c in counts)                         # 4 seeds drawn, seed 0 the rest
    assert np.mean([c == (1, 1, 1) for c in counts]) == pytest.approx(24 / 256, abs=0.01)  # all 4: 4! / 4^4
    low, high = hierarchical_bootstrap(per_client(seeds))
    assert 0.0 <= low < 27.75 < high <= 100.0                      # inside [min, max] around the mean


def test_identical_differences_give_a_point_interval():
    assert hierarchical_bootstrap(per_client({0: [0.02, 0.02], 1: [0.02], 2: [0.02, 0.02, 0.02]})) == (0.02, 0.02)
    assert all(math.isnan(x) for x in hierarchical_bootstrap(per_client({})))
    with pytest.raises(ValueError, match="no \\(seed, client\\) differences"):
        bootstrap_means(per_client({}))


def enumerated(values: dict) -> Counter:
    """Every resample of the hierarchical bootstrap, equally likely: seeds drawn with replacement,
    then each drawn seed's clients with replacement; the mean of the drawn seeds' client means."""
    seeds = list(values)
    out = Counter()
    for drawn in itertools.product(seeds, repeat=len(seeds)):
        per_slot = [list(itertools.product(values[s], repeat=len(values[s]))) for s in drawn]
        for clients in itertools.product(*per_slot):
            out[round(float(np.mean([np.mean(c) for c in clients])), 12)] += 1
    return out


def test_two_seeds_by_two_clients_match_the_enumeration_of_all_resamples():
    values = {0: [0.0, 0.02], 1: [0.03, 0.07]}
    exact = enumerated(values)                                      # 4 seed draws x 4 x 4 client draws
    assert sum(exact.values()) == 64 and exact[0.0] == 1 and exact[0.005] == 4 and exact[0.06] == 4
    draws = Counter(np.round(bootstrap_means(per_client(values), 20_000, seed=7), 12))
    assert set(draws) <= set(exact)
    for value, ways in exact.items():
        assert draws[value] / 20_000 == pytest.approx(ways / 64, abs=0.01), value
    # P(≤ 0) = 1/64 < 2.5 % < P(≤ 0.005) = 5/64 and P(≤ 0.05) = 59/64 < 97.5 % < P(≤ 0.06) = 63/64
    assert hierarchical_bootstrap(per_client(values)) == pytest.approx((0.005, 0.06))


def test_unequal_client_counts_resample_each_seed_within_its_own_clients():
    # seed 0 has one client (0.0), seed 1 three (1, 2, 3): a draw below 0.5 is seed 0 twice (chance 1/4),
    # exactly 0; any draw of seed 1 adds its clients' mean m, at least 1, so nothing lies in (0, 0.5).
    # P(draw >= 1) = 1/4 (seed 1 twice) + 1/2 P(m >= 2) (one each) = 1/4 + 1/2 * 17/27 (sums of 3 draws >= 6)
    draws = bootstrap_means(per_client({0: [0.0], 1: [1.0, 2.0, 3.0]}), 20_000, seed=1)
    assert np.mean(draws == 0.0) == pytest.approx(0.25, abs=0.01) and not ((draws > 0) & (draws < 0.5)).any()
    assert draws.max() <= 3.0 and np.mean(draws >= 1.0) == pytest.approx(1 / 4 + 17 / 54, abs=0.01)


def test_the_bootstrap_is_deterministic_given_its_seed():
    d = per_client({0: [0.01, 0.03, -0.02], 1: [0.04, 0.0], 2: [0.02, 0.05, 0.01]})
    assert hierarchical_bootstrap(d, seed=11) == hierarchical_bootstrap(d, seed=11)
    assert len(bootstrap_means(d)) == BOOTSTRAP_RESAMPLES and len(bootstrap_means(d, 2_500)) == 2_500
    assert not np.array_equal(bootstrap_means(d, 100, seed=1), bootstrap_means(d, 100, seed=2))
    assert np.array_equal(bootstrap_means(d, 2_500, seed=4)[:1_000], bootstrap_means(d, 1_000, seed=4))


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


def test_outside_tests_a_difference_beyond_the_margin_on_its_side():
    """Differences 0.03, 0.04, 0.05 (mean 0.04, sd 0.01, se 0.01/sqrt 3): beyond +0.01 by 0.03, so
    t = 0.03 / (0.01 / sqrt 3) = 5.196 on 2 degrees of freedom; one-sided p = 0.017549, doubled."""
    d = difference(pd.Series([0.83, 0.84, 0.85]), pd.Series([0.80, 0.80, 0.80]))
    assert outside(d, 0.01) == pytest.approx(2 * 0.017549, abs=2e-6)
    assert outside(d, 0.05) > 0.5                      # the mean is inside ±5 pp: no evidence beyond
    flipped = difference(pd.Series([0.80, 0.80, 0.80]), pd.Series([0.83, 0.84, 0.85]))
    assert outside(flipped, 0.01) == pytest.approx(outside(d, 0.01))
    with pytest.raises(ValueError, match="margin must be positive"):
        outside(d, 0.0)
