"""FedSelect grid: personalization rate p x personalization limit α x Dirichlet α x local epochs,
plus FedAvg and Local anchors on the same data settings. Each federated run is one Ray Tune trial.

    python sweeps/fedselect_grid.py                       # default study: digits, 32 trials, ~3 min on 2 cores
    python sweeps/fedselect_grid.py --pers-rate 0.1 0.25 0.5 --seeds 0 1 2
    python sweeps/fedselect_grid.py --preset paper --gpus-per-trial 0.25
    python sweeps/fedselect_grid.py --resume              # continue the latest interrupted sweep
"""
from __future__ import annotations

import argparse
import itertools
import json
import sys
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make the repository importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from fl_core.algorithms import params_class  # noqa: E402
from fl_core.config import RunConfig  # noqa: E402
from sweeps.plan import DATA_CHOICE  # noqa: E402
from sweeps.study import Study, add_axis, data_settings, run_study, trial_grid  # noqa: E402

AXES = ("pers_rate", "pers_limit")
# The paper's CIFAR-10 / ResNet-18 study. Values marked "reference code" are the defaults of the
# public FedSelect code (its utils/options.py), used where the paper's own values could not be
# recovered; values marked "ours" are this project's choices for the swept axes.
PAPER_PRESET = {
    "dataset": ["cifar10"],           # paper
    "model": "resnet18",              # reference code (torchvision ResNet-18, ImageNet stem)
    "partition": ["shards"],          # paper: pathological non-IID, 2 classes per client
    "shards_per_client": 2,           # reference code
    "samples_per_client": 100,        # paper: 100 training samples per client
    "num_clients": 10,                # ours (reference code: 100 clients, 10 % sampled per round)
    "rounds": 50,                     # ours
    "batch_size": 32,                 # reference code (local_bs)
    "lr": 0.05,                       # reference code
    "pers_rate": [0.25],              # reference code (prune_percent 25)
    "pers_limit": [0.2, 0.4, 0.6, 0.8],  # ours around the reference code's prune_target 80
    "dir_alpha": [0.5],               # unused by shards; one value
    "local_epochs": [1, 3],           # ours
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    axes = parser.add_argument_group("swept axes (each a list; the grid is their product)")
    fedselect = params_class("fedselect")
    add_axis(axes, "--pers-rate", "pers_rate", float, [0.1, 0.25, 0.5], owner=fedselect)
    add_axis(axes, "--pers-limit", "pers_limit", float, [0.5, 0.8], owner=fedselect)
    axes.add_argument("--anchors", nargs="*", default=["fedavg", "local"],
                      help="methods run once per data setting, epochs value and seed as anchors, with their own "
                           "default knobs (none: --anchors) (default: fedavg local)")
    axes.add_argument("--preset", choices=("default", "paper"), default="default",
                      help="paper: the CIFAR-10 / ResNet-18 study; it sets data, model and axes, overriding "
                           "those flags (values and sources: PAPER_PRESET in this file) (default: default)")


def apply_preset(args: argparse.Namespace) -> argparse.Namespace:
    if getattr(args, "preset", "default") == "paper":
        for key, value in PAPER_PRESET.items():
            setattr(args, key, value)
    return args


def grid(args: argparse.Namespace) -> list[dict]:
    args = apply_preset(args)
    fedselect = [{"algorithm": "fedselect", "pers_rate": p, "pers_limit": a}
                 for p, a in itertools.product(args.pers_rate, args.pers_limit)]
    anchors = [{"algorithm": algorithm} for algorithm in args.anchors]  # no FedSelect knobs: not theirs
    return trial_grid(args, fedselect + anchors, AXES)


def search(args: argparse.Namespace, configs: list[RunConfig]) -> tuple[RunConfig, dict]:
    """Optuna: p and α as ranges spanning the given values; local epochs and the data setting
    (all loaded up front) as choices; the first seed. The base is the grid's first FedSelect trial."""
    from ray import tune

    args = apply_preset(args)

    def span(values):
        return tune.uniform(min(values), max(values)) if min(values) < max(values) else values[0]

    base = next(c for c in configs if c.algorithm == "fedselect")
    domains = {"pers_rate": span(args.pers_rate), "pers_limit": span(args.pers_limit),
               "local_epochs": tune.choice(args.local_epochs)}
    settings = data_settings(args)
    if len(settings) > 1:
        domains[DATA_CHOICE] = tune.choice([json.dumps(s) for s in settings])
    return base, domains


STUDY = Study(
    name="fedselect_grid",
    description=__doc__.split("\n\n")[0],
    add_arguments=add_arguments,
    grid=grid,
    columns={"algorithm": "algo", "pers_rate": "p", "pers_limit": "α", "dir_alpha": "Dir α", "local_epochs": "epochs"},
    axes=AXES,
    search=search,
    defaults={"local_epochs": [1, 2]},
)

if __name__ == "__main__":
    sys.exit(run_study(STUDY))
