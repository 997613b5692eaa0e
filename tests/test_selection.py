"""One rule chooses a method's configuration everywhere (tables, figures, the sweep's summary):
validation accuracy where there is a split, else the declared configuration; test accuracy never."""
from __future__ import annotations

import numpy as np
import pandas as pd

from analysis.common import chosen_trials
from analysis.tables import methods_table
from sweeps.summary import best_per_setting


def grid(val: bool, rng=np.random.default_rng(0)) -> pd.DataFrame:
    """FedSelect at p 0.1 / 0.5 (2 seeds each) and FedAvg, one setting; p = 0.5 scores best on test,
    p = 0.1 on validation."""
    rows = []
    for p, test, valid in ((0.1, 0.80, 0.90), (0.5, 0.95, 0.70)):
        for seed in (0, 1):
            rows.append({"method": "FedSelect", "algorithm": "fedselect", "pers_rate": p, "pers_limit": 0.5,
                         "seed": seed, "acc_mean": test + 0.01 * seed, "acc_val_mean": valid if val else np.nan})
    rows += [{"method": "FedAvg", "algorithm": "fedavg", "pers_rate": np.nan, "pers_limit": np.nan, "seed": s,
              "acc_mean": 0.5, "acc_val_mean": 0.5 if val else np.nan} for s in (0, 1)]
    trials = pd.DataFrame(rows).assign(setting="digits, Dir(0.1)", dataset="digits", partition="dirichlet",
                                       dir_alpha=0.1, shards_per_client=2, local_epochs=1, rounds=20,
                                       rounds_done=20, status="COMPLETED", mb_total=1.0, threads=1.0)
    trials["config_hash"] = [f"h{i}" for i in range(len(trials))]
    return trials


def chosen_p(trials: pd.DataFrame) -> set:
    chosen = chosen_trials(trials)
    return set(chosen.loc[chosen["method"] == "FedSelect", "pers_rate"])


def test_without_a_split_the_declared_configuration_is_chosen_whatever_test_accuracy_says():
    trials = grid(val=False)
    assert chosen_p(trials) == {0.1}                     # p = 0.5 is better on test: not chosen
    flipped = trials.assign(acc_mean=trials["acc_mean"][::-1].to_numpy())
    assert chosen_p(flipped) == {0.1}                    # test accuracy is never read to choose
    extra = pd.concat([trials, trials[trials["pers_rate"] == 0.5].head(1).assign(seed=2, config_hash="h9")],
                      ignore_index=True)
    assert chosen_p(extra) == {0.5}                      # the configuration run on the most seeds
    summary = best_per_setting(trials, ["pers_rate"]).set_index("method")
    assert summary.loc["FedSelect", "pers_rate"] == 0.1 and summary.loc["FedSelect", "acc"] == "0.8050 ± 0.0071"


def test_with_a_split_the_best_validation_accuracy_is_chosen_and_the_table_says_so():
    trials = grid(val=True)
    assert chosen_p(trials) == {0.1}
    favoured = trials.assign(acc_val_mean=np.where(trials["pers_rate"] == 0.5, 0.99, trials["acc_val_mean"]))
    assert chosen_p(favoured) == {0.5}
    for frame, p in ((trials, 0.1), (favoured, 0.5)):  # the sweep's summary chooses with the tables' rule
        assert best_per_setting(frame, ["pers_rate"]).set_index("method").loc["FedSelect", "pers_rate"] == p
    caption = methods_table(trials).full_caption()
    assert ("FedSelect in every data setting: at p = 0.1, chosen among its 2 configurations as the best mean "
            "validation accuracy over its seeds (the others not shown).") in caption
    assert "declared" in methods_table(grid(val=False)).full_caption()
