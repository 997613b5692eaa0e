"""The sweep machinery every study script shares: flags, trials, validation. A study script only
says which trials it wants (`Study`); `run_study` does the rest.

Flags. The run knobs are generated from their declarations (`fl_core.config.add_run_arguments`:
help, allowed values, default), so every knob of fl_core is reachable from every study, except
  - the swept axes, which take lists: --dataset, --partition, --dir-alpha, --local-epochs,
    --seeds, and the study's own axes (`Study.axes`, e.g. FedSelect's p and α in the grid);
  - --algorithm (the study says which methods run), --device and --threads (a trial's resources,
    --cpus-per-trial and --gpus-per-trial, decide them).
A method knob (e.g. --ft-epochs) applies to the trials of the methods that own it only; giving
one that no trial of the sweep can use is an error.

Order of work in `run_study`, so that bad input fails before anything expensive:
  1. parse flags (or reload them from the sweep folder on --resume);
  2. build every trial's RunConfig: a bad value is one ConfigError naming it (exit 2);
  3. hand the validated configs to `sweeps.launch` (data loaded once per data setting, Ray,
     Tune, sinks, trials table, summary, tables and figures).
"""
from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fl_core.config import (COMMON_KNOBS, DIRICHLET_PARTITIONS, ConfigError, RunConfig, add_run_arguments, knob_owners,
                            split_run_arguments)
from fl_core.data import DataError
from fl_core.knobs import knob_fields

from .errors import SweepError
from .folder import load_args, sweep_folder
from .plan import SweepPlan, grid_space, search_space

# Knobs every study sweeps as lists (flags of their own), and knobs no study takes as flags.
LIST_AXES = ("dataset", "partition", "dir_alpha", "local_epochs", "seed")
NOT_FLAGS = ("algorithm", "device", "threads")
# Three seeds by default: on digits/MNIST the spread over seeds (about 0.1 for a single run) is
# larger than most gaps between methods, so a one-seed table would rank noise.
DEFAULT_SEEDS = [0, 1, 2]


@dataclass(frozen=True)
class Study:
    """What a study script contributes: its name, its own flags and axes, and its trials."""

    name: str                                                  # MLflow experiment, sweep-name prefix
    description: str
    add_arguments: Callable[[argparse.ArgumentParser], None]   # the study's own flags
    grid: Callable[[argparse.Namespace], list[dict]]           # trials as flat RunConfig keywords
    columns: dict[str, str]                                    # progress table: knob -> column title
    axes: tuple[str, ...] = ()                                 # knobs the study sweeps with its own flags
    # --search optuna: (args, validated grid configs) -> (base config, {knob: Tune domain}); None: grid only
    search: Callable[[argparse.Namespace, list[RunConfig]], tuple[RunConfig, dict]] | None = None
    defaults: dict[str, Any] = field(default_factory=dict)     # the study's defaults for shared flags


# ====================================================================== flags
def knob_help(name: str, owner=RunConfig) -> str:
    """The declared help of a knob (common, or of the method parameter class `owner`)."""
    return {f.name: f.metadata["help"] for f in knob_fields(owner)}[name]


def _shown(value: Any) -> str:
    return " ".join(map(str, value)) if isinstance(value, (list, tuple)) else str(value)


def add_axis(group, flag: str, knob: str, kind: type, default: list, owner=RunConfig, **kwargs) -> None:
    """A swept axis: a flag taking one or more values of a knob, with the knob's declared help."""
    help_text = kwargs.pop("help", None) or knob_help(knob, owner)
    group.add_argument(flag, type=kind, nargs="+", default=list(default), dest=kwargs.pop("dest", None) or knob,
                       help=f"{help_text}; one or more (default: {_shown(default)})".replace("%", "%%"), **kwargs)


