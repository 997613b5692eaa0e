"""FedSelect grid: personalization rate p x personalization limit α x Dirichlet α x local epochs,
plus FedAvg and Local anchors on the same data settings. Each federated run is one Ray Tune trial.

    python sweeps/fedselect_grid.py                       # default study: digits, ~5 min on 2 cores
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

from ray import tune  # noqa: E402

from sweeps.study import Study, common_config, data_settings, run_study, trial_grid  # noqa: E402

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
    axes.add_argument("--pers-rate", type=float, nargs="+", default=[0.1, 0.25, 0.5], help="FedSelect p values")
    axes.add_argument("--pers-limit", type=float, nargs="+", default=[0.5, 0.8], help="FedSelect α values")
    axes.add_argument("--anchors", nargs="*", default=["fedavg", "local"],
                      help="algorithms run once per data setting and epochs value as anchors (none: --anchors)")
    axes.add_argument("--preset", choices=("default", "paper"), default="default",
                      help="paper: the CIFAR-10 / ResNet-18 study; it sets data, model and axes, overriding "
                           "those flags (values and sources: PAPER_PRESET in this file)")


def apply_preset(args: argparse.Namespace) -> argparse.Namespace:
    if getattr(args, "preset", "default") == "paper":
        for key, value in PAPER_PRESET.items():
            setattr(args, key, value)
    return args


def grid(args: argparse.Namespace) -> list[dict]:
    args = apply_preset(args)
    fedselect = [{"algorithm": "fedselect", "pers_rate": p, "pers_limit": a}
                 for p, a in itertools.product(args.pers_rate, args.pers_limit)]
    # Anchors carry p = α = 0 (no personalization) so that every trial has every column.
    anchors = [{"algorithm": algo, "pers_rate": 0.0, "pers_limit": 0.0} for algo in args.anchors]
    return trial_grid(args, fedselect + anchors)


def search_space(args: argparse.Namespace) -> dict:
    """Optuna: p and α as ranges spanning the given values; Dirichlet α and epochs as choices
    (their data settings are loaded once up front); the first seed."""
    args = apply_preset(args)

    def span(values):
        return tune.uniform(min(values), max(values)) if min(values) < max(values) else values[0]

    settings = data_settings(args)
    return common_config(args) | {
        "algorithm": "fedselect", "seed": args.seeds[0],
        "pers_rate": span(args.pers_rate), "pers_limit": span(args.pers_limit),
        "local_epochs": tune.choice(args.local_epochs),
        # one choice per data setting (dataset, partition, Dir α; all loaded up front), as JSON text
        # because Optuna's categorical values must be plain scalars
        **(settings[0] if len(settings) == 1 else {"data": tune.choice([json.dumps(s) for s in settings])}),
    }


STUDY = Study(
    name="fedselect_grid",
    description=__doc__.split("\n\n")[0],
    add_arguments=add_arguments,
    grid=grid,
    search_space=search_space,
    columns={"algorithm": "algo", "pers_rate": "p", "pers_limit": "α", "dir_alpha": "Dir α", "local_epochs": "epochs"},
    defaults={"local_epochs": [1, 2]},
)

if __name__ == "__main__":
    sys.exit(run_study(STUDY))
