"""BatchNorm with a β-mix of pretrained and client statistics (FedL2P, Eq. 2).

Under `bn_mixing(model, betas, ...)` every BatchNorm layer b of `model` normalises its input x with

    μ̂ = (1−β_b)·μ_pt + β_b·μ_client,   σ̂² = (1−β_b)·σ²_pt + β_b·σ²_client     (per channel)
    y  = (x − μ̂) / sqrt(σ̂² + ε) · γ + δ

where (μ_pt, σ²_pt) are the layer's running buffers, read at call time, so
`torch.func.functional_call(model, (params, buffers), ...)` supplies them (and γ, δ) as usual.
β = 0 is "BN G" (pretrained statistics, what `model.eval()` does), β = 1 "BN C" (client
statistics). The result is differentiable in β (a meta-net output), in γ, δ and in the input.

Where the client statistics come from (`source`):
- "client" (default): fixed per-channel statistics given in `client_stats` ({layer name:
  (mean, var)}), normally `client_bn_stats(model, x_train)`: one no-grad forward pass of the
  client's training set through the pretrained model in eval mode (so the layers above b use
  pretrained statistics), mean and biased variance over the batch and spatial dimensions. This is
  the pass the authors' code uses for BNNet's KL input; their KLD layer instead mixes the
  incoming batch's statistics during fine-tuning and, at evaluation, running estimates of them
  collected during fine-tuning. Statistics of the whole local set are the stable, deterministic
  stand-in for both (and identical for training and evaluation).
- "batch": the statistics of the incoming batch (biased variance, gradients flowing through them
  as in train-mode BN), whatever the module's train/eval mode; with β = 1 this is "FT (BN I)"
  (FedBABU's incoming-batch statistics, no running statistics).

The mixing forward ignores `module.training` and never updates running buffers: the pretrained
statistics stay fixed while fine-tuning (`functional_sgd`'s buffer copies are returned unchanged).
"""
from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping, Sequence

import torch
from torch import Tensor, nn

BNStats = dict[str, tuple[Tensor, Tensor]]

_SOURCES = ("client", "batch")


def bn_layers(model: nn.Module) -> list[tuple[str, nn.modules.batchnorm._BatchNorm]]:
    """The model's BatchNorm layers as (name, module) in registration order (`named_modules`): the
    order of β and of `bn_kl_features`. For the small sequential CNNs it is the forward order."""
    return [(n, m) for n, m in model.named_modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]


def _channel_shape(x: Tensor) -> list[int]:
    shape = [1] * x.dim()
    shape[1] = x.shape[1]
    return shape


def _reduce_dims(x: Tensor) -> list[int]:
    return [d for d in range(x.dim()) if d != 1]


def run_with_input_hooks(model: nn.Module, layers: Sequence[tuple[str, nn.Module]], hook_for, x: Tensor,
                         batch_size: int | None) -> None:
    """One pass of `x` (in chunks of `batch_size`) through `model` in eval mode with a forward
    pre-hook `hook_for(name)` on each named layer; the mode and the hooks are restored after."""
    handles = [m.register_forward_pre_hook(hook_for(n)) for n, m in layers]
    was_training = model.training
    model.eval()
    try:
        step = x.shape[0] if batch_size is None else batch_size
        for start in range(0, x.shape[0], step):
            model(x[start:start + step])
    finally:
        model.train(was_training)
        for h in handles:
            h.remove()


@torch.no_grad()
def client_bn_stats(model: nn.Module, x: Tensor, batch_size: int | None = None, unbiased: bool = False) -> BNStats:
    """Per-channel (mean, biased variance) of every BatchNorm layer's input over all of `x`: one
    forward pass of the pretrained model in eval mode (no grad; the mode is restored after),
    optionally in chunks of `batch_size` pooled exactly (float64 sums). `unbiased`: the variance
    with Bessel's correction (times n/(n−1), n the elements per channel), as the authors' KL
    features use it (`metanets.bn_kl_features`); the mixing itself normalises with the biased one,
    as BatchNorm does."""
    layers = bn_layers(model)
    sums: dict[str, list[Tensor | float]] = {}

    def hook_for(name: str):
        def hook(_module, inputs):
            inp = inputs[0].detach().double()
            dims = _reduce_dims(inp)
            count = inp.numel() / inp.shape[1]
            s, ss = inp.sum(dims), (inp * inp).sum(dims)
            if name in sums:
                acc = sums[name]
                acc[0], acc[1], acc[2] = acc[0] + s, acc[1] + ss, acc[2] + count
            else:
                sums[name] = [s, ss, count]
        return hook

    run_with_input_hooks(model, layers, hook_for, x, batch_size)
    out: BNStats = {}
    for name, module in layers:
        if name not in sums:
            raise RuntimeError(f"BatchNorm layer {name!r} was not reached by the forward pass")
        s, ss, count = sums[name]
        mean = s / count
        var = (ss / count - mean * mean).clamp_min(0.0)
        if unbiased:
            var = var * count / max(count - 1, 1)
        dtype = module.running_mean.dtype if module.running_mean is not None else x.dtype
        out[name] = (mean.to(dtype), var.to(dtype))
    return out


