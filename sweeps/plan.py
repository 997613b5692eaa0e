"""How a trial's configuration travels through Ray Tune, in both directions, defined once.

Driver -> Tune: the study builds and validates every trial's `RunConfig` first; Tune then gets
their flat dicts (`RunConfig.to_dict()`), never raw flag values:
  grid   {"trial": grid_search([{"run": <flat config>, "stage": <stage>, "show": <progress cells>}, ...])}
  optuna {"run": <flat config of a validated base trial>, "stage": "select", <knob>: <Tune domain>, ...}
(`stage`: which stage of the sweep the trial belongs to, see sweeps/stages.py; an Optuna search
never samples the data setting: each data setting has its own search.) `show` holds the
progress-table cells of each trial ("-" where a trial lacks the knob, e.g. p for the FedAvg anchor),
so that Tune's reporter never looks up a key a trial does not have.

Tune -> trial: `run_config(tune_config)` is the one way back to a `RunConfig`; the trainable, the
trials table and the MLflow sink all use it.

`SweepPlan` is what a study hands to `sweeps.launch`: the launcher needs nothing else from it.
Light module (no Ray import), so that trials and tests can use it cheaply.
"""
from __future__ import annotations

import argparse
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fl_core.config import RunConfig

DATA_CHOICE = "data"   # sweep format 3: an Optuna-sampled data setting as JSON (read back, never written)
MISSING_CELL = "-"


@dataclass(frozen=True)
class SweepPlan:
    """A validated sweep, ready to launch."""

    study: str                       # the study's name: MLflow experiment and sweep-name prefix
    command: str                     # how the study is started, e.g. `python -m sweeps.run fedl2p`
    folder: Path                     # <results>/<sweep name>
    args: argparse.Namespace         # where and how it runs (results, resources, ...; saved to sweep.json)
    spec: Any                        # the resolved study spec (sweeps.spec.StudySpec; saved to study.toml)
    stages: tuple[Any, ...]          # sweeps.stages.Stage, in order (a confirm stage is added at run time)
    knobs: tuple[str, ...] = ()      # the study's knobs and those that vary (the summary's columns)
    named: tuple[str, ...] = ()      # the knobs the study file names per method or searches (always shown)

    @property
    def configs(self) -> list[RunConfig]:
        """Every trial known before the sweep runs (a search's samples are not)."""
        return [config for stage in self.stages if not stage.searched for _, config in stage.configs]

    @property
    def search(self) -> str:
        return self.spec.search


COLUMN_TITLES = {"algorithm": "algo", "dataset": "data", "partition": "split", "dir_alpha": "Dir α",
                 "local_epochs": "epochs", "seed": "seed", "shards_per_client": "shards", "pers_rate": "p",
                 "pers_limit": "α", "fedselect_variant": "variant", "layer_block": "block"}


def varying_knobs(configs: list[RunConfig]) -> list[str]:
    """The knobs whose values differ among the `configs` that have them."""
    flat = [c.semantic_dict() for c in configs]
    names = list(dict.fromkeys(k for d in flat for k in d))
    return [k for k in names if len({repr(d[k]) for d in flat if k in d}) > 1]


def progress_columns(configs: list[RunConfig], named: tuple[str, ...] = ()) -> dict[str, str]:
    """knob -> column title for Tune's progress table: the method, the knobs the study names
    (`named`: its methods' own knobs, a search's knobs) and every knob that varies."""
    present = {k for c in configs for k in c.semantic_dict()}
    knobs = ["algorithm", *[k for k in named if k in present], *varying_knobs(configs)]
    return {k: COLUMN_TITLES.get(k, k) for k in dict.fromkeys(knobs) if k != "seed" or len(configs) > 1}


def grid_space(trials: Sequence[tuple[str, RunConfig]], columns: Mapping[str, str],
               stop_after: Mapping[str, int] | None = None) -> tuple[dict[str, Any], dict[str, str]]:
    """(Tune param space, progress-table columns) of a grid over validated configs, each with the
    stage it belongs to; `columns` maps knob names to column titles; `stop_after` (config hash ->
    round): trials that end after that round (a repair run, sweeps/damage.py)."""
    from ray import tune

    rows = []
    for stage, config in trials:
        flat = config.to_dict()
        rows.append({"run": flat, "stage": stage,
                     "show": {title: flat.get(knob, MISSING_CELL) for knob, title in columns.items()}}
                    | ({"stop_after": stop_after[config.config_hash()]} if stop_after else {}))
    return {"trial": tune.grid_search(rows)}, {f"trial/show/{title}": title for title in columns.values()}


def search_space(base: RunConfig, domains: Mapping[str, Any], columns: Mapping[str, str]) -> tuple[dict, dict]:
    """(Tune param space, progress-table columns) of a search: Tune domains for some knobs
    (`sweeps.spec.Range` -> uniform or log-uniform, int knobs -> integers; a list -> a choice),
    merged into the flat dict of a validated base config."""
    from ray import tune

    from .spec import Range

    flat = base.to_dict()
    unknown = [k for k in domains if k not in flat]
    if unknown:
        raise KeyError(f"searched knob(s) {', '.join(unknown)} are not knobs of {base.algorithm}")
    space: dict[str, Any] = {"run": flat, "stage": "select"}
    for knob, domain in domains.items():
        if not isinstance(domain, Range):
            space[knob] = tune.choice(list(domain))
        elif isinstance(flat[knob], int) and not isinstance(flat[knob], bool):
            low, high = int(math.ceil(domain.low)), int(math.floor(domain.high)) + 1
            space[knob] = tune.lograndint(low, high) if domain.log else tune.randint(low, high)
        else:
            space[knob] = (tune.loguniform(domain.low, domain.high) if domain.log else
                           tune.uniform(domain.low, domain.high))
    shown = {k: title for k, title in columns.items() if k in domains}
    return space, shown


def reached_last_round(config: RunConfig, metrics: Mapping[str, Any]) -> bool:
    """Whether a trial's last reported result is its final round. Not Tune's `done`: Tune sets
    `done` on the last result of a trial its scheduler stopped early too."""
    return metrics.get("round") == config.rounds


def run_config(tune_config: Mapping[str, Any]) -> RunConfig:
    """The RunConfig of a trial from its Tune config (grid or search layout, see above)."""
    if "run" not in tune_config.get("trial", tune_config):
        raise ValueError("this Tune config has no validated 'run' config: the sweep was started before engine v2 "
                         "and cannot be resumed; start it again (its Parquet results stay readable by analysis)")
    if "trial" in tune_config:
        return RunConfig.from_dict(dict(tune_config["trial"]["run"]))
    flat = dict(tune_config["run"])
    for key, value in tune_config.items():
        if key == DATA_CHOICE:  # sweeps before sweep format 4 searched over data settings
            flat.update(json.loads(value))
        elif key not in ("run", "stage"):
            flat[key] = value
    return RunConfig.from_dict(flat)
