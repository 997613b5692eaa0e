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

from fl_core.algorithms.fedselect import BLOCKS, VARIANTS, FedSelectParams  # noqa: E402
from sweeps.study import Study, add_axis, run_study, trial_grid  # noqa: E402

AXES = ("fedselect_variant", "layer_block")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    axes = parser.add_argument_group("ablations (FedSelect's p and α: --pers-rate, --pers-limit below)")
    add_axis(axes, "--variants", "fedselect_variant", str, VARIANTS, owner=FedSelectParams, dest="variants")
    add_axis(axes, "--blocks", "layer_block", str, BLOCKS, owner=FedSelectParams, dest="blocks",
             help="blocks for the layer variant (A-D, see fl_core/models.py)")


def grid(args: argparse.Namespace) -> list[dict]:
    variants = []
    for variant in args.variants:
        if variant == "layer":  # layer_block only matters for `layer`; the others keep its default
            variants += [{"algorithm": "fedselect", "fedselect_variant": variant, "layer_block": b} for b in args.blocks]
        else:
            variants.append({"algorithm": "fedselect", "fedselect_variant": variant})
    return trial_grid(args, variants, AXES)


STUDY = Study(
    name="ablation",
    description=__doc__.split("\n\n")[0],
    add_arguments=add_arguments,
    grid=grid,
    columns={"fedselect_variant": "variant", "layer_block": "block", "dataset": "data", "partition": "split",
             "dir_alpha": "Dir α"},
    axes=AXES,
    # 5 local epochs (ours), as in the baselines study, so that Tables 1 and 3 share one setting.
    defaults={"partition": ["shards", "dirichlet"], "dir_alpha": [0.1], "local_epochs": [5]},
)

if __name__ == "__main__":
    sys.exit(run_study(STUDY))
