"""PerFedMask side by side with the authors' code (github.com/MehdiSet/PerFedMask, fed_perfedmask.py).

The authors' files are imported unmodified from a checkout given by --ref and adapted from outside:
`wandb` (imported at the top of fed_perfedmask.py, used only by its __main__ block) is a stub
module; the import runs with the checkout as working folder because utils/config.py creates
./data and ./checkpoint on import; `varInit` reads a global `fed` (for the number of devices),
set on their module; their federation object is made without its __init__ (which loads their
CIFAR/DomainNet files) and handed our clients. MOSEK (their SCA solver) needs a licence that this
machine has no way to get: with `--ref-solver MOSEK` their try/except swallows the failure and
`optMask` returns its greedy start; by default each cvxpy solve asked of MOSEK goes to Clarabel
with `tol_gap_rel` = their MOSEK relative gap 0.1 (`--ref-gap`).

Part 1, the mask problem P^mask (always): for each instance (the LeNet groups of our studies, a
random small and a random medium one; PreResNet-18 with --preresnet) the authors' greedy start
(`varInit`) and SCA (`optMask`, its last iterate rounded at 0.5 as their `expand_subLayer_Mask`)
against ours (`greedy_masks`, `solve_sca` with its best-rounding rule and with the authors' last-
iterate rule, `solve_exact` where it is small enough). Also the layer-group sizes their
`layerWiseModelPartition` gives their PreResNet-18 / MobileNet against ours, and their device
ratio schedule against fl_core.devices.

Part 2, training (--rounds > 0): Fashion-MNIST, 20 devices of 200 images (3 shards each, the
authors' pu_nclass=3; or --partition dirichlet), LeNet from the same initial weights, slim ratios
8-1, SGD lr 0.01 momentum 0.9 weight decay 5e-4, batch 50, 5 local epochs, all devices each round;
ours with one momentum buffer per round as theirs (`--momentum-scope round`; `epoch`: the engine's default).
Theirs: their `train`, `test`, `personalization` and `SlimmableModelAccumulator` (download,
mask_upload, aggregate) driven by a round loop written here after their __main__ block (it cannot
be imported; its layer expansion has no LeNet case, so each group's parameter names come from
fl_core.models.layer_groups), with the masks their `optMask` chose. Ours: fl_core's Simulation.
Per round, alternating: mean accuracy before fine-tuning (the global model) and after (5 epochs
of SGD on every parameter, their `personalization`, as their test mode runs it), and seconds.

With `--order shared` their training and fine-tuning loaders replay the batches our trainer draws
(benchmarks/parity/report.py `ReplayLoader`): with `--momentum-scope round` both then give the same
accuracies to the last digit for the first rounds (2 to 4 of 20, by seed; measured at 2ecd165)
until float-rounding differences, amplified by training, surface.

    .venv/bin/python -m benchmarks.parity.perfedmask --ref /path/to/PerFedMask --rounds 0   # masks only, ~1 min
    .venv/bin/python -m benchmarks.parity.perfedmask --ref /path/to/PerFedMask --rounds 3 --seeds 0
    .venv/bin/python -m benchmarks.parity.perfedmask --ref /path/to/PerFedMask --skip-masks --rounds 50 --seeds 0 1 2 \\
        --momentum-scope round --data-root ../shared/data --json pfm.json     # the full setting (~50 CPU min)
    .venv/bin/python -m benchmarks.parity.report pfm.json --markdown          # the README's parity row
"""
from __future__ import annotations

import argparse
import contextlib
import copy
import os
import sys
import time
import types
import warnings
from pathlib import Path

import numpy as np
import torch


from benchmarks.parity.report import ReplayLoader, Round, print_summary, save
from fl_core.devices import device_ratios
from fl_core.mask_problem import MaskProblem, greedy_masks, solve_exact, solve_sca
from fl_core.models import build_model, layer_groups


