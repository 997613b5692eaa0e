"""SCAFFOLD beside a reference implementation: ours against PFLlib's (github.com/TsingZ0/PFLlib).

SCAFFOLD's authors published no code; PFLlib's SCAFFOLD is the implementation most PFL papers
run. It is run unmodified from a checkout given with --ref (measured at commit d832e76): this
script imports its `clientSCAFFOLD` (local training with the corrected gradient, option II's
control-variate update) and calls its server's `SCAFFOLD.aggregate_parameters` on a stand-in
server object holding the global model, the server control variate and the clients. What is
adapted from outside, at run time:
  - data: each client's `load_train_data` returns a loader over our partition's training tensors
    (the 20 % validation split held out, as in the `pfl` study): with --order shared it replays
    the batch orders our trainer draws, so both see the same batches; with --order own (default)
    it is a shuffling DataLoader without drop_last (PFLlib's default drops the last partial batch,
    which would change its step count);
  - model: our LeNet from the same initial weights, on the CPU;
  - `h5py`, which PFLlib's server module imports to save result files (not called here), is
    stubbed when it is not installed.
Both sides take turns round by round in one process; each round's score is the mean over clients
of the broadcast model's accuracy on the client's test set (our `acc`).

Per seed it prints every round's accuracies, the size of each side's server control variate ‖c‖
and the largest difference between the two global models' parameters, and at the end whether each
side's ‖c‖ became non-finite (the run diverged).

    .venv/bin/python -m benchmarks.parity.scaffold --ref REF --data-root ../shared/data --lr 0.02 \\
        --seeds 0 1 2 --json scaffold.json
    .venv/bin/python -m benchmarks.parity.scaffold --ref REF --data-root ../shared/data --lr 0.05 --seeds 0 1 2 3 4 5
    .venv/bin/python -m benchmarks.parity.scaffold --ref REF --data-root ../shared/data --order shared --rounds 5
"""
from __future__ import annotations

import argparse
import copy
import math
import sys
import time
import types
from pathlib import Path

import torch
from torch.utils.data import DataLoader, TensorDataset

from benchmarks.parity.report import ReplayLoader, Round, print_summary, save
from fl_core.config import RunConfig
from fl_core.simulation import Simulation

ROOT = Path(__file__).resolve().parents[2]

SETTING = dict(algorithm="scaffold", dataset="fmnist", partition="dirichlet", dir_alpha=0.3, num_clients=10,
               samples_per_client=100, val_fraction=0.2, local_epochs=5, batch_size=32)


def import_reference(ref: Path):
    system = ref / "system"
    if not (system / "flcore" / "clients" / "clientscaffold.py").is_file():
        raise SystemExit(f"error: --ref {ref} is not a PFLlib checkout (no system/flcore/clients/clientscaffold.py)")
    sys.path.insert(0, str(system))
    try:
        import h5py  # noqa: F401
    except ImportError:
        sys.modules["h5py"] = types.ModuleType("h5py")  # imported by serverbase for result files only
    from flcore.clients.clientscaffold import clientSCAFFOLD
    from flcore.servers.serverscaffold import SCAFFOLD
    return clientSCAFFOLD, SCAFFOLD


def mean_accuracy(model: torch.nn.Module, sim: Simulation) -> float:
    model.eval()
    with torch.no_grad():
        accs = [float((model(d.x_test).argmax(1) == d.y_test).float().mean()) for d in sim.data.clients]
    return sum(accs) / len(accs)


def norm(tensors) -> float:
    return float(torch.sqrt(sum((t.double() ** 2).sum() for t in tensors)))


