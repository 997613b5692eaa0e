"""Parity of our DisPFL (fl_core/algorithms/dispfl.py) with the authors' code, rong-dai/DisPFL
(measured against commit e2f47d4a78c276f5f90396b25d8b9ed6141a9262).

Their code is imported from a checkout (`--ref`) and runs unmodified, adapted from the outside only:
it gets our clients as in-memory batch feeds, our initial weights and a silent logger, on the CPU.
1. Components on identical inputs: ERK densities (their `calculate_sparsities`, our
   `layer_densities`), initial active counts (`init_masks`), one mask search on a trained client
   (`Client.fire_mask` + `regrow_mask` vs `search_mask`: counts, the pruned entries, and the prune
   count of every round), one round of aggregation (`_aggregate_func` vs `mix_neighbours`).
2. Whole runs alternating round by round: our Simulation runs a round, then their
   `dispflAPI.train()` (a worker thread paused at each round start through its logger) runs it, on
   the same Fashion-MNIST Dir(0.3) clients, initial weights and batch order per (round, client,
   epoch); density 0.5 ERK, random regrowth, anneal 0.5, lr 0.1 x 0.998^t, wd 5e-4, 5 local
   epochs, 5 random neighbours. Printed: mean client accuracy after local training (theirs:
   `old_mask_test_acc`), the difference, seconds per round (they test each client 3 times a
   round, we twice). `--lockstep` also gives their run our initial masks and neighbour graphs.

    git clone https://github.com/rong-dai/DisPFL /tmp/DisPFL
    .venv/bin/python -m benchmarks.parity.dispfl --ref /tmp/DisPFL                  # 10 clients, 5 rounds, seed 0
    .venv/bin/python -m benchmarks.parity.dispfl --ref /tmp/DisPFL --model lenet --rounds 40 --seeds 0 1 2 \\
        --skip-components --json dispfl.json   # full (~15 CPU min); then python -m benchmarks.parity.report dispfl.json
    .venv/bin/python -m benchmarks.parity.dispfl --ref /tmp/DisPFL --components-only
"""
from __future__ import annotations

import argparse
import importlib
import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import torch

from benchmarks.parity.report import Round, print_summary, save
from fl_core.algorithms import dispfl as ours_dispfl
from fl_core.config import RunConfig
from fl_core.models import build_model
from fl_core.simulation import Simulation
from fl_core.sparse import anneal_rate, layer_densities
from fl_core.training import derive_seed

ROOT = Path(__file__).resolve().parents[2]

ROUND_START = "################Communication round"  # what their train() logs as each round begins


# ---------------------------------------------------------------- their side, driven from outside
def load_reference(path: str, extra: list[str]) -> SimpleNamespace:
    for p in [*extra, path]:
        sys.path.insert(0, str(Path(p).resolve()))
    modules = {"api": "fedml_api.standalone.DisPFL.dispfl_api", "client": "fedml_api.standalone.DisPFL.client",
               "trainer": "fedml_api.standalone.DisPFL.my_model_trainer", "lenet": "fedml_api.model.cv.lenet5"}
    m = {k: importlib.import_module(v) for k, v in modules.items()}
    return SimpleNamespace(API=m["api"].dispflAPI, Client=m["client"].Client, Trainer=m["trainer"].MyModelTrainer,
                           LeNet5=m["lenet"].LeNet5)


class Log:
    """Stands in for their logger: drops messages; `on_round` is called as each round begins."""

    def __init__(self, on_round=None):
        self.on_round = on_round

    def info(self, msg, *a, **kw):
        if self.on_round is not None and isinstance(msg, str) and msg.startswith(ROUND_START):
            self.on_round()

    debug = warning = info


def reference_args(cfg: RunConfig) -> SimpleNamespace:
    """Their argparse namespace for our setting (their defaults where we have no counterpart)."""
    return SimpleNamespace(
        dense_ratio=cfg.density, uniform=cfg.density_distribution == "uniform", erk_power_scale=1,
        different_initial=not cfg.same_masks, diff_spa=False, static=cfg.static_masks,
        dis_gradient_check=cfg.regrowth == "random", anneal_factor=cfg.anneal_factor,
        client_num_in_total=cfg.num_clients, client_num_per_round=cfg.num_neighbours, cs=cfg.topology,
        active=cfg.active, comm_round=cfg.rounds, epochs=cfg.local_epochs, batch_size=cfg.batch_size,
        lr=cfg.lr, lr_decay=cfg.lr_decay, wd=cfg.weight_decay, momentum=cfg.momentum, client_optimizer="sgd",
        dataset="emnist",  # the key their FLOP counter knows for 1x28x28 inputs
        ci=0, save_masks=False)


