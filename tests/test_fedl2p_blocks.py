"""FedL2P building blocks (fl_core/fedl2p): BN mixing, the meta-nets and their input statistics."""
import copy
import math

import pytest
import torch
from torch import nn
from torch.func import functional_call
from torch.nn import functional as F

from fl_core.fedl2p.bn_mixing import bn_layers, bn_mixing, client_bn_stats
from fl_core.fedl2p.metanets import (LRNet, MetaNet, bn_kl_features, bnnet, clamp_ste, gaussian_kl,
                                     layer_input_stats, lrnet, lrnet_input, lrs_by_name, parameter_layers,
                                     parameter_tensor_names)
from fl_core.functional import functional_sgd
from fl_core.models import build_model


def bn_cnn(seed=0, dtype=torch.float32):
    """lenet_bn at 8x8 with random, non-trivial running statistics and affine parameters."""
    torch.manual_seed(seed)
    model = build_model("lenet_bn", (1, 8, 8), 10).to(dtype)
    with torch.no_grad():
        for _, bn in bn_layers(model):
            bn.running_mean.uniform_(-0.5, 0.5)
            bn.running_var.uniform_(0.5, 2.0)
            bn.weight.uniform_(0.5, 1.5)
            bn.bias.uniform_(-0.3, 0.3)
    return model


