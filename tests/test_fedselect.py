"""FedSelect's defining properties: growth schedule, largest-|Δ| selection, private personal
entries, p = 0 / α = 0 equal FedAvg, and the faithful mode's differences."""
import numpy as np
import pytest
import torch

from fl_core.algorithms.base import BYTES_PER_ENTRY
from fl_core.client_state import PackedMask
from fl_core.masks import grow_count
from fl_core.simulation import Simulation

from conftest import tiny


def fraction_schedule(p, alpha, rounds):
    f, out = 0.0, []
    for _ in range(rounds):
        f = min(alpha, f + p * (1 - f))
        out.append(f)
    return out


def test_personal_fraction_of_every_tensor_follows_the_schedule():
    sim = Simulation(tiny(rounds=5, pers_rate=0.3, pers_limit=0.6))
    algo = sim.algorithm
    assert algo.selectable and all(n.endswith("weight") for n in algo.selectable)
    for result, f in zip(sim.run(), fraction_schedule(0.3, 0.6, 5)):
        for client in sim.clients:
            for name in algo.selectable:
                numel = algo.numels[name]
                assert int(client.mask[name].sum()) == grow_count(numel, f), (result.round, name)
            assert set(client.mask) == set(algo.selectable)  # biases never get a mask
    assert f == pytest.approx(0.6)  # the limit was reached and held


def grow_once(variant: str, k: int):
    """Run round 1, then client k's round-2 local update; per selectable tensor yield
    (name, |Δ| of round 2, newly personal entries, still-global entries, mask before)."""
    sim = Simulation(tiny(rounds=3, fedselect_variant=variant))
    next(sim.run())  # round 1: some entries are personal now
    algo = sim.algorithm
    client, data = sim.clients[k], sim.data.clients[k]
    before_state = {n: t.clone() for n, t in client.state.items()}
    before_mask = {n: m.clone() for n, m in client.mask.items()}
    algo.local_update(k, client, data, rnd=2)
    # round 3's mask; round 2 trained and sends with the old one
    grown = PackedMask.from_dict(client.extra.next_mask)
    for name in algo.selectable:
        delta = (client.state[name] - before_state[name]).abs()
        new = grown[name] & ~before_mask[name]
        assert int(new.sum()) > 0
        yield name, delta, new, ~grown[name], before_mask[name]


def test_new_personal_entries_are_the_largest_delta_among_the_global_ones():
    for name, delta, new, still_global, before in grow_once("gradselect", k=1):
        assert not (before & still_global).any()  # personal stays personal
        if still_global.any():
            assert delta[new].min() >= delta[still_global].max(), name


def test_round_t_averages_and_broadcasts_under_the_mask_it_trained_with():
    # Paper §4.5: GradSelect's new mask is the next round's; the round's upload uses m_t.
    sim = Simulation(tiny(rounds=3))
    next(sim.run())
    algo = sim.algorithm
    trained_with = [{n: m.clone() for n, m in c.mask.items()} for c in sim.clients]
    for k, (c, d) in enumerate(zip(sim.clients, sim.data.clients)):
        algo.local_update(k, c, d, rnd=2)
    grown = [PackedMask.from_dict(c.extra.next_mask) for c in sim.clients]
    before = [{n: t.clone() for n, t in c.state.items()} for c in sim.clients]
    sent = algo.aggregate(sim.clients, sim.data.clients, rnd=2)
    for name in algo.selectable:
        stacked = torch.stack([b[name] for b in before])
        glob = (~torch.stack([m[name] for m in trained_with])).float()
        expected = torch.where(glob.sum(0) > 0, (stacked * glob).sum(0) / glob.sum(0).clamp_min(1),
                               algo.global_state[name])
        assert torch.allclose(algo.global_state[name], expected, atol=1e-6)
        for k, c in enumerate(sim.clients):
            m = trained_with[k][name]
            assert torch.equal(c.state[name][m], before[k][name][m])          # personal: untouched
            assert torch.equal(c.state[name][~m], algo.global_state[name][~m])  # global: broadcast
            new = grown[k][name] & ~m
            assert new.any() and torch.equal(c.state[name][new], algo.global_state[name][new])
            assert torch.equal(c.mask[name], grown[k][name])  # after the broadcast: the new mask
    for k, c in enumerate(sim.clients):
        personal = sum(int(m.sum()) for m in trained_with[k].values())
        assert sent.up[k] == sent.down[k] == (sum(algo.numels.values()) - personal) * BYTES_PER_ENTRY


