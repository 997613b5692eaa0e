"""FedSelect's faithful mode against the authors' code, pinned.

The numbers below were measured with benchmarks/parity/fedselect.py against the public reference
github.com/lapisrocks/fedselect at commit 0949f8a50aa5f2efe342e3674573a6468d84a45b, run
unmodified (its `fedselect_algorithm` given our data, our LeNet and our batch orders):

    .venv/bin/python -m benchmarks.parity.fedselect --ref <checkout> --setting tiny --pins

There both runs agreed bit for bit in every parameter of every client in every round. These
tests need no checkout: they rerun our faithful mode on the same tiny setting and compare it
with what the reference produced.
"""
import numpy as np
import pytest
import torch

from fl_core.client_state import PackedMask
from fl_core.config import RunConfig
from fl_core.masks import masked_average
from fl_core.simulation import Simulation

from conftest import tiny

# benchmarks/parity/fedselect.py, SETTINGS["tiny"], seed 0
TINY = dict(algorithm="fedselect", fedselect_mode="faithful", seed=0, threads=1, dataset="synthetic",
            partition="shards", shards_per_client=3, num_clients=5, rounds=5, local_epochs=2, batch_size=16,
            lr=0.05, pers_rate=0.3, pers_limit=0.6, mask_every=1)

# The reference's correct test predictions per round (rows) and client (columns), after local training.
REFERENCE_CORRECT = [[20, 20, 20, 10, 10], [20, 20, 20, 10, 20], [30, 27, 20, 10, 15], [29, 34, 40, 10, 10],
                     [30, 30, 60, 10, 19]]
# The reference's personal masks after the last round, per client: tensor -> [personal entries,
# sum of their flat indices].
REFERENCE_MASKS = [
    {"fc.0.weight": [5046, 19330193], "fc.2.weight": [10080, 50798160], "features.0.weight": [98, 7692],
     "features.3.weight": [1577, 1822729], "head.weight": [552, 224756]},
    {"fc.0.weight": [5046, 19490346], "fc.2.weight": [10080, 50798160], "features.0.weight": [98, 7684],
     "features.3.weight": [1577, 1774635], "head.weight": [552, 238407]},
    {"fc.0.weight": [5048, 19481460], "fc.2.weight": [10080, 50798160], "features.0.weight": [98, 7363],
     "features.3.weight": [1577, 1709760], "head.weight": [552, 227980]},
    {"fc.0.weight": [5047, 19495223], "fc.2.weight": [10080, 50798160], "features.0.weight": [98, 7203],
     "features.3.weight": [1577, 1820848], "head.weight": [552, 233267]},
    {"fc.0.weight": [5048, 19495708], "fc.2.weight": [10080, 50798160], "features.0.weight": [98, 7094],
     "features.3.weight": [1577, 1813856], "head.weight": [552, 232747]},
]


@pytest.mark.pinned_rounding
def test_tiny_faithful_run_reproduces_the_reference():
    """Exact counts after 5 rounds of training: the reproducible mode's bits. (With this CPU's own
    AVX-512 kernels and with ATen unvectorised and oneDNN at SSE4.1 they came out the same in
    2026-11, but nothing promises that for other kernels.)"""
    sim = Simulation(RunConfig(**TINY))
    correct = [[round(c.acc_local * c.n_test) for c in result.clients] for result in sim.run()]
    assert correct == REFERENCE_CORRECT
    masks = []
    for client in sim.clients:  # the last round is not aggregated: its new mask is still held back
        mask = PackedMask.from_dict(client.extra.next_mask)
        masks.append({n: [int(m.sum()), int(m.reshape(-1).nonzero().sum())] for n, m in sorted(mask.items())})
    assert masks == REFERENCE_MASKS


def test_a_share_of_exactly_alpha_already_exceeds_it():
    # Measured: the reference's `_violates_bound` says True for 8 personal of 10 at bound 0.8 (and
    # for 4 of 5, 672 of 840, 800 of 1000): it divides in float32, and float32(0.8) > 0.8.
    sim = Simulation(tiny(fedselect_mode="faithful", pers_limit=0.8, pers_rate=0.25, rounds=1))
    assert type(sim.algorithm).__name__ == "FaithfulFedSelect"  # the mode is its own class
    count = sim.algorithm.growth_count(sim.clients[0])
    for personal, numel in ((8, 10), (4, 5), (672, 840), (800, 1000)):
        mask = torch.zeros(numel, dtype=torch.bool)
        mask[:personal] = True
        assert count("w", mask) == 0
        mask[personal - 1] = False  # one fewer: below α, so it grows by G - round(0.75·G)
        free = numel - personal + 1
        assert count("w", mask) == free - int(np.round(0.75 * free))


def test_faithful_average_is_the_sum_over_the_count():
    # The reference sums each global entry over the clients that hold it global, in client
    # order, and divides by their number. Weights 1 reproduce that to the bit; weights 1/K give
    # the same mean but round differently, and that last-bit difference grew into different
    # masks and accuracies within four rounds of the Fashion-MNIST parity run.
    faithful = Simulation(tiny(fedselect_mode="faithful", num_clients=5, rounds=1))
    default = Simulation(tiny(num_clients=5, rounds=1))
    clients = 10
    weights = faithful.algorithm.aggregation_weights([None] * clients)
    assert weights == [1.0] * clients
    assert default.algorithm.aggregation_weights([None] * clients) == [0.1] * clients
    gen = torch.Generator().manual_seed(0)
    states = [{"w": torch.randn(4000, generator=gen)} for _ in range(clients)]
    personal = [torch.rand(4000, generator=gen) < 0.4 for _ in range(clients)]
    count = sum((~m).float() for m in personal)
    total = states[0]["w"] * (~personal[0]).float()
    for s, m in zip(states[1:], personal[1:]):
        total += s["w"] * (~m).float()
    held = count != 0
    reference = total[held] / count[held]
    previous = {"w": torch.zeros(4000)}
    contributes = [{"w": ~m} for m in personal]
    ours = masked_average(previous, states, contributes, weights, ["w"])["w"]
    assert torch.equal(ours[held], reference)
    tenths = masked_average(previous, states, contributes, [0.1] * clients, ["w"])["w"]
    assert torch.allclose(tenths[held], reference, atol=1e-6)
    assert not torch.equal(tenths[held], reference)
