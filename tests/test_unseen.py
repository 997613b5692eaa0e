"""Seen/unseen client pools (FedL2P): held-out clients never train or send; after the last round
each joins as a newcomer and is scored; every row says its pool; seen means never include them."""
from __future__ import annotations

import math

import pandas as pd
import pytest
import torch

from conftest import tiny
from fl_core.config import ConfigError
from fl_core.results import round_rows, summarize_round
from fl_core.simulation import Simulation


def run(config):
    sim = Simulation(config)
    init = {k: {n: t.clone() for n, t in c.state.items()} for k, c in enumerate(sim.clients)}
    results = list(sim.run())
    return sim, init, results


@pytest.mark.parametrize("algorithm", ["fedavg", "fedselect", "fedrep", "fedavg_ft", "local"])
def test_unseen_clients_never_train_and_are_scored_after_the_last_round(algorithm):
    sim, init, results = run(tiny(algorithm=algorithm, num_clients=5, unseen_clients=2, rounds=3))
    unseen = sim.data.unseen
    assert len(unseen) == 2 and unseen == tuple(sorted(unseen))
    for result in results:
        for c in result.clients:
            assert (c.pool == "unseen") == (c.client in unseen)
            if c.client in unseen:
                assert not c.participated and c.bytes_up == 0
                assert math.isnan(c.acc) == (result.round < 3)
    for k in unseen:  # the stored state never moved: nothing was trained into it
        assert all(torch.equal(sim.clients[k].state[n], t) for n, t in init[k].items())
    last = results[-1]
    rows = pd.DataFrame(round_rows(last, sim.config, sim.model_name))
    summary = summarize_round(rows)
    seen_rows, unseen_rows = rows[rows["pool"] == "seen"], rows[rows["pool"] == "unseen"]
    assert summary["acc_mean"] == pytest.approx(seen_rows["acc"].mean())
    assert summary["acc_unseen_mean"] == pytest.approx(unseen_rows["acc"].mean())
    assert last.mean("acc") == pytest.approx(seen_rows["acc"].mean())
    assert summary["participants"] == 3


def test_an_unseen_fedavg_client_is_scored_on_the_global_model():
    sim, _, results = run(tiny(algorithm="fedavg", num_clients=4, unseen_clients=1, rounds=2))
    k = sim.data.unseen[0]
    d = sim.data.clients[k]
    expected = sim.trainer.evaluate(sim.algorithm.global_state, d.x_test, d.y_test) / d.n_test
    assert results[-1].clients[k].acc == pytest.approx(expected)
    # and the newcomer downloaded the model once: its bytes_down is the broadcast's size
    assert results[-1].clients[k].bytes_down == sum(t.numel() for t in sim.algorithm.global_state.values()) * 4


def test_unseen_clients_leave_the_seen_average_unweighted_by_them():
    """FedAvg's global model with client 2 held out equals the average over the other clients
    only: the same run with client 2's data replaced gives the same seen results."""
    config = tiny(algorithm="fedavg", num_clients=4, unseen_clients=1, rounds=2)
    sim_a, _, res_a = run(config)
    k = sim_a.data.unseen[0]
    sim_b = Simulation(config)
    d = sim_b.data.clients[k]
    d.x_train = torch.randn_like(d.x_train)  # whatever an unseen client holds never reaches the model
    res_b = list(sim_b.run())
    for a, b in zip(res_a, res_b):
        assert [c.acc for c in a.clients if c.client != k] == [c.acc for c in b.clients if c.client != k]


def test_unseen_domains_hold_out_whole_domains():
    config = tiny(algorithm="fedavg", dataset="digits_c", corruptions="clean,fog,contrast",
                  partition="domain_dirichlet", num_clients=6, dir_alpha=10.0, unseen_domains="fog", rounds=1)
    sim = Simulation(config)
    assert sim.data.unseen == tuple(k for k in range(6) if sim.data.client_domain(k) == "fog") and \
        len(sim.data.unseen) == 2


@pytest.mark.parametrize("knobs, needle", [
    (dict(unseen_clients=4), "unseen_clients=4 leaves no client to train"),
    (dict(unseen_domains="fog"), "needs a domain partition"),
    (dict(dataset="digits_c", partition="domain", corruptions="clean,fog", num_clients=2, unseen_domains="rain"),
     "distinct names of digits_c's domains"),
    (dict(dataset="digits_c", partition="domain", corruptions="clean,fog", num_clients=2, unseen_domains="clean,fog"),
     "holds out every domain"),
    (dict(dataset="digits_c", partition="domain", corruptions="clean,fog", num_clients=2, unseen_domains="fog",
          unseen_clients=1), "leaves no client to train"),
])
def test_bad_unseen_requests_fail_before_any_work(knobs, needle):
    with pytest.raises(ConfigError, match=needle):
        tiny(algorithm="fedavg", **knobs)
