"""What the whole-run parity scripts share: the rounds they record, the summary over seeds, and the
docs' whole-run parity table (docs/results/parity/whole_runs.md) made from their saved runs.

Each of benchmarks/parity/{dispfl,perfedmask,fedselect}.py records, per seed, one `Round` per
communication round (both implementations' mean client accuracy and seconds, measured in the same
process, alternating) and, with `--json PATH`, writes them with the command that produced them.
The summary compares the final round over seeds: mean ± sample std of each side, their mean
difference, a paired t-test over seeds (`scipy.stats.ttest_rel`; "no significant difference" at
p ≥ 0.05), whether both sides converged (the mean of the last five rounds moved less than one
point from the five rounds before), and their time per round over ours.

    .venv/bin/python -m benchmarks.parity.report runs/dispfl.json runs/perfedmask.json --markdown
"""
from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

from fl_core.training import batch_order, derive_seed

CONVERGED_WITHIN = 0.01  # accuracy the last five rounds' mean may move from the five before


@dataclass(frozen=True)
class Round:
    rnd: int
    ours: float           # mean client accuracy of the measured model
    theirs: float
    seconds_ours: float   # wall seconds of the round, training and evaluation
    seconds_theirs: float


@dataclass(frozen=True)
class Summary:
    seeds: list[int]
    rounds: int
    ours_mean: float
    ours_std: float
    theirs_mean: float
    theirs_std: float
    diff: float           # mean over seeds of ours - theirs
    p_value: float        # paired t-test over seeds (nan with fewer than 2 seeds or identical pairs)
    converged_ours: bool
    converged_theirs: bool
    speed_ratio: float    # their seconds per round / ours

    def verdict(self) -> str:
        if math.isnan(self.p_value):
            return "equal in every seed" if self.diff == 0 else "too few seeds for a test"
        return "no significant difference" if self.p_value >= 0.05 else f"ours {'higher' if self.diff > 0 else 'lower'}"


def converged(curve: list[float]) -> bool:
    """Whether the mean of the last five values moved less than `CONVERGED_WITHIN` from the five before."""
    if len(curve) < 10:
        return False
    return abs(statistics.mean(curve[-5:]) - statistics.mean(curve[-10:-5])) < CONVERGED_WITHIN


def summarise(runs: dict[int, list[Round]]) -> Summary:
    if not runs or any(not rows for rows in runs.values()):
        raise ValueError("summarise needs at least one round for every seed")
    ours = [rows[-1].ours for rows in runs.values()]
    theirs = [rows[-1].theirs for rows in runs.values()]

    def sd(v):
        return statistics.stdev(v) if len(v) > 1 else float("nan")

    p = float("nan")
    if len(ours) > 1 and any(a != b for a, b in zip(ours, theirs)):
        from scipy.stats import ttest_rel
        p = float(ttest_rel(ours, theirs).pvalue)
    all_rows = [r for rows in runs.values() for r in rows]
    return Summary(
        seeds=list(runs), rounds=len(next(iter(runs.values()))),
        ours_mean=statistics.mean(ours), ours_std=sd(ours),
        theirs_mean=statistics.mean(theirs), theirs_std=sd(theirs),
        diff=statistics.mean(a - b for a, b in zip(ours, theirs)), p_value=p,
        converged_ours=all(converged([r.ours for r in rows]) for rows in runs.values()),
        converged_theirs=all(converged([r.theirs for r in rows]) for rows in runs.values()),
        speed_ratio=sum(r.seconds_theirs for r in all_rows) / sum(r.seconds_ours for r in all_rows))


def print_summary(runs: dict[int, list[Round]]) -> Summary:
    s = summarise(runs)

    def pct(v):
        return f"{100 * v:.1f}"

    print(f"Final round {s.rounds}, seeds {s.seeds}: ours {pct(s.ours_mean)} ± {pct(s.ours_std)}, theirs "
          f"{pct(s.theirs_mean)} ± {pct(s.theirs_std)} (%, mean ± sample std over seeds); ours - theirs "
          f"{100 * s.diff:+.2f} points, per seed "
          f"{', '.join(f'{100 * (r[-1].ours - r[-1].theirs):+.2f}' for r in runs.values())}; "
          f"paired t-test p = {s.p_value:.3g}: {s.verdict()}")
    print(f"Converged (last 5 rounds' mean within {100 * CONVERGED_WITHIN:.0f} point of the 5 before): "
          f"ours {s.converged_ours}, theirs {s.converged_theirs}. Their seconds per round / ours: {s.speed_ratio:.2f}")
    return s


