"""RunConfig: every knob of one federated run, validated before any work starts.

A run's knobs are the *common* knobs below (data, model, schedule, optimiser, resources) plus the
chosen method's *own* knobs, declared beside the method in its algorithm file (e.g. FedSelect's
`pers_rate` in fl_core/algorithms/fedselect.py) and held in `config.method`. The flat view
(`to_dict`, `from_dict`, keyword arguments) uses the project's knob names everywhere; they
are the CLI flags (with dashes), the Parquet columns and the MLflow params.

    RunConfig(algorithm="fedselect", pers_rate=0.25)       # method knobs as keywords
    config.pers_rate                                       # read through to config.method
    RunConfig(algorithm="fedavg", pers_rate=0.25)          # ConfigError: a fedselect knob

The config hash covers the common knobs and the chosen method's knobs only, so adding a knob to
one method, or a new method, never changes the hash of another method's runs.
"""
from __future__ import annotations

import functools
import hashlib
import json
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from .algorithms import ALGORITHMS, get_algorithm, is_algorithm, is_external, method_facts, params_class
from .data.catalog import DOMAINNET_CLASSES, OPTIONS, SOURCES, check_clients, check_options, parse_corruptions
from .data.sources import DataError
from .models import RUNNING_STATS_MODELS, WIDTH_MODELS
from .knobs import (ConfigError, MethodParams, Space, add_knob_arguments, base_type, check_fields, did_you_mean, knob,
                    knob_fields, normalise, search_spaces)

# Part of every config hash. Raised when the same knobs start to give different results (a sweep
# resumed across the change would otherwise mix two semantics under one hash). 3: issue 14 (the
# papers' Dirichlet as `dirichlet`, test sets that follow capped train sets, FedSelect's round-t
# upload under the training mask, the baselines' protocols from their authors).
RESULTS_REVISION = 3

DATASETS = SOURCES  # fl_core/data/catalog.py: what each is, its domains and options
PARTITIONS = ("shards", "dirichlet", "dirichlet_class", "iid", "domain", "domain_dirichlet")  # fl_core/data
DIRICHLET_PARTITIONS = ("dirichlet", "dirichlet_class", "domain_dirichlet")  # the partitions dir_alpha applies to
SOURCE_OPTIONS = ("corruptions", "severity", "image_size", "domainnet_classes")  # knobs of some sources only
MODELS = ("auto", "lenet", "cnn2", "resnet18_cifar", "resnet18", "cnn_bn", "lenet_bn", "preresnet18", "mobilenet_cifar")
WEIGHTINGS = ("uniform", "samples")
EVAL_MODELS = ("all", "acc")
LR_SCHEDULES = ("constant", "exp", "multistep")
MOMENTUM_SCOPES = ("epoch", "round")
BN_STATS = ("global", "local")
DEVICES = ("cpu", "cuda", "auto")
PRECISIONS = ("fp32", "bf16")

__all__ = ["RunConfig", "ConfigError", "ALGORITHMS", "NON_SEMANTIC", "DATA_KNOBS", "COMMON_KNOBS", "config_from_row",
           "method_knob_owners"]


