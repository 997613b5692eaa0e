"""A study is a file: the study spec (TOML), read, checked, overridden by flags, expanded to trials.

    name = "fedselect_grid"                  # MLflow experiment and sweep-name prefix
    description = "FedSelect grid ..."
    seeds = [0, 1, 2]                        # one trial per seed and configuration
    report_round = "last"                    # or "best_val" / "best_val_global": each run's round with the best mean
                                             # validation accuracy (needs val_fraction > 0)
    margin = 0.01                            # optional: the margin m (accuracy as a fraction) of the claims
                                             # tested on this study (analysis.claims): "comparable" means
                                             # |A - B| < m; declared before the study runs

    [search]
    kind = "grid"                            # grid | optuna (sampled configurations per data setting)
    scheduler = "fifo"                       # fifo | asha (early stopping per data setting and method)
    num_samples = 16                         # optuna: configurations sampled per data setting and method
    tune = "all"                             # optional: every method searched in its declared space
                                             # (or a list of algorithms); implies kind = "optuna"
    seed = 1000                              # the seed selection runs on (default 1000), never reported

    [knobs]                                  # every trial; any knob of RunConfig or of a method
    dataset = "digits"
    dir_alpha = [0.1, 0.5]                   # a list is an axis; lists of data knobs are data settings
    local_epochs = [1, 2]
    lr = {low = 0.01, high = 0.3, log = true}   # a range: only for kind = "optuna"

    [[methods]]                              # one entry per method (or variant): its own knobs
    algorithm = "fedselect"
    pers_rate = [0.1, 0.25, 0.5]

    [[methods]]
    algorithm = "fedavg"
    anchor = true                            # a baseline: run to completion on every data setting
                                             # and seed, outside any search or scheduler

    [pretraining]                            # optional: a first stage whose final model every
    algorithm = "fedavg"                     # trial starts from (FedL2P: pretrain, then personalize)
    rounds = 100                             # its own knobs; no lists, no data knobs

Rules. A knob in [knobs] applies to every method that has it (a common knob to all, a method
knob to the methods that own it; one that no method of the study owns is an error); a method
entry's own value wins. Lists are crossed. Data knobs (dataset, partition, dir_alpha, ...)
define the data settings and may only be set in [knobs]: every method sees the same data.
`dir_alpha` only varies for the Dirichlet partitions and `shards_per_client` only for shards
(elsewhere they keep their defaults). `null` does not exist in TOML: write "none" for an unset
nullable knob (e.g. samples_per_client = "none").

A `[pretraining]` table makes the study two stages (sweeps/stages.py): one pretraining run per
data setting, seed and model of the trials (their data knobs and model, the table's knobs, every
other knob at its default) writes its final model, and every trial names it (`pretrained` = its
config hash). The table is the pretraining's alone: [knobs], [[methods]] and the command line's
knob flags set the second stage, which may be searched: then every seed a selected configuration
is confirmed on gets its own pretraining, as does the search seed.

With a search or a scheduler, selection never touches test data or crosses data settings: each
(data setting, method) group is searched or scheduled on its own, on the search's own seed
([search] seed, outside `seeds`: its runs are never reported), by its validation accuracy (a
validation split is required: `val_fraction`); the best configuration of each group is then
re-run on every one of `seeds` to the final round ("confirm"), and anchors run on every seed.
See sweeps/stages.py.

Tuning every method alike. `tune = "all"` (or a list of algorithms) searches each method in the
space its knobs declare (`knob(..., search=Space(...))` beside the declaration, with where the
range comes from; the learning rate for every method: `fl_core.config.search_space`), so every
compared method, FedAvg and Local included, gets the same budget: `num_samples` configurations
and the same scheduler per (data setting, method). A method entry narrows its space with its
own range or list, or fixes a knob with one value; `fixed = true` runs a method as declared
(the anchors of a tuned study; `anchor` is for studies without tune). A list in [knobs] (e.g.
`participation = [1.0, 0.1]`) is then an axis of the study, not a search dimension: each value
is searched and confirmed apart, like a data setting. A tuned study confirms on
at least 5 seeds, the fewest the paired t-test over seeds behind the tables' marks accepts.

The resolved spec (every common knob explicit, flags applied) is saved as `study.toml` in the
sweep folder; `--resume` reads it back. How a spec becomes trials and stages: sweeps/stages.py.
"""
from __future__ import annotations

