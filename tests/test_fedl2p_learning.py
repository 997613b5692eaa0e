"""analysis.fedl2p_learning on a tiny constructed sweep with answers worked out by hand: the
validation loss per client first/last meta round, the paired test over seeds, how far β and η
moved from their initial values, and the between / within domain distances."""
from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from analysis.fedl2p_learning import domain_distances, gain_summary, loss_curve, loss_per_seed, loss_summary, \
    plot_loss_curve, policy_per_seed, policy_summary, report

N_TRAIN = {0: 1, 1: 3, 2: 2, 3: 2}
# (seed) -> {(client, round): val_loss}; clients 2 and 3 never report one
LOSSES = {0: {(0, 1): 2.0, (0, 3): 1.0, (1, 2): 4.0, (1, 3): 2.0},
          1: {(0, 1): 3.0, (0, 2): 2.0, (1, 1): 1.0, (1, 3): 1.0}}
# first = (2·1 + 4·3) / 4 = 3.5, last = (1·1 + 2·3) / 4 = 1.75 (seed 0); 1.5 and 1.25 (seed 1)
INIT_BETA = {0: (0.5, 0.5), 1: (0.5, 0.6), 2: (0.6, 0.5), 3: (0.6, 0.6)}
LEARNED_BETA = {0: {0: (0.5, 0.5), 1: (0.5, 0.8), 2: (0.9, 0.5), 3: (0.9, 0.8)},
                1: {0: (0.5, 0.5), 1: (0.5, 0.8), 2: (1.0, 0.5), 3: (1.0, 0.8)}}
DOMAINS = {0: "fog", 1: "fog", 2: "contrast", 3: "contrast"}


def rounds_frame() -> pd.DataFrame:
    rows = []
    for seed in (0, 1):
        trial = f"t{seed}"
        for rnd in (1, 2, 3):
            for client in range(4):
                row = dict(config_hash=trial, setting="S", method="FedL2P", algorithm="fedl2p", seed=seed,
                           round=rnd, client=client, pool="seen", n_train=N_TRAIN[client])
                loss = LOSSES[seed].get((client, rnd))
                row |= {"val_loss": loss, "val_loss_after": None if loss is None else loss - 0.1}
                if rnd == 3:  # the evaluated round: learned and initial policy per layer
                    b, b0 = LEARNED_BETA[seed][client], INIT_BETA[client]
                    eta_w = 0.015 if seed == 1 else 0.01
                    row |= {"beta:bn1": b[0], "beta:bn2": b[1], "beta_init:bn1": b0[0], "beta_init:bn2": b0[1],
                            "eta:w": eta_w, "eta:b": 0.02, "eta_init:w": 0.01, "eta_init:b": 0.02}
                rows.append(row)
        # an unseen newcomer's and a fine-tuning baseline's rows never enter
        rows.append(dict(config_hash=trial, setting="S", method="FedL2P", algorithm="fedl2p", seed=seed, round=3,
                         client=9, pool="unseen", n_train=100, val_loss=100.0, val_loss_after=0.0))
        rows.append(dict(config_hash=f"ft{seed}", setting="S", method="FT (BN C)", algorithm="ft", seed=seed,
                         round=3, client=0, pool="seen", n_train=1, val_loss=50.0))
    return pd.DataFrame(rows)


def clients_frame() -> pd.DataFrame:
    return pd.DataFrame([dict(config_hash=f"t{s}", client=c, domain=d) for s in (0, 1) for c, d in DOMAINS.items()])


def test_the_validation_loss_is_compared_per_client_between_its_first_and_last_meta_round():
    per_seed = loss_per_seed(rounds_frame()).set_index("seed")
    assert per_seed["first"].tolist() == pytest.approx([3.5, 1.5])
    assert per_seed["last"].tolist() == pytest.approx([1.75, 1.25])
    assert per_seed["within"].tolist() == pytest.approx([-0.1, -0.1])
    (row,) = loss_summary(rounds_frame()).to_dict("records")
    assert (row["method"], row["seeds"], row["fell"]) == ("FedL2P", 2, True)
    assert row["change"] == pytest.approx(-1.0)
    # differences -1.75 and -0.25: t = -4/3 on 1 degree of freedom (a Cauchy law): p = 1 - 2/π·atan(4/3)
    assert row["p"] == pytest.approx(1 - 2 / math.pi * math.atan(4 / 3))


