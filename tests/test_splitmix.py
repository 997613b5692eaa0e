"""Split-Mix FL: with one base (`slim_ratios` "1") it is FedAvg bit for bit; otherwise each device
trains k_n narrow bases from a rotating shift, the server averages each base over exactly those
who trained it, a device scores the mix of its bases 0..k_n-1, and its training cost is k_n bases'."""
import pytest
import torch

from fl_core.config import ConfigError
from fl_core.flops import training_flops
from fl_core.models import build_model
from fl_core.simulation import Simulation

from conftest import tiny

EIGHTH = [{"ratio": 0.125}] * 4  # every device at width 1/8: one base each, so some bases go untrained


def scores(result):
    return [(c.acc, c.acc_global, c.acc_local, c.bytes_up, c.bytes_down) for c in result.clients]


def test_with_one_base_split_mix_is_fedavg_bit_for_bit():
    fedavg, splitmix = Simulation(tiny(algorithm="fedavg")), Simulation(tiny(algorithm="splitmix", slim_ratios="1"))
    assert len(splitmix.trainer.model.bases) == 1
    for _ in range(3):
        ra, rb = fedavg.run_round(), splitmix.run_round()
        ga, gb = fedavg.algorithm.global_state, splitmix.algorithm.global_state
        names_b = splitmix.algorithm.param_names
        assert [f"bases.0.{n}" for n in fedavg.algorithm.param_names] == names_b
        assert all(torch.equal(ga[n], gb[f"bases.0.{n}"]) for n in fedavg.algorithm.param_names)
        assert scores(ra) == scores(rb)
    assert all(c.metrics["bases"] == 1 and c.metrics["width"] == 1 for c in rb.clients)


def test_each_base_is_averaged_over_exactly_the_clients_that_trained_it():
    sim = Simulation(tiny(algorithm="splitmix", rounds=1), profiles=EIGHTH)
    algo, clients, data = sim.algorithm, sim.clients, sim.data.clients
    before = {n: t.clone() for n, t in algo.global_state.items()}
    trained_by = {}
    for k, client in enumerate(clients):
        start = {n: t.clone() for n, t in client.state.items()}
        stats = algo.local_update(k, client, data[k], 1)
        assert stats.metrics == {"width": 0.125, "bases": 1.0}
        (base,) = client.extra.bases  # a 1/8 device trains one base
        trained_by.setdefault(base, []).append(k)
        for i in range(algo.m):  # and only that one
            moved = any(not torch.equal(client.state[n], start[n]) for n in algo.base_names[i])
            assert moved == (i == base)
    states = [{n: t.clone() for n, t in c.state.items()} for c in clients]
    weights = algo.aggregation_weights(data)
    traffic = algo.aggregate(clients, data, 1)
    assert len(trained_by) < algo.m  # some base went untrained this round
    for i in range(algo.m):
        for n in algo.base_names[i]:
            who = trained_by.get(i, [])
            if not who:
                assert torch.equal(algo.global_state[n], before[n])
                continue
            expected = sum(weights[k] * states[k][n] for k in who) / sum(weights[k] for k in who)
            assert torch.allclose(algo.global_state[n], expected, rtol=1e-6, atol=1e-7)
    one_base = 4 * sum(p.numel() for p in sim.trainer.model.bases[0].parameters())
    assert traffic.up == [one_base] * 4  # each sends its one base (float32)
    assert all(torch.equal(c.state["active"], torch.tensor([1.0] + [0.0] * 7)) for c in clients)  # kept local


def test_the_shift_rotates_so_that_every_base_gets_trained():
    sim = Simulation(tiny(algorithm="splitmix", rounds=1), profiles=EIGHTH)
    algo = sim.algorithm
    seen = set()  # random shifts: 4 devices over 20 rounds cover the 8 bases (a seeded draw)
    for rnd in range(1, 21):
        for k in range(4):
            bases = algo.bases_of_round(k, rnd)
            assert len(bases) == 1
            seen.update(bases)
    assert seen == set(range(algo.m))
    full = Simulation(tiny(algorithm="splitmix", rounds=1)).algorithm  # 8-1: clients 2, 3 at width 1
    assert sorted(full.bases_of_round(3, 5)) == list(range(8))
    assert len({tuple(algo.bases_of_round(0, r)) for r in range(1, 9)}) > 1