def run_seed(seed: int, args: argparse.Namespace, client_cls, server_cls) -> tuple[list[Round], dict]:
    cfg = RunConfig(**SETTING, rounds=args.rounds, lr=args.lr, seed=seed, data_root=args.data_root,
                    threads=args.threads, eval_every=1)
    sim = Simulation(cfg)
    model = copy.deepcopy(sim.trainer.model)
    model.load_state_dict({n: t.clone() for n, t in sim.algorithm.global_state.items()}, strict=False)
    ref_args = types.SimpleNamespace(
        model=model, algorithm="SCAFFOLD", dataset="ours", device="cpu", save_folder_name="unused", num_classes=10,
        batch_size=cfg.batch_size, local_learning_rate=cfg.lr, local_epochs=cfg.local_epochs, few_shot=0,
        learning_rate_decay_gamma=1.0, learning_rate_decay=False)
    clients = [client_cls(ref_args, k, d.n_train, d.n_test, train_slow=False, send_slow=False)
               for k, d in enumerate(sim.data.clients)]
    torch.manual_seed(seed)  # their Client.__init__ seeds torch with 0; their shuffling follows our seed
    server = types.SimpleNamespace(
        global_model=copy.deepcopy(model), global_c=[torch.zeros_like(p) for p in model.parameters()],
        clients=clients, uploaded_ids=list(range(len(clients))), num_join_clients=len(clients),
        num_clients=len(clients), server_learning_rate=1.0)
    rows = []
    for rnd in range(1, cfg.rounds + 1):
        t0 = time.perf_counter()
        for k, client in enumerate(clients):
            client.set_parameters(server.global_model, server.global_c)
            d = sim.data.clients[k]
            loader = (ReplayLoader(d.x_train, d.y_train, k, rnd, seed, cfg.batch_size) if args.order == "shared"
                      else DataLoader(TensorDataset(d.x_train, d.y_train), cfg.batch_size, shuffle=True))
            client.load_train_data = (lambda loader=loader: loader)
            client.train()
        server_cls.aggregate_parameters(server)
        theirs = mean_accuracy(server.global_model, sim)
        t1 = time.perf_counter()
        ours = sim.run_round().mean("acc")
        t2 = time.perf_counter()
        rows.append(Round(rnd, ours, theirs, t2 - t1, t1 - t0))
        c_ours, c_theirs = norm(sim.algorithm.control.values()), norm(server.global_c)
        with torch.no_grad():
            gap = max(float((p - sim.algorithm.global_state[n]).abs().max())
                      for n, p in server.global_model.named_parameters())
        print(f"seed {seed} round {rnd:3d}  ours {100 * ours:5.1f}  theirs {100 * theirs:5.1f}  "
              f"|c| ours {c_ours:9.3g} theirs {c_theirs:9.3g}  largest parameter difference {gap:.2g}", flush=True)
    diverged = {"ours": not math.isfinite(c_ours), "theirs": not math.isfinite(c_theirs)}
    return rows, diverged


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--ref", type=Path, required=True, help="checkout of github.com/TsingZ0/PFLlib")
    parser.add_argument("--data-root", required=True, help="folder with torchvision's FashionMNIST/raw")
    parser.add_argument("--lr", type=float, default=0.02)
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0])
    parser.add_argument("--order", choices=("own", "shared"), default="own")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads (both run in this process)")
    parser.add_argument("--json", type=Path, default=None,
                        help="write every round's numbers here (benchmarks/parity/report.py)")
    args = parser.parse_args()
    if args.lr <= 0 or args.rounds < 1:
        parser.error(f"--lr {args.lr} and --rounds {args.rounds}: give lr > 0 and at least 1 round")
    torch.set_num_threads(args.threads)
    client_cls, server_cls = import_reference(args.ref)
    runs, diverged = {}, {}
    for seed in args.seeds:
        runs[seed], diverged[seed] = run_seed(seed, args, client_cls, server_cls)
    print_summary(runs)
    for side in ("ours", "theirs"):
        bad = [s for s in args.seeds if diverged[s][side]]
        print(f"{side}: control variate non-finite at the end in {len(bad)} of {len(args.seeds)} seeds {bad}")
    if args.json:
        save(args.json, "SCAFFOLD", "TsingZ0/PFLlib @ d832e76",
             f"mean client accuracy of the broadcast model, Fashion-MNIST Dir(0.3), 10 clients, LeNet, lr {args.lr}, "
             f"batch order {args.order}", runs, {**SETTING, "lr": args.lr, "order": args.order,
                                                 "diverged": {str(s): d for s, d in diverged.items()}})


if __name__ == "__main__":
    main()