def build_parser(study: Study) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=f"python sweeps/{study.name}.py", description=study.description,
        epilog="Lists are crossed: datasets x partitions x Dir α (Dirichlet partitions only) x local epochs x seeds x the "
               "study's own axes. A method knob applies to that method's trials only.")
    study.add_arguments(parser)
    axes = parser.add_argument_group("data axes (lists, crossed)")
    defaults = RunConfig()
    preset = study.defaults
    add_axis(axes, "--dataset", "dataset", str, preset.get("dataset", [defaults.dataset]))
    add_axis(axes, "--partition", "partition", str, preset.get("partition", ["dirichlet"]))
    add_axis(axes, "--dir-alpha", "dir_alpha", float, preset.get("dir_alpha", [0.1, 0.5]),
             help=knob_help("dir_alpha") + " (varied for the dirichlet and dirichlet_class partitions only)")
    add_axis(axes, "--local-epochs", "local_epochs", int, preset.get("local_epochs", [1]))
    add_axis(axes, "--seeds", "seed", int, preset.get("seed", DEFAULT_SEEDS), dest="seeds",
             help=knob_help("seed") + "; one trial per seed and configuration; tables report mean ± std over seeds")
    scalar_defaults = {k: v for k, v in preset.items() if k not in LIST_AXES}
    add_run_arguments(parser, skip=(*LIST_AXES, *NOT_FLAGS, *study.axes), defaults=scalar_defaults)

    out = parser.add_argument_group("results")
    out.add_argument("--results", type=Path, default=Path("results"), help="results folder (all sweeps) (default: results)")
    out.add_argument("--name", default=None,
                     help="sweep name (default: <study>-<date>-<time>); with --resume, the sweep to continue")
    out.add_argument("--tracking-uri", default=None,
                     help="MLflow tracking URI (default: sqlite store <results>/mlflow.db)")
    out.add_argument("--resume", nargs="?", const=True, default=False, metavar="NAME",
                     help="continue an interrupted sweep: the one named NAME (or --name), else the latest sweep "
                          "of this study under --results, whatever its name; its saved flags are used "
                          "(default: start a new sweep)")
    out.add_argument("--checkpoint-every", type=int, default=1,
                     help="checkpoint the simulation every k rounds (default: 1)")
    out.add_argument("--verbose", type=int, default=1, choices=(0, 1, 2), help="Tune verbosity (default: 1)")

    run = parser.add_argument_group("resources and search")
    run.add_argument("--cpus-per-trial", type=float, default=1.0,
                     help="CPUs per trial; torch uses that many threads (default: 1)")
    run.add_argument("--gpus-per-trial", default="auto",
                     help="GPUs per trial: a fraction packs trials (0.25 = four per GPU); auto = 0.25 on a "
                          "cluster with GPUs, 0 without (default: auto)")
    run.add_argument("--address", default=None,
                     help="join an existing Ray cluster (e.g. auto, or HEAD:6379) (default: none, start a local one)")
    run.add_argument("--max-concurrent", type=int, default=None, help="cap on trials running at once (default: none)")
    run.add_argument("--max-failures", type=int, default=2,
                     help="retries of a crashed trial, from its checkpoint (default: 2)")
    run.add_argument("--search", choices=("grid", "optuna"), default="grid", help="(default: grid)")
    run.add_argument("--num-samples", type=int, default=16, help="trials for --search optuna (default: 16)")
    run.add_argument("--scheduler", choices=("fifo", "asha"), default="fifo",
                     help="asha stops poor trials early, on acc_mean per round (default: fifo)")
    run.add_argument("--inject-crash-at-round", type=int, default=None, help=argparse.SUPPRESS)  # test hook
    return parser


# ====================================================================== trials
def common_config(args: argparse.Namespace) -> dict[str, Any]:
    """The common knobs shared by every trial of a sweep (the list axes excluded)."""
    common, _ = split_run_arguments(vars(args))
    return {k: v for k, v in common.items() if k not in LIST_AXES and k not in NOT_FLAGS}


def method_knobs(args: argparse.Namespace, axes: tuple[str, ...] = ()) -> dict[str, Any]:
    """The method knobs given on the command line (a study's own `axes` excluded)."""
    _, method = split_run_arguments(vars(args))
    return {k: v for k, v in method.items() if k not in axes}