import math
import os
import tomllib
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from fl_core.algorithms import ALGORITHMS, is_algorithm
from fl_core.config import (COMMON_KNOBS, DATA_KNOBS, NON_SEMANTIC, ConfigError, RunConfig, method_knob_owners,
                            search_space)
from fl_core.knobs import Space, did_you_mean
from fl_core.results import REPORT_ROUNDS

from .errors import SweepError

SEARCHES = ("grid", "optuna")
SCHEDULERS = ("fifo", "asha")
TOP_KEYS = ("name", "description", "seeds", "report_round", "margin", "search", "knobs", "methods", "pretraining")
SEARCH_KEYS = ("kind", "scheduler", "num_samples", "tune", "seed")
SEARCH_SEED = 1000        # the search's own seed by default: never one of a study's reported seeds
MIN_CONFIRM_SEEDS = 5     # a study with `tune`: the tables' and claims' paired t-test over seeds needs 5
NOT_IN_SPEC = ("algorithm", "seed", "device", "threads")  # methods say the algorithm; `seeds` the seeds
FROM_TRIALS = ("model", "pretrained")   # [pretraining]: taken from the trials it pretrains for, or never set
STUDIES = Path(__file__).resolve().parents[1] / "studies"
ALL = "all"


@dataclass(frozen=True)
class Range:
    """A search range of a numeric knob (kind = "optuna"): uniform, or log-uniform with `log`."""

    low: float
    high: float
    log: bool = False

    def __str__(self) -> str:
        return f"{self.low:g}:{self.high:g}" + (":log" if self.log else "")


@dataclass(frozen=True)
class Method:
    algorithm: str
    knobs: dict[str, Any] = field(default_factory=dict)   # value, list (axis) or Range
    anchor: bool = False                                  # run as declared (under `tune`: `fixed = true`)


@dataclass(frozen=True)
class StudySpec:
    name: str
    description: str = ""
    seeds: tuple[int, ...] = (0, 1, 2)
    knobs: dict[str, Any] = field(default_factory=dict)
    methods: tuple[Method, ...] = ()
    search: str = "grid"
    scheduler: str = "fifo"
    num_samples: int = 16
    pretraining: Method | None = None                       # [pretraining]: the first stage's method and knobs
    source: str = ""                                        # where it was read from (for messages)
    tune: tuple[str, ...] = ()                              # [search] tune: the algorithms searched in their
                                                            # declared spaces ("all": every method not fixed)
    search_seed: int = SEARCH_SEED                          # [search] seed: the seed selection runs on
    report_round: str = "last"                              # last | best_val: the round a trial reports
    margin: float | None = None                             # the claims' margin m (analysis.claims); None: theirs

    @property
    def selects(self) -> bool:
        """Whether the study has a selection stage (a search or early stopping)."""
        return self.search != "grid" or self.scheduler != "fifo"


# ====================================================================== reading
def load_spec(path: str | Path) -> StudySpec:
    path = Path(path)
    if not path.is_file():
        known = ", ".join(sorted(p.name for p in STUDIES.glob("*.toml")))
        raise SweepError(f"study file {path} does not exist (the project's studies: {known} in {STUDIES})")
    try:
        raw = tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as err:
        raise SweepError(f"{path}: not valid TOML ({err})") from None
    return parse_spec(raw, str(path))