def test_costs_are_those_of_k_bases():
    # LeNet at width 1/8 on 8x8x1 inputs, 10 classes: conv 1->1 ch 5x5 (25 + 1), conv 1->2 ch 5x5
    # (50 + 2), fc 2*2*2 = 8 -> 15 (120 + 15), 15 -> 11 (165 + 11), head 11 -> 10 (110 + 10): 509.
    narrow = 26 + 52 + 135 + 176 + 120
    sim = Simulation(tiny(algorithm="splitmix", rounds=1))  # 8-1: clients 0, 1 at 1/8, clients 2, 3 at 1
    result = sim.run_round()
    small, big = result.clients[0].metrics, result.clients[3].metrics
    assert (small["width"], small["bases"], big["width"], big["bases"]) == (0.125, 1, 1, 8)
    assert small["trainable_params"] == narrow and big["trainable_params"] == 8 * narrow
    fwd, bwd = training_flops(build_model("lenet", (1, 8, 8), 10, width=0.125), (1, 8, 8))
    assert small["fwd_mflops"] == pytest.approx(fwd / 1e6) and small["bwd_mflops"] == pytest.approx(bwd / 1e6)
    assert big["fwd_mflops"] == pytest.approx(8 * small["fwd_mflops"])
    assert big["bwd_mflops"] == pytest.approx(8 * small["bwd_mflops"])


def test_a_device_scores_the_mix_of_its_own_bases():
    sim = Simulation(tiny(algorithm="splitmix", rounds=1, slim_ratios="4-1"))  # M = 4
    result = sim.run_round()
    trainer = sim.trainer
    for k in (0, 3):  # client 0: width 1/4, its base 0; client 3: width 1, all four bases
        d, state = sim.data.clients[k], sim.clients[k].state
        own = range(sim.algorithm.counts[k])
        with torch.no_grad(), trainer.bound(state) as model:
            model.eval()
            logits = sum(model.bases[i](d.x_test) for i in own) / len(own)
            model.train()
        acc = float((logits.argmax(1) == d.y_test).float().mean())
        assert (result.clients[k].acc_global == pytest.approx(acc)
                and result.clients[k].acc == result.clients[k].acc_global)


def test_fine_tuning_changes_only_the_devices_own_bases():
    sim = Simulation(tiny(algorithm="splitmix", rounds=1, ft_epochs=1), profiles=EIGHTH)
    sim.run_round()
    algo, client = sim.algorithm, sim.clients[0]
    tuned = algo.personalized_model(0, client, sim.data.clients[0], 1)
    changed = {i for i in range(algo.m) if any(not torch.equal(tuned[n], client.state[n]) for n in algo.base_names[i])}
    assert changed == {0}


def test_small_models_at_width_1_are_unchanged_and_narrow_at_width_one_half():
    def shapes(m):
        return [tuple(p.shape) for p in m.parameters()]

    assert shapes(build_model("lenet", (1, 8, 8), 10, width=1.0)) == [
        (6, 1, 5, 5), (6,), (16, 6, 5, 5), (16,), (120, 64), (120,), (84, 120), (84,), (10, 84), (10,)]
    assert shapes(build_model("lenet", (1, 8, 8), 10, width=0.5)) == [
        (3, 1, 5, 5), (3,), (8, 3, 5, 5), (8,), (60, 32), (60,), (42, 60), (42,), (10, 42), (10,)]
    assert shapes(build_model("cnn2", (3, 32, 32), 10)) == [
        (32, 3, 5, 5), (32,), (64, 32, 5, 5), (64,), (512, 4096), (512,), (10, 512), (10,)]
    assert shapes(build_model("cnn2", (3, 32, 32), 10, width=0.5)) == [
        (16, 3, 5, 5), (16,), (32, 16, 5, 5), (32,), (256, 2048), (256,), (10, 256), (10,)]
    torch.manual_seed(0)
    a = build_model("lenet_bn", (1, 8, 8), 10)
    torch.manual_seed(0)
    b = build_model("lenet_bn", (1, 8, 8), 10, width=1.0)
    assert all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values()))


def test_models_without_a_width_and_init_weights_are_refused(tmp_path):
    with pytest.raises(ConfigError, match="preresnet18"):
        Simulation(tiny(algorithm="splitmix", model="preresnet18"))
    with pytest.raises(ConfigError, match="preresnet18"):
        build_model("preresnet18", (3, 32, 32), 10, width=0.5)
    weights = tmp_path / "w.pt"
    torch.save(build_model("lenet", (1, 8, 8), 10).state_dict(), weights)
    with pytest.raises(ConfigError, match="init_weights"):
        Simulation(tiny(algorithm="splitmix", init_weights=str(weights)))