# ---------------------------------------------------------------- the authors' modules
def import_reference(ref: Path, extra: list[str]) -> types.SimpleNamespace:
    """Their modules, imported unmodified from the checkout `ref`."""
    sys.path[:0] = [str(ref)] + extra
    sys.modules.setdefault("wandb", types.ModuleType("wandb"))  # only their __main__ block logs to it
    here = os.getcwd()
    os.chdir(ref)  # utils/config.py makes ./data and ./checkpoint where it is imported
    try:
        import fed_perfedmask
        from federated import core, learning
        from nets.slimmable_models import get_slim_ratios_from_str
        from utils.utils import MultiStepLR
    finally:
        os.chdir(here)
    return types.SimpleNamespace(main=fed_perfedmask, core=core, learning=learning,
                                 slim_ratios=get_slim_ratios_from_str, MultiStepLR=MultiStepLR)


@contextlib.contextmanager
def mosek_redirect(solver: str, gap: float, log: list[str]):
    """Each cvxpy solve asked of MOSEK goes to `solver` (MOSEK: left alone); `log` gets the status
    or the exception of every solve, which their bare `except` would hide."""
    import cvxpy as cp
    original = cp.Problem.solve

    def solve(self, *args, **kw):
        if kw.get("solver") == cp.MOSEK and solver != "MOSEK":
            kw.pop("mosek_params", None)
            kw["solver"] = solver
            if solver == "CLARABEL":
                kw["tol_gap_rel"] = gap
        try:
            value = original(self, *args, **kw)
        except Exception as exc:
            log.append(f"{type(exc).__name__}: {str(exc).splitlines()[0][:90]}")
            raise
        log.append(self.status)
        return value

    cp.Problem.solve = solve
    try:
        yield
    finally:
        cp.Problem.solve = original


def reference_masks(ref, p: MaskProblem, solver: str, gap: float, seed: int) -> dict:
    """Their greedy start (varInit) and their SCA (optMask), both seeded as their set_seed does."""
    n, j = p.N, p.J
    ref.main.fed = types.SimpleNamespace(client_sampler=types.SimpleNamespace(tot=lambda: n))
    args = (n, j, list(p.budgets / p.d_w), float(p.d_w), p.group_sizes.astype(float))
    np.random.seed(seed)
    t0 = time.perf_counter()
    greedy = ref.main.varInit(*args)[0]
    t_greedy, log = time.perf_counter() - t0, []
    np.random.seed(seed)
    t0 = time.perf_counter()
    with mosek_redirect(solver, gap, log), np.errstate(all="ignore"):
        last = ref.main.optMask(*args)[0]
    return {"greedy": greedy >= 0.5, "sca": last >= 0.5, "sca_relaxed": last, "t_greedy": t_greedy,
            "t_sca": time.perf_counter() - t0, "solves": log}


def masking_bias(p: MaskProblem, m: np.ndarray) -> float:
    """f(m) of P^mask written out again, so that an over-budget mask (negative slack) is scored too."""
    m = m.astype(float)
    k = m / np.maximum(m.sum(axis=0, keepdims=True), 1.0)
    return float(np.sum(p.d_w * k.max(axis=1) - k @ p.group_sizes + p.budgets - m @ p.group_sizes))


# ---------------------------------------------------------------- instances
def model_group_sizes(model: str, shape: tuple[int, int, int], classes: int = 10) -> tuple[list[str], np.ndarray]:
    params = dict(build_model(model, shape, classes).named_parameters())
    groups = layer_groups(model, list(params))
    return [g for g, _ in groups], np.array([sum(params[q].numel() for q in members) for _, members in groups])