def test_one_seed_has_no_test_and_a_rising_loss_did_not_fall():
    frame = rounds_frame()
    frame = frame[frame["seed"] == 1]
    frame.loc[(frame["client"] == 0) & (frame["round"] == 2), "val_loss"] = 9.0
    (row,) = loss_summary(frame).to_dict("records")
    assert row["seeds"] == 1 and not row["fell"] and math.isnan(row["p"])
    assert row["last"] == pytest.approx((9.0 + 3.0) / 4)


def test_the_policy_moved_from_its_initial_values_by_hand_computed_amounts():
    per_seed = policy_per_seed(rounds_frame(), clients_frame()).set_index("seed")
    assert per_seed["beta_moved"].tolist() == pytest.approx([1.0 / 8, 1.2 / 8])
    assert per_seed["eta_moved"].tolist() == pytest.approx([0.0, 0.25])  # η_w moved by half, η_b not
    assert per_seed["clients"].tolist() == [4, 4]


def test_between_and_within_domain_distances():
    assert domain_distances(np.array([[0.0], [1.0], [3.0], [3.0]]), ["a", "a", "b", "b"]) == pytest.approx((2.5, 0.5))
    per_seed = policy_per_seed(rounds_frame(), clients_frame()).set_index("seed")
    assert per_seed["within_learned"].tolist() == pytest.approx([0.3, 0.3])
    assert per_seed["between_learned"].tolist() == pytest.approx([0.45, (1.0 + 2 * math.sqrt(0.34)) / 4])
    init_ratio = ((0.2 + 2 * math.sqrt(0.02)) / 4) / 0.1
    assert per_seed["ratio_init"].tolist() == pytest.approx([init_ratio, init_ratio])
    (row,) = policy_summary(rounds_frame(), clients_frame()).to_dict("records")
    lifts = [math.log(1.5 / init_ratio), math.log((1.0 + 2 * math.sqrt(0.34)) / 4 / 0.3 / init_ratio)]
    assert row["ratio_learned"] == pytest.approx((1.5 + (1.0 + 2 * math.sqrt(0.34)) / 1.2) / 2)
    assert row["p_domain"] == pytest.approx(stats.ttest_1samp(lifts, 0.0, alternative="greater").pvalue)


def test_without_domains_or_initial_columns_the_numbers_are_missing_not_wrong():
    summary = policy_summary(rounds_frame(), None)
    assert math.isnan(summary["ratio_learned"].iloc[0]) and summary["beta_moved"].iloc[0] == pytest.approx(0.1375)
    old = rounds_frame().drop(columns=[c for c in rounds_frame().columns if "_init:" in c])
    assert math.isnan(policy_summary(old, clients_frame())["beta_moved"].iloc[0])


def test_the_report_renders_both_tables_as_markdown():
    text = report(rounds_frame(), clients_frame(), markdown=True)
    assert "| S | FedL2P | 2 | 2.5 | 1.5 | -1 ± 1.061 |" in text
    assert "mean abs Δβ" in text and sum(line.startswith("|---|") for line in text.splitlines()) == 2


