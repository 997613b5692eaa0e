"""fl_core/vectorized.py: K clients' local SGD as one batched pass gives, client by client, what K
calls of `LocalTrainer.train_pass` give, with unequal client sizes, momentum, weight decay,
per-client masks and frozen tensors; what must not move is bit-identical; a model it cannot batch
is refused with the reason.

Two tolerances. In float64 the two agree to rounding (elementwise |a - b| <= 1e-12 + 1e-9 |b|):
the same algorithm. In float32 they agree to |a - b| <= 1e-6 + 1e-5 |b| unless rounding puts a
ReLU input on the other side of 0 in one of them (a grouped convolution over a padded batch rounds
otherwise than the loop's convolution of the real batch): that sample's gradient then changes by
its whole size, and the parameters by lr times it (measured: 1.2e-5 in one conv weight of cnn2 on
3x32x32 at lr 0.1, pinned kernels; 3e-17 for the same run in float64), as the loop differs from
itself on 2 threads instead of 1. Whether that happens depends on the kernels' rounding, so the
float32 cases are `pinned_rounding`: they hold with the reproducible mode's kernels, at lr 0.05."""
from __future__ import annotations

import pytest
import torch
from torch import nn

from benchmarks.vectorized_round import table
from fl_core.models import HEAD_PREFIX, RUNNING_STATS_MODELS, build_model
from fl_core.training import LocalTrainer, SGDSettings
from fl_core.vectorized import evaluate_together, train_pass_together, vectorizable

SIZES = (37, 16, 5, 64)    # batch 16: 3 batches (the last of 5), 1 full, 1 short, 4 full
SEEDS = (101, 102, 103, 104)
BATCH = 16
BN_FREE = [m for m in HEAD_PREFIX if m not in RUNNING_STATS_MODELS]
SHAPES = {"lenet": (1, 8, 8), "cnn2": (3, 16, 16)}   # the synthetic source's digits shape; CIFAR's, smaller
LR = 0.05
DTYPES = [pytest.param(torch.float64, id="float64"),
          pytest.param(torch.float32, id="float32", marks=pytest.mark.pinned_rounding)]
TOLERANCE = {torch.float64: dict(rtol=1e-9, atol=1e-12), torch.float32: dict(rtol=1e-5, atol=1e-6)}


def clients(model_name: str, sizes=SIZES, dtype: torch.dtype = torch.float32):
    """A model and, per client, a state of its own (the model's, perturbed) and its samples."""
    torch.manual_seed(0)
    shape = SHAPES.get(model_name, (1, 8, 8))
    model = build_model(model_name, shape, 10).to(dtype)
    protos = torch.randn(10, *shape, dtype=dtype)
    ys = [torch.randint(0, 10, (n,)) for n in sizes]
    xs = [protos[y] + 0.8 * torch.randn(len(y), *shape, dtype=dtype) for y in ys]
    home = model.state_dict()
    states = [{n: t + 0.01 * torch.randn_like(t) if t.is_floating_point() else t.clone() for n, t in home.items()}
              for _ in sizes]
    return model, states, xs, ys


def full(model: nn.Module, count: int = len(SIZES)) -> list[dict]:
    return [{n: None for n, _ in model.named_parameters()} for _ in range(count)]


def loop(model, states, xs, ys, updates, seeds=SEEDS, lr=LR, momentum=0.0, weight_decay=0.0):
    trainer = LocalTrainer(model, SGDSettings(lr=lr, batch_size=BATCH, momentum=momentum, weight_decay=weight_decay))
    return [trainer.train_pass(s, x, y, u, seed) for s, x, y, u, seed in zip(states, xs, ys, updates, seeds)]


def together(model, states, xs, ys, updates, seeds=SEEDS, lr=LR, momentum=0.0, weight_decay=0.0, velocities=None):
    return train_pass_together(model, states, xs, ys, updates, list(seeds), lr=lr, batch_size=BATCH,
                               momentum=momentum, weight_decay=weight_decay, velocities=velocities)