def instances(args) -> list[tuple[str, MaskProblem]]:
    rng = np.random.default_rng(args.seed)
    out = []
    for label, n, j in (("random small", 4, 3), ("random medium", 8, 6)):
        sizes = np.round(10 ** rng.uniform(3, 5, j)).astype(int)
        budgets = np.round(rng.uniform(0.1, 1.0, n) * sizes.sum())
        budgets = np.maximum(budgets, sizes.min())  # every device fits a group (their greedy rejects the others)
        out.append((label, MaskProblem(sizes, budgets)))
    _, sizes = model_group_sizes("lenet", (1, 28, 28))
    for spec in ("8-1", "8-4-2-1"):
        out.append((f"LeNet 28x28 {spec}", MaskProblem(sizes, np.array(device_ratios(spec, 20)) * sizes.sum())))
    if args.preresnet:
        _, sizes = model_group_sizes("preresnet18", (3, 32, 32))
        out.append(("PreResNet-18 8-1", MaskProblem(sizes, np.array(device_ratios("8-1", 20)) * sizes.sum())))
    return out


def rows(m: np.ndarray) -> str:
    return " ".join("".join("1" if v else "0" for v in row) for row in m)


def compare_masks(ref, args) -> None:
    print("== layer groups: their layerWiseModelPartition on their model vs our layer_groups")
    here = os.getcwd()
    os.chdir(args.ref)
    from nets.HeteFL.preresne import resnet18
    from nets.Nets import MobileNetCifar
    os.chdir(here)
    for data, theirs, ours, classes in (("Cifar10", resnet18, "preresnet18", 10),
                                        ("Cifar100", MobileNetCifar, "mobilenet_cifar", 100)):
        model = theirs(track_running_stats=False, num_classes=classes, width_scale=1.0)
        named = [(name, q.numel()) for name, q in model.named_parameters() if "linear" not in name]
        _, their_sizes = ref.main.layerWiseModelPartition(data, [q for q, _ in named], [s for _, s in named])
        _, our_sizes = model_group_sizes(ours, (3, 32, 32), classes)
        print(f"  {data}: theirs {their_sizes.astype(int).tolist()}\n  {' ' * len(data)}  ours   {our_sizes.tolist()}"
              f"  -> {'equal' if np.array_equal(their_sizes, our_sizes) else 'DIFFERENT'}")
    print("== device ratios: their get_slim_ratio_schedule vs fl_core.devices.device_ratios (20 devices)")
    for spec in ("8-1", "8-4-2-1"):
        fed = object.__new__(ref.core.HeteFederation)
        fed.client_num, fed.clients = 20, [str(i) for i in range(20)]
        theirs = fed.get_slim_ratio_schedule(ref.slim_ratios(spec), spec)
        print(f"  {spec}: {'equal' if theirs == device_ratios(spec, 20) else 'DIFFERENT'} {theirs}")
    print(f"== P^mask (their SCA solver: {args.ref_solver}"
          f"{f', tol_gap_rel {args.ref_gap}' if args.ref_solver == 'CLARABEL' else ''}; masks: one row per device)")
    for label, p in instances(args):
        theirs = reference_masks(ref, p, args.ref_solver, args.ref_gap, args.seed)
        ours = {"greedy": greedy_masks(p).masks, "sca": solve_sca(p).masks,
                "sca_last": solve_sca(p, keep_best=False).masks}
        try:  # enumeration, or a MILP under a time limit (seconds of wall time: slow on a busy machine)
            ours["exact"] = solve_exact(p, time_limit=args.time_limit).masks
        except (ValueError, RuntimeError) as exc:
            print(f"  (exact: {str(exc)[:100]})")
        best = min(masking_bias(p, m) for m in ours.values())
        budgets = (np.round(p.budgets).astype(int).tolist() if p.N <= 8 else
                   np.unique(np.round(p.budgets)).astype(int).tolist())
        print(f"-- {label}: N={p.N}, group sizes {p.group_sizes.tolist()}, budgets {budgets}")
        for name, m in ([(f"theirs {k}", theirs[k]) for k in ("greedy", "sca")]
                        + [(f"ours {k}", v) for k, v in ours.items()]):
            f = masking_bias(p, m)
            flag = "" if p.feasible(m) else "  OVER BUDGET"
            print(f"  {name:<14} f = {f:>12,.0f}  ({f / best - 1:+.3%} vs our best){flag}  {rows(m)}")
        print(f"  their SCA: {len(theirs['solves'])} solves {sorted(set(theirs['solves']))}, "
              f"{theirs['t_sca']:.1f} s (greedy {theirs['t_greedy']:.1f} s); last iterate "
              f"{np.round(theirs['sca_relaxed'], 2).tolist() if p.N * p.J <= 24 else '(large)'}")
        for k in ("greedy", "sca"):
            same = np.array_equal(theirs[k], ours[k])
            print(f"  {k}: masks {'identical' if same else 'differ'} ({int((theirs[k] != ours[k]).sum())} entries), "
                  f"f theirs - ours = {masking_bias(p, theirs[k]) - masking_bias(p, ours[k]):+,.0f}")