def parse_spec(raw: dict[str, Any], source: str = "study") -> StudySpec:
    """A StudySpec from the TOML tables, or one SweepError naming the bad entry."""
    _only(raw, TOP_KEYS, source)
    if not isinstance(raw.get("name"), str) or not raw["name"]:
        raise SweepError(f"{source}: `name` (the study's name) is required")
    search = raw.get("search", {})
    _only(search, SEARCH_KEYS, f"{source} [search]")
    knobs = {k: _value(v, f"{source} [knobs] {k}") for k, v in raw.get("knobs", {}).items()}
    tune = _tune(search.get("tune", ()), f"{source} [search] tune")
    methods = tuple(_method(entry, f"{source} [[methods]] #{i + 1}", bool(tune))
                    for i, entry in enumerate(raw.get("methods", [])))
    seeds = raw.get("seeds", [0, 1, 2])
    seeds = seeds if isinstance(seeds, list) else [seeds]
    pretraining = _pretraining(raw["pretraining"], f"{source} [pretraining]") if "pretraining" in raw else None
    spec = StudySpec(name=raw["name"], description=raw.get("description", ""),
                     seeds=tuple(seeds), knobs=knobs, methods=methods,
                     search=search.get("kind", "optuna" if tune else "grid"), scheduler=search.get("scheduler", "fifo"),
                     num_samples=search.get("num_samples", 16), pretraining=pretraining, source=source, tune=tune,
                     search_seed=search.get("seed", SEARCH_SEED), report_round=raw.get("report_round", "last"),
                     margin=raw.get("margin"))
    check_spec(spec)
    return spec


def _tune(value: Any, where: str) -> tuple[str, ...]:
    """[search] tune: "all", or a list of algorithms; () when absent."""
    names = [value] if isinstance(value, str) else value
    if not isinstance(names, (list, tuple)) or not all(isinstance(n, str) for n in names):
        raise SweepError(f"{where}={value!r}: give \"all\" or a list of algorithms, e.g. [\"fedselect\", \"fedavg\"]")
    bad = [n for n in names if n != ALL and not is_algorithm(n)]
    if bad or (ALL in names and len(names) > 1):
        raise SweepError(f"{where}={value!r}: " + (f"{bad[0]!r} is not an algorithm; choose among "
                         f"{', '.join(ALGORITHMS)}" if bad else "\"all\" stands alone") + " (or \"all\")")
    return tuple(names)


def _method(entry: dict[str, Any], where: str, tuned: bool) -> Method:
    """One [[methods]] entry. Run as declared with `anchor = true`, or under [search] tune with
    `fixed = true` (every other method is searched there, anchors included)."""
    entry = dict(entry)
    algorithm = entry.pop("algorithm", None)
    if not is_algorithm(algorithm):
        raise SweepError(f"{where}: algorithm={algorithm!r}; choose one of {', '.join(ALGORITHMS)} (or "
                         f"package.module:Class)")
    key, other = ("fixed", "anchor") if tuned else ("anchor", "fixed")
    if other in entry:
        raise SweepError(f"{where}: `{other}` " + (
            "is not used under [search] tune, where every method is searched with the same budget, anchors "
            "included; write `fixed = true` to run a method as declared" if tuned else
            "only goes with [search] tune; without it `anchor = true` runs a method as declared"))
    anchor = entry.pop(key, False)
    if not isinstance(anchor, bool):
        raise SweepError(f"{where}: {key}={anchor!r} must be true or false")
    return Method(algorithm, {k: _value(v, f"{where} {k}") for k, v in entry.items()}, anchor)


def _pretraining(table: Any, where: str) -> Method:
    """The [pretraining] table: its algorithm and one value per knob (the checks: `_check_pretraining`)."""
    if not isinstance(table, dict):
        raise SweepError(f"{where}: expected a table (algorithm = \"fedavg\" and the pretraining's knobs)")
    entry = dict(table)
    algorithm = entry.pop("algorithm", None)
    if not is_algorithm(algorithm):
        raise SweepError(f"{where}: algorithm={algorithm!r}; choose one of {', '.join(ALGORITHMS)} "
                         f"(typically fedavg or fedbabu)")
    for name, value in entry.items():
        if isinstance(value, (list, dict)):
            raise SweepError(f"{where}: {name}={value!r} is a list or a range, and the pretraining has no axes (one "
                             f"run per data setting, seed and model of the trials); give one value")
    return Method(algorithm, {k: _value(v, f"{where} {k}") for k, v in entry.items()})