def save(path: Path, system: str, reference: str, measured: str, runs: dict[int, list[Round]],
         settings: dict) -> None:
    """The runs, the command line and the settings as JSON, written atomically."""
    payload = dict(system=system, reference=reference, measured=measured, command=" ".join(sys.argv),
                   settings=settings, runs={str(seed): [asdict(r) for r in rows] for seed, rows in runs.items()})
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(payload, indent=1))
    os.replace(tmp, path)


def load(path: Path) -> tuple[dict, dict[int, list[Round]]]:
    try:
        payload = json.loads(path.read_text())
        runs = {int(seed): [Round(**r) for r in rows] for seed, rows in payload["runs"].items()}
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise SystemExit(f"error: {path} is not a parity run written by --json ({type(exc).__name__}: {exc})")
    return payload, runs


def mean_std(mean: float, std: float) -> str:
    """A percentage as mean ± std (the mean alone for one seed)."""
    return f"{100 * mean:.1f}" if math.isnan(std) else f"{100 * mean:.1f} ± {100 * std:.1f}"


def markdown(paths: list[Path]) -> str:
    lines = ["| System (reference) | What is compared | Seeds × rounds | Ours (%) | Theirs (%) | Ours − theirs "
             "(points) | Paired t-test | Converged (ours, theirs) | Their time / ours per round |",
             "|---|---|---|---|---|---|---|---|---|"]
    for path in paths:
        payload, runs = load(path)
        s = summarise(runs)
        test = s.verdict() if math.isnan(s.p_value) else f"p = {s.p_value:.2g}: {s.verdict()}"
        lines.append(f"| {payload['system']} ({payload['reference']}) | {payload['measured']} "
                     f"| {len(s.seeds)} × {s.rounds} "
                     f"| {mean_std(s.ours_mean, s.ours_std)} | {mean_std(s.theirs_mean, s.theirs_std)} "
                     f"| {100 * s.diff:+.2f} | {test} | "
                     f"{'yes' if s.converged_ours else 'no'}, {'yes' if s.converged_theirs else 'no'} "
                     f"| {s.speed_ratio:.2f} |")
    return "\n".join(lines)


class ReplayLoader:
    """A training loader for the reference whose i-th pass yields the batches of our trainer's i-th
    pass for client k in round `rnd`: pass i is epoch i // len(purposes) with purpose
    purposes[i % len(purposes)] (FedSelect alternates a personal and a global pass per epoch), in
    the order `LocalTrainer.train_pass` draws (a permutation seeded by `derive_seed`)."""

    def __init__(self, x, y, k: int, rnd: int, seed: int, batch_size: int, purposes: tuple[str, ...] = ("global",)):
        self.x, self.y, self.k, self.rnd, self.seed = x, y, k, rnd, seed
        self.batch_size, self.purposes = batch_size, purposes
        self.passes = 0

    def __len__(self) -> int:
        return -(-len(self.y) // self.batch_size)

    def __iter__(self):
        epoch, i = divmod(self.passes, len(self.purposes))
        self.passes += 1
        seed = derive_seed(self.seed, self.rnd, self.k, epoch, self.purposes[i])
        order = batch_order(seed, len(self.y))
        for start in range(0, len(order), self.batch_size):
            idx = order[start:start + self.batch_size]
            yield self.x[idx], self.y[idx]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("runs", type=Path, nargs="+", help="JSON files written by the parity scripts' --json")
    parser.add_argument("--markdown", action="store_true",
                        help="the docs' table (else one summary per file); docs/results/parity/whole_runs.md")
    parser.add_argument("--out", type=Path, default=None, help="with --markdown: also write the table to this file")
    args = parser.parse_args()
    if args.markdown:
        table = markdown(args.runs)
        print(table)
        if args.out is not None:
            args.out.parent.mkdir(parents=True, exist_ok=True)
            args.out.write_text(table.rstrip("\n") + "\n")
        return
    for path in args.runs:
        payload, runs = load(path)
        print(f"== {payload['system']} ({payload['reference']}): {payload['measured']}\n   {payload['command']}")
        print_summary(runs)


if __name__ == "__main__":
    main()
