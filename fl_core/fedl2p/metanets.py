"""FedL2P's meta-nets and the client statistics they read (paper §3, Eqs. 3–4; App. E).

- `MetaNet`: Linear(in, 100) → ReLU → Linear(100, 100) → ReLU → Linear(100, out), output clamped to
  [low, high] with a straight-through estimator (the forward value is clamped, the gradient passes
  as if it were not). Weights Xavier-normal with gain 0.1 and every bias a constant, so at start the
  output is about that constant whatever the input (the authors' code; App. E's "3-layer").
- `bnnet(B)`: ξ_1..ξ_B (one KL feature per BN layer) → β ∈ [0, 1]^B, biases 0.5.
- `lrnet(M, T)`: (E(x_0), SD(x_0), …, E(x_{M−1}), SD(x_{M−1})) → one rate per parameter tensor
  (T, by default 2M: a weight and a bias per layer) in [0, 1000], biases 1.0, and a learnable
  post-multiplier η̃ ∈ ℝ^T (initialised to the base learning rate, not constrained positive):
  η = LRNet(stats) ⊙ η̃ (`LRNet.learning_rates`).

Statistics, both from one no-grad forward pass of the client's training set through the
pretrained model in eval mode (pretrained BN statistics everywhere, as the authors' precompute
functions do):
- `layer_input_stats`: the scalar mean and SD of the input of every layer owning parameters
  (conv, linear, BN), in forward order: LRNet's input (`lrnet_input` interleaves them).
- `bn_kl_features`: per BN layer, the channel average of the symmetric KL divergence between the
  Gaussians of the client's per-channel input statistics and of the layer's running statistics:
  BNNet's input.
Both use population (biased) variances by default; the authors' `precompute_kld` and
`precompute_feat_stats` use unbiased ones and take the SD as sqrt(var + 1e-5). With n elements per
statistic (thousands here) that is a relative difference of about 1/n (1e-4 on a 40-image client,
benchmarks/parity/fedl2p.py); `unbiased=True` (and `eps=1e-5` for the SD) gives theirs exactly.
"""
from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import Tensor, nn

from .bn_mixing import bn_layers, client_bn_stats, run_with_input_hooks

HIDDEN = 100
INIT_GAIN = 0.1
BNNET_BIAS, LRNET_BIAS = 0.5, 1.0
BETA_RANGE, LR_RANGE = (0.0, 1.0), (0.0, 1000.0)


def clamp_ste(x: Tensor, low: float, high: float) -> Tensor:
    """clamp(x, low, high) in the forward pass, identity in the backward pass (gradient 1 even
    where x is outside the range). Written as x + (clamp(x) − x).detach(), so it is differentiable
    to any order (double backward for the hypergradient needs no custom autograd.Function)."""
    return x + (x.clamp(low, high) - x).detach()


class MetaNet(nn.Module):
    """Three Linear layers (in → hidden → hidden → out) with ReLUs; output STE-clamped to [low, high]."""

    def __init__(self, in_features: int, out_features: int, *, low: float, high: float, bias_init: float,
                 hidden: int = HIDDEN, gain: float = INIT_GAIN):
        super().__init__()
        if in_features < 1 or out_features < 1:
            raise ValueError(f"meta-net sizes must be positive (in={in_features}, out={out_features})")
        if not low < high:
            raise ValueError(f"empty output range [{low}, {high}]")
        self.low, self.high = float(low), float(high)
        self.net = nn.Sequential(nn.Linear(in_features, hidden), nn.ReLU(),
                                 nn.Linear(hidden, hidden), nn.ReLU(),
                                 nn.Linear(hidden, out_features))
        for layer in self.net:
            if isinstance(layer, nn.Linear):
                nn.init.xavier_normal_(layer.weight, gain=gain)
                nn.init.constant_(layer.bias, bias_init)

    @property
    def in_features(self) -> int:
        return self.net[0].in_features

    @property
    def out_features(self) -> int:
        return self.net[-1].out_features

    def forward(self, features: Tensor) -> Tensor:
        return clamp_ste(self.net(features), self.low, self.high)


class LRNet(MetaNet):
    """A MetaNet with the learnable post-multiplier η̃ (`post_multiplier`, one entry per output)."""

    def __init__(self, in_features: int, out_features: int, base_lr: float, **kwargs):
        super().__init__(in_features, out_features, **kwargs)
        self.post_multiplier = nn.Parameter(torch.full((out_features,), float(base_lr)))

    def learning_rates(self, features: Tensor) -> Tensor:
        """η = clamp_STE(MLP(features)) ⊙ η̃: one learning rate per parameter tensor."""
        return self(features) * self.post_multiplier


def bnnet(num_bn_layers: int) -> MetaNet:
    """BNNet: B KL features → B mixing coefficients β ∈ [0, 1], biases 0.5."""
    return MetaNet(num_bn_layers, num_bn_layers, low=BETA_RANGE[0], high=BETA_RANGE[1], bias_init=BNNET_BIAS)


def lrnet(num_layers: int, num_tensors: int | None = None, base_lr: float = 0.01) -> LRNet:
    """LRNet: 2·M input statistics (mean, SD per parameter-owning layer) → one rate per parameter
    tensor in [0, 1000] (`num_tensors`, default 2·M), biases 1.0; η̃ starts at `base_lr`."""
    out = 2 * num_layers if num_tensors is None else num_tensors
    return LRNet(2 * num_layers, out, base_lr, low=LR_RANGE[0], high=LR_RANGE[1], bias_init=LRNET_BIAS)


