"""The registry of methods: the single list of what `algorithm` may name.

Each method lives in one file: its class (hooks on `base.Algorithm`) and its own knobs (a
`MethodParams` dataclass, the class's `Params`), in this package, except FedL2P and L2P, which
live beside their building blocks in `fl_core.fedl2p` (`algorithm.py`, `l2p.py`). A module is
imported only when a run (or a CLI, or a config check) needs that method, and this file imports
no torch, so that `fl_core.config` can list the methods cheaply.

A method outside this package is named `package.module:Class` wherever `algorithm` is given (a
run, a study's [[methods]]): the module must be importable where the run happens (installed, or
on PYTHONPATH, also for Ray's workers), and the class a subclass of `base.Algorithm`
(docs/writing-a-method.md has a complete one).
"""
from __future__ import annotations

import importlib

from ..knobs import MethodParams, knob_fields

# name -> (module in this package, or a full module path, class). Order = the order of tables and --help.
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
    "fedbn": ("fedbn", "FedBN"),
    "dispfl": ("dispfl", "DisPFL"),
    "dpsgd": ("dpsgd", "DPSGD"),
    "fedprox": ("fedprox", "FedProx"),
    "fednova": ("fednova", "FedNova"),
    "heterofl": ("heterofl", "HeteroFL"),
    "splitmix": ("splitmix", "SplitMix"),
    "perfedmask": ("perfedmask", "PerFedMask"),
    "ft": ("ft", "FineTune"),
    "l2p": ("fl_core.fedl2p.l2p", "L2P"),
    "fedl2p": ("fl_core.fedl2p.algorithm", "FedL2P"),
    "perfedavg_fo": ("perfedavg", "PerFedAvgFO"),
    "perfedavg_hf": ("perfedavg", "PerFedAvgHF"),
    "pfedme": ("pfedme", "PFedMe"),
    "apfl": ("apfl", "APFL"),
    "fedfomo": ("fedfomo", "FedFomo"),
    "pfedhn": ("pfedhn", "PFedHN"),
    "fedrod": ("fedrod", "FedRoD"),
    "fedala": ("fedala", "FedALA"),
    "scaffold": ("scaffold", "SCAFFOLD"),
    "moon": ("moon", "MOON"),
}
ALGORITHMS = tuple(_IMPLEMENTATIONS)


def is_external(name: object) -> bool:
    """Whether `name` has the form of a method outside the registry, `package.module:Class`."""
    module, sep, cls = str(name).partition(":")
    return bool(sep) and all(part.isidentifier() for part in module.split(".")) and cls.isidentifier()


def is_algorithm(name: object) -> bool:
    """A registered method's name, or an external one's `package.module:Class`."""
    return name in _IMPLEMENTATIONS or is_external(name)


def get_algorithm(name: str) -> type:
    """The class of the method `name` (a `base.Algorithm`), its module imported on first use."""
    if is_external(name):
        return _external(name)
    if name not in _IMPLEMENTATIONS:
        raise KeyError(f"unknown algorithm {name!r}; registered: {', '.join(ALGORITHMS)} (or package.module:Class)")
    module, cls = _IMPLEMENTATIONS[name]
    return getattr(importlib.import_module(module if "." in module else f"{__name__}.{module}"), cls)


def _external(name: str) -> type:
    module, _, cls = name.partition(":")
    try:
        found = getattr(importlib.import_module(module), cls)
    except (ImportError, AttributeError) as err:
        raise KeyError(f"algorithm {name!r}: cannot import {cls} from {module} ({err}); the module must be "
                       f"importable where runs happen (installed, or on PYTHONPATH)") from None
    # an Algorithm subclass, told by its bases' names: importing base here would close an import cycle
    if not (isinstance(found, type) and any(f"{c.__module__}.{c.__qualname__}" == f"{__name__}.base.Algorithm"
                                             for c in found.__mro__)):
        raise KeyError(f"algorithm {name!r}: {cls} is not a subclass of fl_core.algorithms.base.Algorithm")
    return found


# What a reader of the results needs to know of each row's method, written into every row
# (`fl_core.results.config_columns`) so that analysis reads it from the files, never from here:
# the model its accuracy measures (in words), whether its rounds go through a server (its busiest
# node is then the server), whether it exchanges models at all, and the names of its own knobs
# (space-separated, in declaration order): a reader tells a configuration from a seed by them,
# for a method outside the registry as for one in it (`fl_core.results.knob_columns`).
METHOD_FACTS = ("evaluated_model", "has_server", "communicates", "method_knobs")


def method_facts(name: str) -> dict[str, object]:
    """The `METHOD_FACTS` columns of the method `name` (KeyError: unknown, or not importable here)."""
    cls = get_algorithm(name)
    return {"evaluated_model": cls.evaluated_model(), "has_server": bool(cls.has_server()),
            "communicates": bool(cls.communicates), "method_knobs": " ".join(f.name for f in knob_fields(cls.Params))}


def params_class(name: str) -> type[MethodParams]:
    """The dataclass of a method's own knobs (defaults, help, validation)."""
    return get_algorithm(name).Params


__all__ = ["ALGORITHMS", "METHOD_FACTS", "get_algorithm", "is_algorithm", "is_external", "method_facts", "params_class"]