def _only(table: Any, allowed: tuple[str, ...], where: str) -> None:
    if not isinstance(table, dict):
        raise SweepError(f"{where}: expected a table")
    unknown = sorted(set(table) - set(allowed))
    if unknown:
        raise SweepError(f"{where}: unknown key(s) {', '.join(unknown)}{did_you_mean(unknown[0], allowed)}; "
                         f"allowed: {', '.join(allowed)}")


def _value(value: Any, where: str) -> Any:
    """A knob value from TOML: scalar, list (axis) or {low, high, log} (Range); "none" is None."""
    if isinstance(value, dict):
        _only(value, ("low", "high", "log"), where)
        if not all(isinstance(value.get(k), (int, float)) and not isinstance(value.get(k), bool)
                   for k in ("low", "high")):
            raise SweepError(f"{where}: a range needs numbers `low` and `high`, e.g. {{low = 0.01, high = 0.3}}")
        if not value["low"] < value["high"]:
            raise SweepError(f"{where}: range low={value['low']} must be below high={value['high']}")
        return Range(float(value["low"]), float(value["high"]), bool(value.get("log", False)))
    if isinstance(value, list):
        if not value:
            raise SweepError(f"{where}: an empty list; give at least one value")
        return [_value(v, where) for v in value]
    return None if isinstance(value, str) and value.lower() == "none" else value


def check_spec(spec: StudySpec) -> None:
    """Structure checks (values are checked by RunConfig when the trials are built)."""
    where = spec.source or spec.name
    _check_choices(spec, where)
    _check_seeds(spec, where)
    if not spec.methods:
        raise SweepError(f"{where}: no methods; add a [[methods]] entry (or give --algorithms)")
    _check_study_knobs(spec, where)
    _check_method_knobs(spec, where)
    _check_search(spec, where)
    if spec.tune:
        _check_tune(spec, where)
    if spec.pretraining is not None:
        _check_pretraining(spec, where)


def _check_choices(spec: StudySpec, where: str) -> None:
    """The search kind, the scheduler and the report round are ones this package knows; a margin is a fraction."""
    if spec.search not in SEARCHES:
        raise SweepError(f"{where}: search kind={spec.search!r}; choose one of {', '.join(SEARCHES)}")
    if spec.scheduler not in SCHEDULERS:
        raise SweepError(f"{where}: scheduler={spec.scheduler!r}; choose one of {', '.join(SCHEDULERS)}")
    if spec.report_round not in REPORT_ROUNDS:
        raise SweepError(f"{where}: report_round={spec.report_round!r}; choose one of {', '.join(REPORT_ROUNDS)} (the "
                         f"last round, or each run's round with the best mean validation accuracy)")
    if spec.margin is not None and not (isinstance(spec.margin, float) and 0 < spec.margin < 1):
        raise SweepError(f"{where}: margin={spec.margin!r}; the claims' margin is accuracy as a fraction in (0, 1), "
                         f"e.g. 0.01 for one percentage point")


def _check_seeds(spec: StudySpec, where: str) -> None:
    """num_samples is a positive integer, and the seeds are one or more distinct integers."""
    if not isinstance(spec.num_samples, int) or spec.num_samples < 1:
        raise SweepError(f"num_samples={spec.num_samples!r} must be an integer >= 1")
    if not spec.seeds or not all(isinstance(s, int) and not isinstance(s, bool) for s in spec.seeds):
        raise SweepError(f"{where}: seeds={list(spec.seeds)!r} must be one or more integers")
    if len(set(spec.seeds)) != len(spec.seeds):
        raise SweepError(f"{where}: seeds {list(spec.seeds)} repeat a seed")