@pytest.mark.parametrize("knob,clients", [({"pers_rate": 0.0}, 4), ({"pers_limit": 0.0}, 4), ({"pers_rate": 0.0}, 5)])
def test_p_or_alpha_zero_is_exactly_fedavg(knob, clients):
    # 5 clients: averaging weights 0.2 are not powers of two, so any difference in rounding
    # between masked and unmasked averaging would show.
    fedavg = Simulation(tiny(algorithm="fedavg", rounds=3, num_clients=clients))
    fedsel = Simulation(tiny(rounds=3, num_clients=clients, **knob))
    for a, b in zip(fedavg.run(), fedsel.run()):
        for ca, cb in zip(a.clients, b.clients):
            assert ((ca.acc_local, ca.acc_global, ca.loss, ca.bytes_up)
                    == (cb.acc_local, cb.acc_global, cb.loss, cb.bytes_up))
            assert cb.personal_fraction == 0.0
    for ca, cb in zip(fedavg.clients, fedsel.clients):
        for name, t in ca.state.items():
            assert torch.equal(t, cb.state[name]), name
    for name, t in fedavg.algorithm.global_state.items():
        assert torch.equal(t, fedsel.algorithm.global_state[name]), name


def test_fedselect_differs_from_fedavg_when_personalizing():
    fedavg = list(Simulation(tiny(algorithm="fedavg", rounds=2)).run())
    fedsel = list(Simulation(tiny(rounds=2)).run())
    assert [c.acc_global for c in fedavg[-1].clients] != [c.acc_global for c in fedsel[-1].clients]


def test_select_all_params_masks_biases_too():
    sim = Simulation(tiny(select_params="all", rounds=1))
    assert set(sim.algorithm.selectable) == set(sim.algorithm.param_names)
    next(sim.run())
    assert any(int(m.sum()) > 0 for n, m in sim.clients[0].mask.items() if n.endswith("bias"))


def reference_mask_update(p, bound, current, previous, mask):
    """The public reference's mask update (lottery_ticket.get_mask_from_delta, invert=True),
    restated with numpy: per tensor, skip it once its personal share exceeds `bound`; else the
    entries whose |Δ| reaches the value at sorted position round((1 - p)·G) of the G global
    entries' |Δ| become personal (ties included)."""
    new = {}
    for name, m in mask.items():
        if m.mean() > bound:
            new[name] = m
            continue
        delta = np.abs(current[name] - previous[name])
        cutoff = np.sort(delta[~m])[int(np.round((1 - p) * (~m).sum()))]
        new[name] = np.where(delta >= cutoff, True, m)
    return new


