"""`python -m fl_core`: one federated run from the shell, without Ray or MLflow.

Prints one line per round and a summary; writes DIR/rounds.parquet (one row per round x client)
and DIR/clients.parquet (per-client label histograms), rewritten atomically after every round so
that a crash loses at most the round in progress.
"""
from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

import pandas as pd

from .config import ConfigError, RunConfig
from .data import DataError

EXAMPLE = ("example: python -m fl_core --algorithm fedselect --dataset digits --partition shards "
           "--shards-per-client 2 --num-clients 10 --rounds 20 --pers-rate 0.25 --pers-limit 0.8 "
           "--seed 0 --results results/demo")


def _parse_optional(kind):
    def parse(text: str):
        return None if text.lower() in ("none", "") else kind(text)
    parse.__name__ = kind.__name__
    return parse


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m fl_core", description=__doc__.split("\n\n")[0] + "\n\n" + EXAMPLE,
        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    for f in dataclasses.fields(RunConfig):
        flag = "--" + f.name.replace("_", "-")
        help_text = f.metadata["help"]
        if f.type == "bool":
            parser.add_argument(flag, action="store_true", help=help_text)
            continue
        base = {"int": int, "float": float, "str": str}[f.type.split(" | ")[0]]
        kind = _parse_optional(base) if "None" in f.type else base
        metavar = "{" + ",".join(f.metadata["choices"]) + "}" if f.metadata["choices"] else None
        parser.add_argument(flag, type=kind, default=f.default, help=help_text, metavar=metavar)
    parser.add_argument("--results", type=Path, default=None,
                        help="output folder for rounds.parquet and clients.parquet "
                             "(default: results/runs/<algorithm>-<config hash>)")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = vars(build_parser().parse_args(argv))
    results_dir = args.pop("results")
    try:
        config = RunConfig(**args)
        from .simulation import Simulation  # heavy imports only after the arguments are valid
        sim = Simulation(config)
    except (ConfigError, DataError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    return _run(sim, results_dir or Path("results/runs") / f"{config.algorithm}-{config.config_hash()}")


def _run(sim, results_dir: Path) -> int:
    from .results import client_rows, round_rows, write_parquet

    config = sim.config
    write_parquet(pd.DataFrame(client_rows(sim.data, config)), results_dir / "clients.parquet")
    print(f"{config.algorithm} on {config.dataset} ({config.partition}, {config.num_clients} clients, "
          f"model {sim.model_name}, config {config.config_hash()})", flush=True)
    rows, total = [], 0.0
    for result in sim.run():
        rows.extend(round_rows(result, config, sim.model_name))
        write_parquet(pd.DataFrame(rows), results_dir / "rounds.parquet")
        total += result.seconds
        print(f"round {result.round:3d}/{config.rounds}  acc {result.mean('acc'):.4f}  "
              f"personal {result.mean('personal_fraction'):.3f}  {result.seconds:6.2f} s", flush=True)
    print(f"final: acc {result.mean('acc'):.4f} ± {result.std('acc'):.4f} over {config.num_clients} clients "
          f"(sample-weighted {result.weighted_acc():.4f}); acc_local {result.mean('acc_local'):.4f}, "
          f"acc_global {result.mean('acc_global'):.4f}; {total:.1f} s")
    print(f"wrote {results_dir / 'rounds.parquet'} and {results_dir / 'clients.parquet'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
