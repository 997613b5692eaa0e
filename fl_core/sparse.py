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

from .masks import RADIX_MIN_NUMEL, count_nonzero, flat_nonzero, keep_first, kth_largest_key, select_largest

DISTRIBUTIONS = ("erk", "uniform")
INF_BITS = 0x7F800000  # float32 +inf as an int32; every other non-negative float is below, NaN above


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
        flat[permutation(numel, generator)[:int(densities[name] * numel)]] = True
        masks[name] = flat.reshape(tuple(shape))
    return masks


def permutation(n: int, generator: torch.Generator) -> Tensor:
    """`torch.randperm(n, generator=generator)`: the same permutation and the same generator state
    after it, held as int32 where n fits (torch's shuffle draws the same numbers for any index
    dtype; half the memory to shuffle, about twice as fast for millions of entries)."""
    return torch.randperm(n, generator=generator, dtype=torch.int32 if n < 2**31 else torch.int64)


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
    """A flat bool mask of the `count` smallest entries of the flat, non-negative `scores`
    (magnitudes; +inf allowed, -0.0 not), ties by flat index, lowest first: exactly
    `torch.sort(scores, stable=True).indices[:count]`, found by a selection instead of a sort.
    Needs 0 < count <= len(scores) and NaN-free scores. Large float32 scores are ranked by a radix
    select on their bit patterns (`masks.kth_largest_key`: for non-negative floats, integer order
    is value order), others by `kthvalue`."""
    n = scores.numel()
    if scores.dtype == torch.float32 and n >= RADIX_MIN_NUMEL:
        keys = scores.view(torch.int32)
        kth = kth_largest_key(keys, n - count + 1)  # the count-th smallest
        chosen = keys < kth
        missing = count - count_nonzero(chosen)
        if missing:
            tied = keys == kth
            keep_first(tied, missing)
            chosen |= tied
        return chosen
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
    count = min(count, flat.numel() - count_nonzero(flat))
    if count <= 0:
        return pruned.clone()
    magnitude = weight.detach().reshape(-1).abs()
    if magnitude.dtype == torch.float32:  # masked_fill(flat, inf) by integer ops (see masks.zero_where)
        inf = flat.view(torch.uint8).to(torch.int32)  # from bytes: faster than from bool
        keys = inf.sub(1).bitwise_and_(magnitude.view(torch.int32)).bitwise_or_(inf.mul_(INF_BITS))
        scores, has_nan = keys.view(torch.float32), int(keys.max()) > INF_BITS  # |NaN| is above +inf as an integer
    else:
        scores = magnitude.masked_fill_(flat, math.inf)
        has_nan = bool(torch.isnan(scores).any())
    if has_nan:  # no order for NaN in a selection: the sort places it last
        new = flat.clone()
        new[torch.sort(scores, stable=True).indices[:count]] = True
        return new.reshape(pruned.shape)
    return first_smallest(scores, count).logical_or_(flat).reshape(pruned.shape)


def regrow(pruned: Tensor, count: int, generator: torch.Generator, scores: Tensor | None = None) -> Tensor:
    """Reactivate `count` pruned entries (`pruned`: True = inactive): at random (`scores` None)
    or those with the largest |score| (a dense gradient; ties by flat index). At most the pruned
    entries are regrown. Returns the new mask (True = pruned)."""
    flat = pruned.reshape(-1)
    count = min(count, count_nonzero(flat))
    new = flat.clone()
    if count > 0:
        if scores is None:  # the k-th regrown entry is the randperm's k-th pruned one, in flat order
            candidates = flat_nonzero(flat)
            drawn = permutation(len(candidates), generator)[:count]
            new.index_fill_(0, torch.index_select(candidates, 0, drawn), False)
        else:
            score = scores.detach().reshape(-1)
            if torch.isnan(score).any():  # the sort's order, where NaN ranks first
                ranked = score.abs().to(torch.float64).masked_fill(~flat, -1.0)
                new[torch.sort(ranked, descending=True, stable=True).indices[:count]] = False
            else:  # the active entries play select_largest's "personal" ones: never chosen
                new = select_largest(score, ~flat, count).logical_not_()
    return new.reshape(pruned.shape)


def hamming(a: Mapping[str, Tensor], b: Mapping[str, Tensor]) -> int:
    """Entries where two masks differ, over the tensors of `a`."""
    return sum(count_nonzero(torch.ne(a[n], b[n])) for n in a)
