"""FedSelect ablation study (the paper's Table 3): GradSelect against personalizing the least
changed entries, random entries, and one whole block (A-D) — x datasets x partitions x seeds.
The study is the file studies/ablation.toml; this module gives it two flags of its own
(`python -m sweeps.run` finds them here; `python sweeps/ablation.py` is the same command).

    python -m sweeps.run ablation                           # digits; 2 shards per client and Dir(0.1)
    python -m sweeps.run ablation --variants gradselect random --seeds 0 1 2
"""
from __future__ import annotations

import sys

if __name__ == "__main__":  # `python sweeps/ablation.py` is `python -m sweeps.run ablation`
    from sweeps.run import start
    sys.exit(start(["ablation", *sys.argv[1:]]))

import argparse
from dataclasses import replace

from fl_core.algorithms.fedselect import BLOCKS, VARIANTS
from sweeps.spec import STUDIES, Method, StudySpec
from sweeps.study import Study


def add_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("ablations (FedSelect's p and α: --pers-rate, --pers-limit below)")
    group.add_argument("--variants", nargs="+", choices=VARIANTS, default=None,
                       help=f"FedSelect variants to run (default: {' '.join(VARIANTS)})")
    group.add_argument("--blocks", nargs="+", choices=BLOCKS, default=None,
                       help=f"blocks for the layer variant (A-D, see fl_core/models.py) (default: {' '.join(BLOCKS)})")


def customize(spec: StudySpec, args: argparse.Namespace) -> StudySpec:
    """--variants / --blocks: one method entry for the variants other than `layer`, one for
    `layer` over its blocks (layer_block only matters there)."""
    if args.variants is None and args.blocks is None:
        return spec
    variants = args.variants or list(VARIANTS)
    methods = [m for m in spec.methods if m.algorithm != "fedselect"]
    plain = [v for v in variants if v != "layer"]
    if plain:
        methods.append(Method("fedselect", {"fedselect_variant": plain}))
    if "layer" in variants:
        methods.append(Method("fedselect", {"fedselect_variant": "layer", "layer_block": args.blocks or list(BLOCKS)}))
    return replace(spec, methods=tuple(methods))


STUDY = Study(STUDIES / "ablation.toml", "-m sweeps.run ablation", add_arguments, customize)