def test_the_loss_curve_is_the_weighted_mean_of_each_rounds_clients_then_over_seeds(tmp_path):
    curve = loss_curve(rounds_frame()).set_index("round")
    # round 1: seed 0 client 0 alone (2.0); seed 1 (3·1 + 1·3) / 4 = 1.5 -> 1.75
    # round 2: seed 0 client 1 (4.0); seed 1 client 0 (2.0) -> 3.0; round 3: 1.75 and 1.0 -> 1.375
    assert curve["val_loss"].tolist() == pytest.approx([1.75, 3.0, 1.375])
    # against each client's first loss: round 2: seed 0 client 1's first (0), seed 1 client 0 (2 − 3 = −1);
    # round 3: seed 0 (1·(1 − 2) + 3·(2 − 4)) / 4 = −1.75, seed 1 client 1 (1 − 1 = 0)
    assert curve["change"].tolist() == pytest.approx([0.0, -0.5, -0.875])
    out = plot_loss_curve(rounds_frame(), tmp_path / "loss.png")
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    with pytest.raises(ValueError, match="no meta-learning rows"):
        plot_loss_curve(rounds_frame().iloc[:0], tmp_path / "none.png")


def test_the_learned_lambda_is_compared_with_the_initial_one_per_pool_by_a_paired_test_over_seeds():
    rows = rounds_frame()
    last = rows["round"].eq(3) & rows["algorithm"].eq("fedl2p")
    # seed 0: learned 1, 1, 2, 2 against initial 2, 2, 2, 2; seed 1: learned 1.25 everywhere, initial 2
    learned = {0: {0: 1.0, 1: 1.0, 2: 2.0, 3: 2.0, 9: 5.0}, 1: {0: 1.25, 1: 1.25, 2: 1.25, 3: 1.25, 9: 3.0}}
    rows.loc[last, "val_loss_learned"] = [learned[s][c]
                                          for s, c in zip(rows.loc[last, "seed"], rows.loc[last, "client"])]
    rows.loc[last, "val_loss_init"] = [2.0 if c != 9 else 4.0 for c in rows.loc[last, "client"]]
    summary = gain_summary(rows).set_index("pool")
    # seen, weighted by n_train 1, 3, 2, 2: seed 0 (1 + 3 + 4 + 4) / 8 = 1.5, seed 1 1.25; initial 2 in both
    seen = summary.loc["seen"]
    assert (seen["learned"], seen["init"], seen["change"], seen["seeds"]) == pytest.approx((1.375, 2.0, -0.625, 2))
    assert seen["lower"] == "6 of 8"
    assert seen["p"] == pytest.approx(stats.ttest_rel([1.5, 1.25], [2.0, 2.0]).pvalue)
    unseen = summary.loc["unseen"]
    assert unseen["change"] == pytest.approx(0.0) and unseen["lower"] == "1 of 2"
    assert unseen["p"] == pytest.approx(stats.ttest_rel([5.0, 3.0], [4.0, 4.0]).pvalue)
    assert "L_V learned λ" in report(rows, clients_frame(), markdown=True)
    assert gain_summary(rounds_frame()).empty  # rows without the columns: no table, not zeros


def test_a_tuned_sweeps_report_keeps_the_chosen_configurations_reported_seeds_only():
    """The search trials (search seed 1000, every configuration tried) are not seeds of the method
    the tables report: the report reads the chosen configuration's confirm runs alone."""
    from analysis.fedl2p_learning import reported

    base = dict(setting="S", method="FedL2P", algorithm="fedl2p", status="COMPLETED", search_seed=1000.0)
    trials = pd.DataFrame([
        base | dict(config_hash="search-a", stage="select", seed=1000, lr=0.1, acc_mean=0.9, acc_val_mean=0.9),
        base | dict(config_hash="search-b", stage="select", seed=1000, lr=0.5, acc_mean=0.2, acc_val_mean=0.2),
        base | dict(config_hash="t0", stage="confirm", seed=0, lr=0.1, acc_mean=0.8, acc_val_mean=0.8),
        base | dict(config_hash="t1", stage="confirm", seed=1, lr=0.1, acc_mean=0.7, acc_val_mean=0.7)])
    rounds = rounds_frame()
    searched = rounds[rounds["config_hash"] == "t0"].assign(config_hash="search-b", seed=1000)
    kept = reported(pd.concat([rounds, searched], ignore_index=True), trials)
    assert set(kept["config_hash"]) == {"t0", "t1"}
    assert loss_summary(kept).iloc[0]["seeds"] == 2