def _check_study_knobs(spec: StudySpec, where: str) -> None:
    """Every [knobs] entry is a common knob or a knob of a method the study runs, and within its range."""
    algorithms = {m.algorithm for m in spec.methods}
    try:
        owners = method_knob_owners(algorithms)
    except ConfigError as err:  # a method outside the registry that does not import
        raise SweepError(f"{where}: {err}") from None
    for name, value in spec.knobs.items():
        if name in NOT_IN_SPEC:
            raise SweepError(f"{where}: `{name}` cannot be a knob here ("
                             + ("use `seeds`" if name == "seed" else "a method entry names it" if name == "algorithm"
                                else "a trial's resources decide it") + ")")
        if name not in COMMON_KNOBS and name not in owners:
            raise SweepError(f"{where}: unknown knob {name!r}{did_you_mean(name, [*COMMON_KNOBS, *owners])}; see "
                             f"`python -m fl_core --help` for the knobs")
        if name in owners and not algorithms & set(owners[name]):
            raise SweepError(f"{where}: {name} is a knob of {' and '.join(owners[name])}, but this study runs no "
                             f"trial of {' or '.join(owners[name])}"
                             + (" (a knob of the pretraining goes in [pretraining])" if spec.pretraining else ""))
        _check_range(name, value, spec)


def _check_method_knobs(spec: StudySpec, where: str) -> None:
    """A method entry's knobs are its own (no data knobs, no ranges for an anchor), and no entry is repeated."""
    for method in spec.methods:
        for name, value in method.knobs.items():
            if name in DATA_KNOBS or name in NOT_IN_SPEC:
                raise SweepError(f"{where}: {method.algorithm}: {name} cannot be set per method (every method sees "
                                 f"the same data; set it in [knobs])")
            if method.anchor and (isinstance(value, Range)):
                raise SweepError(f"{where}: anchor {method.algorithm}: {name} is a search range; anchors are not "
                                 f"searched")
            _check_range(name, value, spec)
    keys = [(m.algorithm, repr(sorted(m.knobs.items()))) for m in spec.methods]
    twice = sorted({algorithm for algorithm, knobs in keys if keys.count((algorithm, knobs)) > 1})
    if twice:
        raise SweepError(f"{where}: {', '.join(twice)} is listed twice with the same knobs (in the file, or once as "
                         f"an anchor and once in --algorithms; --anchors NAME... sets the anchors)")


def _check_search(spec: StudySpec, where: str) -> None:
    """An optuna search has a method to search, and a selecting study a search seed of its own."""
    if spec.search == "optuna" and not any(not m.anchor for m in spec.methods):
        raise SweepError(f"{where}: search kind = optuna needs a method that is not an anchor to search")
    if spec.selects and (not isinstance(spec.search_seed, int) or isinstance(spec.search_seed, bool)
                         or spec.search_seed in spec.seeds):
        raise SweepError(f"{where}: [search] seed = {spec.search_seed!r}: the search runs on a seed of its own, never "
                         f"reported, so it must be an integer outside the study's seeds {list(spec.seeds)}")


def tuned(spec: StudySpec, method: Method) -> bool:
    """Whether [search] tune searches this method in its declared space."""
    return bool(spec.tune) and not method.anchor and (spec.tune == (ALL,) or method.algorithm in spec.tune)