class Feed:
    """A client's data as their code iterates it: (x, y) batches. Training feeds give the batch
    order our trainer uses for (seed, round, client, epoch), counting their passes."""

    def __init__(self, x, y, batch_size, seed=None, k=0, epochs=1):
        self.x, self.y, self.batch_size, self.seed, self.k, self.epochs = x, y, batch_size, seed, k, epochs
        self.passes = 0

    def __iter__(self):
        n = len(self.y)
        if self.seed is None:
            order = torch.arange(n)
        else:
            rnd, epoch = self.passes // self.epochs + 1, self.passes % self.epochs
            self.passes += 1
            order = torch.randperm(n, generator=torch.Generator().manual_seed(
                derive_seed(self.seed, rnd, self.k, epoch, "global")))
        for start in range(0, n, self.batch_size):
            idx = order[start:start + self.batch_size]
            yield self.x[idx], self.y[idx]


def reference_dataset(sim: Simulation) -> list:
    cfg, clients = sim.config, sim.data.clients
    train = {k: Feed(d.x_train, d.y_train, cfg.batch_size, cfg.seed, k, cfg.local_epochs)
             for k, d in enumerate(clients)}
    test = {k: Feed(d.x_test, d.y_test, 256) for k, d in enumerate(clients)}
    n_train = sum(d.n_train for d in clients)
    return [n_train, sum(d.n_test for d in clients), None, None, {k: d.n_train for k, d in enumerate(clients)},
            train, test, {k: [] for k in range(len(clients))}]


def reference_model(ref, sim: Simulation, model: str):
    shape, classes = sim.data.input_shape, sim.data.num_classes
    net = ref.LeNet5(classes) if model == "ref_lenet5" else build_model("lenet", shape, classes)
    net.load_state_dict(sim.trainer.model.state_dict())  # our initial weights (the Simulation has not trained yet)
    return net


# ---------------------------------------------------------------- our side
def our_config(args, seed: int) -> RunConfig:
    return RunConfig(algorithm="dispfl", dataset="fmnist", data_root=args.data_root, partition="dirichlet",
                     dir_alpha=0.3, num_clients=args.clients, samples_per_client=args.samples, seed=seed,
                     rounds=args.rounds, local_epochs=5, batch_size=args.batch_size, lr=0.1, lr_schedule="exp",
                     lr_decay=0.998, weight_decay=5e-4, density=0.5, density_distribution="erk",
                     regrowth="random", anneal_factor=0.5, topology="random", num_neighbours=args.neighbours,
                     threads=args.threads)


def our_simulation(cfg: RunConfig, ref, model: str) -> Simulation:
    """Our Simulation; with model ref_lenet5 it builds their LeNet5 (under our seeded init)."""
    if model != "ref_lenet5":
        return Simulation(cfg)
    ours_dispfl.DisPFL.build_model = classmethod(lambda cls, config, name, shape, classes: ref.LeNet5(classes))
    try:
        return Simulation(cfg)
    finally:
        del ours_dispfl.DisPFL.build_model


def rel(a: float, b: float) -> float:
    return abs(a - b) / max(abs(b), 1e-30)