def data(n=32, seed=1, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    return (1.5 * torch.randn(n, 1, 8, 8, generator=g) + 0.7).to(dtype), torch.randint(0, 10, (n,), generator=g)


def random_stats(model, seed=2):
    g = torch.Generator().manual_seed(seed)
    return {n: (torch.rand(bn.num_features, generator=g) - 0.5, 0.3 + torch.rand(bn.num_features, generator=g))
            for n, bn in bn_layers(model)}


# ---- BN mixing -------------------------------------------------------------------------------

def test_beta_zero_reproduces_eval_mode_with_pretrained_statistics():
    model, (x, _) = bn_cnn(), data()
    model.eval()
    with torch.no_grad():
        expected = model(x)
    model.train()  # the mixing forward ignores the mode: train mode must not switch to batch stats
    for source, stats in (("client", random_stats(model)), ("batch", None)):
        with torch.no_grad(), bn_mixing(model, torch.zeros(2), stats, source=source):
            got = model(x)
            params, buffers = dict(model.named_parameters()), dict(model.named_buffers())
            got_functional = functional_call(model, (params, buffers), (x,))
        assert torch.allclose(got, expected, atol=1e-6), source
        assert torch.allclose(got_functional, expected, atol=1e-6), source


def test_beta_one_reproduces_client_statistics():
    model, (x, _) = bn_cnn(), data()
    stats = random_stats(model)
    reference = copy.deepcopy(model).eval()
    with torch.no_grad():
        for name, bn in bn_layers(reference):
            bn.running_mean.copy_(stats[name][0])
            bn.running_var.copy_(stats[name][1])
        expected = reference(x)
        with bn_mixing(model, 1.0, stats):
            got = model(x)
    assert torch.allclose(got, expected, atol=1e-6)
    assert not torch.allclose(got, model.eval()(x), atol=1e-3)  # and the pretrained stats differ


def test_beta_one_with_batch_statistics_is_train_mode_bn():
    # FT (BN I): the incoming batch's statistics, like a train-mode BatchNorm (without its running update)
    model, (x, _) = bn_cnn(), data()
    reference = copy.deepcopy(model).train()
    with torch.no_grad():
        expected = reference(x)
        model.eval()
        running_before = {n: b.clone() for n, b in model.named_buffers()}
        with bn_mixing(model, torch.ones(2), source="batch"):
            got = model(x)
    assert torch.allclose(got, expected, atol=1e-5)
    assert all(torch.equal(b, running_before[n]) for n, b in model.named_buffers())


def test_mixed_statistics_hand_computation_for_one_layer():
    bn = nn.BatchNorm1d(3).double()
    with torch.no_grad():
        bn.running_mean.copy_(torch.tensor([0.1, -0.2, 0.3]))
        bn.running_var.copy_(torch.tensor([1.5, 0.7, 2.0]))
        bn.weight.copy_(torch.tensor([1.2, 0.8, -0.5]))
        bn.bias.copy_(torch.tensor([0.05, 0.0, 0.4]))
    model = nn.Sequential(bn)
    c_mean = torch.tensor([1.0, 0.5, -1.0], dtype=torch.float64)
    c_var = torch.tensor([0.2, 3.0, 0.9], dtype=torch.float64)
    x = torch.randn(5, 3, dtype=torch.float64)
    beta = 0.3
    with bn_mixing(model, beta, {"0": (c_mean, c_var)}):
        got = model(x)
    mean = 0.7 * bn.running_mean + 0.3 * c_mean
    var = 0.7 * bn.running_var + 0.3 * c_var
    expected = (x - mean) / torch.sqrt(var + bn.eps) * bn.weight + bn.bias
    assert torch.allclose(got, expected, atol=1e-12)


def test_gradient_wrt_beta_matches_finite_difference():
    model, (x, y) = bn_cnn(dtype=torch.float64), data(dtype=torch.float64)
    stats = {n: (m.double(), v.double()) for n, (m, v) in random_stats(model).items()}
    params, buffers = dict(model.named_parameters()), dict(model.named_buffers())

    def loss(betas):
        with bn_mixing(model, betas, stats):
            return F.cross_entropy(functional_call(model, (params, buffers), (x,)), y)

    betas = torch.tensor([0.3, 0.6], dtype=torch.float64, requires_grad=True)
    (grad,) = torch.autograd.grad(loss(betas), betas)
    h = 1e-6
    with torch.no_grad():
        fd = torch.stack([(loss(betas + h * e) - loss(betas - h * e)) / (2 * h)
                          for e in torch.eye(2, dtype=torch.float64)])
    assert grad.abs().min() > 1e-4
    assert torch.allclose(grad, fd, rtol=1e-5, atol=1e-8)


def test_beta_from_bnnet_gets_a_gradient_through_functional_fine_tuning():
    model, (x, y) = bn_cnn(), data()
    stats = client_bn_stats(model, x)
    net = bnnet(2)
    xi = bn_kl_features(model, x, client_stats=stats)
    params, buffers = dict(model.named_parameters()), dict(model.named_buffers())
    with bn_mixing(model, net(xi), stats):
        tuned, new_buffers = functional_sgd(model, params, buffers, x, y, {n: 0.05 for n in params},
                                            batch_size=16, seed=0, create_graph=True)
        val = F.cross_entropy(functional_call(model, (tuned, new_buffers), (x,)), y)
    val.backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in net.parameters())
    assert all(torch.equal(new_buffers[n], buffers[n]) for n in buffers)  # pretrained stats untouched


def test_bn_mixing_restores_forward_and_validates_arguments():
    model, (x, _) = bn_cnn(), data()
    model.eval()
    with torch.no_grad():
        before = model(x)
    with pytest.raises(RuntimeError, match="boom"):
        with bn_mixing(model, 1.0, random_stats(model)):
            raise RuntimeError("boom")
    assert all("forward" not in bn.__dict__ for _, bn in bn_layers(model))
    with torch.no_grad():
        assert torch.equal(model(x), before)
    with pytest.raises(ValueError, match="3 β values for 2"):
        with bn_mixing(model, torch.zeros(3), source="batch"):
            pass
    with pytest.raises(ValueError, match="client_stats"):
        with bn_mixing(model, 0.5):
            pass
    with pytest.raises(ValueError, match="unknown BN statistics source"):
        with bn_mixing(model, 0.5, source="running"):
            pass


# ---- meta-nets -------------------------------------------------------------------------------