def _betas_by_layer(names: Sequence[str], betas: Tensor | float | Sequence[float] | Mapping[str, Tensor | float],
                    ) -> dict[str, Tensor | float]:
    if isinstance(betas, Mapping):
        missing = [n for n in names if n not in betas]
        if missing:
            raise ValueError(f"no β for BatchNorm layer(s): {', '.join(missing)}")
        return {n: betas[n] for n in names}
    if isinstance(betas, (int, float)):
        return {n: float(betas) for n in names}
    if not isinstance(betas, Tensor):
        betas = torch.as_tensor(betas, dtype=torch.get_default_dtype())
    if betas.dim() == 0 or betas.numel() == 1:
        return {n: betas.reshape(()) for n in names}
    flat = betas.reshape(-1)
    if flat.numel() != len(names):
        raise ValueError(f"{flat.numel()} β values for {len(names)} BatchNorm layers")
    return {n: flat[i] for i, n in enumerate(names)}


def _mixing_forward(module: nn.modules.batchnorm._BatchNorm, beta: Tensor | float, source: str,
                    stats: tuple[Tensor, Tensor] | None):
    def forward(x: Tensor) -> Tensor:
        if module.running_mean is None or module.running_var is None:
            raise RuntimeError("BN mixing needs pretrained running statistics (track_running_stats=True)")
        if source == "batch":
            dims = _reduce_dims(x)
            c_mean = x.mean(dims)
            c_var = x.var(dims, unbiased=False)
        else:
            c_mean, c_var = stats
        mean = (1 - beta) * module.running_mean + beta * c_mean
        var = (1 - beta) * module.running_var + beta * c_var
        shape = _channel_shape(x)
        y = (x - mean.reshape(shape)) / torch.sqrt(var.reshape(shape) + module.eps)
        if module.weight is not None:
            y = y * module.weight.reshape(shape)
        if module.bias is not None:
            y = y + module.bias.reshape(shape)
        return y
    return forward


@contextlib.contextmanager
def bn_mixing(model: nn.Module, betas: Tensor | float | Sequence[float] | Mapping[str, Tensor | float],
              client_stats: Mapping[str, tuple[Tensor, Tensor]] | None = None, source: str = "client",
              ) -> Iterator[nn.Module]:
    """Within the block, every BatchNorm layer of `model` normalises with the β-mixed statistics
    (module docstring). `betas`: one value per layer in `bn_layers` order (a tensor [B], possibly
    a BNNet output with grad), a single value for all, or {layer name: β}. `client_stats`:
    {layer name: (mean, var)} for `source="client"` (e.g. `client_bn_stats`); unused for
    `source="batch"`. The original forwards are restored on exit, also on error. Yields `model`.
    """
    if source not in _SOURCES:
        raise ValueError(f"unknown BN statistics source {source!r}; choose from {', '.join(_SOURCES)}")
    layers = bn_layers(model)
    by_layer = _betas_by_layer([n for n, _ in layers], betas)
    if source == "client":
        if client_stats is None:
            raise ValueError("source='client' needs client_stats (e.g. client_bn_stats(model, x_train))")
        missing = [n for n, _ in layers if n not in client_stats]
        if missing:
            raise ValueError(f"no client statistics for BatchNorm layer(s): {', '.join(missing)}")
    patched: list[tuple[nn.Module, object]] = []
    try:
        for name, module in layers:
            stats = None if source == "batch" else client_stats[name]
            previous = module.__dict__.get("forward", None)  # an instance-level forward, if any
            module.forward = _mixing_forward(module, by_layer[name], source, stats)
            patched.append((module, previous))
        yield model
    finally:
        for module, previous in reversed(patched):
            if previous is None:
                del module.forward
            else:
                module.forward = previous