def assert_like_the_loop(reference, result) -> None:
    new, loss_sums, counts = result
    tolerance = TOLERANCE[new[0]["head.weight"].dtype]
    assert counts == [n for _, _, n in reference]
    # loss sums are float32 in both (the loop's accumulator), whatever the model's dtype
    torch.testing.assert_close(loss_sums, torch.stack([loss for _, loss, _ in reference]), **TOLERANCE[torch.float32])
    for k, (state, _, _) in enumerate(reference):
        assert list(new[k]) == list(state)
        for name, t in state.items():
            torch.testing.assert_close(new[k][name], t, **tolerance, msg=lambda m: f"client {k} {name}: {m}")


@pytest.mark.parametrize("model_name", BN_FREE)
@pytest.mark.parametrize("momentum, weight_decay", [(0.0, 0.0), (0.9, 1e-3)])
@pytest.mark.parametrize("dtype", DTYPES)
def test_every_client_ends_where_its_own_pass_ends(model_name, momentum, weight_decay, dtype):
    model, states, xs, ys = clients(model_name, dtype=dtype)
    before = [{n: t.clone() for n, t in s.items()} for s in states]
    settings = dict(momentum=momentum, weight_decay=weight_decay)
    result = together(model, states, xs, ys, full(model), **settings)
    assert_like_the_loop(loop(model, states, xs, ys, full(model), **settings), result)
    for k in range(len(SIZES)):   # the given states are untouched and the new ones are fresh tensors
        assert all(torch.equal(states[k][n], before[k][n]) for n in before[k])
        assert all(result[0][k][n].data_ptr() != states[k][n].data_ptr() for n in states[k])
        assert all(t.untyped_storage().nbytes() == t.numel() * t.element_size() for t in result[0][k].values())
    moved = [max(float((result[0][k][n] - states[k][n]).abs().max()) for n in states[k]) for k in range(len(SIZES))]
    assert min(moved) > 1e-3   # every client trained (the equality above is not between untrained states)


@pytest.mark.parametrize("dtype", DTYPES)
def test_a_client_past_its_last_batch_neither_steps_nor_moves_its_momentum(dtype):
    """Client 1 holds 16 samples (one batch) beside a client of 64 (four): with momentum 0.9 and
    weight decay, a client that went on stepping on its buffer or decaying would end elsewhere. A
    client with no samples comes back bit-identical with loss 0."""
    model, states, xs, ys = clients("lenet", sizes=(64, 16, 0), dtype=dtype)
    settings = dict(momentum=0.9, weight_decay=1e-2, seeds=SEEDS[:3])
    result = together(model, states, xs, ys, full(model, 3), **settings)
    assert_like_the_loop(loop(model, states, xs, ys, full(model, 3), **settings), result)
    assert all(torch.equal(result[0][2][n], states[2][n]) for n in states[2])
    assert float(result[1][2]) == 0.0 and result[2][2] == 0


@pytest.mark.parametrize("dtype", DTYPES)
def test_momentum_carried_over_passes_continues_where_each_client_left_it(dtype):
    """Two passes sharing each client's momentum buffers (`momentum_scope="round"`): a client that
    sat out the last batches of the first pass must start the second from the buffer of its own
    last step, neither decayed nor fed by the batches it did not have."""
    sizes = (64, 16, 0, 37)
    model, states, xs, ys = clients("lenet", sizes=sizes, dtype=dtype)
    settings = dict(momentum=0.9, weight_decay=1e-2)
    mine, theirs = [{} for _ in sizes], [{} for _ in sizes]
    ours, ref = states, states
    for epoch in range(2):
        seeds = [s + 10 * epoch for s in SEEDS]
        reference = [LocalTrainer(model, SGDSettings(lr=LR, batch_size=BATCH, **settings)).train_pass(
            s, x, y, u, seed, velocity=v) for s, x, y, u, seed, v in zip(ref, xs, ys, full(model), seeds, theirs)]
        result = together(model, ours, xs, ys, full(model), seeds=seeds, velocities=mine, **settings)
        assert_like_the_loop(reference, result)
        ours, ref = result[0], [state for state, _, _ in reference]
        for k in range(len(sizes)):
            assert sorted(mine[k]) == sorted(theirs[k]) == sorted(n for n, _ in model.named_parameters())
            for name, v in theirs[k].items():
                torch.testing.assert_close(mine[k][name], v, **TOLERANCE[dtype], msg=lambda m: f"{k} {name}: {m}")
    assert all(float(v.abs().max()) == 0.0 for v in mine[2].values())   # no samples: no momentum
    assert all(float(v.abs().max()) > 0.0 for v in mine[1].values())


