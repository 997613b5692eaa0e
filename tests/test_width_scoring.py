"""HeteroFL and Split-Mix scored as the PerFedMask authors score them (`score_width = "full"`):
`acc` is the full-width global model (Split-Mix: the mix of every base), fine-tuned whole, and
the device's own sub-model keeps its score in `acc_device`; the default scores the device's width."""
import pytest
import torch

from fl_core.config import ConfigError, RunConfig
from fl_core.simulation import Simulation

from conftest import tiny


def test_untuned_full_width_heterofl_scores_the_global_model_itself():
    # 8-1: clients 0 and 1 at width 1/8; digits, so that a score can tell the models apart
    sim = Simulation(tiny(algorithm="heterofl", dataset="digits", rounds=3, lr=0.1, local_epochs=2, score_width="full"))
    *_, result = sim.run()
    algo = sim.algorithm
    for c in result.clients:
        d = sim.data.clients[c.client]
        whole = dict(sim.clients[c.client].state) | {n: algo.global_state[n] for n in algo.shared_names()}
        assert c.acc == sim.trainer.evaluate(whole, d.x_test, d.y_test) / d.n_test
        assert c.metrics["acc_device"] == c.acc_global  # un-tuned: the device's slice, as the default scores it
    assert any(c.acc != c.acc_global for c in result.clients[:2])  # a 1/8 slice is not the whole model


def test_fine_tuned_full_width_and_device_width_agree_where_the_device_is_full_width():
    sim = Simulation(tiny(algorithm="heterofl", rounds=2, ft_epochs=1, score_width="full"))
    default = Simulation(tiny(algorithm="heterofl", rounds=2, ft_epochs=1))
    for full, own in zip(sim.run(), default.run()):
        # the device's fine-tuned slice is what the default scores, for every device
        assert [c.metrics["acc_device"] for c in full.clients] == [c.acc for c in own.clients]
        assert [c.acc for c in full.clients[2:]] == [c.acc for c in own.clients[2:]]  # width 1: the same model
        assert "acc_device" not in own.clients[0].metrics


def test_untuned_full_width_split_mix_scores_the_mix_of_every_base():
    sim = Simulation(tiny(algorithm="splitmix", dataset="digits", rounds=1, slim_ratios="4-1", score_width="full"))
    result = sim.run_round()
    for k in (0, 3):  # client 0 runs base 0 alone, client 3 all four
        d, state = sim.data.clients[k], sim.clients[k].state
        with torch.no_grad(), sim.trainer.bound(state) as model:
            model.eval()
            logits = sum(model.bases[i](d.x_test) for i in range(4)) / 4
            model.train()
        assert result.clients[k].acc == pytest.approx(float((logits.argmax(1) == d.y_test).float().mean()))
        assert result.clients[k].metrics["acc_device"] == result.clients[k].acc_global
    assert result.clients[1].acc != result.clients[1].acc_global


def test_fine_tuning_at_full_width_moves_every_base():
    sim = Simulation(tiny(algorithm="splitmix", rounds=1, slim_ratios="4-1", ft_epochs=1, score_width="full"))
    sim.run_round()
    algo, client = sim.algorithm, sim.clients[0]
    full, entries, extra = algo.full_width(client)
    tuned = algo.fine_tuned(0, full, sim.data.clients[0], 1, entries, extra)
    moved = {i for i in range(algo.m) if any(not torch.equal(tuned[n], client.state[n]) for n in algo.base_names[i])}
    assert moved == {0, 1, 2, 3} and torch.equal(tuned["active"], torch.ones(4))


def test_the_scored_width_names_the_method_and_leaves_earlier_hashes_alone():
    before = {"heterofl": "defba08ab4d5", "splitmix": "a1dcac13b773"}  # main at 46b131e, before the knob
    for algorithm, digest in before.items():
        config = RunConfig(algorithm=algorithm, dataset="fmnist", model="lenet", num_clients=20, rounds=50)
        assert config.config_hash() == digest
        full = config.replace(score_width="full")
        assert full.config_hash() != digest
    assert RunConfig(algorithm="heterofl", score_width="full").label() == "HeteroFL (full width)"
    assert RunConfig(algorithm="splitmix", slim_ratios="4-1", score_width="full").label() == \
        "Split-Mix FL (4-1, full width)"


@pytest.mark.parametrize("knobs,needle", [
    (dict(algorithm="heterofl", score_width="full", model="lenet_bn"), "running statistics"),
    (dict(algorithm="heterofl", score_width="whole"), "score_width"),
    (dict(algorithm="perfedmask", score_width="full"), "is a knob of"),
])
def test_bad_scored_widths_are_one_clear_error(knobs, needle):
    with pytest.raises(ConfigError, match=needle):
        Simulation(tiny(**knobs))
