"""Masks: the personal/global split of parameters, and the one averaging primitive.

A mask is a mapping tensor name -> BoolTensor over the *selectable* tensors: True = personal (the
entry never leaves the client), False = global. Tensors without a mask are global in full. At
rest, a client's mask is a `PackedMask` (one bit per entry; fl_core/client_state.py); every
function here also takes a plain `dict[str, BoolTensor]`.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import torch
from torch import Tensor

from .client_state import PackedMask, pack_bits, unpack_bits  # noqa: F401  (mask helpers live here too)

Mask = dict[str, Tensor]
State = dict[str, Tensor]

RADIX_MIN_NUMEL = 1 << 16  # below this, kthvalue is faster than two 65536-bin histograms


def count_true(mask: Mapping[str, Tensor], name: str) -> int:
    """Number of True entries of `mask[name]` (popcount for a `PackedMask`)."""
    return mask.count(name) if isinstance(mask, PackedMask) else int(mask[name].sum())


class Inverted(Mapping):
    """`{name: ~mask[name] for name in mask}`, each inverse made when it is read: what a client
    sends when its mask marks what it keeps. The server reads one tensor at a time per client,
    so a round holds one inverted tensor per client instead of a whole model's worth."""

    __slots__ = ("mask",)

    def __init__(self, mask: Mapping[str, Tensor]) -> None:
        self.mask = mask

    def __getitem__(self, name: str) -> Tensor:
        return ~self.mask[name]

    def __iter__(self):
        return iter(self.mask)

    def __len__(self) -> int:
        return len(self.mask)


def zero_where(values: Tensor, mask: Tensor) -> Tensor:
    """`values.masked_fill(mask, 0.0)` bit for bit (a new tensor). For float32, an integer AND with
    a mask of all-one or all-zero words: masked_fill with an irregular mask is branchy and several
    times slower on CPU."""
    if values.dtype != torch.float32 or values.shape != mask.shape:
        return values.masked_fill(mask, 0.0)
    keep = mask.view(torch.uint8).to(torch.int32).sub_(1)  # -1 (all ones) where kept, 0 where zeroed
    return keep.bitwise_and_(values.view(torch.int32)).view(torch.float32)


def masked_average(
    previous: Mapping[str, Tensor],
    states: Sequence[Mapping[str, Tensor]],
    contributes: Sequence[Mapping[str, Tensor] | None],
    weights: Sequence[float],
    names: Sequence[str],
    zero_outside: bool = False,
) -> State:
    """Per entry, the weighted mean over the clients that contribute to it.

    `contributes[k][name]` is a bool tensor (True = client k sends this entry); a missing name or
    `None` means client k sends the whole tensor. Where no client contributes, the entry keeps
    its `previous` value. Every method's server step is this function with different masks.
    `zero_outside=True` promises that every state is already 0 wherever its mask is False (a
    sparse model, as DisPFL's): the product with the mask is then skipped, with the same result,
    and with equal weights the weight sum comes from a count of contributors (`_counted_average`).
    """
    out: State = {}
    counted = zero_outside and len(set(weights)) == 1 and 0 < len(states) < 256
    for name in names:
        masks = [None if c is None else c.get(name) for c in contributes]
        if counted and all(m is not None for m in masks):
            out[name] = _counted_average(previous[name], [s[name] for s in states], masks, weights[0])
            continue
        total = torch.zeros_like(previous[name])
        weight_sum = torch.zeros_like(previous[name])
        m = masked = None  # scratch reused across clients (no allocation per client)
        for state, mask, w in zip(states, masks, weights):
            if mask is None:
                total.add_(state[name], alpha=w)
                weight_sum.add_(w)
            else:
                if m is None:
                    m, masked = torch.empty_like(total), torch.empty_like(total)
                m.copy_(mask.view(torch.uint8))  # the 0/1 floats of the bool mask, into the scratch buffer
                # value * mask first, then the same `add_(alpha=w)` as the unmasked branch: an
                # all-True mask then rounds exactly like no mask (FedSelect p = 0 == FedAvg).
                total.add_(state[name] if zero_outside else torch.mul(state[name], m, out=masked), alpha=w)
                weight_sum.add_(m, alpha=w)
        out[name] = torch.where(weight_sum > 0, total / weight_sum.clamp_min(1e-30), previous[name])
    return out


