"""Each baseline's protocol as its paper or authors' code defines it (issue 14): fine-tuning
budgets and optimizers, FedRep's pass budget, LG-FedAvg's FedAvg warm start, LotteryFL's
per-dataset defaults."""
import pytest
import torch

from fl_core.algorithms import ALGORITHMS, get_algorithm
from fl_core.algorithms.fedavg_ft import FineTuning
from fl_core.simulation import Simulation

from conftest import tiny

FINE_TUNING = [a for a in ALGORITHMS if issubclass(get_algorithm(a), FineTuning)]


def record_passes(sim):
    """Wrap the algorithm's train_pass: a list of (client, purpose, lr, momentum) per pass."""
    algo, passes = sim.algorithm, []
    original = algo.train_pass

    def recording(k, client, data, rnd, epoch, update, purpose, stats, **options):
        passes.append((k, purpose, options.get("lr", algo.lr(rnd)), options.get("momentum")))
        return original(k, client, data, rnd, epoch, update, purpose, stats, **options)

    algo.train_pass = recording
    return passes


def test_the_fine_tuning_methods_are_the_expected_ones():
    assert set(FINE_TUNING) == {"fedavg_ft", "fedbabu", "fedprox", "fednova", "heterofl", "splitmix", "perfedmask"}


@pytest.mark.parametrize("algorithm", ["fedavg_ft", "fedbabu"])
@pytest.mark.parametrize("local_epochs", [1, 3, 7])
def test_fine_tuning_budget_is_never_below_the_local_update(algorithm, local_epochs):
    sim = Simulation(tiny(algorithm=algorithm, rounds=1, local_epochs=local_epochs))
    passes = record_passes(sim)
    sim.run_round()
    for k in range(sim.config.num_clients):
        tuning = sum(1 for c, purpose, *_ in passes if c == k and purpose == "finetune")
        local = sum(1 for c, purpose, *_ in passes if c == k and purpose != "finetune")
        assert local == local_epochs and tuning >= local, (k, tuning, local)


@pytest.mark.parametrize("algorithm, epochs", [("perfedmask", 5), ("fedprox", 0), ("fednova", 0), ("heterofl", 0),
                                               ("splitmix", 0)])
def test_fixed_fine_tuning_budgets(algorithm, epochs):
    """PerFedMask fine-tunes 5 epochs whatever the local update (the authors' personalization);
    PerFedMask's baselines report the un-tuned model unless a study sets ft_epochs."""
    for local_epochs in (1, 7):
        sim = Simulation(tiny(algorithm=algorithm, rounds=1, local_epochs=local_epochs))
        passes = record_passes(sim)
        sim.run_round()
        assert sum(1 for c, purpose, *_ in passes if c == 0 and purpose == "finetune") == epochs


def test_fedbabu_fine_tunes_as_the_authors_and_fedavg_ft_with_the_training_optimizer():
    babu = Simulation(tiny(algorithm="fedbabu", rounds=1, local_epochs=2, momentum=0.5))
    passes = record_passes(babu)
    babu.run_round()
    tuning = {(lr, m) for _, purpose, lr, m in passes if purpose == "finetune"}
    assert tuning == {(1e-3, 0.9)}
    assert sum(1 for _, purpose, *_ in passes if purpose == "finetune") == 5 * babu.config.num_clients

    ft = Simulation(tiny(algorithm="fedavg_ft", rounds=1, local_epochs=2, lr=0.07, momentum=0.5))
    passes = record_passes(ft)
    ft.run_round()
    assert {(lr, m) for _, purpose, lr, m in passes if purpose == "finetune"} == {(0.07, 0.5)}

    given = Simulation(tiny(algorithm="fedbabu", rounds=1, ft_epochs=1, ft_lr=0.2, ft_momentum=0.0))
    passes = record_passes(given)
    given.run_round()
    assert [(lr, m) for _, purpose, lr, m in passes if purpose == "finetune"] == [(0.2, 0.0)] * given.config.num_clients