def _check_tune(spec: StudySpec, where: str) -> None:
    """[search] tune: a search over sampled configurations, methods the study runs, enough seeds to
    confirm on, and no [knobs] value for a knob a tuned method searches (the method's own entry
    fixes a knob, or narrows its space)."""
    if spec.search != "optuna":
        raise SweepError(f"{where}: [search] tune samples each method's configurations: kind = \"optuna\" (its "
                         f"default), not {spec.search!r}")
    missing = sorted(set(spec.tune) - {ALL} - {m.algorithm for m in spec.methods})
    if missing:
        raise SweepError(f"{where}: [search] tune names {', '.join(missing)}, which the study does not run; its "
                         f"methods: {', '.join(dict.fromkeys(m.algorithm for m in spec.methods))}")
    if len(spec.seeds) < MIN_CONFIRM_SEEDS:
        raise SweepError(f"{where}: [search] tune confirms each method's selected configuration on the study's seeds, "
                         f"and the paired t-test over seeds behind every mark and claim needs at least "
                         f"{MIN_CONFIRM_SEEDS}; got seeds = {list(spec.seeds)}")
    for method in spec.methods:
        searched = [k for k in search_space(method.algorithm) if k not in method.knobs] if tuned(spec, method) else []
        clash = [k for k in searched if k in spec.knobs]
        if clash:
            raise SweepError(f"{where}: {clash[0]} = {show_value(spec.knobs[clash[0]])} in [knobs], but [search] tune "
                             f"searches {method.algorithm}'s {clash[0]} in {search_space(method.algorithm)[clash[0]]}; "
                             f"to fix it, set it in the method's entry (or `fixed = true` for the whole method)")


def with_tuning(spec: StudySpec) -> StudySpec:
    """The spec as its trials run under [search] tune: each tuned method's entry holds its search
    space (the declared one, `fl_core.config.search_space`, where the entry does not set the knob)
    and every other method is run as declared. Unchanged without tune; applying it twice changes
    nothing."""
    if not spec.tune:
        return spec
    methods = []
    for method in spec.methods:
        if tuned(spec, method):
            declared = {k: _domain(s) for k, s in search_space(method.algorithm).items() if k not in method.knobs}
            methods.append(replace(method, knobs=declared | method.knobs))
        else:
            methods.append(replace(method, anchor=True))
    return replace(spec, methods=tuple(methods))


def _domain(space: Space) -> Range | list:
    return list(space.choices) if space.choices else Range(float(space.low), float(space.high), space.log)


def show_value(value: Any) -> str:
    """A knob value as a command line or a message writes it: a list space-separated, None as none."""
    return " ".join(map(str, value)) if isinstance(value, (list, tuple)) else "none" if value is None else str(value)


def _check_pretraining(spec: StudySpec, where: str) -> None:
    """The [pretraining] table: a method that trains a model from scratch, its own knobs only (no
    data knob, no model: those of the trials it pretrains for), and a study that can use it (a
    grid, no `pretrained` or `checkpoint_dir` of its own)."""
    from fl_core.algorithms import get_algorithm
    from fl_core.algorithms.ft import Personalizing

    pre, here = spec.pretraining, f"{where} [pretraining]"
    if issubclass(get_algorithm(pre.algorithm), Personalizing):
        raise SweepError(f"{here}: algorithm={pre.algorithm!r} personalizes a pretrained model itself; the "
                         f"pretraining trains one from scratch (e.g. fedavg or fedbabu)")
    owners = method_knob_owners([pre.algorithm])
    for name in pre.knobs:
        if name in DATA_KNOBS:
            raise SweepError(f"{here}: {name} is a data knob, and a pretraining runs on the data (setting and seed) "
                             f"of the trials it pretrains for; set {name} in [knobs]")
        if name == "model":
            raise SweepError(f"{here}: model: the pretraining trains the model of the trials it pretrains for; set "
                             f"model in [knobs] (or a method entry)")
        if name in FROM_TRIALS or name in NOT_IN_SPEC or name in NON_SEMANTIC:
            raise SweepError(f"{here}: {name} cannot be set for the pretraining (the sweep decides it)")
        if name not in COMMON_KNOBS and pre.algorithm not in owners.get(name, ()):
            raise SweepError(f"{here}: {name} is not a knob of {pre.algorithm}"
                             + (f" (it is a knob of {' and '.join(owners[name])})" if name in owners else "")
                             + "; see `python -m fl_core --help` for the knobs")
    for table, name in [(spec.knobs, "[knobs]"), *((m.knobs, m.algorithm) for m in spec.methods)]:
        if table.get("pretrained") or table.get("checkpoint_dir") is not None:
            knob = "pretrained" if table.get("pretrained") else "checkpoint_dir"
            raise SweepError(f"{where}: {name}: {knob}={table[knob]!r}; with a [pretraining] table every trial starts "
                             f"from its own pretraining, read from <sweep>/checkpoints: leave {knob} out")


