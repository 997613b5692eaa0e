"""Every registered method, interrupted after 2 of 4 rounds and resumed from its saved state,
continues exactly as the uninterrupted run: the same numbers every round, the same client states,
masks and extras, and the same server state (`Algorithm.state_dict`). Half the clients take part
each round, so a method whose server state is not saved (a momentum, a control variate, a
hypernetwork, a mask schedule) diverges after the resume. A new method is covered the moment it
is registered."""
from __future__ import annotations

import pytest
import torch

from fl_core import simulation
from fl_core.algorithms import ALGORITHMS
from fl_core.algorithms.fedavg import FedAvg
from fl_core.checkpoints import save_model
from fl_core.config import RunConfig
from fl_core.simulation import Simulation

from conftest import restore_mid_run, tiny

PERSONALIZING = ("ft", "l2p", "fedl2p")  # they start from a pretraining's checkpoint
OVERRIDES = {  # the smallest settings that exercise each method (its own tests use the same)
    "pfedhn": dict(pfedhn_hidden=6, pfedhn_layers=1, pfedhn_embed_dim=2, pfedhn_inner_steps=3),
    "fedl2p": dict(meta_steps=1, ft_epochs=1),
    "l2p": dict(meta_steps=1, ft_epochs=1),
    "ft": dict(ft_epochs=1),
}


@pytest.fixture(scope="module")
def pretraining(tmp_path_factory):
    """A FedAvg run on a BatchNorm LeNet, saved as the checkpoint the personalizing methods start from."""
    folder = tmp_path_factory.mktemp("checkpoints")
    config = RunConfig(algorithm="fedavg", dataset="synthetic", num_clients=4, partition="shards", shards_per_client=3,
                       model="lenet_bn", rounds=1, batch_size=16, lr=0.05, threads=1, val_fraction=0.25,
                       checkpoint_dir=str(folder))
    sim = Simulation(config)
    list(sim.run())
    save_model(config, sim.model_name, sim.final_model())
    return config, folder


def same(a, b) -> bool:
    """Equal nested server states: tensors bit for bit, containers element by element."""
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.shape == b.shape and torch.equal(a, b)
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return isinstance(b, (list, tuple)) and len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    return a == b or (a != a and b != b)  # NaN equals NaN here


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_every_method_resumes_bit_identically_server_state_included(algorithm, pretraining, tmp_path):
    knobs = dict(algorithm=algorithm, rounds=4, participation=0.5, momentum=0.5, val_fraction=0.25) | \
        OVERRIDES.get(algorithm, {})
    if algorithm in PERSONALIZING:
        config, folder = pretraining
        knobs |= dict(model="lenet_bn", pretrained=config.config_hash(), checkpoint_dir=str(folder))
    straight, resumed, _ = restore_mid_run(tiny(**knobs), tmp_path)
    assert same(straight.algorithm.state_dict(), resumed.algorithm.state_dict())


# ---------------------------------------------------------------------------- what the test catches
class ServerMomentum(FedAvg):
    """FedAvg with server momentum (FedAvgM, β = 0.9): v ← βv + (x − average), x ← x − v."""

    def setup(self, init, clients):
        self.velocity = {}
        return super().setup(init, clients)

    def aggregate(self, clients, data, rnd):
        before = {n: self.global_state[n].clone() for n in self.shared_names()}
        traffic = super().aggregate(clients, data, rnd)  # global_state := the participants' average
        for n, x in before.items():
            step = x - self.global_state[n]
            self.velocity[n] = step if n not in self.velocity else 0.9 * self.velocity[n] + step
            self.global_state[n] = x - self.velocity[n]
        for client in clients:
            self.receive(client)  # the momentum step's model, not the plain average
        return traffic


class SavesItsMomentum(ServerMomentum):
    def state_dict(self):
        return super().state_dict() | {"velocity": self.velocity}

    def load_state_dict(self, d):
        super().load_state_dict(d)
        self.velocity = d["velocity"]


def test_a_method_that_does_not_save_its_server_state_fails_the_resume_check(monkeypatch, tmp_path):
    config = tiny(algorithm="fedavg", rounds=4, participation=0.5)
    monkeypatch.setattr(simulation, "get_algorithm", lambda name: ServerMomentum)
    with pytest.raises(AssertionError):
        restore_mid_run(config, tmp_path / "forgets")
    monkeypatch.setattr(simulation, "get_algorithm", lambda name: SavesItsMomentum)
    straight, resumed, _ = restore_mid_run(config, tmp_path / "saves")
    assert same(straight.algorithm.state_dict(), resumed.algorithm.state_dict())