@dataclass(frozen=True, init=False)
class RunConfig:
    algorithm: str = knob("fedselect", "federated algorithm (or package.module:Class, a method outside the registry)",
                          choices=ALGORITHMS, also=is_external)
    # ---- data (these knobs are the data spec: `data_spec()`)
    dataset: str = knob("digits", "dataset source (digits is bundled with scikit-learn: offline); mnist and fmnist "
                        "(Fashion-MNIST) read torchvision's layout under data_root; mnist_c/fmnist_c/digits_c: "
                        "MNIST/Fashion-MNIST/digits under corruptions, one domain each (the offline feature-shift "
                        "benchmark); the papers' cifar10c, office_caltech10, officehome, domainnet, cifar100, "
                        "mini_imagenet read their files under data_root (fl_core/data/catalog.py)", choices=DATASETS,
                        data=True)
    corruptions: str = knob("", "mnist_c, fmnist_c, digits_c, cifar10c: comma-separated corruption names, one "
                            "domain each (all but cifar10c also take clean); empty = the source's default "
                            "(mnist_c/fmnist_c/digits_c: "
                            "gaussian_noise,motion_blur,fog,contrast; cifar10c: FedL2P's ten)", data=True, added=True)
    severity: int = knob(3, "mnist_c, fmnist_c, digits_c, cifar10c: corruption severity", low=1, high=5, data=True,
                         added=True)
    image_size: int | None = knob(None, "cifar10c, office_caltech10, officehome, domainnet, cifar100, mini_imagenet: "
                                  "images resized to this side; none = 32 (mini_imagenet 84)", low=8, data=True,
                                  added=True)
    domainnet_classes: str = knob("top10", "domainnet: top10 = FedBN's ten classes (as FedL2P), all = 345",
                                  choices=DOMAINNET_CLASSES, data=True, added=True)
    num_clients: int = knob(10, "number of clients", low=1, data=True)
    partition: str = knob("shards", "how the training data is split over clients: shards = shards_per_client classes "
                          "each; dirichlet = the papers' split (Hsu et al. 2019, FedL2P, DisPFL): equal client sizes, "
                          "each client's class mix ~ Dir(dir_alpha); dirichlet_class = per class, shares over clients "
                          "~ Dir(dir_alpha), sizes vary (Yurochkin et al. 2019 / Wang et al. 2020); iid = even random "
                          "split; for sources made of domains: domain = one client per domain, domain_dirichlet = "
                          "num_clients/#domains clients per domain, each domain split as dirichlet. Test sets follow "
                          "each client's train label mix, within its domain (fl_core/data/partition.py, "
                          "domain_partition.py)",
                          choices=PARTITIONS, data=True)
    shards_per_client: int = knob(2, "shards: distinct classes per client", low=1, data=True)
    dir_alpha: float = knob(0.5, "dirichlet, dirichlet_class: concentration of the Dirichlet split (small = skewed)",
                            low=0, low_open=True, data=True)
    samples_per_client: int | None = knob(None, "cap on each client's training samples (the FedSelect paper uses "
                                          "100); none = no cap", low=1, data=True)
    test_samples_per_client: int | None = knob(None, "cap on each client's test samples; none = the largest size, "
                                               "proportional to the client's train size, at which every client's test "
                                               "set follows its train label mix", low=1, data=True)
    min_samples: int = knob(10, "dirichlet, dirichlet_class: minimum training samples per client (dirichlet: of the "
                                "equal size before samples_per_client)", low=1, data=True)
    equal_domains: bool = knob(False, "domain, domain_dirichlet: first cut every domain's train set to the "
                                      "smallest domain's size (FedL2P)", data=True, added=True)
    unseen_clients: int = knob(0, "clients held out of training (a seeded sample): they never train or send, and after "
                               "the last round each joins as a newcomer (receives the broadcast, runs the method's "
                               "local update once) and is scored; results mark every client's pool seen/unseen "
                               "(FedL2P)", low=0, data=True, added=True)
    unseen_domains: str = knob("", "comma-separated domains whose clients are all held out as unseen (a domain "
                               "partition; FedL2P's unseen domains)", data=True, added=True)
    val_fraction: float = knob(0.0, "share of each client's training samples held out as its validation split "
                               "(selection, early stopping; never test data)", low=0, high=1, high_open=True, data=True)
    seed: int = knob(0, "seed of partition, initialisation, client sampling and batch order", data=True)
    # ---- model and schedule
    model: str = knob("auto", "model; auto = lenet for 8x8/28x28 inputs, cnn2 for 32x32", choices=MODELS)
    model_width: float = knob(1.0, "width of a small CNN (lenet, cnn2, lenet_bn, cnn_bn): every hidden layer's C "
                              "channels or units become ceil(w*C), image channels and classes unchanged (w > 1: "
                              "spare capacity, e.g. for a pruned model); 1 = the model as registered", low=0,
                              low_open=True, high=4, added=True)
    init_weights: str | None = knob(None, "file with a state dict (torch.save) that initialises the model instead of "
                                    "the seeded random init, e.g. pretrained weights; loaded with weights_only=True, "
                                    "its keys and shapes must match the model's. Only the path enters the config "
                                    "hash, not the file's content; none = random init", added=True)
    pretrained: str = knob("", "config hash of a pretraining run whose final model every client and the server start "
                           "from (the first stage of a two-stage study, FedL2P): its checkpoint "
                           "<checkpoint_dir>/<hash>.pt must exist and come from this run's data and model "
                           "(fl_core/checkpoints.py); empty = none", added=True)
    rounds: int = knob(20, "communication rounds", low=1)
    participation: float = knob(1.0, "share of clients taking part in each round (seeded sample; 1 = all)",
                                low=0, low_open=True, high=1)
    eval_every: int = knob(1, "evaluate every k rounds (the last round always)", low=1)
    eval_models: str = knob("all", "which models an evaluated round scores: all = after local training (acc_local), "
                            "after the communication step (acc_global) and the method's acc; acc = only the model "
                            "reported as acc, one test pass per client as research scripts make (acc_local and "
                            "acc_global are NaN unless they are that model)", choices=EVAL_MODELS, added=True)
    local_epochs: int = knob(1, "local epochs per round (FedSelect: LocalAlt epochs, each a personal and a global "
                             "pass)", low=1)
    batch_size: int = knob(32, "local mini-batch size", low=1)
    lr: float = knob(0.1, "local SGD learning rate (of round 1 under a schedule)", low=0, low_open=True,
                     search=Space(0.01, 0.3, log=True, source="a decade below and 3x above 0.1, the rate FedSelect, "
                                  "DisPFL, PerFedMask and FedL2P's pretraining train at"))
    lr_schedule: str = knob("constant", "learning rate per round: constant; exp = lr * lr_decay^(t-1); multistep = "
                            "times lr_decay at each of lr_milestones", choices=LR_SCHEDULES)
    lr_decay: float = knob(1.0, "lr_schedule factor (exp: per round; multistep: per milestone)",
                           low=0, low_open=True, high=1)
    lr_milestones: str = knob("", "multistep: comma-separated rounds from which the lr is multiplied by lr_decay once "
                              "more, e.g. 50,75")
    momentum: float = knob(0.0, "local SGD momentum (its buffer's lifetime: momentum_scope)", low=0, high=1,
                           high_open=True)
    momentum_scope: str = knob("epoch", "lifetime of the momentum buffer in a round's local epochs: epoch = it "
                               "restarts at zero with every pass over the data (this engine's rule until now); "
                               "round = it carries over the epochs of a round's local training (and of a "
                               "fine-tuning), as one torch optimizer made per round does (PerFedMask's authors' "
                               "code); FedSelect's alternating passes always restart it", choices=MOMENTUM_SCOPES,
                               added=True)
    weight_decay: float = knob(0.0, "local SGD weight decay", low=0)
    bn_stats: str | None = knob(None, "BatchNorm running statistics (models with BatchNorm): global = the server "
                                "averages them with the weights and broadcasts them, so that every client "
                                "evaluates one and the same global model (FedAvg as its paper and FedSelect's "
                                "evaluate it); local = each client keeps its own (FedBN, the personalized "
                                "methods); none = the method's default: global for fedavg, fedavg_ft, fedbabu, "
                                "fedprox, fednova, scaffold and moon, local for every other", choices=BN_STATS,
                                added=True)
    weighting: str = knob("uniform", "averaging weights: uniform over clients or by training samples",
                          choices=WEIGHTINGS)
    precision: str = knob("fp32", "number format of a round's forward passes: fp32, or bf16 = under torch.autocast "
                          "to bfloat16 (weights, updates and averaging stay float32; results differ from fp32's), "
                          "meant for a GPU or a CPU with bfloat16 arithmetic (AVX-512 BF16, AMX; with "
                          "--no-reproducible, as the reproducible mode holds oneDNN to AVX2); elsewhere emulated, "
                          "many times slower", choices=PRECISIONS, added=True)
    # ---- where and how fast (not in the hash)
    data_root: str | None = knob(None, "folder with torchvision-layout data (default: $FL_DATA_ROOT or ./data)",
                                 data=True, semantic=False)
    download: bool = knob(False, "download mnist/fmnist/cifar10 (and the base set of mnist_c/fmnist_c) if missing "
                          "(needs internet)", data=True, semantic=False)
    device: str = knob("cpu", "torch device for the run", choices=DEVICES, semantic=False)
    threads: int | None = knob(None, "torch CPU threads (none = torch's default; a single run of python -m fl_core: 1 "
                               "for the small CNNs)", low=1, semantic=False)
    checkpoint_dir: str | None = knob(None, "folder of model checkpoints <config_hash>.pt: where `pretrained` is read "
                                      "from, and where `python -m fl_core` writes the run's final model when given; "
                                      "a sweep uses <sweep>/checkpoints (none = ./checkpoints)", semantic=False)
    # ---- the chosen method's own knobs (declared in its algorithm file)
    method: MethodParams = field(default=None, compare=True)  # type: ignore[assignment]

    def __init__(self, **values: Any) -> None:
        method = values.pop("method", None)
        common = {f.name: f for f in knob_fields(RunConfig)}
        for name, f in common.items():
            object.__setattr__(self, name, values.pop(name) if name in values else f.default)
        if not is_algorithm(self.algorithm):
            raise ConfigError(f"algorithm={self.algorithm!r} is not allowed; choose one of {', '.join(ALGORITHMS)} "
                              f"(or package.module:Class){did_you_mean(str(self.algorithm), ALGORITHMS)}")
        try:
            cls = params_class(self.algorithm)
        except KeyError as err:  # an external method that does not import
            raise ConfigError(err.args[0]) from None
        if method is None:
            method = cls(**_own_knobs(self.algorithm, cls, values))
        elif values:
            raise ConfigError(f"give method knobs either in `method` or as keywords, not both ({', '.join(values)})")
        elif not isinstance(method, cls):
            raise ConfigError(f"method={type(method).__name__} is not the parameter class of {self.algorithm} "
                              f"({cls.__name__})")
        object.__setattr__(self, "method", method)
        normalise(self)
        self._canonical_corruptions()
        self.validate()

    def __getattr__(self, name: str) -> Any:
        """Method knobs read through: `config.pers_rate` is `config.method.pers_rate`."""
        if name != "method" and "method" in self.__dict__ and hasattr(self.method, name):
            return getattr(self.method, name)
        raise AttributeError(f"RunConfig of {self.__dict__.get('algorithm')!r} has no knob {name!r}")

    # ------------------------------------------------------------------ validation
    def validate(self) -> None:
        check_fields(self)
        try:  # the source's options, domain partitions and unseen pools, before any data is read
            check_options(self.dataset, **{k: getattr(self, k) for k in SOURCE_OPTIONS})
            check_clients(self.dataset, self.corruptions, self.partition, self.num_clients, self.unseen_clients,
                          self.unseen_domains)
        except DataError as err:
            raise ConfigError(str(err)) from None
        sampled_by = get_algorithm(self.algorithm).sampled_by
        if self.participation < 1 and sampled_by != "participation":
            raise ConfigError(f"participation={self.participation:g}: {self.algorithm} has no server to sample "
                              f"clients; its own knob `{sampled_by}` says which take part in a round (e.g. "
                              f"{sampled_by}=0.5)")
        if self.lr_schedule == "multistep":
            if not self.lr_milestones.strip():
                raise ConfigError("lr_schedule='multistep' needs lr_milestones, e.g. '50,75'")
        self.milestones()  # parses, or names the bad value
        self._check_bn_stats()
        if self.model_width != 1.0 and self.model not in WIDTH_MODELS:
            raise ConfigError(f"model_width={self.model_width:g} needs a model with a width "
                              f"({', '.join(WIDTH_MODELS)}), not model={self.model!r}; set model too")
        if self.pretrained:
            if self.init_weights is not None:
                raise ConfigError("give either pretrained (a pretraining run's config hash) or init_weights (a state "
                                  "dict file), not both")
            if not (len(self.pretrained) == 12 and all(c in "0123456789abcdef" for c in self.pretrained)):
                raise ConfigError(f"pretrained={self.pretrained!r} is not a config hash (12 hex digits, as "
                                  f"RunConfig.config_hash() and the results' config_hash column give)")

    def _check_bn_stats(self) -> None:
        from .algorithms import get_algorithm
        cls = get_algorithm(self.algorithm)
        if self.bn_stats is None or self.bn_stats == cls.default_bn_stats:
            return
        why = ("by definition" if cls.bn_stats_fixed else
               "it has no server to average them" if not cls.has_server() else "")
        if why:
            raise ConfigError(f"bn_stats={self.bn_stats!r} is not allowed for {self.algorithm}: it keeps BatchNorm "
                              f"statistics {cls.default_bn_stats} ({why}); leave bn_stats out")

    def _canonical_corruptions(self) -> None:
        """One spelling per set of domains (one hash): names without spaces, and the source's
        default set as "" (the default). Bad names are left for `validate` to report."""
        if self.corruptions and self.dataset in OPTIONS["corruptions"][0]:
            try:
                names = parse_corruptions(self.dataset, self.corruptions)
            except DataError:
                return
            text = "" if names == parse_corruptions(self.dataset, "") else ",".join(names)
            object.__setattr__(self, "corruptions", text)

    def milestones(self) -> list[int]:
        text = self.lr_milestones.strip()
        if not text:
            return []
        try:
            rounds = [int(part) for part in text.split(",")]
        except ValueError:
            raise ConfigError(f"lr_milestones={self.lr_milestones!r} must be comma-separated round numbers, "
                              f"e.g. 50,75") from None
        if any(r < 1 for r in rounds) or rounds != sorted(set(rounds)):
            raise ConfigError(f"lr_milestones={self.lr_milestones!r} must be increasing round numbers >= 1")
        return rounds

    def lr_at(self, rnd: int) -> float:
        """The local learning rate of round `rnd` (1-based) under the schedule."""
        if self.lr_schedule == "exp":
            return self.lr * self.lr_decay ** (rnd - 1)
        if self.lr_schedule == "multistep":
            return self.lr * self.lr_decay ** sum(rnd >= m for m in self.milestones())
        return self.lr

    # ------------------------------------------------------------------ views
    def to_dict(self) -> dict[str, Any]:
        """Flat: every common knob, then the method's own knobs."""
        return {f.name: getattr(self, f.name) for f in knob_fields(RunConfig)} | self.method.to_dict()

    def semantic_dict(self) -> dict[str, Any]:
        """`to_dict` without the knobs that do not change results (what the hash covers)."""
        return {k: v for k, v in self.to_dict().items() if k not in NON_SEMANTIC}

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> "RunConfig":
        """Build from a flat dict (a Tune config, a Parquet row), rejecting unknown keys by name."""
        return cls(**values)

    def replace(self, **changes: Any) -> "RunConfig":
        """A copy with some knobs changed; changing the algorithm drops the old method's knobs."""
        values = self.to_dict()
        if "algorithm" in changes and changes["algorithm"] != self.algorithm:
            values = {k: v for k, v in values.items() if k in COMMON_KNOBS}
        return RunConfig(**(values | changes))

    def config_hash(self) -> str:
        """Short stable hash of everything that determines the results: the common knobs, the
        chosen method's knobs (never another method's) and `RESULTS_REVISION`. A knob added
        later (`ADDED_KNOBS`, `added_knobs`) enters only when it is not at its default, so adding it left
        every earlier hash as it was. `bn_stats` enters only where it averages running statistics
        (a model with BatchNorm, under "global"), the only case whose results it changed."""
        added = ADDED_KNOBS | added_knobs(self.method)
        values = {k: v for k, v in self.semantic_dict().items() if not (k in added and v == added[k])}
        values.pop("bn_stats", None)  # enters by its effect: averaged statistics (before it, every run kept them local)
        if self.bn_statistics() == "global" and self.model in RUNNING_STATS_MODELS:
            values["bn_stats"] = "global"
        blob = json.dumps(values | {"results_revision": RESULTS_REVISION}, sort_keys=True).encode()
        return hashlib.sha256(blob).hexdigest()[:12]

    def bn_statistics(self) -> str:
        """Where the BatchNorm running statistics live: `bn_stats`, or the method's default."""
        from .algorithms import get_algorithm
        return self.bn_stats or get_algorithm(self.algorithm).default_bn_stats

    def data_spec(self) -> dict[str, Any]:
        """The knobs that decide the clients' data: trials with equal specs share one loaded copy."""
        return {name: getattr(self, name) for name in DATA_KNOBS}

    def data_key(self) -> str:
        return hashlib.sha256(json.dumps(self.data_spec(), sort_keys=True).encode()).hexdigest()[:12]

    def label(self) -> str:
        """The method's display name (e.g. `FedSelect (layer B)`)."""
        from .algorithms import get_algorithm
        return self.method.label(get_algorithm(self.algorithm).display)

    def method_facts(self) -> dict[str, Any]:
        """What the results' readers need to know of the method (`fl_core.algorithms.METHOD_FACTS`)."""
        return method_facts(self.algorithm)