@pytest.mark.parametrize("p,alpha,every", [(0.5, 0.6, 2), (0.3, 0.5, 1)])
def test_faithful_mode_reproduces_the_reference_masks_round_by_round(p, alpha, every):
    rounds = 6
    sim = Simulation(tiny(fedselect_mode="faithful", mask_every=every, pers_rate=p, pers_limit=alpha, rounds=rounds))
    algo = sim.algorithm

    def numpy(d):
        return {n: t.detach().cpu().numpy().copy() for n, t in d.items() if n in algo.selectable}

    trained = {}  # (round, client) -> state after local training, before the broadcast
    update = algo.local_update

    def recording_update(k, client, data, rnd):
        stats = update(k, client, data, rnd)
        trained[rnd, k] = numpy(client.state)
        return stats

    algo.local_update = recording_update
    # The reference's loop (0-based round r = our round - 1): train with the current mask; at
    # r = every, 2·every, ... the mask grows from Δ against the state of the previous update.
    previous = [numpy(sim.clients[k].state) for k in range(len(sim.clients))]
    masks = [{n: np.zeros(algo.numels[n], bool).reshape(previous[0][n].shape) for n in algo.selectable}
             for _ in sim.clients]
    fractions = []
    results = list(sim.run())
    for rnd in range(1, rounds + 1):
        for k, client in enumerate(sim.clients):
            if (rnd - 1) % every == 0 and rnd > 1:
                masks[k] = reference_mask_update(p, alpha, trained[rnd, k], previous[k], masks[k])
                previous[k] = trained[rnd, k]
        fractions.append(sum(int(m.sum()) for m in masks[0].values()) / sum(algo.numels.values()))
    for k, client in enumerate(sim.clients):  # the masks after the last round are the reference's
        for name in algo.selectable:
            assert np.array_equal(client.mask[name].numpy(), masks[k][name]), (k, name)
    assert [r.clients[0].personal_fraction for r in results] == pytest.approx(fractions)
    assert fractions[0] == 0.0 and fractions[-1] > 0
    if (p, alpha) == (0.5, 0.6):  # 0.5 <= alpha, so each tensor grows once more: past alpha
        assert max(int(m.sum()) / m.size for m in masks[0].values()) > alpha
    assert all(c.bytes_up == 0 for c in results[-1].clients)          # last round: no aggregation
    assert all(c.acc_global == c.acc_local for c in results[-1].clients)
    assert all(c.bytes_up > 0 for c in results[-2].clients)


# ---------------------------------------------------------------------- ablations (Table 3)
@pytest.mark.parametrize("variant", ["personalize_least", "random"])
def test_ablations_follow_the_same_schedule(variant):
    sim = Simulation(tiny(rounds=4, fedselect_variant=variant))
    for result, f in zip(sim.run(), fraction_schedule(0.3, 0.6, 4)):
        for client in sim.clients:
            for name in sim.algorithm.selectable:
                assert int(client.mask[name].sum()) == grow_count(sim.algorithm.numels[name], f), (variant, name)


def test_personalize_least_takes_the_smallest_delta():
    for name, delta, new, still_global, _ in grow_once("personalize_least", k=2):
        if still_global.any():
            assert delta[new].max() <= delta[still_global].min(), name


def test_random_variant_is_seeded_and_differs_from_gradselect():
    masks = {}
    for variant, seed in (("random", 0), ("random", 0), ("random", 1), ("gradselect", 0)):
        sim = Simulation(tiny(rounds=1, fedselect_variant=variant, seed=seed))
        sim.run_round()
        masks.setdefault((variant, seed), []).append(sim.clients[0].mask)
    name = "features.0.weight"
    a, b = masks[("random", 0)]
    assert torch.equal(a[name], b[name])
    assert not torch.equal(a[name], masks[("random", 1)][0][name])
    assert not torch.equal(a[name], masks[("gradselect", 0)][0][name])


@pytest.mark.parametrize("block,prefixes", [("A", ("features.0.",)), ("C", ("fc.",)), ("D", ("head.",))])
def test_layer_ablation_personalizes_exactly_one_block(block, prefixes):
    sim = Simulation(tiny(rounds=3, fedselect_variant="layer", layer_block=block))
    list(sim.run())
    algo = sim.algorithm
    for client in sim.clients:
        for name in algo.param_names:
            assert bool(client.mask[name].all()) == name.startswith(prefixes), name
            assert bool(client.mask[name].any()) == name.startswith(prefixes), name
    heads = [c.state[n] for c in sim.clients for n in algo.param_names if n.startswith(prefixes)]
    assert not all(torch.equal(heads[0], h) for h in heads[1:])  # the block is trained, and locally
