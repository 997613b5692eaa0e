"""PerFedMask's mask problem: greedy start vs SCA vs the exact optimum, objective and seconds.

Rows: random small instances (exact by enumeration), random medium ones (exact MILP), the PerFedMask
study's instance (LeNet on 28x28 MNIST: 4 groups, 20 devices) and the authors' CIFAR-10
PreResNet-18 layer groups (10 groups: stem conv, 8 residual blocks, final BN; the linear head
excluded), all with budgets from the slim ratios "8-1" (first half of the devices psi = d_w/8,
second half psi = d_w; fl_core.devices), PreResNet-18 at N = 20 (exact MILP under a time limit)
and N = 100 (too large for the exact solver: "n/a"). `SCA` is `solve_sca` (best rounding over its iterates,
the default); `SCA-last` is the last iterate's rounding, the authors' rule (after budget repair).

    .venv/bin/python -m benchmarks.perfedmask_masks                  # about a minute on 2 cores
    .venv/bin/python -m benchmarks.perfedmask_masks --large 0        # skip the N = 100 row
    .venv/bin/python -m benchmarks.perfedmask_masks --ratios 4-1 --time-limit 120
"""
from __future__ import annotations

import argparse
import time

import numpy as np


from fl_core.mask_problem import MaskProblem, greedy_masks, solve_exact, solve_sca


def model_groups(model: str, shape: tuple[int, int, int]) -> tuple[list[str], np.ndarray]:
    """A registered model's PerFedMask layer groups (fl_core.models.layer_groups) and their sizes."""
    from fl_core.models import build_model, layer_groups

    params = dict(build_model(model, shape, 10).named_parameters())
    groups = layer_groups(model, list(params))
    return [g for g, _ in groups], np.array([sum(params[p].numel() for p in members) for _, members in groups])


def slim_budgets(ratios: str, n: int, d_w: int) -> np.ndarray:
    """psi_n = r_n * d_w with the devices' width ratios as PerFedMask runs get them (fl_core.devices)."""
    from fl_core.devices import device_ratios

    return np.array(device_ratios(ratios, n)) * d_w


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
    for model, shape, sizes_n in (("lenet", (1, 28, 28), (args.mid,)),
                                  ("preresnet18", (3, 32, 32), (args.mid, args.large))):
        names, sizes = model_groups(model, shape)
        d_w = int(sizes.sum())
        print(f"{model} {shape} groups, d_w = {d_w:,}: " + ", ".join(f"{n} {s:,}" for n, s in zip(names, sizes)))
        for n in sizes_n:
            if n:
                cases.append((f"{model} {args.ratios}", MaskProblem(sizes, slim_budgets(args.ratios, n, d_w))))

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