def _check_range(name: str, value: Any, spec: StudySpec) -> None:
    ranges = [v for v in (value if isinstance(value, list) else [value]) if isinstance(v, Range)]
    if not ranges:
        return
    if isinstance(value, list):
        raise SweepError(f"{name}: a list of ranges; give one range (low:high) or a list of values")
    if spec.search != "optuna":
        raise SweepError(f"{name}={value}: a range needs search kind = optuna (a grid takes lists of values)")
    if name in DATA_KNOBS:
        raise SweepError(f"{name}={value}: data settings are never searched; give a list of values (each is a "
                         f"data setting of its own)")


def budget_line(spec: StudySpec) -> str:
    """What selection each method had: the budget per (data setting, method), the seed it ran
    on, and the methods run as declared."""
    searched = sorted({m.algorithm for m in spec.methods if not m.anchor})
    fixed = sorted({m.algorithm for m in spec.methods if m.anchor})
    budget = f"{spec.num_samples} Optuna configurations" if spec.search == "optuna" else "its grid"
    return (("tuned alike" if spec.tune else "searched") + f": {', '.join(searched)}, each with {budget}"
            + (" under ASHA" if spec.scheduler == "asha" else "") + f" per data setting, on search seed "
            f"{spec.search_seed} (never reported), by validation accuracy; confirmed on seeds "
            f"{', '.join(map(str, spec.seeds))}" + (f"; run as declared: {', '.join(fixed)}" if fixed else ""))


# ====================================================================== flags over the spec
def with_overrides(spec: StudySpec, knobs: dict[str, Any], *, algorithms: list[str] | None = None,
                   anchors: list[str] | None = None, seeds: list[int] | None = None, search: str | None = None,
                   scheduler: str | None = None, num_samples: int | None = None, tune: list[str] | None = None,
                   search_seed: int | None = None, report_round: str | None = None) -> StudySpec:
    """The spec with command-line values: a knob given on the command line replaces its value in
    [knobs] and in every method entry that sets it (a method knob goes to [knobs] when no entry
    sets it); `algorithms` / `anchors` replace the searched / anchor method entries (entries of
    the spec for the same algorithm keep their knobs). `tune` on a spec without it tunes every
    method, the file's anchors included, unless `anchors` names the ones to run as declared."""
    methods = list(spec.methods)
    if algorithms is not None:
        methods = _replace_methods(methods, algorithms, anchor=False)
    if anchors is not None:
        methods = _replace_methods(methods, anchors, anchor=True)
    top = dict(spec.knobs)
    algorithms = {m.algorithm for m in methods}
    owners = method_knob_owners(algorithms)
    for name in knobs:
        if name in owners and not algorithms & set(owners[name]):
            raise SweepError(f"--{name.replace('_', '-')} is a knob of {' and '.join(owners[name])}, but this study "
                             f"runs no trial of {' or '.join(owners[name])}")
    for name, value in knobs.items():
        value = value[0] if isinstance(value, list) and len(value) == 1 else value
        setting = [i for i, m in enumerate(methods) if name in m.knobs]
        for i in setting:
            methods[i] = replace(methods[i], knobs=methods[i].knobs | {name: value})
        if not setting or name in top or name in COMMON_KNOBS:
            top[name] = value
    tuning = _tune(tune, "--tune") if tune is not None else spec.tune
    if tuning and not spec.tune and anchors is None:  # --tune on a file without it: its anchors are tuned too
        methods = [replace(m, anchor=False) for m in methods]
    out = replace(spec, knobs=top, methods=tuple(methods), seeds=tuple(seeds) if seeds is not None else spec.seeds,
                  search=search or ("optuna" if tuning and not spec.tune else spec.search),
                  scheduler=scheduler or spec.scheduler,
                  num_samples=num_samples if num_samples is not None else spec.num_samples, tune=tuning,
                  search_seed=search_seed if search_seed is not None else spec.search_seed,
                  report_round=report_round or spec.report_round)
    check_spec(out)
    return out