# ---------------------------------------------------------------- 1. components
def compare_components(ref, sim: Simulation) -> None:
    cfg, algo = sim.config, sim.algorithm
    log = Log()
    trainer = ref.Trainer(sim.trainer.model, reference_args(cfg), log)
    params = trainer.get_trainable_params()
    print(f"ERK densities (density {cfg.density}) and initial active counts:")
    sparsities = trainer.calculate_sparsities(params, sparse=cfg.density)
    theirs, their_masks = {n: 1 - float(s) for n, s in sparsities.items()}, trainer.init_masks(params, sparsities)
    mine = layer_densities(algo.shapes, cfg.density, "erk")
    print(f"  {'tensor':18s} {'theirs':>12s} {'ours':>12s} {'rel.diff':>9s} {'count theirs':>12s} {'ours':>8s}")
    for n in algo.param_names:
        ct, co = int(their_masks[n].sum()), int((~sim.clients[0].mask[n]).sum())
        print(f"  {n:18s} {theirs[n]:12.9f} {mine[n]:12.9f} {rel(mine[n], theirs[n]):9.1e} {ct:12d} {co:8d}")

    # one round of local training for every client, then the mask search and the aggregation
    for k, client in enumerate(sim.clients):
        algo.local_update(k, client, sim.data.clients[k], 1)
    sent = [{n: (~c.mask[n]).float() for n in algo.param_names} for c in sim.clients]
    new = [{n: (~c.extra.next_mask[n]).float() for n in algo.param_names} for c in sim.clients]
    snapshot = [{n: t.clone() for n, t in c.state.items()} for c in sim.clients]
    compare_mask_search(ref, sim, trainer, sent[0], snapshot[0])

    graph = algo.neighbours(1, list(range(cfg.num_clients)))
    algo.mix_neighbours(sim.clients, sim.data.clients, graph, 1)
    worst = 0.0
    for k, others in graph.items():
        theirs_k, _ = ref.API._aggregate_func(SimpleNamespace(logger=log), k, cfg.num_clients, cfg.num_neighbours,
                                               np.sort(np.array([*others, k])), snapshot, new, sent)
        for n in algo.param_names:
            diff = float((sim.clients[k].state[n] - theirs_k[n]).abs().max())
            worst = max(worst, diff / max(float(theirs_k[n].abs().max()), 1e-30))
    print(f"Aggregation, round 1, {cfg.num_clients} clients: max |ours - theirs| / max |theirs| = {worst:.2e}")


def compare_mask_search(ref, sim: Simulation, trainer, sent: dict, weights: dict) -> None:
    """Client 0's mask search on its trained weights: theirs (fire_mask, regrow_mask) and ours
    (search_mask, whose calls to `regrow` are recorded: the pruned mask and the count)."""
    cfg, algo, client, data = sim.config, sim.algorithm, sim.clients[0], sim.data.clients[0]
    theirs = ref.Client(0, None, None, data.n_train, reference_args(cfg), torch.device("cpu"), trainer, Log())
    recorded, real_regrow = [], ours_dispfl.regrow
    ours_dispfl.regrow = lambda cut, count, gen, scores=None: (recorded.append((cut, count))
                                                               or real_regrow(cut, count, gen, scores))
    try:
        print("Mask search, client 0 after round 1 (prune = regrow counts; pruned entries identical?):")
        fired, removed = theirs.fire_mask({n: m.clone() for n, m in sent.items()}, weights, 0)
        grown = theirs.regrow_mask(fired, removed)
        recorded.clear()
        ours_new = algo.search_mask(0, client, data, 1, client.mask)
        for n, (cut, count) in zip(algo.param_names, recorded):
            print(f"  {n:18s} pruned theirs {int(removed[n]):7d} ours {count:7d}   same entries "
                  f"{torch.equal(cut, fired[n] == 0)}   active after: theirs {int(grown[n].sum()):7d} "
                  f"ours {int((~ours_new[n]).sum()):7d}")
        mismatched = []
        for t in range(cfg.rounds):  # the prune count of every round of the schedule
            _, removed = theirs.fire_mask({n: m.clone() for n, m in sent.items()}, weights, t)
            recorded.clear()
            algo.search_mask(0, client, data, t + 1, client.mask)
            mismatched += [(t, n, int(removed[n]), c) for n, (_, c) in zip(algo.param_names, recorded)
                           if int(removed[n]) != c]
    finally:
        ours_dispfl.regrow = real_regrow
    print(f"  prune counts over all {cfg.rounds} rounds x {len(algo.param_names)} tensors: {len(mismatched)} differ")
    for t, n, theirs_count, ours_count in mismatched:
        active = int(sent[n].sum())
        print(f"    round {t} (0-based) {n}: theirs {theirs_count} ours {ours_count} (active {active}, "
              f"rate x active = {anneal_rate(cfg.anneal_factor, t, cfg.rounds) * active!r})")


