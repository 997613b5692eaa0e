"""Masks: the personal/global split of parameters, and the one averaging primitive.

A mask is a mapping tensor name -> BoolTensor over the *selectable* tensors: True = personal (the
entry never leaves the client), False = global. Tensors without a mask are global in full. At
rest, a client's mask is a `PackedMask` (one bit per entry, see below); every function here also
takes a plain `dict[str, BoolTensor]`.
"""
from __future__ import annotations

import math
from collections.abc import Iterator, Mapping, MutableMapping, Sequence
from typing import Any

import numpy as np
import torch
from torch import Tensor

Mask = dict[str, Tensor]
State = dict[str, Tensor]

RADIX_MIN_NUMEL = 1 << 16  # below this, kthvalue is faster than two 65536-bin histograms
PACKED_MARK = "__packed_mask__"  # key that tells a `PackedMask.to_dict()` from a plain mask dict
_BIT_WEIGHTS = (128, 64, 32, 16, 8, 4, 2, 1)  # np.packbits order: first entry = most significant bit


def pack_bits(mask: Tensor) -> Tensor:
    """A bool tensor as uint8 bytes, 8 entries per byte in flat order, first entry in the most
    significant bit, zero-padded at the end: byte for byte `np.packbits(mask.reshape(-1))`
    (which does it on CPU, 20x faster than tensor ops; `_pack_torch` on other devices)."""
    flat = mask.reshape(-1)
    flat = flat if flat.dtype == torch.bool else flat != 0
    return torch.from_numpy(np.packbits(flat.numpy())) if flat.device.type == "cpu" else _pack_torch(flat)


def unpack_bits(packed: Tensor, shape: Sequence[int]) -> Tensor:
    """The inverse of `pack_bits`: a fresh bool tensor of `shape`."""
    numel = math.prod(int(s) for s in shape)
    if packed.device.type == "cpu":
        return torch.from_numpy(np.unpackbits(packed.numpy(), count=numel).view(np.bool_)).reshape(tuple(shape))
    return _unpack_torch(packed, numel).reshape(tuple(shape))


def _pack_torch(flat: Tensor) -> Tensor:
    pad = (-flat.numel()) % 8
    bits = (torch.cat([flat, flat.new_zeros(pad)]) if pad else flat).view(torch.uint8).reshape(-1, 8)
    out = bits[:, 0] << 7
    for i in range(1, 8):
        out |= bits[:, i] << (7 - i)
    return out


def _unpack_torch(packed: Tensor, numel: int) -> Tensor:
    weights = torch.tensor(_BIT_WEIGHTS, dtype=torch.uint8, device=packed.device)
    bits = torch.bitwise_and(packed.reshape(-1, 1), weights).ne_(0)  # 0/1 bytes, read as bools
    return bits.view(torch.bool).reshape(-1)[:numel]


def _popcount(packed: Tensor) -> int:
    """Number of set bits in a uint8 tensor, without unpacking it (on CPU)."""
    if packed.device.type == "cpu" and hasattr(np, "bitwise_count"):
        return int(np.bitwise_count(packed.numpy()).sum(dtype=np.int64))
    return int(_unpack_torch(packed, packed.numel() * 8).count_nonzero())


class PackedMask(MutableMapping):
    """A mask stored one bit per entry (1/8 of a bool tensor), used like `dict[str, BoolTensor]`.

    `mask[name]` unpacks a *fresh* bool tensor: writing into it does not change the mask; assign
    instead (`mask[name] = new`), which packs. Iteration order is insertion order, as a dict's.
    Equality compares names, shapes and bits (with another `PackedMask` or a plain mapping).
    `to_dict()` / `from_dict()` give plain tensors, ints and dicts (`torch.load(weights_only=True)`
    safe); the packed bytes are `np.packbits` of the flattened mask, so sinks can write them as is.
    """

    __slots__ = ("_bits", "_shapes")

    def __init__(self, mask: Mapping[str, Tensor] | None = None) -> None:
        self._bits: dict[str, Tensor] = {}
        self._shapes: dict[str, tuple[int, ...]] = {}
        if mask is not None:
            for name, m in mask.items():
                self[name] = m

    # ---------------------------------------------------------------- the mapping
    def __getitem__(self, name: str) -> Tensor:
        return unpack_bits(self._bits[name], self._shapes[name])

    def __setitem__(self, name: str, mask: Tensor) -> None:
        mask = mask if mask.dtype == torch.bool else mask != 0
        self._bits[name] = pack_bits(mask)
        self._shapes[name] = tuple(mask.shape)

    def __delitem__(self, name: str) -> None:
        del self._bits[name], self._shapes[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._bits)

    def __len__(self) -> int:
        return len(self._bits)

    def __contains__(self, name: object) -> bool:
        return name in self._bits

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Mapping) or set(self) != set(other):
            return False
        if isinstance(other, PackedMask):
            return all(self._shapes[n] == other._shapes[n] and torch.equal(b, other._bits[n])
                       for n, b in self._bits.items())
        return all(torch.equal(self[n], torch.as_tensor(other[n]).to(torch.bool)) for n in self)

    __hash__ = None  # mutable

    def __repr__(self) -> str:
        return f"PackedMask({', '.join(f'{n}: {list(s)}' for n, s in self._shapes.items())})"

    # ---------------------------------------------------------------- packed access
    def shape(self, name: str) -> tuple[int, ...]:
        return self._shapes[name]

    def packed(self, name: str) -> Tensor:
        """The stored bytes of one tensor's mask (`np.packbits` layout); do not modify."""
        return self._bits[name]

    def count(self, name: str) -> int:
        """Number of personal (True) entries of one tensor, without unpacking."""
        return _popcount(self._bits[name])

    def copy(self) -> "PackedMask":
        out = PackedMask()
        out._bits = {n: b.clone() for n, b in self._bits.items()}
        out._shapes = dict(self._shapes)
        return out

    def to_dict(self) -> dict[str, Any]:
        return {PACKED_MARK: 1, "bits": dict(self._bits), "shapes": {n: list(s) for n, s in self._shapes.items()}}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "PackedMask":
        """From `to_dict()` output, or from a plain mapping name -> bool tensor (older states)."""
        if PACKED_MARK not in d:
            return cls(d)
        out = cls()
        out._bits = dict(d["bits"])
        out._shapes = {n: tuple(int(v) for v in s) for n, s in d["shapes"].items()}
        return out


