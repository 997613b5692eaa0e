"""`bn_stats`: where BatchNorm running statistics live. FedAvg evaluates one global model (the
server averages the running statistics with the weights), so every client's evaluated model gives
the same logits on the same input; FedBN keeps them local, so its clients' models differ. The
config hash moves exactly where the knob changes results."""
import pytest
import torch

from fl_core.algorithms.base import BYTES_PER_ENTRY
from fl_core.config import MODELS, RunConfig
from fl_core.knobs import ConfigError
from fl_core.models import RUNNING_STATS_MODELS, build_model
from fl_core.simulation import Simulation

from conftest import tiny

BN_RUN = dict(model="cnn_bn", rounds=2, local_epochs=2)


def logits(sim, state, x):
    with sim.trainer.bound(state) as model:
        model.eval()
        try:
            return model(x)
        finally:
            model.train()


def evaluated_logits(algorithm, **knobs):
    sim = Simulation(tiny(algorithm=algorithm, **(BN_RUN | knobs)))
    results = list(sim.run())
    x = sim.data.clients[0].x_test[:16]
    return [logits(sim, client.state, x) for client in sim.clients], results[-1]


def test_fedavg_evaluates_one_model_for_every_client():
    outputs, last = evaluated_logits("fedavg")
    assert all(torch.equal(outputs[0], o) for o in outputs[1:])
    assert all(c.acc == c.acc_global for c in last.clients)


def test_fedbn_and_a_local_statistics_fedavg_evaluate_a_model_per_client():
    for algorithm, knobs in (("fedbn", {}), ("fedavg", {"bn_stats": "local"})):
        outputs, _ = evaluated_logits(algorithm, **knobs)
        assert not all(torch.allclose(outputs[0], o) for o in outputs[1:]), algorithm


def test_the_running_statistics_are_the_weighted_mean_of_the_participants():
    sim = Simulation(tiny(algorithm="fedavg", weighting="samples", **BN_RUN))
    algo, seen = sim.algorithm, {}
    original = algo.aggregate

    def aggregate(clients, data, rnd):
        seen["trained"] = [{n: c.state[n].clone() for n in algo.statistic_names} for c in clients]
        seen["weights"] = algo.aggregation_weights(data)
        return original(clients, data, rnd)

    algo.aggregate = aggregate
    sim.run_round()
    assert sorted(algo.statistic_names) == sorted(n for n in sim.clients[0].state if n.endswith(("_mean", "_var")))
    for name in algo.statistic_names:
        expected = sum(w * s[name] for w, s in zip(seen["weights"], seen["trained"]))
        for client in sim.clients:
            torch.testing.assert_close(client.state[name], expected, rtol=1e-6, atol=1e-7)


def test_the_bytes_count_the_statistics_both_ways():
    sims = [Simulation(tiny(algorithm="fedavg", bn_stats=b, **BN_RUN)) for b in ("global", "local")]
    rows = [sim.run_round().clients for sim in sims]
    stats = sum(t.numel() for n, t in sims[0].clients[0].state.items() if n.endswith(("_mean", "_var")))
    assert stats > 0
    for glob, loc in zip(*rows):
        assert (glob.bytes_up - loc.bytes_up, glob.bytes_down - loc.bytes_down) == (stats * BYTES_PER_ENTRY,) * 2


def test_a_client_that_missed_broadcasts_downloads_the_statistics_too():
    runs = {b: Simulation(tiny(algorithm="fedavg", participation=0.5, bn_stats=b, **BN_RUN))
            for b in ("global", "local")}
    rows = {b: [sim.run_round().clients for _ in range(2)][1] for b, sim in runs.items()}
    extra = runs["global"].algorithm.statistics_bytes()
    assert extra > 0 and runs["local"].algorithm.statistics_bytes() == 0
    for glob, loc in zip(rows["global"], rows["local"]):
        assert glob.bytes_down - loc.bytes_down in (0, extra, 2 * extra)  # a download, a broadcast, or both
    assert any(glob.bytes_down - loc.bytes_down == 2 * extra for glob, loc in zip(rows["global"], rows["local"]))


def test_a_client_that_missed_broadcasts_is_scored_with_the_servers_statistics():
    sim = Simulation(tiny(algorithm="fedavg", participation=0.5, **BN_RUN))
    for _ in range(2):
        sim.run_round()
    server = {n: sim.algorithm.global_state[n] for n in sim.algorithm.statistic_names}
    x = sim.data.clients[0].x_test[:16]
    from fl_core.simulation import download
    outputs = []
    for client in sim.clients:
        copy = type(client)(state=dict(client.state), mask=client.mask, extra=client.extra.copy())
        download(sim.algorithm, copy)
        assert all(torch.equal(copy.state[n], v) for n, v in server.items())
        outputs.append(logits(sim, copy.state, x))
    assert all(torch.equal(outputs[0], o) for o in outputs[1:])


def test_the_running_statistics_models_are_those_with_batchnorm():
    with_stats = {m for m in MODELS if m != "auto"
                  and any(b.is_floating_point() for b in build_model(m, (3, 32, 32), 10).buffers())}
    assert with_stats == set(RUNNING_STATS_MODELS)


def test_the_hash_moves_only_where_the_statistics_are_averaged():
    def h(**k):
        return RunConfig(algorithm=k.pop("algorithm"), dataset="digits", **k).config_hash()
    # before the knob every method kept them local: those hashes stay
    assert h(algorithm="fedavg", model="lenet_bn", bn_stats="local") == "ef9b51b3e2d4"  # main at d1937da
    assert (h(algorithm="fedavg", model="lenet") == h(algorithm="fedavg", model="lenet", bn_stats="local")
            == "be0fecb20690")
    assert h(algorithm="fedbn", model="lenet_bn") == "526de6a2c02f"
    # FedAvg's default now averages them on a BatchNorm model: a new hash, never an old result
    assert h(algorithm="fedavg", model="lenet_bn") == h(algorithm="fedavg", model="lenet_bn", bn_stats="global")
    assert h(algorithm="fedavg", model="lenet_bn") != "ef9b51b3e2d4"
    assert h(algorithm="fedselect", model="lenet_bn", bn_stats="global") != h(algorithm="fedselect", model="lenet_bn")


@pytest.mark.parametrize("algorithm,why", [("fedbn", "by definition"), ("local", "no server"),
                                           ("dpsgd", "no server")])
def test_global_statistics_where_the_method_cannot_have_them_is_one_error(algorithm, why):
    with pytest.raises(ConfigError, match=f"bn_stats='global' is not allowed for {algorithm}.*{why}"):
        RunConfig(algorithm=algorithm, bn_stats="global")
    assert RunConfig(algorithm=algorithm, bn_stats="local").bn_statistics() == "local"


def test_each_method_default_follows_its_paper_and_the_help_names_them():
    from fl_core.algorithms import ALGORITHMS
    from fl_core.knobs import knob_fields
    globals_ = [a for a in ALGORITHMS if RunConfig(algorithm=a).bn_statistics() == "global"]
    assert set(globals_) == {"fedavg", "fedavg_ft", "fedbabu", "fedprox", "fednova", "scaffold", "moon"}
    help_ = next(f for f in knob_fields(RunConfig) if f.name == "bn_stats").metadata["help"]
    named = help_.split("global for ")[1].split(", local for")[0].replace(" and ", ", ").split(", ")
    assert sorted(named) == sorted(globals_)
