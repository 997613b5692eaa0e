"""Algorithm registry: one file per method, each a few hooks on `base.Algorithm`."""
from __future__ import annotations

from .base import Algorithm, ClientState
from .fedavg import FedAvg
from .fedavg_ft import FedAvgFT
from .fedselect import FedSelect
from .local import Local

REGISTRY: dict[str, type[Algorithm]] = {cls.name: cls for cls in (FedSelect, FedAvg, Local, FedAvgFT)}

__all__ = ["Algorithm", "ClientState", "REGISTRY", "FedAvg", "FedAvgFT", "FedSelect", "Local"]
