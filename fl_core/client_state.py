"""One client's state between rounds: its model state, its mask (mask-based methods), and what
its method keeps besides (`ClientExtras`: a dataclass each method declares beside its knobs).

The mask is kept bit-packed (`PackedMask`, 1 bit per entry instead of a bool's byte): with
thousands of clients, or ResNet-sized models, masks at rest would otherwise add a quarter of the
model's size to every client. Assigning a plain `dict[str, BoolTensor]` packs it; reading gives
bool tensors, so algorithms use `client.mask` as a dict.
"""
from __future__ import annotations

import math
from collections.abc import Iterator, Mapping, MutableMapping, Sequence
from dataclasses import dataclass, fields, replace
from typing import Any

import numpy as np
import torch
from torch import Tensor

from .training import State

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

    `mask[name]` unpacks a bool tensor; assigning (`mask[name] = new`) packs. A tensor handed out
    by a read stays attached until the mask is next used (any read, write, count or save): then
    in-place edits of it (`mask[n].view(-1)[i] = True`) are folded back into the bits and the
    mask lets go of it, so at rest only bits are held; an edit made after that is not seen.
    Iteration order is insertion order, as a dict's. Equality compares names, shapes and bits
    (with another `PackedMask` or a plain mapping). `to_dict()` / `from_dict()` give plain
    tensors, ints and dicts (`torch.load(weights_only=True)` safe); the packed bytes are
    `np.packbits` of the flattened mask, so sinks can write them as they are.
    """

    __slots__ = ("_bits", "_shapes", "_out")

    def __init__(self, mask: Mapping[str, Tensor] | None = None) -> None:
        self._bits: dict[str, Tensor] = {}
        self._shapes: dict[str, tuple[int, ...]] = {}
        self._out: dict[str, Tensor] = {}  # tensors handed out since the last use
        if mask is not None:
            for name, m in mask.items():
                self[name] = m

    def _sync(self) -> None:
        """Fold in-place edits of the tensors handed out by earlier reads back into the bits."""
        if self._out:
            for name, t in self._out.items():
                if name in self._bits:
                    self._bits[name] = pack_bits(t)
            self._out.clear()

    # ---------------------------------------------------------------- the mapping
    def __getitem__(self, name: str) -> Tensor:
        self._sync()
        out = unpack_bits(self._bits[name], self._shapes[name])
        self._out[name] = out
        return out

    def __setitem__(self, name: str, mask: Tensor) -> None:
        self._sync()
        mask = mask if mask.dtype == torch.bool else mask != 0
        self._bits[name] = pack_bits(mask)
        self._shapes[name] = tuple(mask.shape)

    def __delitem__(self, name: str) -> None:
        self._sync()
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
        self._sync()
        if isinstance(other, PackedMask):
            other._sync()
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
        self._sync()
        return self._bits[name]

    def count(self, name: str) -> int:
        """Number of personal (True) entries of one tensor, without unpacking."""
        self._sync()
        return _popcount(self._bits[name])

    def copy(self) -> "PackedMask":
        self._sync()
        out = PackedMask()
        out._bits = {n: b.clone() for n, b in self._bits.items()}
        out._shapes = dict(self._shapes)
        return out

    def to_dict(self) -> dict[str, Any]:
        self._sync()
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


@dataclass(slots=True, eq=False)
class ClientExtras:
    """What a method keeps per client between rounds besides the model state and the mask. A method
    declares a subclass (`Algorithm.Extras`, `@dataclass(slots=True, eq=False)`) with one field
    per item, each None while unset; a name that is not a field is an AttributeError, not a new
    key. A checkpoint holds `to_dict()`: the fields that are set, by name."""

    def to_dict(self) -> dict[str, Any]:
        return {f.name: v for f in fields(self) if (v := getattr(self, f.name)) is not None}

    @classmethod
    def from_dict(cls, saved: Mapping[str, Any]) -> "ClientExtras":
        unknown = sorted(set(saved) - {f.name for f in fields(cls)})
        if unknown:
            raise ValueError(f"a saved client state holds {unknown}, which {cls.__name__} does not declare "
                             f"(fields: {', '.join(f.name for f in fields(cls)) or 'none'})")
        return cls(**saved)

    def copy(self) -> "ClientExtras":
        """A shallow copy: the same values (tensors are shared), its own fields."""
        return replace(self)


@dataclass(slots=True, eq=False)
class PersonalModel(ClientExtras):
    """A second model a client keeps and never sends (Ditto's v_k, pFedMe's θ̃, APFL's v)."""
    personal: State | None = None


class ClientState:
    """One client: its full model state (parameters and buffers), for masked methods its mask, and
    its method's extras (`ClientExtras`)."""

    __slots__ = ("state", "_mask", "extra")

    def __init__(self, state: State, mask: Mapping[str, Tensor] | None = None,
                 extra: ClientExtras | None = None) -> None:
        self.state = state
        self.mask = mask
        self.extra = ClientExtras() if extra is None else extra

    @property
    def mask(self) -> PackedMask | None:
        """None for methods without masks; else name -> bool tensor (True = personal / pruned)."""
        return self._mask

    @mask.setter
    def mask(self, mask: Mapping[str, Tensor] | None) -> None:
        self._mask = mask if mask is None or isinstance(mask, PackedMask) else PackedMask(mask)

    def __repr__(self) -> str:
        return (f"ClientState({len(self.state)} tensors, mask={self._mask!r}, "
                f"extra={sorted(self.extra.to_dict())})")

    def copy(self) -> "ClientState":
        """A shallow copy: the same tensors in its own containers (state dict, mask bits, extras)."""
        return ClientState(state=dict(self.state), mask=None if self._mask is None else self._mask.copy(),
                           extra=self.extra.copy())

    def to_dict(self) -> dict[str, Any]:
        """Plain tensors, ints and dicts (what `torch.save` writes and `weights_only` loads)."""
        return {"state": self.state, "mask": None if self._mask is None else self._mask.to_dict(),
                "extra": self.extra.to_dict()}

    @classmethod
    def from_dict(cls, d: dict[str, Any], extras: type[ClientExtras] = ClientExtras) -> "ClientState":
        """From `to_dict()`, its extras as the method's `extras` class; also takes the mask as a
        plain dict of bool tensors (older states)."""
        mask = None if d["mask"] is None else PackedMask.from_dict(d["mask"])
        return cls(state=d["state"], mask=mask, extra=extras.from_dict(d["extra"]))
