"""`python -m fl_core`: one federated run from the shell, without Ray or MLflow.

Prints one line per round and a summary; writes DIR/rounds.parquet (one row per round x client)
and DIR/clients.parquet (per-client label histograms), rewritten atomically after every round so
that a crash loses at most the round in progress. The flags are generated from the knob
declarations (fl_core/config.py and each method's file); a method's knobs apply to it only.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from .kernels import OPT_OUT, KernelError, machine_isa, pin_from_argv, require

# torch loads with fl_core.config and what follows it: imported inside the functions, so that the
# command pins the kernels first (fl_core/kernels.py) and importing this module changes nothing.

EXAMPLE = ("example: python -m fl_core --algorithm fedselect --dataset digits --partition shards "
           "--shards-per-client 2 --num-clients 10 --rounds 20 --pers-rate 0.25 --pers-limit 0.8 "
           "--seed 0 --results results/demo")


def named_external(argv: list[str]) -> tuple[str, ...]:
    """The method outside the registry that `--algorithm` names in `argv` (`package.module:Class`),
    if any: its knobs get flags as a registered method's do."""
    from .algorithms import is_external

    given = [argv[i + 1] for i, a in enumerate(argv[:-1]) if a == "--algorithm"]
    given += [a.partition("=")[2] for a in argv if a.startswith("--algorithm=")]
    return tuple(a for a in given if is_external(a))


def build_parser(argv: list[str] | None = None) -> argparse.ArgumentParser:
    from .config import add_run_arguments
    from .knobs import OneLineParser

    parser = OneLineParser(
        prog="python -m fl_core", description=__doc__.split("\n\n")[0] + "\n\n" + EXAMPLE,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    external = named_external(argv or [])
    add_run_arguments(parser, external=external)
    parser.set_defaults(external_methods=external)
    parser.add_argument("--results", type=Path, default=None,
                        help="output folder for rounds.parquet and clients.parquet (default: results/runs/"
                             "<algorithm>-<config hash>). An external method's package.module:Class is written "
                             "package.module.Class there, a name every OS accepts")
    parser.add_argument(OPT_OUT, dest="reproducible", action="store_false",
                        help="run the CPU's own kernels (faster on AVX-512 CPUs) instead of the reproducible mode, "
                             "which pins them so that any x86-64 CPU with AVX2 gives the same numbers (column kernels)")
    return parser


# The small CNNs: a single run of one trains on batches too small for torch's intra-op threads to
# pay, and on a busy machine its extra threads only wait for cores (fedselect on digits, 20 rounds,
# 2 cores busy with a sweep: 3.4 s at torch's default of 2 threads, 2.7 s at 1).
SMALL_MODELS = ("lenet", "cnn2", "lenet_bn", "cnn_bn")


def single_run_threads(config) -> int | None:
    """The torch threads of a single run: `--threads` when given; else 1 for a small CNN on the
    CPU, torch's default (None) for the rest (a ResNet's convolutions use the cores)."""
    if config.threads is not None or config.device != "cpu":
        return config.threads
    from .data.catalog import input_shape_of
    from .models import resolve_model_name

    name = resolve_model_name(config.model, input_shape_of(config.dataset, config.image_size))
    return 1 if name in SMALL_MODELS else None


def main(argv: list[str] | None = None) -> int:
    """The command (`python -m fl_core`, `fl-run`); `argv` given: called from Python, whose process
    already chose its kernels (a run that asks for the mode without them is refused)."""
    if argv is None:
        pin_from_argv(sys.argv[1:])  # before torch loads: see fl_core/kernels.py
    from .config import ConfigError, RunConfig, split_run_arguments
    from .data import DataError
    from .knobs import portable_name
    from .results import results_problem

    argv = sys.argv[1:] if argv is None else argv
    try:
        parser = build_parser(argv)
    except ConfigError as err:  # a method outside the registry that does not import
        print(f"error: {err}", file=sys.stderr)
        return 2
    args = vars(parser.parse_args(argv))
    results_dir, reproducible, external = args.pop("results"), args.pop("reproducible"), args.pop("external_methods")
    try:
        common, method = split_run_arguments(args, external)
        config = RunConfig(**common, **method)
        results_dir = results_dir or Path("results/runs") / f"{portable_name(config.algorithm)}-{config.config_hash()}"
        unusable = results_problem(results_dir)
        if unusable:
            raise ConfigError(unusable)
        from .simulation import Simulation  # heavy imports only after the arguments are valid
        kernels = require(reproducible)
        sim = Simulation(config.replace(threads=single_run_threads(config)))
    except (ConfigError, DataError, KernelError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    try:
        return _run(sim, results_dir, kernels)
    except OSError as err:  # a full disk, a folder made read-only meanwhile: every earlier write is intact
        print(f"error: could not write to {results_dir}: {err.strerror or err}; the rounds written before are "
              f"kept in {results_dir / 'rounds.parquet'}", file=sys.stderr)
        return 2


def _run(sim, results_dir: Path, kernels: str) -> int:
    import pandas as pd

    from .results import client_rows, round_rows, summarize_round, write_parquet

    config = sim.config
    write_parquet(pd.DataFrame(client_rows(sim.data, config)), results_dir / "clients.parquet")
    print(f"{config.label()} on {config.dataset} ({config.partition}, {config.num_clients} clients, "
          f"model {sim.model_name}, config {config.config_hash()}; kernels {kernels})", flush=True)
    rows, total, last = [], 0.0, None
    context = {"kernels": kernels, "cpu_isa": machine_isa()}  # once: the CPU does not change during a run
    for result in sim.run():
        new = round_rows(result, config, sim.model_name, **context)
        rows.extend(new)
        write_parquet(pd.DataFrame(rows), results_dir / "rounds.parquet")
        summary = summarize_round(pd.DataFrame(new))
        total += result.seconds
        acc = f"acc {summary['acc_mean']:.4f}" if result.evaluated else "acc   --  "
        print(f"round {result.round:3d}/{config.rounds}  {acc}  personal {summary['personal_fraction_mean']:.3f}  "
              f"{result.seconds:6.2f} s", flush=True)
        last = summary
    unseen = len(sim.data.unseen)
    print(f"final: acc {last['acc_mean']:.4f} ± {last['acc_std']:.4f} over {config.num_clients - unseen} "
          f"{'seen ' if unseen else ''}clients (sample-weighted {last['acc_weighted']:.4f}); acc_local "
          f"{last['acc_local_mean']:.4f}, acc_global {last['acc_global_mean']:.4f}; {total:.1f} s")
    if unseen:
        print(f"unseen: acc {last['acc_unseen_mean']:.4f} over {unseen} held-out clients (scored as newcomers)")
    print(f"wrote {results_dir / 'rounds.parquet'} and {results_dir / 'clients.parquet'}")
    from .algorithms.ft import Personalizing  # FT, L2P, FedL2P never change the model they start from
    if config.checkpoint_dir is not None and not isinstance(sim.algorithm, Personalizing):
        from .checkpoints import save_model  # the first stage of a two-stage run: hand the model on
        path = save_model(config, sim.model_name, sim.final_model())
        print(f"wrote {path} (start a second stage from it with --pretrained {config.config_hash()} "
              f"--checkpoint-dir {config.checkpoint_dir})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