def config_from_row(row: Mapping[str, Any]) -> RunConfig:
    """The RunConfig of a result row: its common knobs and its own method's knobs (a row of
    engine v1 carries every method's knobs; the others are left out). Empty cells take the
    knob's default."""
    own = params_class(row["algorithm"])
    values = {}
    for cls in (RunConfig, own):
        for f in knob_fields(cls):
            if f.name not in row or f.name in NON_SEMANTIC:
                continue
            value = _plain(row[f.name])
            if value is None and f.default is not None:
                continue  # a column another method or sweep wrote; not this row's
            if base_type(cls, f)[0] is int and isinstance(value, float) and value.is_integer():
                value = int(value)  # an int column that held NaN for other rows was read as float
            values[f.name] = value
    return RunConfig.from_dict(values)


def _plain(value: Any) -> Any:
    """A Parquet cell as a plain Python value (None for an empty cell; arrays left as they are)."""
    import numpy as np  # here, not at the top: listing the methods and knobs needs neither
    import pandas as pd

    if isinstance(value, (list, tuple, np.ndarray)):
        return value
    if value is None or (isinstance(value, float) and math.isnan(value)) or value is pd.NA:
        return None
    return value.item() if isinstance(value, np.generic) else value


def _own_knobs(algorithm: str, cls: type[MethodParams], values: dict[str, Any]) -> dict[str, Any]:
    """The given knobs that belong to `algorithm`; a knob of another method or an unknown name is
    a ConfigError that says whose knob it is."""
    own = {f.name for f in knob_fields(cls)}
    foreign = [k for k in values if k not in own]
    if foreign:
        owners = knob_owners()
        name = foreign[0]
        if name in owners:
            raise ConfigError(f"{name} is a knob of {', '.join(owners[name])}, not of {algorithm}; "
                              f"{algorithm}'s own knobs: {', '.join(sorted(own)) or 'none'}")
        known = sorted(set(COMMON_KNOBS) | set(owners))
        unknown = sorted(foreign)
        raise ConfigError(f"unknown config key(s) {', '.join(unknown)}{did_you_mean(unknown[0], known)}; known keys: "
                          f"{', '.join(known)}")
    return values