def parameter_layers(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """Modules owning parameters directly (conv, linear, BN, ...), in registration order."""
    return [(n, m) for n, m in model.named_modules() if any(True for _ in m.parameters(recurse=False))]


def parameter_tensor_names(model: nn.Module) -> list[str]:
    """The names of the model's parameter tensors in `named_parameters` order: the order of
    LRNet's outputs (`lrs_by_name`)."""
    return [n for n, _ in model.named_parameters()]


def lrs_by_name(eta: Tensor, names: Sequence[str]) -> dict[str, Tensor]:
    """Split LRNet's output vector into {parameter name: scalar lr} for `functional_sgd`."""
    flat = eta.reshape(-1)
    if flat.numel() != len(names):
        raise ValueError(f"{flat.numel()} learning rates for {len(names)} parameter tensors")
    return {n: flat[i] for i, n in enumerate(names)}


@torch.no_grad()
def layer_input_stats(model: nn.Module, x: Tensor, batch_size: int | None = None, unbiased: bool = False,
                      eps: float = 0.0) -> tuple[Tensor, Tensor]:
    """(means [M], sds [M]): the scalar mean and (population) standard deviation over all elements
    of the input to each of the M parameter-owning layers, in the order the forward pass first
    reaches them. One no-grad pass of `x` in eval mode (the pretrained model with its running BN
    statistics, as the authors' `precompute_feat_stats`; the mode is restored after), optionally
    in chunks of `batch_size`, pooled exactly (float64 sums). A layer called more than once pools
    the elements of all its calls into its one entry. `unbiased` and `eps`: SD = sqrt(unbiased
    variance + eps), the authors' estimator with eps = 1e-5 (module docstring).
    """
    layers = parameter_layers(model)
    order: list[str] = []
    sums: dict[str, list[float]] = {}

    def hook_for(name: str):
        def hook(_module, inputs):
            inp = inputs[0].detach().double()
            if name not in sums:
                order.append(name)
                sums[name] = [0.0, 0.0, 0]
            acc = sums[name]
            acc[0] += inp.sum().item()
            acc[1] += (inp * inp).sum().item()
            acc[2] += inp.numel()
        return hook

    run_with_input_hooks(model, layers, hook_for, x, batch_size)
    if len(order) != len(layers):
        unreached = [n for n, _ in layers if n not in sums]
        raise RuntimeError(f"layer(s) not reached by the forward pass: {', '.join(unreached)}")
    means, sds = [], []
    for name in order:
        s, ss, count = sums[name]
        mean = s / count
        var = max(ss / count - mean * mean, 0.0)
        if unbiased:
            var = var * count / max(count - 1, 1)
        means.append(mean)
        sds.append(math.sqrt(var + eps))
    return torch.tensor(means, dtype=x.dtype), torch.tensor(sds, dtype=x.dtype)


def lrnet_input(means: Tensor, sds: Tensor) -> Tensor:
    """Interleave per-layer statistics into LRNet's input (E(x_0), SD(x_0), E(x_1), SD(x_1), ...)."""
    return torch.stack([means, sds], dim=1).reshape(-1)


def gaussian_kl(mean1: Tensor, var1: Tensor, mean2: Tensor, var2: Tensor) -> Tensor:
    """KL(N(μ1, σ1²) ‖ N(μ2, σ2²)) = log(σ2/σ1) + (σ1² + (μ1 − μ2)²)/(2σ2²) − ½, elementwise."""
    return 0.5 * torch.log(var2 / var1) + (var1 + (mean1 - mean2) ** 2) / (2 * var2) - 0.5


def bn_kl_features(model: nn.Module, x: Tensor, batch_size: int | None = None,
                   client_stats: dict[str, tuple[Tensor, Tensor]] | None = None, unbiased: bool = False) -> Tensor:
    """ξ [B]: for each BatchNorm layer (`bn_layers` order, the order of β), the channel mean of
    ½[KL(P_j‖Q_j) + KL(Q_j‖P_j)] with P_j the client's N(μ_j, σ_j² + ε) (per-channel input mean and
    biased variance over all of `x`, from `client_bn_stats`, unless `client_stats` is given) and
    Q_j the layer's running N(μ_pt,j, σ²_pt,j + ε), ε the layer's eps. (The authors' code lists
    the layers last-first; here they follow the model, matching β.) `unbiased`: the client's variance
    with Bessel's correction, as the authors (module docstring; ignored when `client_stats` is given)."""
    stats = client_bn_stats(model, x, batch_size, unbiased) if client_stats is None else client_stats
    feats = []
    for name, module in bn_layers(model):
        if module.running_mean is None or module.running_var is None:
            raise RuntimeError(f"BatchNorm layer {name!r} has no running statistics")
        c_mean, c_var = stats[name]
        p_mean = module.running_mean.detach()
        p_var = module.running_var.detach() + module.eps
        c_var = c_var + module.eps
        sym = 0.5 * (gaussian_kl(c_mean, c_var, p_mean, p_var) + gaussian_kl(p_mean, p_var, c_mean, c_var))
        feats.append(sym.mean())
    if not feats:
        return torch.zeros(0, dtype=x.dtype)
    return torch.stack(feats).to(x.dtype)
