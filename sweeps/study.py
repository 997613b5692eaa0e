"""Running a study file: its command line, its trials, validation. A study is a TOML file
(sweeps/spec.py, the project's in studies/); `python -m sweeps.run STUDY [flags]` runs any of
them (sweeps/run.py), and a study with flags of its own declares them in a module of its name
(sweeps/fedl2p.py, sweeps/ablation.py: `Study.add_arguments` / `customize`).

Flags over the file. Every knob of fl_core is a flag, generated from its declaration (help,
allowed values), showing the file's value as its default, except --algorithm (the methods are
the file's `[[methods]]`, or --algorithms / --anchors), --device and --threads (a trial's
resources decide them). A flag replaces the knob's value in the file, in [knobs] and in every
method entry that sets it. Each knob flag takes one or more values (several: an axis) or, for
a numeric knob under --search optuna, a range LOW:HIGH (LOW:HIGH:log for log-uniform). A method
knob applies to the trials of the methods that own it; giving one that no trial of the study can
use is an error.

Order of work in `run_study`, so that bad input fails before anything expensive:
  1. parse flags and read the study file (or, on --resume, the sweep's saved study.toml);
  2. build every trial's RunConfig: a bad value is one ConfigError naming it (exit 2);
  3. --dry-run prints the trials (a [pretraining] study's pretrain stage first) and stops; else
     hand the plan to `sweeps.launch` (data loaded once per data setting, Ray, Tune stage by
     stage, sinks, trials table, summary, tables).
"""
from __future__ import annotations

if __name__ == "__main__":  # a part of the runner, not a command
    from sweeps.commands import not_a_command
    not_a_command(__file__)

import argparse
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fl_core.algorithms import is_external
from fl_core.config import COMMON_KNOBS, ConfigError, RunConfig, add_run_arguments, method_knob_owners
from fl_core.data import DataError
from fl_core.knobs import OneLineParser
from fl_core.kernels import OPT_OUT
from fl_core.results import REPORT_ROUNDS, results_problem

from . import resources
from .errors import SweepError
from .folder import load_args, resume_name, saved_study, sweep_folder
from .gpu_sharing import MODES as GPU_SHARING_MODES
from .plan import SweepPlan, varying_knobs
from .spec import (SCHEDULERS, SEARCHES, Range, StudySpec, budget_line, load_spec, resolved, show_value,
                   with_overrides)
from .stages import plan_stages

NOT_FLAGS = ("algorithm", "device", "threads", "seed")   # seeds: --seeds
RUNTIME = ("results", "name", "tracking_uri", "resume", "checkpoint_every", "verbose", "cpus_per_trial",
           "gpus_per_trial", "gpu_sharing", "address", "max_concurrent", "max_failures", "reproducible",
           "inject_crash_at_round")


@dataclass(frozen=True)
class Study:
    """A study file and how it is started: `script` (what follows `python`, e.g.
    `-m sweeps.run fedl2p`), optional flags of its own and how they change the spec."""

    spec: Path
    script: str
    add_arguments: Callable[[argparse.ArgumentParser], None] | None = None
    customize: Callable[[StudySpec, argparse.Namespace], StudySpec] | None = None

    @property
    def presets(self) -> dict[str, Path]:
        """`--preset NAME` choices: "default" (the file itself) and each sibling study file
        `<stem>_<name>.toml` (e.g. dispfl_fmnist.toml: the study on Fashion-MNIST, 5 seeds)."""
        found = {"default": self.spec}
        for path in sorted(self.spec.parent.glob(f"{self.spec.stem}_*.toml")):
            found[path.stem.removeprefix(f"{self.spec.stem}_")] = path
        return found

    @property
    def name(self) -> str:
        return load_spec(self.spec).name


def study_of_file(path: str | Path) -> Study:
    return Study(Path(path), f"-m sweeps.run {path}")


# ====================================================================== flags
def spec_defaults(spec: StudySpec) -> dict[str, str]:
    """What each knob flag shows as its default: the file's value (per method entry where they differ)."""
    shown = {k: show_value(v) for k, v in resolved(spec).knobs.items()}
    for method in spec.methods:
        for knob, value in method.knobs.items():
            text = f"{method.algorithm}: {show_value(value)}"
            shown[knob] = text if knob not in shown or shown[knob] == text else f"{shown[knob]}; {text}"
    return shown


