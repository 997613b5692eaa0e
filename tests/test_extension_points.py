"""The engine's extension points, each exercised by a toy method (issue 8): client sampling,
`eval_every`, the validation split, server-less rounds with traffic up and down, setup with sizes
and capability profiles, predictor evaluation, learning-rate schedules, and a method's own
per-client metrics flowing to the result rows and their summary."""
from __future__ import annotations

import math

import pandas as pd
import pytest
import torch

from fl_core import simulation
from fl_core.algorithms.base import BYTES_PER_ENTRY, LocalStats
from fl_core.algorithms.fedavg import FedAvg
from fl_core.algorithms.fedavg_ft import FedAvgFT
from fl_core.config import ConfigError
from fl_core.results import round_rows, summarize_round
from fl_core.simulation import Simulation

from conftest import metrics, tiny


def toy_simulation(monkeypatch, cls, profiles=None, **overrides) -> Simulation:
    """A Simulation whose algorithm is the toy class `cls` (the config names its base method)."""
    monkeypatch.setattr(simulation, "get_algorithm", lambda name: cls)
    return Simulation(tiny(**overrides), profiles=profiles)


def states(sim):
    return [{n: t.clone() for n, t in c.state.items()} for c in sim.clients]


# ---------------------------------------------------------------------------- client sampling
class RecordingFedAvg(FedAvg):
    """FedAvg that records, per round, who trained and the state each started from."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.started = {}

    def local_update(self, k, client, data, rnd):
        self.started[(rnd, k)] = {n: t.clone() for n, t in client.state.items()}
        return super().local_update(k, client, data, rnd)


def test_participation_samples_seeded_clients_and_averages_over_them_only(monkeypatch):
    sim = toy_simulation(monkeypatch, RecordingFedAvg, algorithm="fedavg", num_clients=6, participation=0.5,
                         rounds=4, shards_per_client=2)
    algo = sim.algorithm
    chosen = [algo.participants(r) for r in range(1, 5)]
    assert all(len(c) == 3 and c == sorted(set(c)) for c in chosen)
    assert len({tuple(c) for c in chosen}) > 1                         # a new sample each round
    assert chosen == [algo.participants(r) for r in range(1, 5)]       # seeded: the same again

    before = states(sim)
    first = sim.run_round()
    trained = states(sim)
    for k in range(6):
        if k in chosen[0]:
            assert all(torch.equal(trained[k][n], algo.global_state[n]) for n in algo.param_names)
        else:  # non-participants keep their state, bit for bit, and send nothing
            assert all(torch.equal(trained[k][n], before[k][n]) for n in before[k])
            row = first.clients[k]
            assert not row.participated and row.bytes_up == row.bytes_down == 0 and math.isnan(row.loss)
    # the server average is the mean of the participants' trained models only
    trained_by = {k: sim.clients[k] for k in chosen[0]}
    assert set(trained_by) == set(chosen[0])
    assert first.clients[chosen[0][0]].participated


def test_a_client_that_missed_broadcasts_downloads_the_current_model_first(monkeypatch):
    sim = toy_simulation(monkeypatch, RecordingFedAvg, algorithm="fedavg", num_clients=6, participation=0.5,
                         rounds=6, shards_per_client=2)
    algo = sim.algorithm
    model_bytes = BYTES_PER_ENTRY * sum(algo.numels.values())
    held = [True] * 6
    for rnd in range(1, 7):
        global_before = {n: t.clone() for n, t in algo.global_state.items()}
        result = sim.run_round()
        for k in algo.participants(rnd):
            start = algo.started[(rnd, k)]
            assert all(torch.equal(start[n], global_before[n]) for n in algo.param_names), (rnd, k)
            catch_up = 0 if held[k] else model_bytes
            assert result.clients[k].bytes_down == model_bytes + catch_up, (rnd, k)
            assert result.clients[k].bytes_up == model_bytes
        held = [k in algo.participants(rnd) for k in range(6)]


def test_full_participation_is_unchanged_by_the_sampling_hook():
    a = metrics(Simulation(tiny(algorithm="fedavg")).run())
    b = metrics(Simulation(tiny(algorithm="fedavg", participation=1.0)).run())
    assert a == b


# ---------------------------------------------------------------------------- eval_every
class CountingFT(FedAvgFT):
    calls: list

    def personalized_model(self, k, client, data, rnd):
        self.calls.append(rnd)
        return super().personalized_model(k, client, data, rnd)


def test_eval_every_skips_evaluation_but_always_evaluates_the_last_round(monkeypatch):
    CountingFT.calls = []
    sim = toy_simulation(monkeypatch, CountingFT, algorithm="fedavg_ft", rounds=5, eval_every=2)
    results = list(sim.run())
    assert [r.evaluated for r in results] == [False, True, False, True, True]
    assert sorted(set(CountingFT.calls)) == [2, 4, 5] and len(CountingFT.calls) == 3 * 4  # 4 clients
    for r in results:
        accs = [c.acc for c in r.clients]
        assert all(math.isnan(a) for a in accs) != r.evaluated
    # training is untouched by skipping evaluations
    every = metrics(Simulation(tiny(algorithm="fedavg_ft", rounds=5)).run())
    assert [[c["loss"] for c in r] for r in every] == [[c.loss for c in r.clients] for r in results]


# ---------------------------------------------------------------------------- validation split
class ValidationUser(FedAvg):
    """Reports, as its own metric, the size of the validation split it sees."""

    def local_update(self, k, client, data, rnd):
        stats = super().local_update(k, client, data, rnd)
        stats.metrics = {"toy_val_seen": float(data.n_val)}
        return stats


def test_validation_split_is_held_out_of_training_and_scored(monkeypatch):
    plain = Simulation(tiny(algorithm="fedavg", rounds=1))
    sim = toy_simulation(monkeypatch, ValidationUser, algorithm="fedavg", rounds=1, val_fraction=0.25)
    result = sim.run_round()
    for k, (d0, d) in enumerate(zip(plain.data.clients, sim.data.clients)):
        assert d.n_val == math.floor(0.25 * d0.n_train) and d.n_train + d.n_val == d0.n_train
        pool = torch.cat([d.x_train, d.x_val]).flatten(1)
        assert torch.equal(pool.sort(0).values, d0.x_train.flatten(1).sort(0).values)  # a split, nothing lost
        row = result.clients[k]
        assert row.metrics["toy_val_seen"] == d.n_val and 0 <= row.acc_val <= 1
    assert sim.data.val_hist.sum(1).tolist() == [d.n_val for d in sim.data.clients]
    assert all(math.isnan(c.acc_val) for c in plain.run_round().clients)


# ---------------------------------------------------------------------------- server-less rounds
class Ring(FedAvg):
    """Each client averages with its two ring neighbours; no server."""

    def neighbours(self, rnd, participants):
        n = len(self.clients_info)
        return {k: sorted({(k - 1) % n, (k + 1) % n}) for k in participants}


class FullGraph(FedAvg):
    def neighbours(self, rnd, participants):
        return {k: [j for j in participants if j != k] for k in participants}


def test_ring_neighbours_average_from_one_snapshot_with_traffic_up_and_down(monkeypatch):
    sim = toy_simulation(monkeypatch, Ring, algorithm="fedavg", num_clients=5, rounds=1, shards_per_client=2)
    algo = sim.algorithm
    recorded = {}
    mix = algo.mix_neighbours

    def spy(clients, data, graph, rnd):
        recorded["snapshot"] = [{n: t.clone() for n, t in c.state.items()} for c in clients]
        return mix(clients, data, graph, rnd)

    algo.mix_neighbours = spy
    result = sim.run_round()
    snap = recorded["snapshot"]
    for k, client in enumerate(sim.clients):
        group = sorted({k, (k - 1) % 5, (k + 1) % 5})
        for n in algo.param_names:
            expected = torch.stack([snap[j][n] for j in group]).mean(0)
            assert torch.allclose(client.state[n], expected, atol=1e-6), (k, n)
    model_bytes = BYTES_PER_ENTRY * sum(algo.numels.values())
    for c in result.clients:  # each sends its model to 2 neighbours and receives 2 models
        assert c.bytes_up == c.bytes_down == 2 * model_bytes
    rows = pd.DataFrame(round_rows(result, sim.config, sim.model_name))
    assert summarize_round(rows)["busiest_mb"] == pytest.approx(4 * model_bytes / 1e6)


def test_a_full_graph_equals_fedavg_bit_for_bit(monkeypatch):
    fedavg = Simulation(tiny(algorithm="fedavg", rounds=3))
    expected = [[c.acc_local for c in r.clients] for r in fedavg.run()]
    sim = toy_simulation(monkeypatch, FullGraph, algorithm="fedavg", rounds=3)
    got = [[c.acc_local for c in r.clients] for r in sim.run()]
    assert got == expected
    for a, b in zip(fedavg.clients, sim.clients):
        assert all(torch.equal(a.state[n], b.state[n]) for n in a.state)


# ---------------------------------------------------------------------------- setup, predictors
class SeesSetup(FedAvg):
    seen: list

    def setup(self, init, clients):
        SeesSetup.seen = list(clients)
        return super().setup(init, clients)


def test_setup_sees_client_sizes_and_capability_profiles(monkeypatch):
    profiles = [{"budget": 0.25 * (k + 1)} for k in range(4)]
    sim = toy_simulation(monkeypatch, SeesSetup, profiles=profiles, algorithm="fedavg", val_fraction=0.2)
    for k, (info, d) in enumerate(zip(SeesSetup.seen, sim.data.clients)):
        assert (info.k, info.n_train, info.n_val, info.n_test) == (k, d.n_train, d.n_val, d.n_test)
        assert info.train_label_hist.sum() == d.n_train and info.profile == profiles[k]
    with pytest.raises(ConfigError, match="3 capability profiles for 4 clients"):
        Simulation(tiny(algorithm="fedavg"), profiles=profiles[:3])


class Ensemble(FedAvg):
    """Evaluates the mean of the logits of the client's model and the initial model."""

    acc_from = "custom"

    def setup(self, init, clients):
        self.initial = {n: t.clone() for n, t in init.items()}
        return super().setup(init, clients)

    def personalized_model(self, k, client, data, rnd):
        model = self.trainer.model

        def predict(x):
            outs = []
            for state in (client.state, self.initial):
                model.load_state_dict(state)
                model.eval()
                with torch.no_grad():
                    outs.append(model(x))
            return (outs[0] + outs[1]) / 2
        return predict


