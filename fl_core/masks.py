"""Masks: the personal/global split of parameters, and the one averaging primitive.

A mask is a `dict[str, BoolTensor]` over the *selectable* tensors: True = personal (the entry
never leaves the client), False = global. Tensors without a mask are global in full.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch
from torch import Tensor

Mask = dict[str, Tensor]
State = dict[str, Tensor]


def masked_average(
    previous: Mapping[str, Tensor],
    states: Sequence[Mapping[str, Tensor]],
    contributes: Sequence[Mapping[str, Tensor] | None],
    weights: Sequence[float],
    names: Sequence[str],
) -> State:
    """Per entry, the weighted mean over the clients that contribute to it.

    `contributes[k][name]` is a bool tensor (True = client k sends this entry); a missing name or
    `None` means client k sends the whole tensor. Where no client contributes, the entry keeps
    its `previous` value. Every method's server step is this function with different masks.
    """
    out: State = {}
    for name in names:
        total = torch.zeros_like(previous[name])
        weight_sum = torch.zeros_like(previous[name])
        for state, contrib, w in zip(states, contributes, weights):
            mask = None if contrib is None else contrib.get(name)
            if mask is None:
                total.add_(state[name], alpha=w)
                weight_sum.add_(w)
            else:
                m = mask.to(total.dtype)
                # value * mask first, then the same `add_(alpha=w)` as the unmasked branch: an
                # all-True mask then rounds exactly like no mask (FedSelect p = 0 == FedAvg).
                total.add_(state[name] * m, alpha=w)
                weight_sum.add_(m, alpha=w)
        out[name] = torch.where(weight_sum > 0, total / weight_sum.clamp_min(1e-30), previous[name])
    return out


def grow_count(numel: int, fraction: float) -> int:
    """Number of personal entries a tensor of `numel` entries has at personal fraction `fraction`."""
    return min(numel, int(round(fraction * numel)))


def select_largest(delta: Tensor, personal: Tensor, count: int, include_ties: bool = False) -> Tensor:
    """Make `count` more entries personal: the still-global ones with the largest |delta|
    (`delta` may be any score; its magnitude ranks the entries).

    Exactly `count` entries are added (fewer only if fewer are global). Ties at the cut-off are
    broken deterministically by flat index (lowest first), so a tensor full of equal deltas grows
    by exactly `count`, not by every tied entry. `include_ties=True` instead takes every entry
    tied at the cut-off, as the public FedSelect code does. Returns the new mask.
    """
    flat_personal = personal.reshape(-1)
    free = int((~flat_personal).sum())
    count = min(count, free)
    if count <= 0:
        return personal.clone()
    scores = delta.reshape(-1).abs().to(torch.float64)
    scores = scores.masked_fill(flat_personal, -1.0)  # |delta| >= 0 > -1: personal entries never win
    n = scores.numel()
    threshold = torch.kthvalue(scores, n - count + 1).values  # the count-th largest score
    if include_ties:
        return (flat_personal | (scores >= threshold)).reshape(personal.shape)
    above = scores > threshold
    missing = count - int(above.sum())
    tied = torch.nonzero(scores == threshold).reshape(-1)[:missing]
    chosen = above
    chosen[tied] = True
    return (flat_personal | chosen).reshape(personal.shape)


def personal_counts(mask: Mapping[str, Tensor]) -> dict[str, int]:
    return {name: int(m.sum()) for name, m in mask.items()}


def personal_fraction(mask: Mapping[str, Tensor], numels: Mapping[str, int]) -> float:
    """Share of all parameter entries (over `numels`, masked or not) that are personal."""
    total = sum(numels.values())
    personal = sum(int(mask[name].sum()) for name in mask)
    return personal / total if total else 0.0


def mask_iou(a: Mapping[str, Tensor], b: Mapping[str, Tensor], names: Sequence[str] | None = None) -> float:
    """Intersection over union of two clients' personal sets (1.0 when both are empty)."""
    names = list(a) if names is None else list(names)
    inter = sum(int((a[n] & b[n]).sum()) for n in names)
    union = sum(int((a[n] | b[n]).sum()) for n in names)
    return inter / union if union else 1.0
