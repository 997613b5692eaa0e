"""One client's state between rounds: its model state, its mask (mask-based methods), extras.

The mask is kept bit-packed (`masks.PackedMask`, 1 bit per entry instead of a bool's byte):
with thousands of clients, or ResNet-sized models, masks at rest would otherwise add a quarter
of the model's size to every client. Assigning a plain `dict[str, BoolTensor]` packs it; reading
gives bool tensors, so algorithms use `client.mask` as a dict.
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from torch import Tensor

from .masks import PackedMask
from .training import State


class ClientState:
    """One client: its full model state (parameters and buffers) and, for masked methods, its mask."""

    __slots__ = ("state", "_mask", "extra")

    def __init__(self, state: State, mask: Mapping[str, Tensor] | None = None,
                 extra: dict[str, Any] | None = None) -> None:
        self.state = state
        self.mask = mask
        self.extra = {} if extra is None else extra

    @property
    def mask(self) -> PackedMask | None:
        """None for methods without masks; else name -> bool tensor (True = personal / pruned)."""
        return self._mask

    @mask.setter
    def mask(self, mask: Mapping[str, Tensor] | None) -> None:
        self._mask = mask if mask is None or isinstance(mask, PackedMask) else PackedMask(mask)

    def __repr__(self) -> str:
        return f"ClientState({len(self.state)} tensors, mask={self._mask!r}, extra={sorted(self.extra)})"

    def to_dict(self) -> dict[str, Any]:
        """Plain tensors, ints and dicts (what `torch.save` writes and `weights_only` loads)."""
        return {"state": self.state, "mask": None if self._mask is None else self._mask.to_dict(),
                "extra": self.extra}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "ClientState":
        """From `to_dict()`; also takes the mask as a plain dict of bool tensors (older states)."""
        mask = None if d["mask"] is None else PackedMask.from_dict(d["mask"])
        return cls(state=d["state"], mask=mask, extra=d["extra"])
