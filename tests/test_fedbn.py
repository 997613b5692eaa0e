"""FedBN's defining property: every BatchNorm entry (weight, bias, running statistics) stays the
client's own, never averaged, while every other parameter is exactly FedAvg's aggregate; without
BatchNorm FedBN is FedAvg; the bytes sent leave the BN entries out."""
import torch

from fl_core.algorithms.base import BYTES_PER_ENTRY
from fl_core.algorithms.fedavg import FedAvg
from fl_core.algorithms.fedbn import batchnorm_entries
from fl_core.client_state import ClientState
from fl_core.simulation import Simulation

from conftest import tiny

BN_RUN = dict(model="cnn_bn", rounds=2, local_epochs=2)


def copied(states):
    return [{n: t.clone() for n, t in s.items()} for s in states]


def test_the_bn_entries_are_those_of_the_batchnorm_layers():
    sim = Simulation(tiny(algorithm="fedbn", **BN_RUN))
    bn = batchnorm_entries(sim.trainer.model)
    assert bn == [f"features.{i}.{e}" for i in (1, 5)
                  for e in ("weight", "bias", "running_mean", "running_var", "num_batches_tracked")]
    shared = sim.algorithm.shared_names()
    assert set(shared) == set(sim.algorithm.param_names) - set(bn) and "head.weight" in shared


def test_bn_entries_stay_local_and_the_rest_is_fedavgs_aggregate_bit_for_bit():
    sim = Simulation(tiny(algorithm="fedbn", **BN_RUN))
    algo, bn = sim.algorithm, set(batchnorm_entries(sim.trainer.model))
    seen = {}
    original = algo.aggregate

    def aggregate(clients, data, rnd):
        seen["trained"] = copied(c.state for c in clients)
        seen["previous"] = {n: t.clone() for n, t in algo.global_state.items()}
        return original(clients, data, rnd)

    algo.aggregate = aggregate
    for _ in range(2):  # in round 2 the clients start from different BN layers
        sim.run_round()
        # FedAvg's server step on the very same trained clients
        fedavg = FedAvg(sim.config.replace(algorithm="fedavg"), sim.trainer, sim.model_name)
        fedavg.global_state = seen["previous"]
        twins = [ClientState(state=s) for s in copied(seen["trained"])]
        fedavg.aggregate(twins, sim.data.clients, sim.completed)
        for client, trained, twin in zip(sim.clients, seen["trained"], twins):
            for name, value in client.state.items():
                if name in bn:  # the client's own post-training value, never averaged
                    assert torch.equal(value, trained[name]), name
                elif name in algo.param_names:
                    assert torch.equal(value, twin.state[name]), name
        weights = [c.state["features.1.weight"] for c in sim.clients]
        assert not all(torch.equal(weights[0], w) for w in weights[1:])  # personal indeed
        averaged = [t.state["features.1.weight"] for t in twins]
        assert all(torch.equal(averaged[0], w) for w in averaged[1:])  # where FedAvg averages


def test_fedavg_with_local_statistics_and_fedbn_part_only_in_the_bn_weights_after_a_round():
    fedavg, fedbn = (Simulation(tiny(algorithm=a, **BN_RUN, **k)) for a, k in (("fedavg", {"bn_stats": "local"}),
                                                                              ("fedbn", {})))
    fedavg.run_round()
    fedbn.run_round()
    bn = set(batchnorm_entries(fedbn.trainer.model))
    for a, b in zip(fedavg.clients, fedbn.clients):
        differ = {n for n in a.state if not torch.equal(a.state[n], b.state[n])}
        assert differ and differ <= {n for n in bn if n.endswith(("weight", "bias"))}


def test_without_batchnorm_fedbn_is_fedavg_bit_for_bit():
    runs = [Simulation(tiny(algorithm=a, model="lenet", rounds=2)) for a in ("fedavg", "fedbn")]
    assert not batchnorm_entries(runs[1].trainer.model)
    results = [[r for r in sim.run()] for sim in runs]
    for a, b in zip(*(sim.clients for sim in runs)):
        assert all(torch.equal(a.state[n], b.state[n]) for n in a.state)
    for ra, rb in zip(*results):
        assert [(c.acc, c.acc_global, c.bytes_up, c.bytes_down) for c in ra.clients] == \
               [(c.acc, c.acc_global, c.bytes_up, c.bytes_down) for c in rb.clients]


def test_bytes_sent_leave_the_bn_entries_out():
    sim = Simulation(tiny(algorithm="fedbn", **BN_RUN, participation=0.5))
    model = sim.trainer.model
    bn = set(batchnorm_entries(model))
    params = {n: p.numel() for n, p in model.named_parameters()}
    bn_params = sum(v for n, v in params.items() if n in bn)
    expected = (sum(params.values()) - bn_params) * BYTES_PER_ENTRY
    assert bn_params > 0
    for result in sim.run():
        for c in result.clients:
            assert c.bytes_up in (0, expected) and c.bytes_down in (0, expected, 2 * expected)
            assert c.personal_fraction == bn_params / sum(params.values())
        assert any(c.bytes_up == expected for c in result.clients)