def _counted_average(previous: Tensor, values: Sequence[Tensor], masks: Sequence[Tensor], weight: float) -> Tensor:
    """`masked_average` of one tensor for states zero outside their masks, every client masked and
    weighted alike: the per-entry weight sum is `weight` added once per contributing client, so
    it is read from a table of those float sums by the count of contributors (uint8 adds of the
    masks), instead of adding a float copy of every mask. The same roundings, bit for bit."""
    total = torch.zeros_like(previous)
    counts = torch.zeros(previous.shape, dtype=torch.uint8, device=previous.device)
    for value, mask in zip(values, masks):
        total.add_(value, alpha=weight)
        counts.add_(mask.view(torch.uint8))
    one, sums = torch.ones(1, dtype=previous.dtype), [torch.zeros(1, dtype=previous.dtype)]
    for _ in values:  # the weight sum after c contributions, with the add_ of the general path
        sums.append(sums[-1].clone().add_(one, alpha=weight))
    table = torch.cat(sums)
    scaled = torch.arange(len(sums), dtype=torch.uint8).to(previous.dtype).mul_(weight)
    if torch.equal(scaled, table):  # c · w rounds to the sum of c w's for every c here (most group sizes)
        weight_sum = counts.to(previous.dtype).mul_(weight)
    elif previous.device.type == "cpu":  # numpy gathers by uint8 index without an int64 copy
        weight_sum = torch.from_numpy(table.numpy()[counts.numpy()])
    else:
        weight_sum = table.to(previous.device)[counts.long()]
    return torch.where(weight_sum > 0, total / weight_sum.clamp_min(1e-30), previous)


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

    For float32 scores the cut-off is found by a two-level radix select on the scores' bit
    patterns (for non-negative floats, integer order is value order), a few linear passes
    instead of `kthvalue`'s quickselect with an index array, and without float64 copies (|delta| of
    a float32 is exact, so ranking in float32 is ranking in float64). `select_largest_reference` is
    the plain definition (it serves small tensors and other dtypes); both give the same mask, except
    with NaN scores (diverged training), which the radix path ranks highest and the reference never
    selects.
    """
    flat_personal = personal.reshape(-1)
    free = flat_personal.numel() - count_nonzero(flat_personal)
    count = min(count, free)
    if count <= 0:
        return personal.clone()
    if count == free:  # every global entry becomes personal
        return torch.ones_like(personal, dtype=torch.bool)
    if delta.dtype != torch.float32 or delta.numel() < RADIX_MIN_NUMEL:
        return select_largest_reference(delta, personal, count, include_ties)
    # Personal entries score 0, the lowest |delta|: as count <= free, the count-th largest score
    # is the same as among the global entries alone; only ties at 0 need them excluded. |delta|'s
    # bits are delta's with the sign bit cleared, and an integer product with the global flags
    # zeroes the personal ones: half the time of `abs` and `masked_fill_` on a ResNet's tensors.
    keys = delta.detach().reshape(-1).view(torch.int32).bitwise_and(0x7FFFFFFF).mul_(flat_personal.logical_not())
    nonzero = count_nonzero(keys)
    if nonzero <= count:  # the cut-off is 0 (often: taps without gradient), no search needed
        chosen = keys > 0
        if nonzero < count:
            free_zero = torch.logical_or(chosen, flat_personal).logical_not_()
            if include_ties:
                chosen |= free_zero
            else:
                keep_first(free_zero, count - nonzero)
                chosen |= free_zero
    else:
        cut = kth_largest_key(keys, count)
        chosen = keys >= cut if include_ties else keys > cut
        missing = 0 if include_ties else count - count_nonzero(chosen)
        if missing:
            tied = keys == cut
            keep_first(tied, missing)
            chosen |= tied
    return chosen.logical_or_(flat_personal).reshape(personal.shape)


def count_nonzero(t: Tensor) -> int:
    """Non-zero (True) entries; numpy's counter is several times faster than torch's on CPU."""
    return int(np.count_nonzero(t.numpy())) if t.device.type == "cpu" else int(torch.count_nonzero(t))


def flat_nonzero(flags: Tensor) -> Tensor:
    """Flat indices (int64) of the True entries of a flat bool tensor, ascending: what
    `torch.nonzero(flags).reshape(-1)` gives, by numpy on CPU (about ten times faster there)."""
    if flags.device.type == "cpu":
        return torch.from_numpy(np.flatnonzero(flags.numpy()))
    return torch.nonzero(flags).reshape(-1)


def kth_largest_key(keys: Tensor, k: int) -> int:
    """The k-th largest of non-negative int32 `keys` (1-based): histogram the top 16 bits, then
    the low 16 bits of the keys in the bin holding it."""
    bins = torch.bitwise_right_shift(keys, 16)  # 0 .. 32767, in key order
    high, k = _bin_from_top(torch.bincount(bins, minlength=1 << 15), k)
    low_keys = torch.index_select(keys, 0, flat_nonzero(bins == high)).bitwise_and_(0xFFFF)
    low, _ = _bin_from_top(torch.bincount(low_keys, minlength=1 << 16), k)
    return (high << 16) | low


def _bin_from_top(counts: Tensor, k: int) -> tuple[int, int]:
    """(bin holding the k-th largest entry, its rank within that bin counted from the top)."""
    at_or_above = np.cumsum(counts.cpu().numpy()[::-1])[::-1]  # entries in this bin or higher ones
    b = int(np.count_nonzero(at_or_above >= k)) - 1
    above = int(at_or_above[b + 1]) if b + 1 < at_or_above.size else 0
    return b, k - above


def keep_first(flags: Tensor, m: int, block: int = 1 << 16) -> None:
    """Clear all but the first `m` True entries of the flat bool tensor `flags`, in place: count
    block by block up to the block holding the m-th True, search only that block."""
    start, seen = 0, 0
    while True:
        inside = count_nonzero(flags[start:start + block])
        if seen + inside >= m:
            break
        seen += inside
        start += block
    where = flags[start:start + block].nonzero().reshape(-1)
    flags[start + int(where[m - seen - 1]) + 1:] = False


def select_largest_reference(delta: Tensor, personal: Tensor, count: int, include_ties: bool = False) -> Tensor:
    """`select_largest` by its definition (kthvalue over float64 scores): the tests' reference."""
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


def personal_fraction(mask: Mapping[str, Tensor], numels: Mapping[str, int]) -> float:
    """Share of all parameter entries (over `numels`, masked or not) that are personal."""
    total = sum(numels.values())
    personal = sum(count_true(mask, name) for name in mask)
    return personal / total if total else 0.0


def mask_iou(a: Mapping[str, Tensor], b: Mapping[str, Tensor], names: Sequence[str] | None = None) -> float:
    """Intersection over union of two clients' personal sets (1.0 when both are empty)."""
    names = list(a) if names is None else list(names)
    inter = sum(int((a[n] & b[n]).sum()) for n in names)
    union = sum(int((a[n] | b[n]).sum()) for n in names)
    return inter / union if union else 1.0
