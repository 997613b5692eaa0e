"""Which round a trial reports under each rule, inside the trial as Tune sees it and in the rows:
`best_val_global` (PerFedMask's authors: the round whose model before fine-tuning validates best)
beside `best_val` (the evaluated model) and `last`."""
import math

import pytest

from fl_core.simulation import Simulation
from sweeps.trainable import _selection

from conftest import tiny


def objectives(rule, summaries):
    """The objective Tune sees after each round under `rule`."""
    progress, seen = {}, []
    for summary in summaries:
        selection, chosen_by = _selection(progress, summary, "acc_val_mean", rule)
        progress = {"selection": selection, "chosen_by": chosen_by}
        seen.append(selection)
    return seen


SUMMARIES = [{"acc_val_mean": 0.40, "acc_val_global_mean": 0.30},
             {"acc_val_mean": math.nan, "acc_val_global_mean": math.nan},  # a round that is not evaluated
             {"acc_val_mean": 0.75, "acc_val_global_mean": 0.35},
             {"acc_val_mean": 0.80, "acc_val_global_mean": 0.20},
             {"acc_val_mean": 0.70, "acc_val_global_mean": 0.35}]           # ties the best: the earlier stays


@pytest.mark.parametrize("rule, expected", [
    ("last", [0.40, 0.40, 0.75, 0.80, 0.70]),
    ("best_val", [0.40, 0.40, 0.75, 0.80, 0.80]),
    ("best_val_global", [0.40, 0.40, 0.75, 0.75, 0.75]),
])
def test_the_objective_is_the_validation_accuracy_of_the_round_the_rule_would_report(rule, expected):
    assert objectives(rule, SUMMARIES) == expected


def test_a_state_saved_before_chosen_by_keeps_best_vals_best():
    # progress restored from a trial that ran before `chosen_by` existed: only its best so far
    assert _selection({"selection": 0.8}, SUMMARIES[2], "acc_val_mean", "best_val") == (0.8, 0.8)


def test_acc_val_global_is_the_un_tuned_models_validation_accuracy():
    knobs = dict(val_fraction=0.2, rounds=2, local_epochs=1)
    plain = list(Simulation(tiny(algorithm="fedavg", **knobs)).run())
    tuned = list(Simulation(tiny(algorithm="fedavg_ft", ft_epochs=2, **knobs)).run())
    for a, b in zip(plain, tuned):
        # FedAvg+FT trains as FedAvg does (the same batches) and fine-tunes a copy only for scoring
        assert [c.acc_val for c in a.clients] == [c.acc_val_global for c in b.clients]
        assert [c.acc_val for c in a.clients] == [c.acc_val_global for c in a.clients]
    assert any(c.acc_val != c.acc_val_global for c in tuned[-1].clients)
    assert all(0 <= c.acc_val_global <= 1 for c in tuned[-1].clients)