def count_true(mask: Mapping[str, Tensor], name: str) -> int:
    """Number of True entries of `mask[name]` (popcount for a `PackedMask`)."""
    return mask.count(name) if isinstance(mask, PackedMask) else int(mask[name].sum())


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
        m = masked = None  # scratch reused across clients (no allocation per client)
        for state, contrib, w in zip(states, contributes, weights):
            mask = None if contrib is None else contrib.get(name)
            if mask is None:
                total.add_(state[name], alpha=w)
                weight_sum.add_(w)
            else:
                if m is None:
                    m, masked = torch.empty_like(total), torch.empty_like(total)
                m.copy_(mask)
                # value * mask first, then the same `add_(alpha=w)` as the unmasked branch: an
                # all-True mask then rounds exactly like no mask (FedSelect p = 0 == FedAvg).
                total.add_(torch.mul(state[name], m, out=masked), alpha=w)
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

    For float32 scores the cut-off is found by a two-level radix select on the scores' bit
    patterns (for non-negative floats, integer order is value order), a few linear passes
    instead of `kthvalue`'s quickselect with an index array, and without float64 copies (|delta| of a float32 is exact, so ranking in float32 is ranking in
    float64). `select_largest_reference` is the plain definition (it serves small tensors and
    other dtypes); both give the same mask, except with NaN scores (diverged training), which
    the radix path ranks highest and the reference never selects.
    """
    flat_personal = personal.reshape(-1)
    free = flat_personal.numel() - _count_nonzero(flat_personal)
    count = min(count, free)
    if count <= 0:
        return personal.clone()
    if count == free:  # every global entry becomes personal
        return torch.ones_like(personal, dtype=torch.bool)
    if delta.dtype != torch.float32 or delta.numel() < RADIX_MIN_NUMEL:
        return select_largest_reference(delta, personal, count, include_ties)
    # Personal entries score 0, the lowest |delta|: as count <= free, the count-th largest score
    # is the same as among the global entries alone; only ties at 0 need them excluded.
    keys = delta.detach().reshape(-1).abs().masked_fill_(flat_personal, 0.0).view(torch.int32)
    nonzero = _count_nonzero(keys)
    if nonzero <= count:  # the cut-off is 0 (often: taps without gradient), no search needed
        chosen = keys > 0
        if nonzero < count:
            free_zero = torch.logical_or(chosen, flat_personal).logical_not_()
            if include_ties:
                chosen |= free_zero
            else:
                _keep_first(free_zero, count - nonzero)
                chosen |= free_zero
    else:
        cut = _kth_largest_key(keys, count)
        chosen = keys >= cut if include_ties else keys > cut
        missing = 0 if include_ties else count - _count_nonzero(chosen)
        if missing:
            tied = keys == cut
            _keep_first(tied, missing)
            chosen |= tied
    return chosen.logical_or_(flat_personal).reshape(personal.shape)


def _count_nonzero(t: Tensor) -> int:
    """Non-zero (True) entries; numpy's counter is several times faster than torch's on CPU."""
    return int(np.count_nonzero(t.numpy())) if t.device.type == "cpu" else int(torch.count_nonzero(t))


def _kth_largest_key(keys: Tensor, k: int) -> int:
    """The k-th largest of non-negative int32 `keys` (1-based): histogram the top 16 bits, then
    the low 16 bits of the keys in the bin holding it."""
    bins = torch.bitwise_right_shift(keys, 16)  # 0 .. 32767, in key order
    high, k = _bin_from_top(torch.bincount(bins, minlength=1 << 15), k)
    low_keys = torch.masked_select(keys, bins == high).bitwise_and_(0xFFFF)
    low, _ = _bin_from_top(torch.bincount(low_keys, minlength=1 << 16), k)
    return (high << 16) | low


def _bin_from_top(counts: Tensor, k: int) -> tuple[int, int]:
    """(bin holding the k-th largest entry, its rank within that bin counted from the top)."""
    at_or_above = np.cumsum(counts.cpu().numpy()[::-1])[::-1]  # entries in this bin or higher ones
    b = int(np.count_nonzero(at_or_above >= k)) - 1
    above = int(at_or_above[b + 1]) if b + 1 < at_or_above.size else 0
    return b, k - above


def _keep_first(flags: Tensor, m: int, block: int = 1 << 16) -> None:
    """Clear all but the first `m` True entries of the flat bool tensor `flags`, in place: count
    block by block up to the block holding the m-th True, search only that block."""
    start, seen = 0, 0
    while True:
        inside = _count_nonzero(flags[start:start + block])
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


def personal_counts(mask: Mapping[str, Tensor]) -> dict[str, int]:
    return {name: count_true(mask, name) for name in mask}


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