def range_or_value(parse, kind):
    """A knob flag's value: the knob's own type, or LOW:HIGH[:log] for a number (a search range)."""
    def value(text: str):
        parts = text.split(":")
        if kind in (int, float) and len(parts) in (2, 3) and (len(parts) == 2 or parts[2] == "log"):
            try:
                low, high = float(parts[0]), float(parts[1])
            except ValueError:
                raise argparse.ArgumentTypeError(f"{text!r} is not a range LOW:HIGH[:log]") from None
            if not low < high:
                raise argparse.ArgumentTypeError(f"range {text!r}: LOW must be below HIGH")
            return Range(low, high, len(parts) == 3)
        return parse(text)
    value.__name__ = getattr(parse, "__name__", "value")
    return value


def external_methods(study: Study, argv: Sequence[str] = ()) -> tuple[str, ...]:
    """The methods outside the registry (`package.module:Class`) a run of `study` may have: those
    its files (each preset's) name and those the command line names (--algorithms, --anchors)."""
    named = [m.algorithm for path in study.presets.values() for m in load_spec(path).methods]
    return tuple(dict.fromkeys(a for a in [*named, *argv] if is_external(a)))


def build_parser(study: Study, argv: Sequence[str] = ()) -> argparse.ArgumentParser:
    """The study's flags; a method outside the registry that the study or `argv` names gets its
    knobs' flags as a registered method has them."""
    spec = load_spec(study.spec)
    parser = OneLineParser(
        prog=f"python {study.script}", description=spec.description,
        usage=f"python {study.script} [--KNOB VALUE [VALUE ...]] ... [--seeds S ...] [--search {{grid,optuna}}] "
              f"[--scheduler {{fifo,asha}}] [--dry-run] [--resume [NAME]] [--name NAME] [--results DIR] [...]",
        epilog=f"The study file is {study.spec}; flags override it. Lists are crossed: data settings x the "
               "common axes x seeds x each method's own axes. A method knob applies to that method's trials only. "
               "With --search optuna or --scheduler asha each (data setting, method) is selected on its own, on "
               "the first seed, by validation accuracy (--val-fraction), and the best re-run on every seed."
               + (f" The file's [pretraining] ({spec.pretraining.algorithm}) runs first, once per data setting, seed "
                  "and model; the knob flags set the trials after it, never the pretraining."
                  if spec.pretraining else ""))
    presets = study.presets
    if len(presets) > 1:
        names = tuple(presets)
        parser.add_argument("--preset", choices=names, default="default",
                            help=f"the study file to use: {', '.join(names[:-1])} or {names[-1]}. "
                                 + ", ".join(f"{name} = {path.parent.name}/{path.name}"
                                             for name, path in presets.items())
                                 + "; flags still override it, and --help shows the default file's values "
                                   "(default: default, the file itself)")
    if study.add_arguments:
        study.add_arguments(parser)
    external = external_methods(study, argv)
    _method_arguments(parser, spec, external)
    _result_arguments(parser)
    _search_arguments(parser, spec)
    parser.set_defaults(external_methods=external)  # given_knobs: their knobs are knobs too
    return parser


def _method_arguments(parser: argparse.ArgumentParser, spec: StudySpec, external: tuple[str, ...] = ()) -> None:
    """The compared methods, the anchors, the seeds and every knob (defaults from the study file)."""
    methods = parser.add_argument_group("methods and seeds")
    methods.add_argument("--algorithms", nargs="+", default=argparse.SUPPRESS, metavar="ALGORITHM",
                         help="the compared (searched) methods, each with its knobs from the file where it has an "
                              "entry (default: "
                              + show_value([m.algorithm for m in spec.methods if not m.anchor]) + ")")
    methods.add_argument("--anchors", nargs="*", default=argparse.SUPPRESS, metavar="ALGORITHM",
                         help="methods run as anchors on every data setting, epochs value and seed, to completion, "
                              "outside any search or scheduler; none: --anchors (default: "
                              + (show_value([m.algorithm for m in spec.methods if m.anchor]) or "none") + ")")
    methods.add_argument("--seeds", type=int, nargs="+", default=argparse.SUPPRESS,
                         help="one trial per seed and configuration; tables report mean ± std over seeds "
                              f"(default: {show_value(list(spec.seeds))})")
    add_run_arguments(parser, skip=NOT_FLAGS, many=_all_knobs(external), defaults=spec_defaults(spec),
                      only_given=True, wrap_type=range_or_value, external=external)


