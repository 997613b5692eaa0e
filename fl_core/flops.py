"""Training FLOPs per sample, counted by `torch.utils.flop_counter` (no hand formulas).

`layer_flops(model, input_shape)` runs one forward and backward pass of one sample under
`FlopCounterMode` and returns, per module that owns parameters (its name in the model, e.g.
`features.0`), the FLOPs of its forward and backward operations (convolutions and matrix
products; the counter does not count element-wise work such as BatchNorm or ReLU, and neither do
the sparse-training papers). The backward of the first layer has no input gradient, as in real
training.

`training_flops(model, input_shape, trainable, densities)` separates the forward from the backward
FLOPs of one sample when only some parameters train: autograd computes no weight gradient for a
frozen parameter and no input gradient where nothing before the layer trains, so counting the
real backward pass under `requires_grad` flags is the frozen-layer-aware count (PerFedMask's
backward FLOPs). `densities` scales each module as below (HeteroFL's width-sliced sub-models).

`sparse_flops(per_layer, densities)` scales each layer by the density of its weight (a layer with
half its weights active does half the multiply-adds): the convention of RigL and of DisPFL's
authors (`count_training_flops_per_sample`), with the per-layer dense counts from the counter.
"""
from __future__ import annotations

from collections.abc import Collection, Mapping

import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode


def layer_flops(model: nn.Module, input_shape: tuple[int, ...]) -> dict[str, int]:
    """Forward + backward FLOPs of one sample per parameter-owning module (see the module docstring).
    The model's parameters, buffers and gradients are left as they were."""
    owners = [name for name, m in model.named_modules() if any(True for _ in m.parameters(recurse=False))]
    was_training = model.training
    saved = {n: b.clone() for n, b in model.named_buffers()}
    x = torch.zeros((2, *input_shape), device=next(model.parameters()).device)  # 2: BatchNorm needs > 1 sample
    try:
        model.train()
        with FlopCounterMode(display=False) as counter:
            model(x).sum().backward()
        counts = counter.get_flop_counts()
    finally:
        model.zero_grad(set_to_none=True)
        with torch.no_grad():
            for n, b in model.named_buffers():
                b.copy_(saved[n])
        model.train(was_training)
    root = type(model).__name__
    return {name: sum(counts.get(f"{root}.{name}", {}).values()) // 2 for name in owners}


def sparse_flops(per_layer: Mapping[str, int], densities: Mapping[str, float]) -> float:
    """Σ layer FLOPs × the density of the layer's weight (`densities`: module name -> density;
    a module not listed counts as dense)."""
    return float(sum(flops * densities.get(name, 1.0) for name, flops in per_layer.items()))


def training_flops(model: nn.Module, input_shape: tuple[int, ...], trainable: Collection[str] | None = None,
                   densities: Mapping[str, float] | None = None) -> tuple[float, float]:
    """(forward, backward) FLOPs of one training sample when only the parameters named in
    `trainable` (all if None) get gradients; `densities` (module name -> share of its weight in
    use) scales each module's count. The model is left as it was (see the module docstring)."""
    params = dict(model.named_parameters())
    if trainable is not None and (unknown := set(trainable) - set(params)):
        raise KeyError(f"not parameters of the model: {sorted(unknown)[:5]}")
    flags = {n: p.requires_grad for n, p in params.items()}
    was_training = model.training
    saved = {n: b.clone() for n, b in model.named_buffers()}
    x = torch.zeros((2, *input_shape), device=next(model.parameters()).device)  # 2: BatchNorm needs > 1 sample
    try:
        model.train()
        for n, p in params.items():
            p.requires_grad_(trainable is None or n in trainable)
        with FlopCounterMode(display=False) as forward:
            model(x)
        # Backward FLOPs are attributed to modules only when the forward ran under the same counter.
        with FlopCounterMode(display=False) as both:
            out = model(x).sum()
            if out.requires_grad:
                out.backward()
    finally:
        model.zero_grad(set_to_none=True)
        for n, p in params.items():
            p.requires_grad_(flags[n])
        with torch.no_grad():
            for n, b in model.named_buffers():
                b.copy_(saved[n])
        model.train(was_training)
    fwd, total = _per_module(model, forward.get_flop_counts()), _per_module(model, both.get_flop_counts())
    bwd = {name: total[name] - fwd[name] for name in total}
    scale = densities or {}
    return sparse_flops(fwd, scale), sparse_flops(bwd, scale)


def _per_module(model: nn.Module, counts: Mapping[str, Mapping]) -> dict[str, float]:
    """Per-sample FLOPs by parameter-owning module (the batch holds 2 samples); work outside any
    such module (e.g. a functional op in `forward`) is kept under the key ""."""
    root = type(model).__name__
    owners = [name for name, m in model.named_modules() if name and any(True for _ in m.parameters(recurse=False))]
    out = {name: sum(counts.get(f"{root}.{name}", {}).values()) / 2 for name in owners}
    out[""] = sum(counts.get("Global", {}).values()) / 2 - sum(out.values())
    return out
