"""One evaluation pass per distinct model: the engine scores a client's model after local
training, and scores it again after the communication step only where that step changed it;
a custom personalized model that is the broadcast state itself is not scored twice. A state
changed in place (same tensors, new values) is scored again."""
import pytest
import torch

from fl_core import simulation
from fl_core.algorithms.fedavg import FedAvg
from fl_core.config import ConfigError
from fl_core.simulation import Simulation
from fl_core.training import LocalTrainer

from conftest import tiny


def count_passes(monkeypatch, sim):
    """Replace the trainer's evaluate by a counting wrapper; returns the list it appends to."""
    calls = []
    original = LocalTrainer.evaluate

    def counted(self, model, x, y, batch_size=1024):
        calls.append(x.shape[0])
        return original(self, model, x, y, batch_size)

    monkeypatch.setattr(LocalTrainer, "evaluate", counted)
    return calls


def run_all(sim):
    return [[(c.acc, c.acc_local, c.acc_global) for c in r.clients] for r in sim.run()]


@pytest.mark.parametrize("algorithm, passes_per_client", [
    ("fedavg", 2),     # after local training and after the broadcast: two models
    ("fedprox", 2),    # acc is the broadcast state itself (no fine-tuning epochs): not scored a third time
    ("local", 1),      # nothing is broadcast: the trained model is the model after communication
])
def test_each_distinct_model_is_scored_once_per_round(monkeypatch, algorithm, passes_per_client):
    reference = run_all(Simulation(tiny(algorithm=algorithm)))  # before counting: the same numbers
    sim = Simulation(tiny(algorithm=algorithm))
    calls = count_passes(monkeypatch, sim)
    assert run_all(sim) == reference
    rounds, clients = sim.config.rounds, sim.config.num_clients
    assert len(calls) == passes_per_client * clients * rounds


class ShiftsInPlace(FedAvg):
    """FedAvg whose clients keep their trained tensors after communication, one logit's bias
    raised in place."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.trained = {}  # id(client) -> its state right after local training

    def aggregate(self, clients, data, rnd):
        traffic = super().aggregate(clients, data, rnd)
        for client in clients:  # undo the broadcast's new tensors: the trained ones, changed in place
            client.state = dict(self.trained[id(client)])
            with torch.no_grad():
                client.state["head.bias"][0].add_(100.0)  # through a view: every prediction is class 0
        return traffic

    def local_update(self, k, client, data, rnd):
        stats = super().local_update(k, client, data, rnd)
        self.trained[id(client)] = dict(client.state)
        return stats


def test_a_state_changed_in_place_after_scoring_is_scored_again(monkeypatch):
    monkeypatch.setattr(simulation, "get_algorithm", lambda name: ShiftsInPlace)
    sim = Simulation(tiny(algorithm="fedavg", rounds=1, batch_size=1000))
    calls = count_passes(monkeypatch, sim)
    result = sim.run_round()
    assert len(calls) == 2 * sim.config.num_clients  # the same tensor objects, but modified: scored again
    assert any(c.acc_local != c.acc_global for c in result.clients)


@pytest.mark.parametrize("algorithm, acc_column, skipped", [
    ("fedselect", "acc_local", "acc_global"),  # acc is the model after local training
    ("fedavg", "acc_global", "acc_local"),     # acc is the broadcast model
    ("fedavg_ft", None, "acc_local"),          # acc is a fine-tuned model of its own (custom)
])
def test_eval_models_acc_scores_only_the_reported_model(monkeypatch, algorithm, acc_column, skipped):
    everything = [r.clients for r in Simulation(tiny(algorithm=algorithm)).run()]
    sim = Simulation(tiny(algorithm=algorithm, eval_models="acc"))
    calls = count_passes(monkeypatch, sim)
    only = [r.clients for r in sim.run()]
    assert len(calls) == sim.config.num_clients * sim.config.rounds  # one test pass per client and round
    for full_round, lean_round in zip(everything, only):
        for full, lean in zip(full_round, lean_round):
            assert lean.acc == full.acc  # the same training, the same reported number
            if acc_column:
                assert getattr(lean, acc_column) == full.acc
            assert getattr(lean, skipped) != getattr(lean, skipped)  # NaN: not scored


def test_eval_models_rejects_an_unknown_choice():
    with pytest.raises(ConfigError, match="eval_models='some' is not allowed; choose one of all, acc"):
        tiny(eval_models="some")
