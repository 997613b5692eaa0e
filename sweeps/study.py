"""The sweep machinery every study script shares: flags, validation, data once, Ray Tune, sinks,
resume, summary. A study script only says which trials it wants (`Study`).

Order of work in `run_study`, so that bad input fails before anything expensive:
  1. parse flags (or reload them from the sweep folder on --resume);
  2. build every trial's RunConfig: a bad value is a ConfigError naming it (exit 2);
  3. load each distinct data setting once (missing files: DataError, exit 2);
  4. start or join Ray, check the per-trial request against the cluster (SweepError, exit 2);
  5. run (or restore) the Tuner with the MLflow callback; Parquet is written by the trials;
  6. write trials.parquet and print the best configurations and where everything is.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fl_core.config import ConfigError, RunConfig
from fl_core.data import DataError

from .errors import SweepError

COMMON_KNOBS = ("model", "num_clients", "shards_per_client", "samples_per_client", "test_samples_per_client",
                "rounds", "batch_size", "lr", "data_root")
RESUME_OVERRIDES = ("address", "cpus_per_trial", "gpus_per_trial", "max_failures", "resume", "name", "results",
                    "max_concurrent", "verbose")


@dataclass(frozen=True)
class Study:
    """What a study script contributes: its name, its flags, and its trials."""

    name: str                                                  # MLflow experiment, sweep-name prefix
    description: str
    add_arguments: Callable[[argparse.ArgumentParser], None]   # the study's own axes
    grid: Callable[[argparse.Namespace], list[dict]]           # grid trials (RunConfig keys)
    search_space: Callable[[argparse.Namespace], dict] | None  # Tune space for --search optuna (None: grid only)
    columns: dict[str, str]                                    # progress-table parameter columns
    defaults: dict[str, Any] = field(default_factory=dict)     # the study's defaults for common flags


# ====================================================================== flags
def build_parser(study: Study) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=f"python sweeps/{study.name}.py", description=study.description,
        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    study.add_arguments(parser)
    data = parser.add_argument_group("data and model (lists are crossed: datasets x partitions x Dir α)")
    defaults = RunConfig()
    data.add_argument("--dataset", nargs="+", default=[defaults.dataset],
                      help="datasets: digits (offline), mnist, cifar10, synthetic")
    data.add_argument("--partition", nargs="+", default=["dirichlet"], help="partitions: dirichlet, shards, iid")
    data.add_argument("--dir-alpha", type=float, nargs="+", default=[0.1, 0.5],
                      help="Dirichlet α values (used by the dirichlet partition only)")
    data.add_argument("--local-epochs", type=int, nargs="+", default=[1], help="local epoch values")
    data.add_argument("--model", default=defaults.model, help="auto, lenet, cnn2, resnet18_cifar, resnet18")
    data.add_argument("--num-clients", type=int, default=defaults.num_clients)
    data.add_argument("--shards-per-client", type=int, default=defaults.shards_per_client)
    data.add_argument("--samples-per-client", type=_optional_int, default=None,
                      help="cap on each client's training samples (none = no cap)")
    data.add_argument("--test-samples-per-client", type=_optional_int, default=None)
    data.add_argument("--rounds", type=int, default=defaults.rounds)
    data.add_argument("--batch-size", type=int, default=defaults.batch_size)
    data.add_argument("--lr", type=float, default=defaults.lr)
    data.add_argument("--data-root", default=None, help="torchvision-layout data folder (mnist, cifar10)")
    data.add_argument("--seeds", type=int, nargs="+", default=[0], help="one trial per seed and configuration")

    out = parser.add_argument_group("results")
    out.add_argument("--results", type=Path, default=Path("results"), help="results folder (all sweeps)")
    out.add_argument("--name", default=None, help="sweep name (default: <study>-<date>-<time>)")
    out.add_argument("--tracking-uri", default=None,
                     help="MLflow tracking URI (default: sqlite store <results>/mlflow.db)")
    out.add_argument("--resume", action="store_true",
                     help="continue an interrupted sweep (--name, or the latest sweep of this study)")
    out.add_argument("--checkpoint-every", type=int, default=1, help="checkpoint the simulation every k rounds")
    out.add_argument("--verbose", type=int, default=1, choices=(0, 1, 2), help="Tune verbosity")

    run = parser.add_argument_group("resources and search")
    run.add_argument("--cpus-per-trial", type=float, default=1.0)
    run.add_argument("--gpus-per-trial", default="auto",
                     help="GPUs per trial: a fraction packs trials (0.25 = four per GPU); auto = 0.25 on a "
                          "cluster with GPUs, 0 without")
    run.add_argument("--address", default=None, help="join an existing Ray cluster (e.g. ray://host:10001 or auto)")
    run.add_argument("--max-concurrent", type=int, default=None, help="cap on trials running at once")
    run.add_argument("--max-failures", type=int, default=2, help="retries of a crashed trial (from its checkpoint)")
    run.add_argument("--search", choices=("grid", "optuna"), default="grid")
    run.add_argument("--num-samples", type=int, default=16, help="trials for --search optuna")
    run.add_argument("--scheduler", choices=("fifo", "asha"), default="fifo",
                     help="asha stops poor trials early (on acc_mean per round)")
    run.add_argument("--inject-crash-at-round", type=int, default=None, help=argparse.SUPPRESS)  # test hook
    parser.set_defaults(**study.defaults)
    return parser


def _optional_int(text: str) -> int | None:
    return None if text.lower() == "none" else int(text)


def common_config(args: argparse.Namespace) -> dict[str, Any]:
    """The knobs shared by every trial of a sweep."""
    return {k: getattr(args, k) for k in COMMON_KNOBS}


def data_settings(args: argparse.Namespace) -> list[dict[str, Any]]:
    """Every (dataset, partition, Dir α) setting of a sweep. Dir α only varies for the dirichlet
    partition; other partitions get RunConfig's default, so they are not repeated per Dir α."""
    settings = []
    for dataset in args.dataset:
        for partition in args.partition:
            alphas = args.dir_alpha if partition == "dirichlet" else [RunConfig().dir_alpha]
            settings += [{"dataset": dataset, "partition": partition, "dir_alpha": a} for a in alphas]
    return settings