def test_a_method_can_be_evaluated_through_its_own_predictor(monkeypatch):
    sim = toy_simulation(monkeypatch, Ensemble, algorithm="fedavg", rounds=2)
    result = list(sim.run())[-1]
    algo = sim.algorithm
    for k, (client, d) in enumerate(zip(sim.clients, sim.data.clients)):
        logits = algo.personalized_model(k, client, d, 2)(d.x_test)
        expected = (logits.argmax(1) == d.y_test).float().mean().item()
        assert result.clients[k].acc == pytest.approx(expected)
    assert any(c.acc != c.acc_global for c in result.clients)


# ---------------------------------------------------------------------------- schedules and metrics
def test_learning_rate_schedules_per_round(monkeypatch):
    seen = []
    sim = Simulation(tiny(algorithm="fedavg", rounds=4, lr=0.1, lr_schedule="multistep", lr_decay=0.5,
                          lr_milestones="2,4"))
    original = sim.trainer.train_pass
    monkeypatch.setattr(sim.trainer, "train_pass",
                        lambda *a, **kw: (seen.append(kw.get("lr", 0.1)), original(*a, **kw))[1])
    results = list(sim.run())
    per_round = [seen[i * 4] for i in range(4)]  # 4 clients, one pass each per round
    assert per_round == pytest.approx([0.1, 0.05, 0.05, 0.025])
    assert [r.lr for r in results] == pytest.approx(per_round)
    exp = tiny(algorithm="fedavg", lr=0.2, lr_schedule="exp", lr_decay=0.9)
    assert [exp.lr_at(t) for t in (1, 2, 3)] == pytest.approx([0.2, 0.18, 0.162])
    with pytest.raises(ConfigError, match="needs lr_milestones"):
        tiny(algorithm="fedavg", lr_schedule="multistep")
    with pytest.raises(ConfigError, match="increasing round numbers"):
        tiny(algorithm="fedavg", lr_schedule="multistep", lr_milestones="5,3")