def _result_arguments(parser: argparse.ArgumentParser) -> None:
    """Where the results go, the sweep's name, resuming and checkpoints."""
    out = parser.add_argument_group("results")
    out.add_argument("--results", type=Path, default=Path("results"),
                     help="results folder (all sweeps) (default: results)")
    out.add_argument("--name", default=None,
                     help="sweep name (default: <study>-<date>-<time>); with --resume, the sweep to continue")
    out.add_argument("--tracking-uri", default=None,
                     help="MLflow tracking URI (default: sqlite store <results>/mlflow.db)")
    out.add_argument("--resume", nargs="?", const=True, default=False, metavar="NAME",
                     help="continue an interrupted sweep: the one named NAME (or --name), else the latest sweep "
                          "of this study under --results, whatever its name; its saved study.toml is used "
                          "(default: start a new sweep)")
    out.add_argument("--dry-run", action="store_true",
                     help="print the trials (count, axes, data settings, stages) and exit (default: off)")
    out.add_argument("--checkpoint-every", type=int, default=1,
                     help="checkpoint the simulation every k rounds (default: 1)")
    out.add_argument("--verbose", type=int, default=1, choices=(0, 1, 2),
                     help="what a sweep prints while its trials run: 0 nothing; 1 one line per stage every 30 s to "
                          "5 min (trials done, running and pending, time elapsed, an estimate of the time left); 2 "
                          "Ray Tune's own status table and a line per reported result (default: 1)")


def _search_arguments(parser: argparse.ArgumentParser, spec: StudySpec) -> None:
    """Resources, the search and the scheduler, the reported round and the kernels."""
    run = parser.add_argument_group("resources and search")
    run.add_argument("--cpus-per-trial", type=float, default=1.0,
                     help="CPUs per trial; torch uses that many threads (default: 1)")
    run.add_argument("--gpus-per-trial", default="auto",
                     help="GPUs per trial: a fraction packs trials (0.25 = four per GPU); auto = measured: 0.25 "
                          "only where packed GPU trials finish rounds faster than the CPUs (a short probe of the "
                          "first configuration, recorded in the sweep's gpu_choice.json), 0 without GPUs "
                          "(default: auto)")
    run.add_argument("--gpu-sharing", choices=GPU_SHARING_MODES, default="auto",
                     help="how trials packed on one GPU (--gpus-per-trial below 1) share it: mps starts NVIDIA's "
                          "Multi-Process Service for the sweep (its own daemon, stopped at the end), so that they "
                          "run at once; time-slice leaves them to take turns (each has its own CUDA context); auto "
                          "= mps where it can run (packed trials, this sweep's own Ray, nvidia-cuda-mps-control on "
                          "PATH), else time-slice; the sweep prints which runs (default: auto)")
    run.add_argument("--address", default=None,
                     help="join a running Ray cluster: auto, or HEAD:PORT (default: none, start a local one)")
    run.add_argument("--max-concurrent", type=int, default=None, help="cap on trials running at once (default: none)")
    run.add_argument("--max-failures", type=int, default=2,
                     help="retries of a crashed trial, from its checkpoint (default: 2)")
    run.add_argument("--search", choices=SEARCHES, default=argparse.SUPPRESS,
                     help=f"grid: every listed configuration; optuna: Optuna (TPE) per data setting and method over "
                          f"the knobs given as lists (choices) or ranges LOW:HIGH (default: {spec.search})")
    run.add_argument("--num-samples", type=int, default=argparse.SUPPRESS,
                     help=f"--search optuna: configurations per data setting and method (default: {spec.num_samples})")
    run.add_argument("--tune", nargs="+", default=argparse.SUPPRESS, metavar="ALGORITHM",
                     help="search every method (all) or these in the spaces their knobs declare, each with the "
                          "same budget (--num-samples per data setting) on the search seed, then confirm on "
                          "--seeds (5 or more) (default: " + (show_value(list(spec.tune)) or "none") + ")")
    run.add_argument("--search-seed", type=int, default=argparse.SUPPRESS,
                     help=f"the seed a search or scheduler selects on; never one of --seeds, never reported "
                          f"(default: {spec.search_seed})")
    run.add_argument("--report-round", choices=REPORT_ROUNDS, default=argparse.SUPPRESS,
                     help="which round each trial reports: last, best_val (its round with the best mean "
                          "validation accuracy, as some papers report) or best_val_global (the same, of the model "
                          f"before fine-tuning, as PerFedMask's authors); both need --val-fraction (default: "
                          f"{spec.report_round})")
    run.add_argument("--scheduler", choices=SCHEDULERS, default=argparse.SUPPRESS,
                     help=f"asha: stop poor configurations early, per data setting and method, on validation "
                          f"accuracy (default: {spec.scheduler})")
    run.add_argument(OPT_OUT, dest="reproducible", action="store_false",
                     help="run each CPU's own kernels (faster on AVX-512 CPUs) instead of the reproducible mode, "
                          "which pins them so that any x86-64 CPU with AVX2 gives the same numbers; the trials' "
                          "column `kernels` says which ran (default: reproducible)")
    run.add_argument("--inject-crash-at-round", type=int, default=None, help=argparse.SUPPRESS)  # test hook