# ---------------------------------------------------------------- training
def our_simulation(args, seed: int):
    from fl_core.config import RunConfig
    from fl_core.simulation import Simulation
    r = args.rounds
    schedule = {"lr_schedule": "multistep", "lr_decay": 0.1, "lr_milestones": f"{r // 2 + 1},{3 * r // 4 + 1}"} \
        if args.lr_schedule == "multistep" and r >= 4 else {}
    return Simulation(RunConfig(
        algorithm="perfedmask", dataset="fmnist", data_root=args.data_root, partition=args.partition,
        shards_per_client=args.shards, dir_alpha=args.dir_alpha, num_clients=args.clients,
        samples_per_client=args.samples, test_samples_per_client=args.samples, model="lenet", rounds=r,
        eval_every=1, local_epochs=args.local_epochs, batch_size=50, lr=args.lr, momentum=0.9, weight_decay=5e-4,
        weighting="samples", seed=seed, slim_ratios="8-1", ft_epochs=5, momentum_scope=args.momentum_scope,
        **schedule))


class AuthorsRun:
    """Their training pieces on our clients: one running model, their federation's aggregator."""

    def __init__(self, ref, sim, masks: np.ndarray, args, seed: int):
        self.shared_order, self.our_seed, self.epochs = args.order == "shared", sim.config.seed, args.local_epochs
        from torch.utils.data import DataLoader, TensorDataset
        torch.manual_seed(seed)  # their set_seed: the DataLoaders' shuffling draws from it
        np.random.seed(seed)
        self.ref, data = ref, sim.data
        self.model = build_model("lenet", data.input_shape, data.num_classes)
        self.model.load_state_dict(sim.clients[0].state)  # our initial weights
        groups = layer_groups("lenet", [n for n, _ in self.model.named_parameters()])
        self.trains = [[q for j, (_, members) in enumerate(groups) if row[j] for q in members] for row in masks]
        self.train = [DataLoader(TensorDataset(d.x_train, d.y_train), batch_size=50, shuffle=True)
                      for d in data.clients]
        self.test = [DataLoader(TensorDataset(d.x_test, d.y_test), batch_size=128) for d in data.clients]
        sizes = [d.n_train for d in data.clients]
        n = len(sizes)
        fed = self.fed = object.__new__(ref.core.HeteFederation)  # its __init__ would load their data sets
        fed.args = types.SimpleNamespace(pr_nuser=n)
        fed.clients, fed.client_num = [str(k) for k in range(n)], n
        fed.client_weights = [s / sum(sizes) for s in sizes]
        fed.client_sampler = ref.core.UserSampler(list(range(n)), n, mode="uni")
        fed.make_aggregator(self.model)
        # their step count: epochs over the client's own loader for equal sizes ('uni'), else the mean loader's
        mean_iters = int(np.mean([len(dl) for dl in self.train]))
        self.steps = [len(dl) * args.local_epochs if len(set(sizes)) == 1 else mean_iters * args.local_epochs
                      for dl in self.train]
        self.loss = torch.nn.CrossEntropyLoss()

    def loader(self, k: int, rnd: int, purpose: str):
        """Client k's training loader: their shuffling DataLoader, or (order shared) one replaying
        the batches our trainer draws for this round and purpose."""
        if not self.shared_order:
            return self.train[k]
        d = self.train[k].dataset.tensors
        return ReplayLoader(d[0], d[1], k, rnd, self.our_seed, 50, (purpose,))

    def round(self, lr: float, rnd: int) -> tuple[float, float]:
        learning, model, fed, cpu = self.ref.learning, self.model, self.fed, torch.device("cpu")
        for k in fed.client_sampler.iter():
            fed.download(model, k)
            groups = []
            for name, q in model.named_parameters():  # the others stay frozen at lr 0, as theirs
                q.requires_grad_(name in self.trains[k])
                groups.append({"params": q, "lr": lr if name in self.trains[k] else 0.0})
            opt = torch.optim.SGD(groups, momentum=0.9, weight_decay=5e-4)
            learning.train(model, self.loader(k, rnd, "global"), opt, self.loss, cpu, max_iter=self.steps[k],
                           progress=False)
            fed.mask_upload(model, k, self.trains[k])
        fed.aggregate()
        before, after = [], []
        for k in range(fed.client_num):
            fed.download(model, k)
            before.append(learning.test(model, self.test[k], self.loss, cpu)[1])
            tuned = copy.deepcopy(model)
            tuned.requires_grad_(True)  # as in their test mode, where the model is built afresh
            after.append(learning.personalization(tuned, self.loader(k, rnd, "finetune"), self.test[k], self.loss, lr,
                                                  cpu)[1])
        return float(np.mean(before)), float(np.mean(after))


