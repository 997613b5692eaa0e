"""Sparse-training utilities (DisPFL; RigL-style dynamic sparsity): layer densities, random masks,
magnitude pruning at an annealed rate, and regrowth. A mask here marks the **active** entries
(True = the weight exists and is trained) in `random_masks`; pruning and regrowth take and
return the complement, True = pruned, which is what `ClientState.mask` holds for a sparse method
(entries that never leave the client).

Layer densities (`layer_densities`), as the DisPFL authors' `calculate_sparsities`:
  * uniform: every tensor at `density`;
  * ERK (Erdős–Rényi kernel, Evci et al. 2020): tensor i's density ∝ (Σ shape_i / Π shape_i),
    scaled by one ε so that the active entries total `density` × all entries; a tensor whose
    density would exceed 1 is made dense and ε recomputed (so 1-D tensors, biases and BN
    weights, end up dense). Only tensors in `names` are sparsified.
"""
from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import torch
from torch import Tensor

DISTRIBUTIONS = ("erk", "uniform")


def layer_densities(shapes: Mapping[str, Sequence[int]], density: float, distribution: str = "erk") -> dict[str, float]:
    """Per-tensor density whose entry-weighted mean is `density` (see the module docstring)."""
    if distribution not in DISTRIBUTIONS:
        raise ValueError(f"unknown density distribution {distribution!r}; allowed: {', '.join(DISTRIBUTIONS)}")
    if distribution == "uniform" or density >= 1.0:
        return {n: float(min(density, 1.0)) for n in shapes}
    numel = {n: math.prod(s) for n, s in shapes.items()}
    raw = {n: sum(s) / numel[n] for n, s in shapes.items()}
    dense: set[str] = set()
    while True:
        budget = density * sum(numel.values()) - sum(numel[n] for n in dense)
        divisor = sum(raw[n] * numel[n] for n in shapes if n not in dense)
        epsilon = budget / divisor
        over = [n for n in shapes if n not in dense and raw[n] * epsilon > 1.0]
        if not over:
            return {n: 1.0 if n in dense else raw[n] * epsilon for n in shapes}
        top = max(raw[n] for n in over)
        dense.update(n for n in over if raw[n] == top)  # the authors make the largest dense, then retry


def random_masks(shapes: Mapping[str, Sequence[int]], densities: Mapping[str, float],
                 generator: torch.Generator) -> dict[str, Tensor]:
    """A random active mask per tensor with ⌊density × numel⌋ active entries."""
    masks = {}
    for name, shape in shapes.items():
        numel = math.prod(shape)
        flat = torch.zeros(numel, dtype=torch.bool)
        flat[torch.randperm(numel, generator=generator)[:int(densities[name] * numel)]] = True
        masks[name] = flat.reshape(tuple(shape))
    return masks


def anneal_rate(initial: float, rnd: int, rounds: int) -> float:
    """DisPFL's prune rate of round `rnd` (0-based, as the authors' loop): α₀/2 · (1 + cos(rnd·π / rounds))."""
    return initial / 2 * (1 + math.cos(rnd * math.pi / rounds))


def prune_count(rate: float, active: int) -> int:
    """⌈rate · active⌉, DisPFL's entries to prune and regrow in a tensor with `active` live ones.
    A product that is a whole number up to float rounding counts as that number: at rate
    0.125 = α₀/2 · (1 + cos(2π/3)) float64 gives 0.125000…02 · 5000 > 625, and the plain ceiling 626
    (the authors' code, in float32, prunes 625)."""
    return math.ceil(rate * active - 1e-9)


def first_smallest(scores: Tensor, count: int) -> Tensor:
    """A flat bool mask of the `count` smallest entries of the flat `scores`, ties by flat index,
    lowest first: exactly `torch.sort(scores, stable=True).indices[:count]`, found by a selection
    (`kthvalue`, linear time) instead of a sort. Needs 0 < count <= len(scores); NaN-free."""
    kth = torch.kthvalue(scores, count).values
    chosen = scores < kth
    ties = torch.nonzero(scores == kth).reshape(-1)[:count - int(chosen.sum())]
    chosen[ties] = True
    return chosen


def prune_smallest(weight: Tensor, pruned: Tensor, count: int) -> Tensor:
    """Prune `count` more entries: the unpruned ones with the smallest |weight| (`pruned`: True =
    inactive). Exactly `count` (fewer only if fewer are unpruned); ties by flat index, lowest
    first. Returns the new mask (True = pruned). Used by LotteryFL and DisPFL."""
    flat = pruned.reshape(-1)
    count = min(count, int((~flat).sum()))
    if count <= 0:
        return pruned.clone()
    scores = weight.detach().reshape(-1).abs().masked_fill(flat, math.inf)
    if torch.isnan(scores).any():  # no order for NaN in a selection: the sort places it last
        new = flat.clone()
        new[torch.sort(scores, stable=True).indices[:count]] = True
        return new.reshape(pruned.shape)
    return (flat | first_smallest(scores, count)).reshape(pruned.shape)


def regrow(pruned: Tensor, count: int, generator: torch.Generator, scores: Tensor | None = None) -> Tensor:
    """Reactivate `count` pruned entries (`pruned`: True = inactive): at random (`scores` None)
    or those with the largest |score| (a dense gradient; ties by flat index). At most the pruned
    entries are regrown. Returns the new mask (True = pruned)."""
    flat = pruned.reshape(-1)
    count = min(count, int(flat.sum()))
    new = flat.clone()
    if count > 0:
        if scores is None:
            candidates = torch.nonzero(flat).reshape(-1)
            new[candidates[torch.randperm(len(candidates), generator=generator)[:count]]] = False
        else:
            score = scores.detach().reshape(-1).abs().neg().masked_fill(~flat, math.inf)  # largest |score| first
            if torch.isnan(score).any():  # the sort's order, where NaN ranks first
                ranked = scores.detach().reshape(-1).abs().to(torch.float64).masked_fill(~flat, -1.0)
                new[torch.sort(ranked, descending=True, stable=True).indices[:count]] = False
            else:
                new &= ~first_smallest(score, count)
    return new.reshape(pruned.shape)


def hamming(a: Mapping[str, Tensor], b: Mapping[str, Tensor]) -> int:
    """Entries where two masks differ, over the tensors of `a`."""
    return sum(int((a[n] != b[n]).sum()) for n in a)