def test_clamp_ste_clamps_forward_and_passes_gradient_one():
    x = torch.tensor([-2.0, 0.5, 3.0], requires_grad=True)
    y = clamp_ste(x, 0.0, 1.0)
    assert torch.equal(y.detach(), torch.tensor([0.0, 0.5, 1.0]))
    (g,) = torch.autograd.grad((y * torch.tensor([1.0, 2.0, 3.0])).sum(), x)
    assert torch.equal(g, torch.tensor([1.0, 2.0, 3.0]))  # identity Jacobian, also outside [0, 1]
    net = MetaNet(3, 2, low=0.0, high=1.0, bias_init=5.0)  # output ≈ 5: clamped to 1 but trainable
    out = net(torch.zeros(3))
    assert torch.equal(out.detach(), torch.ones(2))
    out.sum().backward()
    assert net.net[-1].bias.grad is not None and torch.equal(net.net[-1].bias.grad, torch.ones(2))


def test_metanet_initial_outputs_are_about_the_bias():
    # With zero input the first layer gives the bias b; each later layer adds Σ W·h, whose SD is
    # b·0.1·sqrt(2/(fan_in+fan_out))·sqrt(100) ≈ 0.07·b here: |out − b| < 0.3·b is over 4 SDs.
    torch.manual_seed(0)
    beta = bnnet(4)(torch.zeros(4))
    lr = lrnet(7)(torch.zeros(14))
    assert beta.shape == (4,) and lr.shape == (14,)
    assert (beta - 0.5).abs().max() < 0.15
    assert (lr - 1.0).abs().max() < 0.3
    for net, b in ((bnnet(4), 0.5), (lrnet(7), 1.0)):
        for layer in net.net:
            if isinstance(layer, nn.Linear):
                assert torch.equal(layer.bias, torch.full_like(layer.bias, b))
    assert lrnet(7).net[0].in_features == 14 and lrnet(7, num_tensors=10).out_features == 10


def test_metanet_weights_have_xavier_gain_0_1_spread():
    torch.manual_seed(0)
    net = lrnet(50)  # 100 → 100 → 100 → 100
    for layer in net.net:
        if isinstance(layer, nn.Linear):
            fan_in, fan_out = layer.in_features, layer.out_features
            target = 0.1 * math.sqrt(2.0 / (fan_in + fan_out))
            assert abs(layer.weight.std().item() / target - 1) < 0.05  # 10,000 draws: SE ≈ 0.7%
            assert abs(layer.weight.mean().item()) < 0.05 * target * 3


def test_lrnet_post_multiplier_scales_and_may_go_negative():
    net = lrnet(3, base_lr=0.02)
    assert isinstance(net, LRNet) and net.post_multiplier.requires_grad
    assert torch.equal(net.post_multiplier.detach(), torch.full((6,), 0.02))
    feats = torch.randn(6)
    assert torch.allclose(net.learning_rates(feats), net(feats) * 0.02)
    with torch.no_grad():
        net.post_multiplier[0] = -0.1
    assert net.learning_rates(feats)[0] < 0
    names = [f"p{i}" for i in range(6)]
    lrs = lrs_by_name(net.learning_rates(feats), names)
    assert list(lrs) == names and lrs["p0"] < 0
    with pytest.raises(ValueError):
        lrs_by_name(torch.zeros(5), names)


# ---- statistics ------------------------------------------------------------------------------

def test_bn_kl_features_zero_when_client_matches_pretrained():
    model, (x, _) = bn_cnn(), data()
    with torch.no_grad():
        for name, bn in bn_layers(model):  # layer by layer: an upstream layer's stats change later inputs
            stats = client_bn_stats(model, x)
            bn.running_mean.copy_(stats[name][0])
            bn.running_var.copy_(stats[name][1])
    assert not torch.allclose(stats["features.5"][1], torch.ones(1))  # stats are non-trivial
    xi = bn_kl_features(model, x)
    assert xi.shape == (2,)
    assert xi.abs().max() < 1e-5
    assert (bn_kl_features(bn_cnn(), x) > 1e-3).all()  # and positive for the random running stats


