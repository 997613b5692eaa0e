"""A sweep's stages: which trials run together under which search and scheduler.

A plain grid (search kind = grid, scheduler = fifo) is one stage, `tune`: every trial, anchors
included, run to completion.

With a search or a scheduler, selection must not mislead, so the sweep runs in stages, each a
Ray Tune experiment of its own (folder `tune-<stage>` in the sweep, resumed stage by stage):
  anchors     the anchor methods on every data setting and seed, to completion, no scheduler
  select-<i>  one per (data setting, searched method): the method's grid (ASHA) or an Optuna
              search of `num_samples` configurations, on the first seed, scheduled/maximised on
              the trial's `objective`: validation accuracy (a validation split is required). Data
              settings are never a search dimension and never share an ASHA bracket
  confirm     per select stage, its best COMPLETED configuration (highest objective at the final
              round; an early-stopped trial never wins) re-run on the other seeds, to completion
Every trial row records its stage (`stage`: grid, anchor, select, confirm), so tables compare the
confirmed configurations with the anchors over the same seeds at the same round, and the select
trials (single seed, partly stopped) go to the search's own table and figure.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from fl_core.config import DATA_KNOBS, RunConfig
from fl_core.results import setting_label

from .errors import SweepError
from .plan import reached_last_round
from .spec import Range, StudySpec, data_settings, grid_trials, method_trials, search_domains

OBJECTIVE = "objective"   # what every trial reports for selection (see `objective_of`)


@dataclass(frozen=True)
class Stage:
    name: str                                          # Tune experiment folder: <sweep>/<name>
    kind: str                                          # grid (plain sweep), anchor, select, confirm
    configs: tuple[tuple[str, RunConfig], ...] = ()    # (stage of the trial, config); a search: its base
    domains: dict[str, Any] = field(default_factory=dict)  # optuna: knob -> Range or list of choices
    group: str = ""                                    # select: "<data setting> / <method>"

    @property
    def searched(self) -> bool:
        return bool(self.domains)


def objective_of(config: RunConfig) -> str:
    """The metric selection uses for this trial: validation accuracy when it has a split."""
    return "acc_val_mean" if config.val_fraction > 0 else "acc_mean"


def plan_stages(spec: StudySpec) -> list[Stage]:
    """The stages of a sweep, every config validated (raises ConfigError / SweepError)."""
    if not spec.selects:
        trials = [("anchor" if _is_anchor(spec, t) else "grid", RunConfig.from_dict(t)) for t in grid_trials(spec)]
        return [Stage("tune", "grid", tuple(trials))]
    stages = []
    anchors = grid_trials(spec, anchors=True)
    if anchors:
        stages.append(Stage("tune-anchors", "anchor", tuple(("anchor", RunConfig.from_dict(t)) for t in anchors)))
    first = spec.seeds[:1]
    index = 0
    for setting in data_settings(spec):
        for method in spec.methods:
            if method.anchor:
                continue
            trials = [RunConfig.from_dict(t) for t in method_trials(spec, method, setting, first)]
            group = f"{setting_label(trials[0].to_dict())} / {trials[0].label()}"
            no_val = [c for c in trials if c.val_fraction <= 0]
            if no_val:
                raise SweepError(f"{group}: a search or scheduler selects by validation accuracy, and these trials "
                                 f"have no validation split (val_fraction = 0); give --val-fraction 0.1 (or "
                                 f"val_fraction in the study's [knobs])")
            if spec.search == "optuna":
                domains = search_domains(spec, method)
                _check_domains(trials[0], domains)
                stages.append(Stage(f"tune-select-{index}", "select", (("select", trials[0]),), domains, group))
            else:
                stages.append(Stage(f"tune-select-{index}", "select", tuple(("select", c) for c in trials), {}, group))
            index += 1
    return stages


def _is_anchor(spec: StudySpec, trial: dict[str, Any]) -> bool:
    return any(m.anchor and m.algorithm == trial["algorithm"] for m in spec.methods) and not any(
        not m.anchor and m.algorithm == trial["algorithm"] for m in spec.methods)


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
    """The winners of the select stages on the seeds other than the first (None: nothing to run)."""
    trials = [("confirm", c.replace(seed=s)) for c in winners for s in spec.seeds[1:]]
    return Stage("tune-confirm", "confirm", tuple(trials)) if trials else None


def best_completed(results: list[tuple[RunConfig, dict[str, Any]]]) -> RunConfig | None:
    """The select trial to confirm: the highest objective among trials that reported their last
    round (never one a scheduler stopped early); ties go to the smaller config hash, so a resumed sweep picks the same one."""
    done = [(config, metrics[OBJECTIVE]) for config, metrics in results
            if reached_last_round(config, metrics) and metrics.get(OBJECTIVE) == metrics.get(OBJECTIVE)]
    if not done:
        return None
    return min(done, key=lambda pair: (-pair[1], pair[0].config_hash()))[0]


def data_configs(spec: StudySpec, stages: list[Stage]) -> list[RunConfig]:
    """One config per data the sweep will need (every data setting on every seed, including the
    seeds only a confirm stage will run), so that the driver loads each once."""
    out = []
    for stage in stages:
        for _, config in stage.configs:
            out += [config.replace(seed=s) for s in spec.seeds]
    return out
