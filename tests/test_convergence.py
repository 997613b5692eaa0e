"""analysis.convergence: a configuration has converged when its mean accuracy over seeds moved by less
than one seed std over the last 20 % of the rounds; constructed curves with known answers."""
import numpy as np
import pandas as pd
import pytest

from analysis.convergence import caption, convergence, convergence_cells, tail_round


def rows_of(trial: str, curve: dict[int, float], clients: int = 2) -> list[dict]:
    """Round rows of one trial whose mean accuracy over clients is `curve[round]` (two clients at ±0.01)."""
    out = []
    for rnd, acc in curve.items():
        for client in range(clients):
            out.append(dict(config_hash=trial, round=rnd, client=client, acc=acc + (0.01 if client else -0.01),
                            acc_local=acc, acc_global=acc, n_test=50, loss=0.5, bytes_up=10, bytes_down=10,
                            personal_fraction=0.0))
    return out


def study(curves: dict[str, list[dict[int, float]]]):
    """Trials and rows for methods -> one curve per seed."""
    rows, trials = [], []
    for method, per_seed in curves.items():
        for seed, curve in enumerate(per_seed):
            name = f"{method}-{seed}"
            rows += rows_of(name, curve)
            trials.append(dict(config_hash=name, algorithm=method, method=method, seed=seed, dataset="digits",
                               setting="digits, Dir(0.1)", rounds=10, acc_mean=curve[max(curve)]))
    return pd.DataFrame(rows), pd.DataFrame(trials)


def test_tail_round_is_the_evaluated_round_nearest_to_four_fifths():
    assert tail_round([2, 4, 6, 8, 10]) == 8
    assert tail_round([5, 10, 15, 20]) == 15      # 16 is nearest to 15
    assert tail_round(list(range(1, 61))) == 48
    assert tail_round([3, 6, 9], tail=0.5) == 3   # 4.5: 3 and 6 are as near; the earlier


def test_flat_curves_converge_and_rising_ones_do_not():
    flat = [{r: 0.5 + 0.03 * min(r, 6) + s * 0.02 + (0.004 if r == 10 else 0.0) for r in (2, 4, 6, 8, 10)}
            for s in range(3)]  # 0.68 + 0.02 s at round 8, +0.004 at round 10: Δ = 0.004 < std 0.02
    rising = [{r: 0.3 + 0.05 * r + s * 0.01 for r in (2, 4, 6, 8, 10)} for s in range(3)]  # Δ = 0.1 > std 0.01
    rounds, trials = study({"flat": flat, "rising": rising})
    table = convergence(rounds, trials).set_index("method")
    assert table.loc["flat", "round_tail"] == 8 and table.loc["flat", "round_last"] == 10
    assert table.loc["flat", "delta"] == pytest.approx(0.004)
    assert table.loc["flat", "std"] == pytest.approx(0.02)  # sample std of 0.684, 0.704, 0.724
    assert bool(table.loc["flat", "converged"]) is True
    assert table.loc["rising", "delta"] == pytest.approx(0.1)
    assert bool(table.loc["rising", "converged"]) is False
    assert table.loc["rising", "seeds"] == 3
    cells = convergence_cells(table.reset_index()).set_index("Method")
    assert cells.loc["flat", "Converged"] == "yes" and cells.loc["rising", "Converged"] == "NO"
    assert cells.loc["rising", "Δ"] == "+10.0" and cells.loc["flat", "Rounds"] == "8 → 10"
    assert "1 of 2 configurations converged" in caption(table)


def test_one_seed_has_no_verdict_and_unfinished_runs_are_named():
    rounds, trials = study({"solo": [{2: 0.5, 4: 0.6, 6: 0.7}]})  # planned 10 rounds, stopped at 6
    table = convergence(rounds, trials)
    assert pd.isna(table.loc[0, "converged"]) and np.isnan(table.loc[0, "std"])
    cells = convergence_cells(table)
    assert cells.loc[0, "Converged"] == "n/a" and cells.loc[0, "Rounds"] == "4 → 6 (of 10: unfinished)"
    assert "1 with one seed: n/a" in caption(table)


def test_a_bad_tail_is_refused():
    rounds, trials = study({"a": [{1: 0.5, 2: 0.6}]})
    with pytest.raises(ValueError, match="tail=1.5 must lie strictly between 0 and 1"):
        convergence(rounds, trials, tail=1.5)


def test_a_single_evaluated_round_has_no_tail_and_no_verdict():
    rounds, trials = study({"once": [{10: 0.5}, {10: 0.6}]})  # eval_every = rounds: only the last round
    table = convergence(rounds, trials)
    assert table.loc[0, "round_tail"] == table.loc[0, "round_last"] == 10
    assert pd.isna(table.loc[0, "converged"]) and table.loc[0, "seeds"] == 2  # the seeds that have it
    assert table.loc[0, "acc_last"] == pytest.approx(0.55)
    assert "1 evaluated at the last round only (no tail to compare): n/a" in caption(table)
    assert "one seed" not in caption(table)


def test_configurations_of_one_method_are_told_apart_by_their_knobs():
    """Two learning rates of one method in one setting: two rows named by the knob that differs
    (unique row names: LaTeX rendering needs them)."""
    rounds, trials = study({"m": [{2: 0.5, 4: 0.6}, {2: 0.5, 4: 0.6}]})
    trials["lr"] = [0.1, 0.1]
    more_rounds, more = study({"m": [{2: 0.4, 4: 0.45}, {2: 0.41, 4: 0.44}]})
    more["config_hash"] = more["config_hash"] + "-b"
    more_rounds["config_hash"] = more_rounds["config_hash"] + "-b"
    more["lr"] = [0.3, 0.3]
    table = convergence(pd.concat([rounds, more_rounds]), pd.concat([trials, more], ignore_index=True))
    cells = convergence_cells(table)
    assert sorted(cells["Method"]) == ["m [lr=0.1]", "m [lr=0.3]"]
