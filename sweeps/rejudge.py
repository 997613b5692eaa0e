"""Judge a finished sweep's trials again by the current divergence rule, from its round rows.

A sweep keeps each trial's verdict (`diverged`, `diverged_why` in trials.parquet) as the rule of
the code that ran it decided it. When the rule changes (fl_core.results.divergence), the round
rows the sweep kept are enough to judge it again; this rewrites trials.parquet with the new
verdicts (atomically) and prints every verdict that changed:

    python -m sweeps.rejudge results/t1-fedavg --chance 0.1      # 10 classes
    python -m sweeps.rejudge results/t1-fedavg --chance 0.1 --dry-run

`--chance` (1 / number of classes) is used for the rows that do not record their own (`chance`,
written by sweeps since it was added); without either, only lost losses count.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pandas as pd

from fl_core.result_files import read_rounds, rejudged
from fl_core.results import write_parquet


def changes(before: pd.DataFrame, after: pd.DataFrame) -> list[str]:
    """One line per trial whose verdict changed: its hash, method, seed and both verdicts."""
    lines = []
    for (_, old), (_, new) in zip(before.iterrows(), after.iterrows()):
        was = old.get("diverged_why") or "not diverged"
        if bool(old.get("diverged", False)) != bool(new["diverged"]) or was != (new["diverged_why"] or "not diverged"):
            lines.append(f"{new['config_hash']} {new.get('algorithm', '?')} seed {new.get('seed', '?')}: "
                         f"{was} -> {new['diverged_why'] or 'not diverged'}")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sweeps.rejudge", description=__doc__.splitlines()[0])
    parser.add_argument("sweep", type=Path, help="the sweep folder (holds trials.parquet and rounds/)")
    parser.add_argument("--chance", type=float, default=None,
                        help="1 / number of classes, for rows that do not record it (default: none; only lost "
                             "losses then count)")
    parser.add_argument("--dry-run", action="store_true", help="print the changes, write nothing")
    args = parser.parse_args(argv)
    trials_file = args.sweep / "trials.parquet"
    if not trials_file.exists():
        parser.error(f"{args.sweep}: no trials.parquet (a finished sweep's folder is needed)")
    if args.chance is not None and not 0 < args.chance < 1:
        parser.error(f"--chance {args.chance}: must be between 0 and 1 (1 / number of classes)")
    trials = pd.read_parquet(trials_file)
    after = rejudged(trials, read_rounds(args.sweep), args.chance)
    lines = changes(trials, after)
    print("\n".join(lines) if lines else "no verdict changed", file=sys.stderr)
    if lines and not args.dry_run:
        write_parquet(after, trials_file)
        print(f"{trials_file}: {len(lines)} verdicts rewritten", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