def compare_training(ref, args) -> None:
    torch.set_num_threads(args.threads)
    runs: dict[int, list[Round]] = {}
    before_ft: dict[str, list[float]] = {"ours": [], "theirs": []}
    for seed in args.seeds:
        sim = our_simulation(args, seed)
        our_masks = sim.algorithm.solution.masks
        sizes = np.array([sum(sim.algorithm.numels[q] for q in members)
                          for _, members in layer_groups("lenet", sim.algorithm.param_names)])
        p = MaskProblem(sizes, np.array(sim.algorithm.ratios) * sizes.sum())
        theirs_masks = reference_masks(ref, p, args.ref_solver, args.ref_gap, seed + 1)["sca"]  # their seed default 1
        print(f"== training, seed {seed}: masks {'identical' if np.array_equal(theirs_masks, our_masks) else 'DIFFER'} "
              f"(ours f = {masking_bias(p, our_masks):,.0f}, theirs f = {masking_bias(p, theirs_masks):,.0f})")
        run = AuthorsRun(ref, sim, theirs_masks, args, seed + 1)
        lrs = [args.lr] * args.rounds
        if args.lr_schedule == "multistep" and args.rounds >= 4:
            schedule = ref.MultiStepLR(args.lr, milestones=[args.rounds // 2, args.rounds * 3 // 4], gamma=0.1,
                                       last_epoch=0)
            lrs = [schedule.step() for _ in range(args.rounds)]
        print(f"{'round':>5} {'lr':>7} | {'ours before':>11} {'after':>6} | {'theirs before':>13} {'after':>6} | "
              f"{'diff before':>11} {'after':>6} | wall s: ours theirs | cpu s: ours theirs")
        runs[seed] = []
        for rnd in range(1, args.rounds + 1):
            assert abs(sim.config.lr_at(rnd) - lrs[rnd - 1]) < 1e-12, "lr schedules differ"
            c0, t0 = time.process_time(), time.perf_counter()
            result = sim.run_round()
            c1, t1 = time.process_time(), time.perf_counter()
            before, after = run.round(lrs[rnd - 1], rnd)
            c2, t2 = time.process_time(), time.perf_counter()
            ours_b, ours_a = result.mean("acc_global"), result.mean("acc")
            runs[seed].append(Round(rnd, ours_a, after, t1 - t0, t2 - t1))
            print(f"{rnd:>5} {lrs[rnd - 1]:>7.4f} | {ours_b:>11.4f} {ours_a:>6.4f} | {before:>13.4f} {after:>6.4f} | "
                  f"{ours_b - before:>+11.4f} {ours_a - after:>+6.4f} | {t1 - t0:>6.1f} {t2 - t1:>6.1f} | "
                  f"{c1 - c0:>6.1f} {c2 - c1:>6.1f}", flush=True)
        before_ft["ours"].append(ours_b)
        before_ft["theirs"].append(before)
        if args.json:  # after every seed: a long run's finished seeds survive an interruption
            save(args.json, "PerFedMask", "MehdiSet/PerFedMask @ 2ecd165",
                 f"mean client accuracy after fine-tuning, Fashion-MNIST {args.clients} devices of {args.samples} "
                 f"images ({args.partition}), LeNet 8-1, momentum scope {args.momentum_scope}, batch order "
                 f"{args.order}",
                 runs, vars(args) | {"ref": str(args.ref), "json": str(args.json)})
    print("== after fine-tuning (the accuracy PerFedMask reports)")
    print_summary(runs)
    o, t = before_ft["ours"], before_ft["theirs"]
    print(f"   before fine-tuning (the global model), final round: ours {100 * np.mean(o):.1f}, "
          f"theirs {100 * np.mean(t):.1f} (%, mean over seeds)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0], epilog=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ref", type=Path, required=True, help="checkout of MehdiSet/PerFedMask")
    parser.add_argument("--extra-path", action="append", default=[],
                        help="folder put on sys.path (their extra packages)")
    parser.add_argument("--ref-solver", default="CLARABEL", help="where their MOSEK solves go (MOSEK: as they are)")
    parser.add_argument("--ref-gap", type=float, default=0.1,
                        help="Clarabel tol_gap_rel for their solves (their MOSEK gap)")
    parser.add_argument("--preresnet", action="store_true", help="add the PreResNet-18 instance (their SCA: minutes)")
    parser.add_argument("--time-limit", type=float, default=300.0, help="seconds for our exact MILP")
    parser.add_argument("--seed", type=int, default=1, help="instances' and their greedy's seed (their default 1)")
    parser.add_argument("--skip-masks", action="store_true", help="training only")
    parser.add_argument("--rounds", type=int, default=0, help="training rounds (0: no training comparison)")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0])
    parser.add_argument("--data-root", default="../shared/data", help="folder with FashionMNIST/raw")
    parser.add_argument("--partition", default="shards", choices=("shards", "dirichlet"))
    parser.add_argument("--shards", type=int, default=3, help="classes per device (their pu_nclass 3)")
    parser.add_argument("--dir-alpha", type=float, default=0.5)
    parser.add_argument("--clients", type=int, default=20)
    parser.add_argument("--samples", type=int, default=200, help="train (and test) images per device")
    parser.add_argument("--local-epochs", type=int, default=5)
    parser.add_argument("--momentum-scope", default="round", choices=("round", "epoch"),
                        help="ours: one momentum buffer per round as their optimizer (round) or per epoch (epoch)")
    parser.add_argument("--lr", type=float, default=0.01)
    parser.add_argument("--lr-schedule", default="constant", choices=("constant", "multistep"),
                        help="multistep: their default, x0.1 at rounds R/2 and 3R/4")
    parser.add_argument("--order", default="own", choices=("own", "shared"),
                        help="own: their shuffling DataLoaders; shared: they replay our batch orders (training and "
                             "fine-tuning)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads for both")
    parser.add_argument("--json", type=Path, default=None,
                        help="write every round's numbers here (benchmarks/parity/report.py)")
    args = parser.parse_args()
    args.ref = args.ref.resolve()
    ref = import_reference(args.ref, args.extra_path)
    warnings.filterwarnings("ignore", message=".*unitialized memory.*")  # their np.divide(where=) without out
    warnings.filterwarnings("ignore", message="Solution may be inaccurate")  # they accept optimal_inaccurate
    if not args.skip_masks:
        compare_masks(ref, args)
    if args.rounds > 0:
        compare_training(ref, args)


if __name__ == "__main__":
    main()
