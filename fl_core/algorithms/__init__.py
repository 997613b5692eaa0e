"""Algorithm registry: one file per method, each a few hooks on `base.Algorithm`.

Imported lazily by name, so that a method's module is loaded only when a run uses it.
"""
from __future__ import annotations

import importlib

from .base import Algorithm, ClientState

# name -> (module in this package, class)
_IMPLEMENTATIONS = {
    "fedselect": ("fedselect", "FedSelect"),
    "fedavg": ("fedavg", "FedAvg"),
    "local": ("local", "Local"),
    "fedavg_ft": ("fedavg_ft", "FedAvgFT"),
    "fedper": ("fedper", "FedPer"),
    "fedrep": ("fedrep", "FedRep"),
    "fedbabu": ("fedbabu", "FedBABU"),
    "lg_fedavg": ("lg_fedavg", "LGFedAvg"),
    "ditto": ("ditto", "Ditto"),
    "fedpac": ("fedpac", "FedPAC"),
    "lotteryfl": ("lotteryfl", "LotteryFL"),
}


def get_algorithm(name: str) -> type[Algorithm]:
    module, cls = _IMPLEMENTATIONS[name]
    return getattr(importlib.import_module(f"{__name__}.{module}"), cls)


__all__ = ["Algorithm", "ClientState", "get_algorithm"]
