"""How a trial's configuration travels through Ray Tune, in both directions, defined once.

Driver -> Tune: the study builds and validates every trial's `RunConfig` first; Tune then gets
their flat dicts (`RunConfig.to_dict()`), never raw flag values:
  grid   {"trial": grid_search([{"run": <flat config>, "show": <progress-table cells>}, ...])}
  optuna {"run": <flat config of a validated base trial>, <knob>: <Tune domain>, ...,
          "data": choice([<data setting as JSON>, ...])}
`show` holds the progress-table cells of each trial ("-" where a trial lacks the knob, e.g. p for
the FedAvg anchor), so that Tune's reporter never looks up a key a trial does not have.

Tune -> trial: `run_config(tune_config)` is the one way back to a `RunConfig`; the trainable, the
trials table and the MLflow sink all use it.

`SweepPlan` is what a study hands to `sweeps.launch`: the launcher needs nothing else from it.
Light module (no Ray import), so that trials and tests can use it cheaply.
"""
from __future__ import annotations

import argparse
import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fl_core.config import RunConfig

DATA_CHOICE = "data"   # Optuna: a sampled data setting, as JSON text (categoricals must be scalars)
MISSING_CELL = "-"


@dataclass(frozen=True)
class SweepPlan:
    """A validated sweep, ready to launch."""

    study: str                       # MLflow experiment and sweep-name prefix
    folder: Path                     # <results>/<sweep name>
    args: argparse.Namespace         # the sweep's flags (saved to sweep.json for --resume)
    configs: list[RunConfig]         # every trial (grid) or every data setting to load (optuna)
    param_space: dict[str, Any]      # what Tune receives (see the module docstring)
    columns: dict[str, str]          # progress table: Tune config path -> column title
    search: str = "grid"             # grid or optuna
    knobs: tuple[str, ...] = ()      # the knobs the study shows (its summary's columns)


def grid_space(configs: list[RunConfig], columns: Mapping[str, str]) -> tuple[dict[str, Any], dict[str, str]]:
    """(Tune param space, progress-table columns) of a grid over validated configs; `columns`
    maps knob names to column titles."""
    from ray import tune

    trials = []
    for config in configs:
        flat = config.to_dict()
        trials.append({"run": flat, "show": {title: flat.get(knob, MISSING_CELL) for knob, title in columns.items()}})
    return {"trial": tune.grid_search(trials)}, {f"trial/show/{title}": title for title in columns.values()}


def search_space(base: RunConfig, domains: Mapping[str, Any], columns: Mapping[str, str]) -> tuple[dict, dict]:
    """(Tune param space, progress-table columns) of a search: Tune domains for some knobs (and
    optionally `DATA_CHOICE`), merged into the flat dict of a validated base config."""
    unknown = [k for k in domains if k != DATA_CHOICE and k not in base.to_dict()]
    if unknown:
        raise KeyError(f"searched knob(s) {', '.join(unknown)} are not knobs of {base.algorithm}")
    space = {"run": base.to_dict(), **domains}
    shown = {k: title for k, title in (dict(columns) | {DATA_CHOICE: DATA_CHOICE}).items() if k in domains}
    return space, shown


def run_config(tune_config: Mapping[str, Any]) -> RunConfig:
    """The RunConfig of a trial from its Tune config (grid or search layout, see above)."""
    if "run" not in tune_config.get("trial", tune_config):
        raise ValueError("this Tune config has no validated 'run' config: the sweep was started before engine v2 "
                         "and cannot be resumed; start it again (its Parquet results stay readable by analysis)")
    if "trial" in tune_config:
        return RunConfig.from_dict(dict(tune_config["trial"]["run"]))
    flat = dict(tune_config["run"])
    for key, value in tune_config.items():
        if key == DATA_CHOICE:
            flat.update(json.loads(value))
        elif key != "run":
            flat[key] = value
    return RunConfig.from_dict(flat)