def search_space(algorithm: str) -> dict[str, Space]:
    """The knobs a study with `tune` searches for `algorithm` by default, each with its declared
    space: the common ones (the learning rate, unless the method's `common_search` replaces its
    space), then the method's own (`knob(..., search=...)`)."""
    params = params_class(algorithm)
    return search_spaces(RunConfig) | params.common_search | search_spaces(params)


@functools.cache
def knob_owners() -> dict[str, list[str]]:
    """Method knob name -> the methods that declare it (computed once: it is asked for every
    round summary, to tell a method's metric columns from knob columns)."""
    owners: dict[str, list[str]] = {}
    for algorithm in ALGORITHMS:
        for f in knob_fields(params_class(algorithm)):
            owners.setdefault(f.name, []).append(algorithm)
    return owners


def method_knob_owners(algorithms: Iterable[str] = ()) -> dict[str, list[str]]:
    """`knob_owners()` with the knobs of the methods outside the registry among `algorithms`
    (`package.module:Class`, imported here): what a study or a command line that runs them
    accepts, as it accepts a registered method's."""
    owners = {name: list(methods) for name, methods in knob_owners().items()}
    for algorithm in dict.fromkeys(a for a in algorithms if is_external(a)):
        try:
            params = params_class(algorithm)
        except KeyError as err:  # not importable here: the one error, before any work
            raise ConfigError(err.args[0]) from None
        for f in knob_fields(params):
            owners.setdefault(f.name, []).append(algorithm)
    return owners


