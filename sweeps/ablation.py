"""FedSelect ablation study (the paper's Table 3): GradSelect against personalizing the least
changed entries, random entries, and one whole block (A-D) — x datasets x partitions x seeds.
The study is the file studies/ablation.toml; this script runs it with two flags of its own.

    python sweeps/ablation.py                           # digits; 2 shards per client and Dir(0.1)
    python sweeps/ablation.py --variants gradselect random --seeds 0 1 2
"""
from __future__ import annotations

import argparse
import sys
from dataclasses import replace
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make the repository importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
if __name__ == "__main__":  # a signal from here until the sweep starts: one line, its exit status
    from sweeps.interrupts import while_starting
    while_starting()
    from fl_core.kernels import pin_from_argv
    pin_from_argv(sys.argv[1:])  # the reproducible mode, before torch loads (fl_core/kernels.py)

from fl_core.algorithms.fedselect import BLOCKS, VARIANTS  # noqa: E402
from sweeps.spec import STUDIES, Method, StudySpec  # noqa: E402
from sweeps.study import Study, run_study  # noqa: E402


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


STUDY = Study(STUDIES / "ablation.toml", "sweeps/ablation.py", add_arguments, customize)

if __name__ == "__main__":
    sys.exit(run_study(STUDY))