@pytest.mark.parametrize("dtype", DTYPES)
def test_per_client_masks_freeze_their_own_entries_bit_for_bit(dtype):
    model, states, xs, ys = clients("lenet", dtype=dtype)
    g = torch.Generator().manual_seed(5)
    updates = full(model)
    shape = states[0]["fc.0.weight"].shape
    for k, update in enumerate(updates):   # half of fc.0.weight frozen, other entries per client
        mask = torch.rand(shape, generator=g) < 0.5
        update["fc.0.weight"] = mask if k % 2 else mask.to(dtype)   # bool and 0/1 float masks alike
    update_head = [dict(u, **{"head.weight": torch.rand(states[0]["head.weight"].shape, generator=g) < 0.5})
                   for u in updates]
    result = together(model, states, xs, ys, update_head, momentum=0.9, weight_decay=1e-3)
    assert_like_the_loop(loop(model, states, xs, ys, update_head, momentum=0.9, weight_decay=1e-3), result)
    for k, update in enumerate(update_head):
        for name in ("fc.0.weight", "head.weight"):
            frozen = ~update[name].bool()
            assert torch.equal(result[0][k][name][frozen], states[k][name][frozen])
            assert (result[0][k][name][~frozen] != states[k][name][~frozen]).float().mean() > 0.9


@pytest.mark.parametrize("dtype", DTYPES)
def test_a_tensor_left_out_of_the_update_comes_back_bit_identical(dtype):
    model, states, xs, ys = clients("cnn2", dtype=dtype)
    updates = [{n: None for n, _ in model.named_parameters() if not n.startswith("features.0.")} for _ in SIZES]
    result = together(model, states, xs, ys, updates, momentum=0.9)
    assert_like_the_loop(loop(model, states, xs, ys, updates, momentum=0.9), result)
    for k in range(len(SIZES)):
        for name in ("features.0.weight", "features.0.bias"):
            assert torch.equal(result[0][k][name], states[k][name])


def test_two_calls_give_the_same_bits():
    model, states, xs, ys = clients("lenet")
    first = together(model, states, xs, ys, full(model), momentum=0.9, weight_decay=1e-3)
    second = together(model, states, xs, ys, full(model), momentum=0.9, weight_decay=1e-3)
    assert torch.equal(first[1], second[1])
    assert all(torch.equal(a[n], b[n]) for a, b in zip(first[0], second[0]) for n in a)


@pytest.mark.parametrize("model_name", ["lenet_bn", "cnn_bn"])
def test_a_batchnorm_model_is_refused_with_the_reason(model_name):
    model, states, xs, ys = clients(model_name)
    reason = vectorizable(model)
    assert reason is not None and type(model).__name__ in reason and "BatchNorm (features.1, " in reason
    with pytest.raises(ValueError, match=f"train_pass_together: {type(model).__name__} has BatchNorm"):
        together(model, states, xs, ys, full(model))