def add_run_arguments(parser, *, skip: tuple[str, ...] = (), many: tuple[str, ...] = (),
                      defaults: dict[str, Any] | None = None, only_given: bool = False, wrap_type: Any = None,
                      external: Sequence[str] = ()) -> None:
    """Every knob as a flag, generated from the declarations: a group of common knobs, then one
    group per method. Method flags are only passed on when given (a run never carries another
    method's knobs; giving one is a ConfigError naming its owner). A knob several methods
    declare (e.g. ft_epochs) appears once, in the first method's group. Used by `python -m
    fl_core` and by every study (which `skip` the knobs they define as swept axes). `only_given`:
    common flags too are passed on only when given (a study file holds the defaults, shown in
    `defaults`); `wrap_type`: see `add_knob_arguments`; `external`: methods outside the registry
    (`package.module:Class`) whose knobs get flags too, named like a registered method's."""
    common = parser.add_argument_group("run (common knobs)")
    add_knob_arguments(common, RunConfig, skip=skip, many=many, defaults=defaults, suppress_defaults=only_given,
                       wrap_type=wrap_type)
    seen = set(skip)
    external = tuple(dict.fromkeys(a for a in external if is_external(a)))
    owners = method_knob_owners(external)
    for algorithm in (*ALGORITHMS, *external):
        cls = params_class(algorithm)
        if hasattr(parser, "method_knobs"):  # `--help METHOD` (fl_core.knobs.OneLineParser)
            parser.method_knobs[algorithm] = [f.name for f in knob_fields(cls) if f.name not in skip]
        names = [f.name for f in knob_fields(cls) if f.name not in seen]
        if not names:
            continue
        shared = sorted({o for n in names for o in owners[n]} - {algorithm})
        title = f"{algorithm} knobs" + (f" (also used by {', '.join(shared)})" if shared else "")
        group = parser.add_argument_group(title)
        add_knob_arguments(group, cls, skip=tuple(n for n in (f.name for f in knob_fields(cls)) if n not in names),
                           suppress_defaults=True, many=many, defaults=defaults, wrap_type=wrap_type)
        seen.update(names)


