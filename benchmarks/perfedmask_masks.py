"""PerFedMask's mask problem: greedy start vs SCA vs the exact optimum, objective and seconds.

Rows: random small instances (exact by enumeration), random medium ones (exact MILP), and the
authors' CIFAR-10 PreResNet-18 layer groups (10 groups: stem conv, 8 residual blocks, final BN; the
linear head excluded) with budgets from the slim ratios "8-1" (first half of the devices psi = d_w/8,
second half psi = d_w), at N = 20 (exact MILP under a time limit) and N = 100 (too large for the
exact solver: "n/a"). `SCA` is `solve_sca` (best rounding over its iterates, the default);
`SCA-last` is the last iterate's rounding, the authors' rule (after budget repair).

    .venv/bin/python benchmarks/perfedmask_masks.py                  # about a minute on 2 cores
    .venv/bin/python benchmarks/perfedmask_masks.py --large 0        # skip the N = 100 row
    .venv/bin/python benchmarks/perfedmask_masks.py --ratios 4-1 --time-limit 120
"""
from __future__ import annotations

import argparse
import re
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from fl_core.mask_problem import MaskProblem, greedy_masks, solve_exact, solve_sca  # noqa: E402


def preresnet18_groups() -> tuple[list[str], np.ndarray]:
    """Parameter counts of the authors' 10 CIFAR-10 PreResNet-18 layer groups, head excluded."""
    from fl_core.models import build_model

    sizes: dict[str, int] = {}
    for name, param in build_model("preresnet18", (3, 32, 32), 10).named_parameters():
        if name.startswith("linear."):
            continue
        block = re.match(r"layer\d+\.\d+\.", name)
        group = "stem" if name.startswith("conv1.") else "final" if name.startswith("bn4.") else \
            block.group(0)[:-1] if block else None
        if group is None:
            raise RuntimeError(f"parameter {name} belongs to no PerFedMask layer group")
        sizes[group] = sizes.get(group, 0) + param.numel()
    return list(sizes), np.array(list(sizes.values()))


def slim_budgets(ratios: str, n: int, d_w: int) -> np.ndarray:
    """SplitMix-style slim ratios "8-1": equal shares of the devices, in order, with psi = d_w / r."""
    widths = [1.0 / float(r) for r in ratios.split("-")]
    share = np.arange(n) * len(widths) // n
    return np.array([widths[s] * d_w for s in share])


def random_problem(rng: np.random.Generator, n: int, j: int) -> MaskProblem:
    sizes = np.round(10 ** rng.uniform(3, 6.5, j)).astype(int)
    return MaskProblem(sizes, rng.uniform(0.0, 1.1, n) * sizes.sum())


def fmt(value: float | None) -> str:
    return "n/a" if value is None else f"{value:,.0f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    parser.add_argument("--small", type=int, default=4, help="random small instances (N 3-5, J 3-4)")
    parser.add_argument("--medium", type=int, default=2, help="random medium instances (N=8, J=6; MILP)")
    parser.add_argument("--mid", type=int, default=20, help="devices of the PreResNet-18 row with an exact MILP")
    parser.add_argument("--large", type=int, default=100, help="devices of the large PreResNet-18 row (0: skip)")
    parser.add_argument("--ratios", default="8-1", help="slim ratios for the PreResNet-18 budgets")
    parser.add_argument("--time-limit", type=float, default=60.0, help="seconds for each exact MILP")
    parser.add_argument("--penalty", type=float, default=100.0, help="SCA penalty (raw units, as the authors)")
    parser.add_argument("--solver", default="CLARABEL", help="cvxpy solver for SCA")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    rng = np.random.default_rng(args.seed)
    cases = [(f"random small {i}", random_problem(rng, int(rng.integers(3, 6)), int(rng.integers(3, 5))))
             for i in range(args.small)]
    cases += [(f"random medium {i}", random_problem(rng, 8, 6)) for i in range(args.medium)]
    names, sizes = preresnet18_groups()
    d_w = int(sizes.sum())
    print(f"PreResNet-18 (CIFAR-10) groups, d_w = {d_w:,}: " + ", ".join(f"{n} {s:,}" for n, s in zip(names, sizes)))
    for n in (args.mid, args.large):
        if n:
            cases.append((f"preresnet18 {args.ratios}", MaskProblem(sizes, slim_budgets(args.ratios, n, d_w))))

    header = (f"{'instance':<20} {'N':>4} {'J':>3} {'greedy':>12} {'SCA':>12} {'SCA-last':>12} {'exact':>12} "
              f"{'SCA/ex':>7} {'gr/ex':>7} {'iters':>5} {'t_gr':>6} {'t_sca':>6} {'t_ex':>6}")
    print(header)
    print("-" * len(header))
    exact_masks = {}
    for label, p in cases:
        greedy = greedy_masks(p)
        sca = solve_sca(p, penalty=args.penalty, solver=args.solver)
        exact, t_exact = None, None
        try:
            exact = solve_exact(p, time_limit=args.time_limit)
            t_exact = f"{exact.seconds:6.2f}"
            exact_masks[(label, p.N)] = exact.masks
        except (ValueError, RuntimeError) as exc:
            t_exact = "n/a"
            note = str(exc).split(";")[0]
        ratio = lambda v: f"{v / exact.objective:7.3f}" if exact and exact.objective > 0 else "    n/a"  # noqa: E731
        print(f"{label:<20} {p.N:>4} {p.J:>3} {fmt(greedy.objective):>12} {fmt(sca.objective):>12} "
              f"{fmt(sca.last_objective):>12} {fmt(exact and exact.objective):>12} {ratio(sca.objective)} "
              f"{ratio(greedy.objective)} {sca.iterations:>5} {greedy.seconds:6.2f} {sca.seconds:6.2f} {t_exact:>6}")
        if exact is None:
            print(f"{'':<20} exact: {note}")
        if sca.notes:
            print(f"{'':<20} sca: {sca.notes}")
        small = exact_masks.get((label, args.mid))
        repeated = None if small is None or p.N % args.mid else np.repeat(small, p.N // args.mid, axis=0)
        if exact is None and repeated is not None and p.feasible(repeated):
            # The N = mid optimum with every device repeated: feasible here, an upper bound on the optimum.
            bound = p.objective(repeated)
            print(f"{'':<20} N={args.mid} optimum repeated x{p.N // args.mid}: f = {bound:,.0f} (>= optimum); "
                  f"SCA/that = {sca.objective / bound:.3f}, greedy/that = {greedy.objective / bound:.3f}")


if __name__ == "__main__":
    t0 = time.perf_counter()
    main()
    print(f"total {time.perf_counter() - t0:.1f} s")