def test_which_registered_models_can_be_batched():
    assert BN_FREE == ["lenet", "cnn2"]
    assert all(vectorizable(build_model(m, (1, 8, 8), 10)) is None for m in BN_FREE)
    assert all("BatchNorm" in vectorizable(build_model(m, (3, 32, 32), 10)) for m in RUNNING_STATS_MODELS)
    dropout = nn.Sequential(nn.Flatten(), nn.Linear(64, 10), nn.Dropout(0.5))
    assert vectorizable(dropout) == ("Sequential has dropout (2): its random draws cannot follow the loop's random "
                                     "stream; such a model trains client by client")
    assert vectorizable(nn.Sequential(nn.Flatten(), nn.Linear(64, 10), nn.Dropout(0.0))) is None
    counted = nn.Sequential(nn.Flatten(), nn.Linear(64, 10))
    counted.register_buffer("steps", torch.zeros(()))
    assert "holds buffers (steps)" in vectorizable(counted)


def test_bad_input_is_one_error_naming_what_differs():
    model, states, xs, ys = clients("lenet")
    with pytest.raises(ValueError, match=r"differ in length \(states 4, xs 4, ys 4, updates 4, seeds 3\)"):
        together(model, states, xs, ys, full(model), seeds=SEEDS[:3])
    updates = full(model)
    del updates[2]["head.bias"]
    with pytest.raises(ValueError, match=r"client 2's update names differ from client 0's: extra \[\], "
                                         r"missing \['head.bias'\]"):
        together(model, states, xs, ys, updates)
    with pytest.raises(ValueError, match=r"client 1's data: x \(16, 1, 8, 8\).*y \(15,\)"):
        together(model, states, xs, [ys[0], ys[1][:15], *ys[2:]], full(model))
    broken = [dict(s) for s in states]
    del broken[3]["head.bias"]
    with pytest.raises(ValueError, match=r"client 3's state does not match the model: missing \['head.bias'\]"):
        together(model, broken, xs, ys, full(model))
    updates = full(model)
    updates[1]["head.bias"] = torch.ones(3, dtype=torch.bool)
    with pytest.raises(ValueError, match=r"client 1's mask for head.bias has shape \(3,\), the parameter \(10,\)"):
        together(model, states, xs, ys, updates)
    with pytest.raises(ValueError, match="batch_size 0"):
        train_pass_together(model, states, xs, ys, full(model), list(SEEDS), lr=0.1, batch_size=0)


@pytest.mark.parametrize("model_name", ["lenet", "lenet_bn"])
def test_scoring_together_counts_what_the_trainer_counts(model_name):
    model, states, xs, ys = clients(model_name, sizes=(37, 0, 5, 64))
    trainer = LocalTrainer(model, SGDSettings(lr=0.1, batch_size=BATCH))
    trained = [trainer.train_pass(s, x, y, u, seed)[0] for s, x, y, u, seed in zip(states, xs, ys, full(model), SEEDS)]
    expected = [trainer.evaluate(s, x, y) for s, x, y in zip(trained, xs, ys)]
    assert evaluate_together(model, trained, xs, ys, batch_size=16) == expected
    assert sum(expected) > 10   # trained on separable data: the counts are not all zero
    with pytest.raises(ValueError, match=r"states 4, xs 3, ys 4"):
        evaluate_together(model, trained, xs[:3], ys)


def test_the_benchmark_table_has_a_row_per_model_and_thread_count():
    rows = [dict(case="lenet-8x8", threads=1, clients=10, loop=0.5, together=0.25, diff=3e-8, within=10),
            dict(case="cnn2-32x32x3", threads=2, clients=10, loop=3.0, together=4.0, diff=1.2e-3, within=7)]
    lines = table(rows)
    assert lines[0].startswith("| model, input | threads | clients | loop (s) | together (s) | loop / together |")
    assert lines[2] == "| lenet-8x8 | 1 | 10 | 0.500 | 0.250 | 2.00 | 3e-08 | 10 / 10 |"
    assert lines[3] == "| cnn2-32x32x3 | 2 | 10 | 3.000 | 4.000 | 0.75 | 1e-03 | 7 / 10 |"
    assert len(lines) == 4 and all(line.count("|") == lines[0].count("|") for line in lines)
