"""One client's state between rounds: its model state, its mask (mask-based methods), extras."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .masks import Mask
from .training import State


@dataclass
class ClientState:
    """One client: its full model state (parameters and buffers) and, for masked methods, its mask."""

    state: State
    mask: Mask | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"state": self.state, "mask": self.mask, "extra": self.extra}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "ClientState":
        return cls(state=d["state"], mask=d["mask"], extra=d["extra"])
