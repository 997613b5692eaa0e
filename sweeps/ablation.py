"""FedSelect ablation study (the paper's Table 3): GradSelect against personalizing the least
changed entries, random entries, and one whole block (A-D) — x datasets x partitions x seeds.
Same flags, resources, sinks and resume as fedselect_grid.py.

    python sweeps/ablation.py                           # digits; 2 shards per client and Dir(0.1)
    python sweeps/ablation.py --variants gradselect random --seeds 0 1 2
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make the repository importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from fl_core.config import BLOCKS, FEDSELECT_VARIANTS  # noqa: E402
from sweeps.study import Study, run_study, trial_grid  # noqa: E402


def add_arguments(parser: argparse.ArgumentParser) -> None:
    axes = parser.add_argument_group("ablations")
    axes.add_argument("--variants", nargs="+", default=list(FEDSELECT_VARIANTS),
                      help=f"FedSelect variants ({', '.join(FEDSELECT_VARIANTS)})")
    axes.add_argument("--blocks", nargs="+", default=list(BLOCKS), help="blocks for the layer variant (A-D)")
    axes.add_argument("--pers-rate", type=float, default=0.25, help="FedSelect p")
    axes.add_argument("--pers-limit", type=float, default=0.8, help="FedSelect α")


def grid(args: argparse.Namespace) -> list[dict]:
    base = {"algorithm": "fedselect", "pers_rate": args.pers_rate, "pers_limit": args.pers_limit}
    variants = []
    for variant in args.variants:
        blocks = args.blocks if variant == "layer" else ["A"]  # layer_block only matters for `layer`
        variants += [base | {"fedselect_variant": variant, "layer_block": b} for b in blocks]
    return trial_grid(args, variants)


STUDY = Study(
    name="ablation",
    description=__doc__.split("\n\n")[0],
    add_arguments=add_arguments,
    grid=grid,
    search_space=None,
    columns={"fedselect_variant": "variant", "layer_block": "block", "dataset": "data", "partition": "split",
             "dir_alpha": "Dir α"},
    # 5 local epochs (ours), as in the baselines study, so that Tables 1 and 3 share one setting.
    defaults={"partition": ["shards", "dirichlet"], "dir_alpha": [0.1], "local_epochs": [5]},
)

if __name__ == "__main__":
    sys.exit(run_study(STUDY))
