"""A study spec's trials (data settings, axes, their order) and the sweep's stages: which trials
run together under which search and scheduler.

A plain grid (search kind = grid, scheduler = fifo) is one stage, `tune`: every trial, anchors
included, run to completion.

With a search or a scheduler, selection must not mislead, so the sweep runs in stages, each a
Ray Tune experiment of its own (folder `tune-<stage>` in the sweep, resumed stage by stage):
  anchors     the anchor methods on every data setting and seed, to completion, no scheduler
  select-<i>  one per (data setting, searched method): the method's grid (ASHA) or an Optuna
              search of `num_samples` configurations, on the search seed ([search] seed, never
              one of the study's seeds: a select run is never reported), scheduled/maximised on
              the trial's `objective`: validation accuracy (a validation split is required). Data
              settings are never a search dimension and never share an ASHA bracket
  confirm     per select stage, its best COMPLETED configuration (highest objective at the final
              round; an early-stopped trial never wins) re-run on every seed of the study, to
              completion
A study with a [pretraining] table runs a stage before them (before the grid, or before the
anchor and select stages, with a pretraining for the search seed and every confirm seed):
  pretrain    one run of the table's method per data setting, seed and model of the trials
              (`pretraining_config`): it writes its final model to <sweep>/checkpoints/<hash>.pt
              (sweeps/trainable.py), and every trial of the next stage names that hash in its
              `pretrained` knob, so that it starts from that model and never trains it again
Every trial row records its stage (`stage`: pretrain, grid, anchor, select, confirm), so tables compare the
confirmed configurations with the anchors over the same seeds at the same round, and the select
trials (single seed, partly stopped) go to the search's own table and figure.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Any

from fl_core.config import COMMON_KNOBS, DATA_KNOBS, DIRICHLET_PARTITIONS, SOURCE_OPTIONS, RunConfig, method_knob_owners
from fl_core.data.catalog import OPTIONS, source_domains
from fl_core.results import setting_label

from .errors import SweepError
from .plan import reached_last_round
from .spec import Method, Range, StudySpec, show_value, with_tuning

OBJECTIVE = "objective"   # what every trial reports for selection (see `objective_of`)


@dataclass(frozen=True)
class Stage:
    name: str                                          # Tune experiment folder: <sweep>/<name>
    kind: str                                          # pretrain, grid (plain sweep), anchor, select, confirm, repair
    configs: tuple[tuple[str, RunConfig], ...] = ()    # (stage of the trial, config); a search: its base
    domains: dict[str, Any] = field(default_factory=dict)  # optuna: knob -> Range or list of choices
    group: str = ""                                    # select: "<data setting> / <method>"
    stop_after: dict[str, int] = field(default_factory=dict)  # repair: config hash -> round to stop after

    @property
    def searched(self) -> bool:
        return bool(self.domains)


def group_name(config: RunConfig, axes: tuple[str, ...] = ()) -> str:
    """The (data setting, method) group a select stage searches, e.g. `digits, Dir(0.1) / FedSelect`;
    `axes`: the study's axes under tune (`axis_knobs`) beside participation, which the setting
    label names already, e.g. `digits, Dir(0.1), local_epochs = 5 / FedSelect`."""
    extra = "".join(f", {k} = {show_value(getattr(config, k))}" for k in axes if k != "participation")
    return f"{setting_label(config.to_dict())}{extra} / {config.label()}"


def objective_of(config: RunConfig) -> str:
    """The metric selection uses for this trial: validation accuracy when it has a split."""
    return "acc_val_mean" if config.val_fraction > 0 else "acc_mean"


# ---------------------------------------------------------------------- a spec's trials
def _axis(value: Any) -> list[Any]:
    return value if isinstance(value, list) else [value]


def data_settings(spec: StudySpec) -> list[dict[str, Any]]:
    """Every combination of the data knobs' values, without repeats, where a knob only varies
    where it applies (elsewhere it keeps its default): `dir_alpha` for Dirichlet partitions,
    `shards_per_client` for shards, a source option (`corruptions`, `severity`, ...) for the
    datasets that take it. Under `partition = "domain"` (one client per domain) `num_clients` is
    the dataset's number of domains."""
    default = RunConfig()
    data = {k: _axis(v) for k, v in spec.knobs.items() if k in DATA_KNOBS}
    names = list(data)
    settings: list[dict[str, Any]] = []
    for values in itertools.product(*data.values()):
        setting = dict(zip(names, values))
        partition = setting.get("partition", default.partition)
        dataset = setting.get("dataset", default.dataset)
        if "dir_alpha" in setting and partition not in DIRICHLET_PARTITIONS:
            setting["dir_alpha"] = default.dir_alpha
        if "shards_per_client" in setting and partition != "shards":
            setting["shards_per_client"] = default.shards_per_client
        for option in SOURCE_OPTIONS:
            if option in setting and dataset not in OPTIONS[option][0]:
                setting[option] = getattr(default, option)
        if partition == "domain":
            setting["num_clients"] = len(source_domains(dataset, setting.get("corruptions", default.corruptions)))
        if setting not in settings:
            settings.append(setting)
    return settings