def trial_grid(args: argparse.Namespace, variants: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The product of data settings x local epochs x seeds x the study's own `variants`."""
    base = common_config(args)
    return [base | setting | {"local_epochs": e, "seed": s} | variant
            for setting in data_settings(args) for e in args.local_epochs for s in args.seeds
            for variant in variants]


def validate_trials(trials: list[dict]) -> list[RunConfig]:
    """Every trial's RunConfig, or one ConfigError naming the first bad value."""
    if not trials:
        raise SweepError("the sweep has no trials; give at least one value per axis")
    configs = [RunConfig.from_dict(t) for t in trials]
    hashes = [c.config_hash() for c in configs]
    if len(set(hashes)) != len(hashes):
        raise SweepError("the grid lists the same configuration twice (repeated axis values?)")
    return configs


# ====================================================================== sweep folder
def sweep_folder(study: Study, args: argparse.Namespace) -> Path:
    results = args.results.resolve()
    if args.resume:
        if args.name:
            folder = results / args.name
        else:
            found = sorted(results.glob(f"{study.name}-*/sweep.json"), key=lambda p: p.stat().st_mtime)
            if not found:
                raise SweepError(f"--resume: no {study.name} sweep under {results}")
            folder = found[-1].parent
        if not (folder / "sweep.json").exists():
            raise SweepError(f"--resume: {folder} holds no sweep (no sweep.json)")
        return folder
    name = args.name or f"{study.name}-{time.strftime('%Y%m%d-%H%M%S')}"
    folder = results / name
    if (folder / "sweep.json").exists():
        raise SweepError(f"sweep {name!r} already exists in {results}; use --resume to continue it or another --name")
    return folder


def save_args(folder: Path, args: argparse.Namespace) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    saved = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()}
    (folder / "sweep.json").write_text(json.dumps(saved, indent=1))


def load_args(folder: Path, current: argparse.Namespace) -> argparse.Namespace:
    """The flags the sweep was started with; resources and address may change on resume."""
    saved = json.loads((folder / "sweep.json").read_text())
    for key in RESUME_OVERRIDES:
        saved[key] = getattr(current, key)
    saved["results"] = Path(saved["results"])
    saved["name"] = folder.name
    return argparse.Namespace(**saved)


# ====================================================================== the run
def run_study(study: Study, argv: list[str] | None = None) -> int:
    parser = build_parser(study)
    args = parser.parse_args(argv)
    try:
        return _run(study, args)
    except (ConfigError, DataError, SweepError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2


def _run(study: Study, args: argparse.Namespace) -> int:
    from . import resources

    folder = sweep_folder(study, args)
    if args.resume:
        args = load_args(folder, args)
    gpus = resources.parse_gpus(args.gpus_per_trial)
    if args.checkpoint_every < 1:
        raise SweepError(f"--checkpoint-every {args.checkpoint_every} must be >= 1")
    if args.search == "optuna" and study.search_space is None:
        raise SweepError(f"--search optuna: the {study.name} study is a grid only; drop --search")
    if args.search == "optuna" and args.num_samples < 1:
        raise SweepError(f"--num-samples {args.num_samples} must be >= 1")

    configs = validate_trials(study.grid(args))  # bad values fail here, before any data or Ray
    from .launch import launch                    # heavy imports (ray, mlflow) only for valid sweeps
    return launch(study, args, folder, configs, gpus)
