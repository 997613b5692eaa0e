"""Body/head baselines: FedPer and FedRep keep the head personal and average the body, LG-FedAvg
the other way round, FedBABU never trains or sends its head and fine-tunes a copy before
evaluation; FedRep's two phases each touch only their own parameters."""
import pytest
import torch

from fl_core.algorithms.base import BYTES_PER_ENTRY
from fl_core.config import RunConfig
from fl_core.models import is_head
from fl_core.simulation import Simulation

from conftest import tiny

# method -> which group the server averages ("body" or "head"); the other group is personal
SHARED_GROUP = {"fedper": "body", "fedrep": "body", "lg_fedavg": "head", "fedbabu": "body"}
# Knobs that isolate the split: LG-FedAvg without its FedAvg warm start (tested on its own below).
SPLIT_KNOBS = {"fedrep": {"head_epochs": 2}, "lg_fedavg": {"lg_warmup_rounds": 0}}


def groups(sim):
    """(shared, personal) parameter names, derived from the model registry independently of the algorithm."""
    names = [n for n, _ in sim.trainer.model.named_parameters()]
    head = [n for n in names if is_head(sim.model_name, n)]
    body = [n for n in names if not is_head(sim.model_name, n)]
    assert head and body
    return (body, head) if SHARED_GROUP[sim.config.algorithm] == "body" else (head, body)


def snapshot(clients):
    return [{n: t.clone() for n, t in c.state.items()} for c in clients]


@pytest.mark.parametrize("algorithm", ["fedper", "fedrep", "lg_fedavg"])
def test_personal_group_never_averaged_and_shared_group_is_the_clients_mean(algorithm):
    sim = Simulation(tiny(algorithm=algorithm, rounds=2, **SPLIT_KNOBS.get(algorithm, {})))
    sim.run_round()
    algo = sim.algorithm
    shared, personal = groups(sim)
    assert sorted(algo.shared_names()) == sorted(shared)
    for k, (c, d) in enumerate(zip(sim.clients, sim.data.clients)):
        algo.local_update(k, c, d, rnd=2)
    before = snapshot(sim.clients)
    sent = algo.aggregate(sim.clients, sim.data.clients, rnd=2)

    for name in personal:
        for k, c in enumerate(sim.clients):
            assert torch.equal(c.state[name], before[k][name]), (k, name)  # exactly what the client had
        assert not all(torch.equal(c.state[name], sim.clients[0].state[name]) for c in sim.clients[1:]), name
    for name in shared:
        mean = torch.stack([b[name] for b in before]).mean(0)
        assert torch.allclose(algo.global_state[name], mean, atol=1e-6), name
        assert not torch.equal(before[0][name], before[1][name]), name  # the average did something
        for c in sim.clients:
            assert torch.equal(c.state[name], algo.global_state[name]), name
    assert sent.up == sent.down == [BYTES_PER_ENTRY * sum(algo.numels[n] for n in shared)] * len(sim.clients)


@pytest.mark.parametrize("algorithm", ["fedper", "fedrep", "lg_fedavg", "fedbabu"])
def test_bytes_are_four_per_shared_entry_and_acc_is_the_declared_model(algorithm):
    sim = Simulation(tiny(algorithm=algorithm, rounds=1, **SPLIT_KNOBS.get(algorithm, {})))
    shared, _ = groups(sim)
    expected = BYTES_PER_ENTRY * sum(p.numel() for n, p in sim.trainer.model.named_parameters() if n in shared)
    result = sim.run_round()
    for c in result.clients:
        assert c.bytes_up == c.bytes_down == expected
        if algorithm != "fedbabu":
            assert c.acc == c.acc_global


def test_fedrep_head_phase_touches_only_the_head_and_body_phase_only_the_body():
    sim = Simulation(tiny(algorithm="fedrep", rounds=1, head_epochs=3, local_epochs=2))
    algo = sim.algorithm
    _, head = groups(sim)
    passes = []
    original = algo.train_pass

    def recording(k, client, data, rnd, epoch, update, purpose, stats, **options):
        before = {n: t.clone() for n, t in client.state.items()}
        original(k, client, data, rnd, epoch, update, purpose, stats, **options)
        changed = {n for n in algo.param_names if not torch.equal(client.state[n], before[n])}
        passes.append((purpose, changed))

    algo.train_pass = recording
    k, client, data = 2, sim.clients[2], sim.data.clients[2]
    algo.local_update(k, client, data, rnd=1)
    body = set(algo.param_names) - set(head)
    assert [p for p, _ in passes] == ["head"] * 3 + ["global"] * 2  # head first, then body
    for purpose, changed in passes:
        assert changed == (set(head) if purpose == "head" else body), purpose  # the others bit-identical