def _all_knobs(external: Sequence[str] = ()) -> tuple[str, ...]:
    return (*COMMON_KNOBS, *method_knob_owners(external))


def given_knobs(args: argparse.Namespace) -> dict[str, Any]:
    """The knob flags given on the command line (the others are absent: the file holds them),
    a method's outside the registry included."""
    knobs = _all_knobs(getattr(args, "external_methods", ()))
    return {k: v for k, v in vars(args).items() if k in knobs}


def study_spec(study: Study, args: argparse.Namespace) -> StudySpec:
    """The study file with the command line applied."""
    spec = load_spec(study.presets.get(getattr(args, "preset", "default"), study.spec))
    if study.customize:
        spec = study.customize(spec, args)
    given = vars(args)
    return with_overrides(spec, given_knobs(args), algorithms=given.get("algorithms"), anchors=given.get("anchors"),
                          seeds=given.get("seeds"), search=given.get("search"), scheduler=given.get("scheduler"),
                          num_samples=given.get("num_samples"), tune=given.get("tune"),
                          search_seed=given.get("search_seed"), report_round=given.get("report_round"))


# ====================================================================== the run
def run_study(study: Study, argv: list[str] | None = None) -> int:
    try:
        parser = build_parser(study, argv or ())
        args = parser.parse_args(argv)
        plan, gpus = plan_sweep(study, args)
        if args.dry_run:
            print(describe(plan))
            return 0
        from .launch import launch  # heavy imports (ray, mlflow) only for valid sweeps
        return launch(plan, gpus)
    except (ConfigError, DataError, SweepError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2


def plan_sweep(study: Study, args: argparse.Namespace) -> tuple[SweepPlan, float | str]:
    """Check the flags and the study file and build every trial's config (raises before any data,
    Ray or file)."""
    name = load_spec(study.presets.get(getattr(args, "preset", "default"), study.spec)).name
    if (problem := results_problem(args.results)) is not None:
        raise SweepError(problem)
    if args.resume and (asked := resume_name(args)):  # a named sweep of any of this script's presets
        owner = saved_study(args.results.resolve() / asked)
        name = owner if owner in {load_spec(p).name for p in study.presets.values()} else name
    folder = sweep_folder(name, args)
    if args.resume:
        extra = sorted(set(given_knobs(args)) | ({"algorithms", "anchors", "seeds", "search", "scheduler",
                                                   "num_samples", "tune", "search_seed", "report_round"}
                                                  & set(vars(args))))
        if extra:
            raise SweepError(f"--resume continues {folder.name} as it was planned (its study.toml); "
                             f"--{extra[0].replace('_', '-')} cannot change it; start a new sweep instead")
        asked = args.reproducible
        args = load_args(folder, args, RUNTIME)
        if args.reproducible != asked:  # the kernels were chosen from this command line, before torch loaded
            raise SweepError(f"--resume: {folder.name} ran " + ("in the reproducible mode; resume it without "
                             f"{OPT_OUT}" if args.reproducible else f"with {OPT_OUT}; resume it with {OPT_OUT} too"))
        spec = load_spec(folder / "study.toml")
    else:
        spec = resolved(study_spec(study, args))
    gpus = resources.parse_gpus(args.gpus_per_trial)
    if args.checkpoint_every < 1:
        raise SweepError(f"--checkpoint-every {args.checkpoint_every} must be >= 1")
    stages = plan_stages(spec)
    configs = [c for stage in stages for _, c in stage.configs]
    validate_trials(configs)
    if spec.report_round != "last" and any(c.val_fraction <= 0 for c in configs):
        raise SweepError(f"report_round = {spec.report_round} reports each run's round with the best mean validation "
                         "accuracy, and these trials have no validation split; give --val-fraction 0.1 (or "
                         "val_fraction in the study's [knobs])")
    named = tuple(dict.fromkeys([k for m in spec.methods for k in m.knobs]
                                + [k for stage in stages for k in stage.domains]))
    compared = [c for stage in stages if stage.kind != "pretrain" for _, c in stage.configs]  # a pretraining's
    knobs = tuple(k for k in dict.fromkeys((*named, *varying_knobs(compared))) if k not in ("seed", "pretrained"))
    runtime = argparse.Namespace(**{k: getattr(args, k) for k in RUNTIME})
    return SweepPlan(name, f"python {study.script}", folder, runtime, spec, tuple(stages), knobs, named), gpus


def validate_trials(configs: list[RunConfig]) -> list[RunConfig]:
    """The configs, or one error: none at all, or the same configuration twice."""
    if not configs:
        raise SweepError("the sweep has no trials; give at least one value per axis")
    hashes = [c.config_hash() for c in configs]
    if len(set(hashes)) != len(hashes):
        raise SweepError("the grid lists the same configuration twice (repeated axis values?)")
    return configs


def describe(plan: SweepPlan) -> str:
    """--dry-run: the stages, axes, data settings and trials of a planned sweep."""
    import pandas as pd

    from fl_core.results import config_columns

    spec = plan.spec
    known = [c for stage in plan.stages if stage.kind != "pretrain" and not stage.searched for _, c in stage.configs]
    lines = [f"study {spec.name} ({spec.source}): search {spec.search}, scheduler {spec.scheduler}, "
             f"seeds {show_value(list(spec.seeds))}; sweep folder {plan.folder}"]
    every = [c for stage in plan.stages if stage.kind != "pretrain" for _, c in stage.configs]  # searches' bases too
    settings = list(dict.fromkeys(config_columns(c)["setting"] for c in every))
    lines.append(f"data settings ({len(settings)}): " + "; ".join(settings))
    axes = {k: sorted({repr(c.semantic_dict()[k]) for c in known if k in c.semantic_dict()}) for k in plan.knobs}
    lines.append("grid axes: " + ("; ".join(f"{k} {' '.join(v)}" for k, v in axes.items() if len(v) > 1) or "none"))
    if spec.pretraining is not None:
        default = RunConfig(algorithm=spec.pretraining.algorithm).to_dict()
        own = ", ".join(f"{k} {show_value(v)}" for k, v in spec.pretraining.knobs.items() if default.get(k) != v)
        lines.append(f"pretraining: {spec.pretraining.algorithm} ({own or 'its defaults'}) once per data setting, seed "
                     f"and model; every later trial starts from its final model (column `pretraining`: its hash)")
    for stage in plan.stages:
        if stage.searched:
            space = ", ".join(f"{k} ~ {'log-uniform' if getattr(d, 'log', False) else 'uniform'}({d.low:g}, {d.high:g})"
                              if isinstance(d, Range) else f"{k} in {show_value(d)}" for k, d in stage.domains.items())
            lines.append(f"stage {stage.name} [{stage.group}]: Optuna, {spec.num_samples} configurations on seed "
                         f"{spec.search_seed}" + (", ASHA" if spec.scheduler == "asha" else "") + f"; {space}")
        else:
            lines.append(f"stage {stage.name}{f' [{stage.group}]' if stage.group else ''}: {len(stage.configs)} trials"
                         + (", ASHA" if stage.kind == "select" and spec.scheduler == "asha" else ""))
    if spec.selects:
        groups = sum(1 for s in plan.stages if s.kind == "select")
        lines.append(f"stage tune-confirm: the best configuration of each select stage on seeds "
                     f"{show_value(list(spec.seeds))}: {groups * len(spec.seeds)} trials")
        lines.append(budget_line(spec))
    total = len(plan.configs) + sum(spec.num_samples for s in plan.stages if s.searched) + (
        sum(1 for s in plan.stages if s.kind == "select") * len(spec.seeds) if spec.selects else 0)
    lines.append(f"{total} trials in all")
    rows = [{"stage": kind, **{k: c.semantic_dict().get(k, "-") for k in ("algorithm", *plan.knobs)}, "seed": c.seed}
            | ({"pretraining": c.config_hash() if kind == "pretrain" else c.pretrained} if spec.pretraining else {})
            for stage in plan.stages if not stage.searched for kind, c in stage.configs]
    if rows:  # a study whose every method is searched lists its samples only as they are drawn
        with pd.option_context("display.max_rows", 400, "display.width", 200):
            lines.append(pd.DataFrame(rows).to_string(index=False))
    return "\n".join(lines)
