"""Training FLOPs per sample, counted by `torch.utils.flop_counter` (no hand formulas).

`layer_flops(model, input_shape)` runs one forward and backward pass of one sample under
`FlopCounterMode` and returns, per module that owns parameters (its name in the model, e.g.
`features.0`), the FLOPs of its forward and backward operations (convolutions and matrix
products; the counter does not count element-wise work such as BatchNorm or ReLU, and neither do
the sparse-training papers). The backward of the first layer has no input gradient, as in real
training.

`sparse_flops(per_layer, densities)` scales each layer by the density of its weight (a layer with
half its weights active does half the multiply-adds): the convention of RigL and of DisPFL's
authors (`count_training_flops_per_sample`), with the per-layer dense counts from the counter.
"""
from __future__ import annotations

from collections.abc import Mapping

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
