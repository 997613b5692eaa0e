"""LocalTrainer: a pass never touches its input state, equals the plain load/train/read loop bit
for bit, takes a per-call learning rate; dense gradients; evaluation of states and predictors."""
import pytest
import torch
from torch import nn
from torch.nn import functional as F

from fl_core.training import LocalTrainer, SGDSettings, load_state, read_state


class SmallNet(nn.Module):
    """A conv, a BatchNorm (buffers that train mode updates) and a linear head."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(1, 4, 3, padding=1)
        self.bn = nn.BatchNorm2d(4)
        self.head = nn.Linear(4 * 4 * 4, 3)

    def forward(self, x):
        return self.head(F.relu(self.bn(self.conv(x))).flatten(1))


def setup(momentum=0.0, weight_decay=0.0, lr=0.1):
    torch.manual_seed(0)
    model = SmallNet()
    trainer = LocalTrainer(model, SGDSettings(lr=lr, batch_size=8, momentum=momentum, weight_decay=weight_decay))
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(30, 1, 4, 4, generator=g), torch.randint(0, 3, (30,), generator=g)
    return trainer, read_state(model), x, y


def plain_pass(state, x, y, update, seed, lr, momentum=0.0, weight_decay=0.0):
    """The definition: load the state into a fresh model, masked SGD over the seeded batch order, read back."""
    model = SmallNet()
    load_state(model, state)
    model.train()
    params = dict(model.named_parameters())
    for n, p in params.items():
        p.requires_grad_(n in update)
    velocity = {n: torch.zeros_like(params[n]) for n in update}
    order = torch.randperm(x.shape[0], generator=torch.Generator().manual_seed(seed))
    for start in range(0, x.shape[0], 8):
        idx = order[start:start + 8]
        for p in params.values():
            p.grad = None
        F.cross_entropy(model(x[idx]), y[idx]).backward()
        with torch.no_grad():
            for n, m in update.items():
                g = params[n].grad + weight_decay * params[n] if weight_decay else params[n].grad
                if momentum:
                    velocity[n] = velocity[n] * momentum + g
                    g = velocity[n].clone()
                if m is not None:
                    g = g * m
                params[n].add_(g, alpha=-lr)
    return read_state(model)


def masks_for(state, names, seed=2):
    g = torch.Generator().manual_seed(seed)
    return {n: (torch.rand(state[n].shape, generator=g) < 0.5).float() for n in names}


@pytest.mark.parametrize("momentum,weight_decay", [(0.0, 0.0), (0.5, 1e-3)])
def test_pass_equals_the_plain_loop_and_leaves_its_input_untouched(momentum, weight_decay):
    trainer, state, x, y = setup(momentum, weight_decay)
    before = {n: t.clone() for n, t in state.items()}
    update = {**masks_for(state, ["conv.weight", "head.weight"]), "bn.weight": None}
    new, loss_sum, n = trainer.train_pass(state, x, y, update, seed=5)
    expected = plain_pass(state, x, y, update, 5, 0.1, momentum, weight_decay)
    assert n == 30 and float(loss_sum) > 0
    assert all(torch.equal(new[k], expected[k]) for k in expected)
    assert all(torch.equal(state[k], before[k]) for k in state)                     # input untouched
    assert all(new[k].untyped_storage().data_ptr() != state[k].untyped_storage().data_ptr() for k in state)
    assert not torch.equal(new["bn.running_mean"], state["bn.running_mean"])      # buffers trained too
    assert torch.equal(new["head.bias"], state["head.bias"])                        # frozen: not in update
    m = update["conv.weight"]
    assert torch.equal(new["conv.weight"][m == 0], state["conv.weight"][m == 0])    # masked-out entries fixed
    # the shared model never aliases a returned state
    model_ptrs = {t.untyped_storage().data_ptr() for t in trainer.model.state_dict().values()}
    assert not model_ptrs & {t.untyped_storage().data_ptr() for t in new.values()}


def test_a_bool_mask_trains_the_same_bits_as_its_float_mask():
    """Methods hand the trainer their bool masks; it multiplies by their 0/1 floats, made per pass."""
    trainer, state, x, y = setup(momentum=0.5, weight_decay=1e-3)
    floats = masks_for(state, ["conv.weight", "head.weight"])
    bools = {n: m.bool() for n, m in floats.items()}
    from_float, _, _ = trainer.train_pass(state, x, y, floats, seed=5)
    from_bool, _, _ = trainer.train_pass(state, x, y, bools, seed=5)
    assert all(torch.equal(from_float[k].view(torch.int32), from_bool[k].view(torch.int32))
               for k in from_float if from_float[k].is_floating_point())
    assert not torch.equal(from_bool["conv.weight"], state["conv.weight"])  # the pass did train


def test_per_call_learning_rate_overrides_the_settings():
    trainer, state, x, y = setup(lr=0.1)
    full = {n: None for n in trainer.params}
    at_03, _, _ = trainer.train_pass(state, x, y, full, seed=3, lr=0.3)
    assert all(torch.equal(at_03[k], t) for k, t in plain_pass(state, x, y, full, 3, 0.3).items())
    default, _, _ = trainer.train_pass(state, x, y, full, seed=3)
    assert all(torch.equal(default[k], t) for k, t in plain_pass(state, x, y, full, 3, 0.1).items())
    assert trainer.sgd.lr == 0.1


def test_pass_rejects_a_state_of_another_shape():
    trainer, state, x, y = setup()
    with pytest.raises(RuntimeError, match="missing keys"):
        trainer.train_pass({k: v for k, v in state.items() if k != "head.bias"}, x, y, {}, seed=0)
    with pytest.raises(RuntimeError, match="size mismatch for head.bias"):
        trainer.train_pass(state | {"head.bias": torch.zeros(5)}, x, y, {}, seed=0)


def test_gradients_are_those_of_the_mean_loss_and_change_nothing():
    trainer, state, x, y = setup()
    before = {n: t.clone() for n, t in state.items()}
    grads = trainer.gradients(state, x, y, names=["conv.weight", "head.bias"])
    model = SmallNet()
    load_state(model, state)
    model.train()
    F.cross_entropy(model(x), y).backward()
    assert set(grads) == {"conv.weight", "head.bias"}
    assert torch.allclose(grads["conv.weight"], model.conv.weight.grad, atol=1e-6)
    assert torch.allclose(grads["head.bias"], model.head.bias.grad, atol=1e-6)
    assert all(torch.equal(state[k], before[k]) for k in state)  # running statistics included
    assert set(trainer.gradients(state, x, y)) == set(trainer.params)
    # in chunks: the same mean-loss gradient (a model without BatchNorm, whose batch statistics differ per chunk)
    lin = LocalTrainer(nn.Linear(16, 3), SGDSettings(lr=0.1, batch_size=8))
    lin_state = read_state(lin.model)
    xs = x.reshape(30, 16)
    whole = lin.gradients(lin_state, xs, y)
    parts = lin.gradients(lin_state, xs, y, batch_size=7)
    assert all(torch.allclose(whole[n], parts[n], atol=1e-6) for n in whole)
    assert all(p.grad is None and p.requires_grad for p in trainer.params.values())


def test_evaluate_takes_a_state_or_a_predictor():
    trainer, state, x, y = setup()
    model = SmallNet()
    load_state(model, state)
    model.eval()
    with torch.no_grad():
        expected = int((model(x).argmax(1) == y).sum())
    assert trainer.evaluate(state, x, y) == expected
    assert trainer.evaluate(state, x, y, batch_size=7) == expected
    assert trainer.evaluate(lambda inputs: model(inputs), x, y) == expected

    def ensemble(inputs):  # any callable x -> logits
        return model(inputs) + 0 * inputs.sum()

    assert trainer.evaluate(ensemble, x, y) == expected
    assert trainer.evaluate(lambda inputs: F.one_hot(y[:inputs.shape[0]], 3).float(), x, y) == 30
    with pytest.raises(TypeError, match="predictor"):
        trainer.evaluate(3, x, y)
    assert trainer.model.training  # back in train mode after evaluating a state


def test_inplace_pass_trains_the_given_tensors_to_the_same_numbers():
    trainer, state, x, y = setup(momentum=0.5)
    update = {**masks_for(state, ["conv.weight"]), "head.weight": None, "bn.weight": None}
    copied, loss_a, _ = trainer.train_pass(state, x, y, update, seed=4)
    mine = {n: t.clone() for n, t in state.items()}
    trained, loss_b, _ = trainer.train_pass(mine, x, y, update, seed=4, inplace=True)
    assert torch.equal(loss_a, loss_b)
    assert all(torch.equal(trained[n], copied[n]) for n in copied)
    assert all(trained[n] is mine[n] for n in mine)  # the given tensors, trained in place


def test_a_loss_calling_back_into_the_trainer_is_refused_and_leaves_the_model_usable():
    trainer, state, x, y = setup()

    def reentrant(model, xb, yb):
        trainer.evaluate(state, xb, yb)
        return F.cross_entropy(model(xb), yb)

    with pytest.raises(RuntimeError, match="already running"):
        trainer.train_pass(state, x, y, {n: None for n in trainer.params}, seed=0, loss_fn=reentrant)
    new, _, _ = trainer.train_pass(state, x, y, {n: None for n in trainer.params}, seed=0)
    assert all(torch.equal(new[k], t)
               for k, t in plain_pass(state, x, y, {n: None for n in trainer.params}, 0, 0.1).items())


def test_passes_sharing_a_velocity_dict_are_one_torch_sgd_run_and_separate_passes_are_not():
    """momentum_scope="round": two epochs continue one momentum buffer, as one torch.optim.SGD
    made for the round; without the dict each epoch restarts it (the engine's default)."""
    trainer, state, x, y = setup(momentum=0.9, weight_decay=5e-4)
    full = {n: None for n in trainer.params}
    shared: dict = {}
    carried = state
    for seed in (5, 6):
        carried, _, _ = trainer.train_pass(carried, x, y, full, seed=seed, velocity=shared)
    assert set(shared) == set(trainer.params)

    model = SmallNet()
    load_state(model, state)
    model.train()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=5e-4)
    for seed in (5, 6):
        order = torch.randperm(30, generator=torch.Generator().manual_seed(seed))
        for start in range(0, 30, 8):
            idx = order[start:start + 8]
            opt.zero_grad()
            F.cross_entropy(model(x[idx]), y[idx]).backward()
            opt.step()
    expected = read_state(model)
    assert all(torch.allclose(carried[k], expected[k], atol=1e-6, rtol=0) for k in expected)

    restarted = state
    for seed in (5, 6):
        restarted, _, _ = trainer.train_pass(restarted, x, y, full, seed=seed)
    assert (carried["head.weight"] - restarted["head.weight"]).abs().max() > 1e-3


def test_a_conv_model_is_scored_by_its_channels_last_copy_refilled_from_each_state():
    """evaluate runs a channels-last copy of the model whose values come from the scored state:
    the same counts as the shared model's forward, a second state's own values (nothing stale), the
    shared model in its own format, and a state of another shape refused."""
    trainer, state, x, y = setup()
    other = {k: (t * -1.0 if t.is_floating_point() else t) for k, t in state.items()}
    model = trainer.model

    def plain_count(s):
        load_state(model, s)
        model.eval()
        with torch.no_grad():
            return int((model(x).argmax(1) == y).sum())

    counts = [trainer.evaluate(s, x, y, batch_size=7) for s in (state, other, state)]
    expected = [plain_count(s) for s in (state, other)]
    assert counts == [expected[0], expected[1], expected[0]] and expected[0] != expected[1]
    scorer = trainer.scoring_model()
    assert scorer is not None and not scorer.training
    assert scorer.conv.weight.is_contiguous(memory_format=torch.channels_last)
    assert trainer.model.conv.weight.is_contiguous()  # the shared model keeps its format
    with pytest.raises(RuntimeError, match=r"size mismatch for head.bias"):
        trainer.evaluate(state | {"head.bias": torch.zeros(1)}, x, y)