def test_bn_kl_features_match_closed_form_by_hand():
    bn = nn.BatchNorm2d(1)
    with torch.no_grad():
        bn.running_mean.fill_(0.4)
        bn.running_var.fill_(2.0)
    model = nn.Sequential(bn)
    x = torch.tensor([1.0, 2.0, 4.0, -1.0, 0.0, 3.0]).reshape(2, 1, 1, 3)
    m1 = sum([1.0, 2.0, 4.0, -1.0, 0.0, 3.0]) / 6
    v1 = sum((t - m1) ** 2 for t in [1.0, 2.0, 4.0, -1.0, 0.0, 3.0]) / 6 + 1e-5
    m2, v2 = 0.4, 2.0 + 1e-5

    def kl(ma, va, mb, vb):
        return math.log(math.sqrt(vb) / math.sqrt(va)) + (va + (ma - mb) ** 2) / (2 * vb) - 0.5

    expected = 0.5 * (kl(m1, v1, m2, v2) + kl(m2, v2, m1, v1))
    got = bn_kl_features(model, x)
    assert got.shape == (1,) and abs(got.item() - expected) < 1e-5
    one = torch.tensor(1.0)
    assert torch.allclose(gaussian_kl(one * m1, one * v1, one * m2, one * v2), torch.tensor(kl(m1, v1, m2, v2)))


def test_client_bn_stats_pool_chunks_exactly_and_restore_mode():
    model, (x, _) = bn_cnn(), data(n=30)
    model.train()
    whole, chunks = client_bn_stats(model, x), client_bn_stats(model, x, batch_size=7)
    assert model.training
    first = model.features[0](x)  # conv1's output feeds the first BN
    assert torch.allclose(whole["features.1"][0], first.mean((0, 2, 3)), atol=1e-5)
    assert torch.allclose(whole["features.1"][1], first.var((0, 2, 3), unbiased=False), atol=1e-5)
    for name in whole:
        assert torch.allclose(whole[name][0], chunks[name][0], atol=1e-5)
        assert torch.allclose(whole[name][1], chunks[name][1], atol=1e-5)


def test_layer_input_stats_one_entry_per_parameter_layer_in_forward_order():
    model, (x, _) = bn_cnn(), data()
    means, sds = layer_input_stats(model, x)
    names = [n for n, _ in parameter_layers(model)]
    assert names[:4] == ["features.0", "features.1", "features.4", "features.5"]
    assert means.shape == sds.shape == (len(names),) and len(names) == 7
    assert abs(means[0].item() - x.mean().item()) < 1e-5
    assert abs(sds[0].item() - x.std(unbiased=False).item()) < 1e-5
    model.eval()
    with torch.no_grad():
        h = model.features[0](x)  # input to the BN layer, the second entry
    assert abs(means[1].item() - h.mean().item()) < 1e-5 and abs(sds[1].item() - h.std(unbiased=False).item()) < 1e-5
    chunked = layer_input_stats(model, x, batch_size=5)
    assert torch.allclose(chunked[0], means, atol=1e-5) and torch.allclose(chunked[1], sds, atol=1e-5)
    assert torch.equal(lrnet_input(means, sds)[:4], torch.stack([means[0], sds[0], means[1], sds[1]]))
    assert len(parameter_tensor_names(model)) == 14  # a weight and a bias per layer: LRNet's 2M outputs


class Reordered(nn.Module):
    """Registration order (second, first) differs from forward order (first, second)."""

    def __init__(self):
        super().__init__()
        self.second = nn.Linear(4, 2)
        self.first = nn.Linear(3, 4)

    def forward(self, x):
        return self.second(torch.relu(self.first(x)))


def test_layer_input_stats_follow_forward_not_registration_order():
    torch.manual_seed(0)
    model, x = Reordered(), 3.0 + 2.0 * torch.randn(64, 3)
    means, sds = layer_input_stats(model, x)
    assert abs(means[0].item() - x.mean().item()) < 1e-5 and abs(sds[0].item() - x.std(unbiased=False).item()) < 1e-5
    h = torch.relu(model.first(x)).detach()
    assert abs(means[1].item() - h.mean().item()) < 1e-5