def data_settings(args: argparse.Namespace) -> list[dict[str, Any]]:
    """Every (dataset, partition, Dir α) setting of a sweep. Dir α only varies for the Dirichlet
    partitions; other partitions get RunConfig's default, so they are not repeated per Dir α."""
    settings = []
    for dataset in args.dataset:
        for partition in args.partition:
            alphas = args.dir_alpha if partition in DIRICHLET_PARTITIONS else [RunConfig().dir_alpha]
            settings += [{"dataset": dataset, "partition": partition, "dir_alpha": a} for a in alphas]
    return settings


def trial_grid(args: argparse.Namespace, variants: list[dict[str, Any]], axes: tuple[str, ...] = ()) -> list[dict]:
    """The product of data settings x local epochs x seeds x the study's `variants` (each names
    its algorithm; `axes`: the method knobs the study sweeps itself). The method knobs given on
    the command line are added to the variants of the methods that own them."""
    owners = knob_owners()
    given = method_knobs(args, axes)
    unused = [k for k in given if not any(v["algorithm"] in owners[k] for v in variants)]
    if unused:
        name = unused[0]
        raise SweepError(f"--{name.replace('_', '-')} is a knob of {' and '.join(owners[name])}, but this sweep "
                         f"runs no trial of {' or '.join(owners[name])}")
    base = common_config(args)
    own = [{k: v for k, v in given.items() if variant["algorithm"] in owners[k]} | variant for variant in variants]
    return [base | setting | {"local_epochs": e, "seed": s} | variant
            for setting in data_settings(args) for e in args.local_epochs for s in args.seeds for variant in own]


def validate_trials(trials: list[dict]) -> list[RunConfig]:
    """Every trial's RunConfig, or one error naming the first bad value."""
    if not trials:
        raise SweepError("the sweep has no trials; give at least one value per axis")
    configs = [RunConfig.from_dict(t) for t in trials]
    hashes = [c.config_hash() for c in configs]
    if len(set(hashes)) != len(hashes):
        raise SweepError("the grid lists the same configuration twice (repeated axis values?)")
    return configs


# ====================================================================== the run
def run_study(study: Study, argv: list[str] | None = None) -> int:
    parser = build_parser(study)
    args = parser.parse_args(argv)
    try:
        plan, gpus = plan_sweep(study, args, parser.parse_args([]))
        from .launch import launch  # heavy imports (ray, mlflow) only for valid sweeps
        return launch(plan, gpus)
    except (ConfigError, DataError, SweepError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2


def progress_columns(columns: dict[str, str], configs: list[RunConfig]) -> dict[str, str]:
    """The study's progress-table columns, plus dataset, partition and seed wherever they vary
    among the trials (crossed data settings must be told apart in the table)."""
    shown = dict(columns)
    for knob, title in (("dataset", "data"), ("partition", "split"), ("seed", "seed")):
        if knob not in shown and len({getattr(c, knob) for c in configs}) > 1:
            shown[knob] = title
    return shown


def plan_sweep(study: Study, args: argparse.Namespace, defaults: argparse.Namespace) -> tuple[SweepPlan, float | str]:
    """Check the flags and build every trial's config (raises before any data, Ray or file)."""
    from . import resources

    folder = sweep_folder(study.name, args)
    if args.resume:
        args = load_args(folder, args, defaults)
    gpus = resources.parse_gpus(args.gpus_per_trial)
    if args.checkpoint_every < 1:
        raise SweepError(f"--checkpoint-every {args.checkpoint_every} must be >= 1")
    if args.search == "optuna" and study.search is None:
        raise SweepError(f"--search optuna: the {study.name} study is a grid only; drop --search")
    if args.search == "optuna" and args.num_samples < 1:
        raise SweepError(f"--num-samples {args.num_samples} must be >= 1")
    unknown = sorted(set(study.columns) - set(COMMON_KNOBS) - set(knob_owners()))
    if unknown:
        raise SweepError(f"study {study.name}: progress columns {', '.join(unknown)} are not knobs")

    configs = validate_trials(study.grid(args))
    shown = progress_columns(study.columns, configs)
    if args.search == "optuna":
        base, domains = study.search(args, configs)
        space, columns = search_space(base, domains, shown)
    else:
        space, columns = grid_space(configs, shown)
    return SweepPlan(study.name, folder, args, configs, space, columns, args.search, tuple(study.columns)), gpus