def split_run_arguments(values: dict[str, Any], external: Sequence[str] = ()) -> tuple[dict[str, Any], dict[str, Any]]:
    """(common knobs, method knobs) of a parsed namespace's dict (`external`: methods outside the
    registry whose knobs count too); other entries are left out."""
    owners = method_knob_owners(external)
    return ({k: v for k, v in values.items() if k in COMMON_KNOBS},
            {k: v for k, v in values.items() if k in owners})


COMMON_KNOBS = tuple(f.name for f in knob_fields(RunConfig))
DATA_KNOBS = tuple(f.name for f in knob_fields(RunConfig) if f.metadata["data"])
# Knobs that change where or how fast a run happens, not what it computes: left out of the hash,
# so that the same experiment on a laptop and on a cluster shares one hash.
NON_SEMANTIC = tuple(f.name for f in knob_fields(RunConfig) if not f.metadata["semantic"])
# Knobs added after results were first stored (`knob(added=True)`), with their defaults: left out
# of the config hash while at them, so that adding a knob never moves an earlier run's hash.
ADDED_KNOBS = {f.name: f.default for f in knob_fields(RunConfig) if f.metadata.get("added")}


def added_knobs(params) -> dict[str, Any]:
    """A method's knobs added after its first results (`knob(added=True)`), with their defaults."""
    return {f.name: f.default for f in knob_fields(params) if f.metadata.get("added")}