def test_fedrep_head_epochs_zero_trains_only_the_body():
    sim = Simulation(tiny(algorithm="fedrep", rounds=1, head_epochs=0))
    _, head = groups(sim)
    before = snapshot(sim.clients)
    sim.run_round()
    for b, c in zip(before, sim.clients):
        assert all(torch.equal(b[n], c.state[n]) for n in head)


def test_fedbabu_head_stays_at_its_initialisation_on_every_client_and_the_server():
    sim = Simulation(tiny(algorithm="fedbabu", rounds=4))
    algo = sim.algorithm
    shared, head = groups(sim)
    init = {n: t.clone() for n, t in algo.global_state.items()}
    for c in sim.clients:  # all clients start from the one init
        assert all(torch.equal(c.state[n], init[n]) for n in algo.param_names)
    for result in sim.run():
        for name in head:
            assert torch.equal(algo.global_state[name], init[name]), (result.round, name)
            for c in sim.clients:
                assert torch.equal(c.state[name], init[name]), (result.round, name)
        for name in shared:
            assert not torch.equal(algo.global_state[name], init[name]), (result.round, name)
            for c in sim.clients:
                assert torch.equal(c.state[name], algo.global_state[name])


def test_fedbabu_finetunes_a_copy_for_evaluation_without_touching_training():
    tuned_run = Simulation(tiny(algorithm="fedbabu", rounds=3, ft_epochs=2))
    plain_run = Simulation(tiny(algorithm="fedbabu", rounds=3, ft_epochs=0))
    for a, b in zip(tuned_run.run(), plain_run.run()):
        for ca, cb in zip(a.clients, b.clients):
            assert (ca.acc_local, ca.acc_global, ca.loss) == (cb.acc_local, cb.acc_global, cb.loss)
            assert cb.acc == cb.acc_global  # no fine-tuning: the broadcast model itself
        assert [c.acc for c in a.clients] != [c.acc_global for c in a.clients]  # fine-tuning happened
    for ca, cb in zip(tuned_run.clients, plain_run.clients):  # the training state never saw the fine-tuning
        assert all(torch.equal(t, cb.state[n]) for n, t in ca.state.items())

    algo, k = tuned_run.algorithm, 1
    client, data = tuned_run.clients[k], tuned_run.data.clients[k]
    before = {n: t.clone() for n, t in client.state.items()}
    tuned = algo.personalized_model(k, client, data, rnd=3)
    assert all(torch.equal(client.state[n], before[n]) for n in before)
    assert all(not torch.equal(tuned[n], before[n]) for n in algo.param_names)  # every parameter, head too


def digits(algorithm, **overrides):
    base = dict(dataset="digits", partition="shards", shards_per_client=2, num_clients=10, threads=1,
                algorithm=algorithm, local_epochs=5)
    return RunConfig(**(base | overrides))


# Measured final mean acc (seed 0, the evaluated model acc_global; 2026-11, AVX-512 CPU, in the
# reproducible mode / with the CPU's own kernels / ATen unvectorised with oneDNN at SSE4.1): fedper
# 0.900 / 0.898 / 0.903 (its acc_local: 0.99), fedrep 0.951 / 0.955 / 0.957, lg_fedavg 0.989 in all
# three, fedbabu (with the authors' fine-tuning) 0.933 / 0.937 / 0.937. Each has levelled off: over
# rounds 5 to 8 none is below 0.878, 0.927, 0.919 (lg_fedavg from round 6 on), 0.921.
@pytest.mark.slow
@pytest.mark.parametrize("algorithm, overrides, threshold", [
    ("fedper", dict(rounds=8), 0.8),
    ("fedrep", dict(rounds=8), 0.9),
    ("lg_fedavg", dict(rounds=8), 0.9),
    ("fedbabu", dict(rounds=8), 0.9),
])
def test_learns_on_digits(algorithm, overrides, threshold):
    *_, last = Simulation(digits(algorithm, **overrides)).run()
    assert last.mean("acc") > threshold, [round(c.acc, 3) for c in last.clients]