def test_fine_tuning_momentum_reaches_the_tuned_model_and_leaves_training_alone():
    tuned = []
    for momentum in (0.0, 0.9):
        sim = Simulation(tiny(algorithm="fedavg_ft", rounds=2, ft_momentum=momentum))
        sim.run_round()
        before = {n: t.clone() for n, t in sim.clients[0].state.items()}
        tuned.append(sim.algorithm.personalized_model(0, sim.clients[0], sim.data.clients[0], rnd=1))
        assert all(torch.equal(t, sim.clients[0].state[n]) for n, t in before.items())  # a copy is tuned
    assert any(not torch.equal(t, tuned[1][n]) for n, t in tuned[0].items())


@pytest.mark.parametrize("local_epochs,head_epochs,passes", [(2, None, 4), (3, None, 6), (1, 9, 10)])
def test_fedrep_round_budget(local_epochs, head_epochs, passes):
    knobs = {} if head_epochs is None else {"head_epochs": head_epochs}
    sim = Simulation(tiny(algorithm="fedrep", rounds=1, local_epochs=local_epochs, **knobs))
    recorded = record_passes(sim)
    sim.run_round()
    assert sum(1 for k, *_ in recorded if k == 0) == passes


def test_lg_fedavg_warm_start_is_fedavg_bit_for_bit_then_shares_only_the_head():
    fedavg = Simulation(tiny(algorithm="fedavg", rounds=4))
    lg = Simulation(tiny(algorithm="lg_fedavg", rounds=4, lg_warmup_rounds=2))
    for rnd in (1, 2):
        a, b = fedavg.run_round(), lg.run_round()
        assert [c.acc_global for c in a.clients] == [c.acc_global for c in b.clients]
        assert [c.bytes_up for c in a.clients] == [c.bytes_up for c in b.clients]
        assert all(c.personal_fraction == 0.0 for c in b.clients)
    for name, t in fedavg.algorithm.global_state.items():
        assert torch.equal(t, lg.algorithm.global_state[name]), name
    third = lg.run_round()
    head = set(lg.algorithm.head_names)
    assert sorted(lg.algorithm.shared_names()) == sorted(head)
    assert all(0 < c.personal_fraction < 1 and c.bytes_up < b.clients[0].bytes_up for c in third.clients)
    bodies = [c.state[n] for c in lg.clients for n in lg.algorithm.body_names[:1]]
    assert not torch.equal(bodies[0], bodies[1])  # the representations went local after the warm start


def test_lg_fedavg_default_warm_start_is_two_thirds_of_the_rounds():
    assert Simulation(tiny(algorithm="lg_fedavg", rounds=20)).algorithm.warmup_rounds == 13
    assert Simulation(tiny(algorithm="lg_fedavg", rounds=20, lg_warmup_rounds=0)).algorithm.warmup_rounds == 0


@pytest.mark.parametrize("dataset,threshold,target", [("digits", 0.5, 0.9), ("synthetic", 0.1, 0.5)])
def test_lotteryfl_takes_the_authors_values_for_the_dataset(dataset, threshold, target):
    algo = Simulation(tiny(algorithm="lotteryfl", dataset=dataset, rounds=1)).algorithm
    assert (algo.acc_threshold, algo.target_sparsity) == (threshold, target)
    given = Simulation(tiny(algorithm="lotteryfl", dataset=dataset, rounds=1, lottery_target_sparsity=0.3)).algorithm
    assert given.target_sparsity == 0.3


def test_momentum_scope_round_carries_the_buffer_over_a_rounds_epochs_only():
    """One local epoch: both scopes are the same run bit for bit; two: they differ."""
    def client_state(scope, epochs):
        sim = Simulation(tiny(algorithm="fedavg", rounds=1, local_epochs=epochs, momentum=0.9, momentum_scope=scope))
        sim.run_round()
        return sim.clients[0].state
    one = [client_state(scope, 1) for scope in ("epoch", "round")]
    assert all(torch.equal(t, one[1][n]) for n, t in one[0].items())
    two = [client_state(scope, 2) for scope in ("epoch", "round")]
    assert any(not torch.equal(t, two[1][n]) for n, t in two[0].items())


def test_momentum_scope_at_its_default_leaves_the_config_hash_alone():
    assert tiny(algorithm="fedavg", momentum=0.9).config_hash() == \
        tiny(algorithm="fedavg", momentum=0.9, momentum_scope="epoch").config_hash()
    assert tiny(algorithm="fedavg", momentum=0.9).config_hash() != \
        tiny(algorithm="fedavg", momentum=0.9, momentum_scope="round").config_hash()