# ---------------------------------------------------------------- 2. whole runs, alternating
def run_pair(ref, args, seed: int) -> list[Round]:
    cfg = our_config(args, seed)
    sim = our_simulation(cfg, ref, args.model)
    reached, go, failure = threading.Semaphore(0), threading.Semaphore(0), []

    def pause():
        reached.release()
        go.acquire()

    log, rargs = Log(on_round=pause), reference_args(cfg)
    np.random.seed(seed)  # as their main script seeds numpy, torch and random
    torch.manual_seed(seed)
    trainer = ref.Trainer(reference_model(ref, sim, args.model), rargs, log)
    api = ref.API(reference_dataset(sim), torch.device("cpu"), rargs, trainer, log)
    if args.lockstep:  # our initial masks and our neighbour graphs
        masks = iter([{n: (~c.mask[n]).float() for n in sim.algorithm.param_names} for c in sim.clients])
        trainer.init_masks = lambda params, sparsities: next(masks)
        everyone = list(range(cfg.num_clients))
        api._benefit_choose = lambda rnd, k, *a, **kw: np.array(sim.algorithm.neighbours(rnd, everyone)[k])

    def work():
        try:
            api.train()
        except BaseException as err:  # noqa: BLE001 - re-raised in the main thread
            failure.append(err)
        finally:
            reached.release()

    worker = threading.Thread(target=work, daemon=True)
    worker.start()
    reached.acquire()  # their set-up done, paused before round 0
    rows = []
    for r in range(cfg.rounds):
        t0 = time.perf_counter()
        ours = sim.run_round().mean("acc")
        t_ours = time.perf_counter() - t0
        t0 = time.perf_counter()
        go.release()
        reached.acquire()
        t_theirs = time.perf_counter() - t0
        if failure:
            raise failure[0]
        theirs = api.stat_info["old_mask_test_acc"][r]
        rows.append(Round(r + 1, ours, theirs, t_ours, t_theirs))
        print(f"  seed {seed} round {r + 1:3d}: ours {ours:.4f} theirs {theirs:.4f} diff {ours - theirs:+.4f}   "
              f"s/round ours {t_ours:6.2f} theirs {t_theirs:6.2f}", flush=True)
    worker.join()
    return rows


def default_data_root() -> str:
    for p in (ROOT.parent / "shared" / "data", Path("/work/shared/data")):
        if (p / "FashionMNIST").is_dir():
            return str(p)
    return "data"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ref", required=True, help="checkout of rong-dai/DisPFL")
    ap.add_argument("--extra-path", nargs="*", default=[], help="folders put on sys.path for their imports")
    ap.add_argument("--data-root", default=default_data_root())
    ap.add_argument("--clients", type=int, default=10)
    ap.add_argument("--samples", type=int, default=200, help="training images per client")
    ap.add_argument("--neighbours", type=int, default=5)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--batch-size", type=int, default=32, help="ours default (the study's); the authors' scripts: 128")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0])
    ap.add_argument("--model", choices=("ref_lenet5", "lenet"), default="ref_lenet5",
                    help="ref_lenet5: their LeNet5 (20/50 channels, 500 units) in both; lenet: our LeNet in both")
    ap.add_argument("--lockstep", action="store_true", help="their run gets our initial masks and neighbour graphs")
    ap.add_argument("--components-only", action="store_true")
    ap.add_argument("--skip-components", action="store_true")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--json", type=Path, default=None,
                    help="write every round's numbers here (benchmarks/parity/report.py)")
    args = ap.parse_args()
    ref = load_reference(args.ref, args.extra_path)
    print(f"DisPFL parity: Fashion-MNIST Dir(0.3), {args.clients} clients x {args.samples} images, "
          f"{args.neighbours} random neighbours, model {args.model}, batch {args.batch_size}")
    if not args.skip_components:
        for model in ("ref_lenet5", "lenet"):
            print(f"== components, model {model}")
            compare_components(ref, our_simulation(our_config(args, args.seeds[0]), ref, model))
    if args.components_only:
        return
    print(f"== whole runs{' (lockstep: our masks and graphs)' if args.lockstep else ''}")
    runs = {}
    for seed in args.seeds:
        runs[seed] = run_pair(ref, args, seed)
        if args.json:  # after every seed, so that a long run's finished seeds survive an interruption
            save(args.json, "DisPFL", "rong-dai/DisPFL @ e2f47d4", f"mean client accuracy after local training "
                 f"(theirs: old_mask_test_acc), Fashion-MNIST Dir(0.3), {args.clients} clients, model {args.model}"
                 f"{', lockstep' if args.lockstep else ''}", runs, vars(args) | {"json": str(args.json)})
    print_summary(runs)


if __name__ == "__main__":
    main()