class Reporting(FedAvg):
    def local_update(self, k, client, data, rnd):
        stats = super().local_update(k, client, data, rnd)
        return stats + LocalStats(torch.zeros(()), 0, {"toy_score": float(10 * k + rnd)})


class Clashing(FedAvg):
    def local_update(self, k, client, data, rnd):
        stats = super().local_update(k, client, data, rnd)
        stats.metrics = {"acc": 1.0}
        return stats


def test_a_methods_own_metrics_reach_the_rows_and_the_round_summary(monkeypatch):
    sim = toy_simulation(monkeypatch, Reporting, algorithm="fedavg", rounds=2)
    results = list(sim.run())
    rows = pd.DataFrame(round_rows(results[-1], sim.config, sim.model_name))
    assert rows.toy_score.tolist() == [10.0 * k + 2 for k in range(4)]
    assert summarize_round(rows)["toy_score_mean"] == pytest.approx(17.0)
    clash = toy_simulation(monkeypatch, Clashing, algorithm="fedavg", rounds=1)
    with pytest.raises(ValueError, match="clash with standard result columns"):
        clash.run_round()


def test_dense_gradients_on_request_change_nothing():
    sim = Simulation(tiny(algorithm="fedavg", rounds=1))
    trainer, d, state = sim.trainer, sim.data.clients[0], sim.clients[0].state
    before = {n: t.clone() for n, t in state.items()}
    head = ([n for n in trainer.params if n.startswith("classifier") or n.startswith("fc")][-2:]
            or list(trainer.params)[-2:])
    grads = trainer.gradients(state, d.x_train[:16], d.y_train[:16], names=head)
    assert set(grads) == set(head)
    model = trainer.model
    model.load_state_dict(state)
    model.zero_grad()
    torch.nn.functional.cross_entropy(model(d.x_train[:16]), d.y_train[:16]).backward()
    for n in head:
        assert torch.allclose(grads[n], dict(model.named_parameters())[n].grad)
    assert all(torch.equal(state[n], before[n]) for n in state)
    assert all(p.requires_grad for p in trainer.params.values())
