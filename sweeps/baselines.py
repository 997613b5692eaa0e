"""Baselines study (the FedSelect paper's Table 1): every method x datasets x partitions x seeds.
Each federated run is one Ray Tune trial; same flags, resources, sinks and resume as
fedselect_grid.py.

    python sweeps/baselines.py                          # digits; 2 shards per client and Dir(0.1)
    python sweeps/baselines.py --dataset digits mnist --data-root ../shared/data --seeds 0 1 2
    python sweeps/baselines.py --algorithms fedselect fedrep ditto --partition dirichlet --dir-alpha 0.1 0.5
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make the repository importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from fl_core.algorithms import ALGORITHMS  # noqa: E402
from sweeps.study import Study, run_study, trial_grid  # noqa: E402


def add_arguments(parser: argparse.ArgumentParser) -> None:
    methods = parser.add_argument_group("methods")
    methods.add_argument("--algorithms", nargs="+", default=list(ALGORITHMS), metavar="ALGORITHM",
                         help=f"methods to compare, each with its own knobs (the method flags below; FedSelect: "
                              f"p = 0.25, α = 0.8 by default) (default: all: {' '.join(ALGORITHMS)})")


def grid(args: argparse.Namespace) -> list[dict]:
    return trial_grid(args, [{"algorithm": a} for a in args.algorithms])


STUDY = Study(
    name="baselines",
    description=__doc__.split("\n\n")[0],
    add_arguments=add_arguments,
    grid=grid,
    columns={"algorithm": "algo", "dataset": "data", "partition": "split", "dir_alpha": "Dir α"},
    # 5 local epochs (ours): with 1, several baselines (FedPer, FedBABU, LotteryFL) are still far
    # from converged after 20 rounds on digits, and the table would compare convergence speed.
    defaults={"partition": ["shards", "dirichlet"], "dir_alpha": [0.1], "local_epochs": [5]},
)

if __name__ == "__main__":
    sys.exit(run_study(STUDY))