def _replace_methods(methods: list[Method], names: list[str], anchor: bool) -> list[Method]:
    bad = [n for n in names if not is_algorithm(n)]
    if bad:
        raise SweepError(f"algorithm={bad[0]!r} is not allowed; choose one of {', '.join(ALGORITHMS)}")
    kept = [m for m in methods if m.anchor != anchor]
    mine = [m for m in methods if m.anchor == anchor]
    chosen = []
    for name in names:
        chosen += [m for m in mine if m.algorithm == name] or [Method(name, {}, anchor)]
    return (chosen + kept) if not anchor else (kept + chosen)


# ====================================================================== writing
def resolved(spec: StudySpec) -> StudySpec:
    """The spec with every semantic common knob explicit (defaults filled in), so that a resumed
    sweep computes the same trials whatever the code's defaults become."""
    spec = with_tuning(spec)
    default = RunConfig().to_dict()
    fixed = {k: default[k] for k in COMMON_KNOBS if k not in NOT_IN_SPEC and k not in NON_SEMANTIC}
    pre = spec.pretraining
    if pre is not None:  # the pretraining's own common knobs (its data and model are the trials')
        own = {k: v for k, v in fixed.items() if k not in DATA_KNOBS and k not in FROM_TRIALS}
        pre = replace(pre, knobs=own | pre.knobs)
    return replace(spec, knobs=fixed | spec.knobs, pretraining=pre)


def to_toml(spec: StudySpec) -> str:
    lines = [f"# resolved study spec: {spec.source or spec.name} with the command line applied",
             f"name = {_toml(spec.name)}", f"description = {_toml(spec.description)}",
             f"seeds = {_toml(list(spec.seeds))}", f"report_round = {_toml(spec.report_round)}"]
    lines += [f"margin = {_toml(spec.margin)}"] if spec.margin is not None else []
    lines += ["", "[search]",
             f"kind = {_toml(spec.search)}",
             f"scheduler = {_toml(spec.scheduler)}", f"num_samples = {spec.num_samples}"]
    lines += [f"tune = {_toml(list(spec.tune))}"] if spec.tune else []
    lines += [f"seed = {spec.search_seed}"] if spec.selects else []
    lines += ["", "[knobs]"]
    lines += [f"{k} = {_toml(v)}" for k, v in spec.knobs.items()]
    if spec.pretraining is not None:
        lines += ["", "[pretraining]", f"algorithm = {_toml(spec.pretraining.algorithm)}"]
        lines += [f"{k} = {_toml(v)}" for k, v in spec.pretraining.knobs.items()]
    for method in spec.methods:
        lines += ["", "[[methods]]", f"algorithm = {_toml(method.algorithm)}"]
        lines += [f"{'fixed' if spec.tune else 'anchor'} = true"] if method.anchor else []
        lines += [f"{k} = {_toml(v)}" for k, v in method.knobs.items()]
    return "\n".join(lines) + "\n"


def _toml(value: Any) -> str:
    if value is None:
        return '"none"'
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, Range):
        return f"{{low = {value.low!r}, high = {value.high!r}, log = {_toml(value.log)}}}"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    if isinstance(value, float) and not math.isfinite(value):
        raise SweepError(f"{value} cannot be written to a study file")
    if isinstance(value, (int, float)):
        return repr(value)
    text = str(value).replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
    return f'"{text}"'


def save_spec(folder: Path, spec: StudySpec) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path, tmp = folder / "study.toml", folder / ".study.toml.tmp"
    tmp.write_text(to_toml(spec))
    os.replace(tmp, path)
    return path