def method_values(spec: StudySpec, method: Method) -> dict[str, Any]:
    """The non-data knobs of one method's trials: [knobs] entries it has, then its own."""
    owners = method_knob_owners([method.algorithm])
    shared = {k: v for k, v in spec.knobs.items() if k not in DATA_KNOBS
              and (k in COMMON_KNOBS or method.algorithm in owners.get(k, ()))}
    return shared | method.knobs


def method_trials(spec: StudySpec, method: Method, setting: dict[str, Any], seeds,
                  fixed: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """The flat configs of one method on one data setting: its axes crossed, times `seeds`
    (ranges are left to the search: their low end stands in, see `search_domains`); `fixed`: the
    study's axes under tune set to one combination (`tuned_axes`), never crossed again."""
    fixed = fixed or {}
    values = {k: v for k, v in method_values(spec, method).items() if k not in fixed}
    axes = {k: _axis(v) for k, v in values.items()}
    trials = []
    for combo in itertools.product(*axes.values()):
        picked = {k: (v.low if isinstance(v, Range) else v) for k, v in zip(axes, combo)}
        trials += [setting | picked | {"algorithm": method.algorithm, "seed": s} for s in seeds]
    return trials


def grid_trials(spec: StudySpec, anchors: bool | None = None) -> list[tuple[str, RunConfig]]:
    """(stage, validated config) of every trial: "anchor" for an anchor entry's trials, else
    "grid"; ordered data setting, common axes (e.g. local epochs), seed, method, the method's
    own axes, so that the anchors of a cell run beside its other methods; `anchors`
    True/False keeps only anchors / only the others."""
    seeds = list(spec.seeds)
    common = {k: v for k, v in spec.knobs.items() if k in COMMON_KNOBS and k not in DATA_KNOBS and isinstance(v, list)}
    keyed = []
    for s, setting in enumerate(data_settings(spec)):
        for m, method in enumerate(spec.methods):
            if anchors is not None and method.anchor != anchors:
                continue
            for i, trial in enumerate(method_trials(spec, method, setting, seeds)):
                position = tuple(_index(common[k], trial[k]) for k in common)
                kind = "anchor" if method.anchor else "grid"
                keyed.append(((s, position, seeds.index(trial["seed"]), m, i), (kind, trial)))
    return [(kind, RunConfig.from_dict(trial)) for _, (kind, trial) in sorted(keyed, key=lambda pair: pair[0])]


def _index(values: list[Any], value: Any) -> int:
    return values.index(value) if value in values else len(values)


def search_domains(spec: StudySpec, method: Method, fixed: dict[str, Any] | None = None) -> dict[str, Any]:
    """For a searched method: knob -> Range or list of choices (its non-data axes, less the
    knobs `fixed` sets: the study's axes under tune)."""
    fixed = fixed or {}
    return {k: v for k, v in method_values(spec, method).items() if isinstance(v, (Range, list)) and k not in fixed}


def axis_knobs(spec: StudySpec) -> tuple[str, ...]:
    """Under [search] tune, the common non-data knobs [knobs] gives a list of values (e.g.
    `participation = [1.0, 0.1]`): the study's axes, each value a setting of its own, searched
    and confirmed apart like a data setting, never a search dimension (a method's entry holds
    what is searched). None without tune."""
    if not spec.tune:
        return ()
    return tuple(k for k, v in spec.knobs.items() if k in COMMON_KNOBS and k not in DATA_KNOBS and isinstance(v, list))


def tuned_axes(spec: StudySpec) -> list[dict[str, Any]]:
    """Every combination of the study's axes' values (`axis_knobs`); one empty one without."""
    names = axis_knobs(spec)
    return [dict(zip(names, combo)) for combo in itertools.product(*(spec.knobs[k] for k in names))]


# ---------------------------------------------------------------------- stages
def plan_stages(spec: StudySpec) -> list[Stage]:
    """The stages of a sweep, every config validated (raises ConfigError / SweepError)."""
    spec = with_tuning(spec)
    if spec.pretraining is not None and not spec.selects:
        return pretrained_stages(grid_trials(spec), spec.pretraining)
    if not spec.selects:
        return [Stage("tune", "grid", tuple(grid_trials(spec)))]
    stages = selection_stages(spec)
    return stages if spec.pretraining is None else pretrained_selection(spec, stages)


def selection_stages(spec: StudySpec) -> list[Stage]:
    """anchors, then one select stage per (data setting, searched method) on the search seed."""
    stages = []
    anchors = grid_trials(spec, anchors=True)
    if anchors:
        stages.append(Stage("tune-anchors", "anchor", tuple(anchors)))
    first = [spec.search_seed]
    index = 0
    for setting, axes in itertools.product(data_settings(spec), tuned_axes(spec)):
        for method in spec.methods:
            if method.anchor:
                continue
            trials = [RunConfig.from_dict(t) for t in method_trials(spec, method, setting | axes, first, axes)]
            group = group_name(trials[0], axis_knobs(spec))
            no_val = [c for c in trials if c.val_fraction <= 0]
            if no_val:
                raise SweepError(f"{group}: a search or scheduler selects by validation accuracy, and these trials "
                                 f"have no validation split (val_fraction = 0); give --val-fraction 0.1 (or "
                                 f"val_fraction in the study's [knobs])")
            if spec.search == "optuna":
                domains = search_domains(spec, method, axes)
                _check_domains(trials[0], domains)
                stages.append(Stage(f"tune-select-{index}", "select", (("select", trials[0]),), domains, group))
            else:
                stages.append(Stage(f"tune-select-{index}", "select", tuple(("select", c) for c in trials), {}, group))
            index += 1
    return stages


def pretrained_selection(spec: StudySpec, stages: list[Stage]) -> list[Stage]:
    """A [pretraining] study that selects: the pretrain stage first, with a pretraining for every
    data setting and model of the later trials on the search seed and on every confirm seed (a
    selected configuration is confirmed on seeds that need their own), then the anchor and select
    stages, each trial naming its pretraining (`pretrained`); `confirm_stage` names the confirm
    seeds' ones."""
    bases = [c for stage in stages for _, c in stage.configs]
    needed = [c.replace(seed=s) for c in bases for s in (*spec.seeds, spec.search_seed)]
    first = {}
    for config in needed:
        pre = pretraining_config(config, spec.pretraining)
        first.setdefault(pre.config_hash(), pre)
    named = [Stage(s.name, s.kind, tuple((kind, with_pretraining(c, spec.pretraining)) for kind, c in s.configs),
                   s.domains, s.group) for s in stages]
    return [Stage("tune-pretrain", "pretrain", tuple(("pretrain", c) for c in first.values())), *named]


def with_pretraining(config: RunConfig, pretraining: Method | None) -> RunConfig:
    """The config naming its own pretraining's hash (unchanged without a [pretraining])."""
    return config if pretraining is None else config.replace(
        pretrained=pretraining_config(config, pretraining).config_hash())


def pretraining_config(config: RunConfig, pretraining: Method) -> RunConfig:
    """The pretraining a trial starts from: its data knobs (every one, the seed and the validation
    split included: the pretraining sees exactly its clients) and its model, the [pretraining]
    table's algorithm and knobs, every other knob at its default."""
    data = {k: getattr(config, k) for k in DATA_KNOBS}
    return RunConfig.from_dict(data | {"model": config.model, "algorithm": pretraining.algorithm} | pretraining.knobs)


def pretrained_stages(trials: list[tuple[str, RunConfig]], pretraining: Method) -> list[Stage]:
    """[pretraining] study: the pretrain stage (each distinct pretraining once, in the order of the
    trials that need it), then the trials, each naming its pretraining (`pretrained`)."""
    first: dict[str, RunConfig] = {}
    second = []
    for kind, config in trials:
        pre = pretraining_config(config, pretraining)
        first.setdefault(pre.config_hash(), pre)
        second.append((kind, config.replace(pretrained=pre.config_hash())))
    return [Stage("tune-pretrain", "pretrain", tuple(("pretrain", c) for c in first.values())),
            Stage("tune", "grid", tuple(second))]


def _check_domains(base: RunConfig, domains: dict[str, Any]) -> None:
    """Both ends of every range and every choice make a valid config (one error, before any work)."""
    for knob, domain in domains.items():
        if knob in DATA_KNOBS:
            raise SweepError(f"{knob}: data settings are never searched")
        values = [domain.low, domain.high] if isinstance(domain, Range) else list(domain)
        for value in values:
            base.replace(**{knob: int(value) if isinstance(getattr(base, knob), int) and float(value).is_integer()
                            else value})


def confirm_stage(spec: StudySpec, winners: list[RunConfig]) -> Stage | None:
    """The winners of the select stages on every seed of the study, each naming that seed's
    pretraining where the study has one (None: nothing to run)."""
    trials = [("confirm", with_pretraining(c.replace(seed=s), spec.pretraining)) for c in winners for s in spec.seeds]
    return Stage("tune-confirm", "confirm", tuple(trials)) if trials else None


def best_completed(results: list[tuple[RunConfig, dict[str, Any]]]) -> RunConfig | None:
    """The select trial to confirm: the highest objective among trials that reported their last
    round (never one a scheduler stopped early) and did not diverge (the trainable's `diverged`);
    ties go to the smaller config hash, so a resumed sweep picks the same one."""
    done = [(config, metrics[OBJECTIVE]) for config, metrics in results
            if reached_last_round(config, metrics) and metrics.get(OBJECTIVE) == metrics.get(OBJECTIVE)
            and not metrics.get("diverged", False)]
    if not done:
        return None
    return min(done, key=lambda pair: (-pair[1], pair[0].config_hash()))[0]


def data_configs(spec: StudySpec, stages: list[Stage]) -> list[RunConfig]:
    """One config per data the sweep will need (every data setting on every seed, including the
    seeds only a confirm stage will run, and the search seed), so that the driver loads each once."""
    seeds = [*spec.seeds, spec.search_seed] if spec.selects else list(spec.seeds)
    out = []
    for stage in stages:
        for _, config in stage.configs:
            out += [config.replace(seed=s) for s in seeds]
    return out
