"""Our rounds beside PFLlib's (github.com/TsingZ0/PFLlib): FedAvg, Ditto and FedRep, training
rounds and evaluated rounds, equal work on both sides.

PFLlib is the library most PFL papers run. Its clients (`clientAVG`, `clientDitto`, `clientRep`)
run unmodified from a checkout given with --ref (measured at commit d832e76), on our data and our
initial model; the server's steps are theirs too (`Server.aggregate_parameters` on a stand-in
server holding the global model and the uploaded models, FedRep averaging the representation
only, as its server does). Both sides train the same clients (Fashion-MNIST Dir(0.3), 10 clients x
200 images, batch 10, one local epoch; Ditto's personal pass and FedRep's head pass one epoch
each) and take turns every round in one process, who goes first alternating.

Equal work when scoring: an evaluated round scores, on each client's test set, the model the
method reports: FedAvg the broadcast model, Ditto the personal model, FedRep the received
representation with the client's head. Ours with `eval_models = "acc"` (only that model); theirs
with the same call their server makes for it (`test_metrics`, Ditto's `test_metrics_personalized`:
its test loader of batch 10 and its accuracy and AUC), without their server's training-loss pass
(`train_metrics`), which ours has no counterpart of. Even rounds are evaluated, odd rounds train
only; each ratio is the median over those rounds of theirs / ours, measured side by side.

Targets (issue 43): an evaluated round at least 2x faster than PFLlib's, training no slower.

    .venv/bin/python -m benchmarks.pfllib --ref REF --data-root ../shared/data            # lenet and cnn2
    .venv/bin/python -m benchmarks.pfllib --ref REF --data-root ../shared/data --models lenet --rounds 6
"""
from __future__ import annotations

import argparse
import copy
import statistics
import sys
import time
import types
import warnings
from pathlib import Path

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from benchmarks.fixtures import machine_caption, write_report
from fl_core.config import RunConfig
from fl_core.simulation import Simulation

METHODS = {"fedavg": "clientAVG", "ditto": "clientDitto", "fedrep": "clientRep"}
SETTING = dict(dataset="fmnist", partition="dirichlet", dir_alpha=0.3, num_clients=10, samples_per_client=200,
               batch_size=10, local_epochs=1, lr=0.01, eval_models="acc", eval_every=2)
MU, PERSONAL_EPOCHS = 0.01, 1  # Ditto's proximal weight; Ditto's personal and FedRep's head epochs, both sides
OURS_KNOBS = {"fedavg": {}, "ditto": {"ditto_lambda": MU}, "fedrep": {"head_epochs": PERSONAL_EPOCHS}}


def import_reference(ref: Path) -> dict[str, type]:
    """Their client classes, and their server's aggregation and model split, from a checkout."""
    system = ref / "system"
    if not (system / "flcore" / "clients" / "clientavg.py").is_file():
        raise SystemExit(f"error: --ref {ref} is not a PFLlib checkout (no system/flcore/clients/clientavg.py)")
    sys.path.insert(0, str(system))  # their modules import each other from there
    try:
        import h5py  # noqa: F401
    except ImportError:
        sys.modules["h5py"] = types.ModuleType("h5py")  # serverbase imports it for result files only
    from flcore.clients.clientavg import clientAVG
    from flcore.clients.clientditto import clientDitto
    from flcore.clients.clientrep import clientRep
    from flcore.servers.serverbase import Server
    from flcore.trainmodel.models import BaseHeadSplit
    return {"clientAVG": clientAVG, "clientDitto": clientDitto, "clientRep": clientRep, "Server": Server,
            "BaseHeadSplit": BaseHeadSplit}


class Theirs:
    """PFLlib's clients on our data and initial model; one round = their server's order of work."""

    def __init__(self, method: str, sim: Simulation, ref: dict[str, type]) -> None:
        model = copy.deepcopy(sim.trainer.model)
        model.load_state_dict(sim.algorithm.global_state)
        if method == "fedrep":  # their FedRep trains a model split into .base and .head
            model = ref["BaseHeadSplit"](nn.Sequential(model.features, model.fc), model.head)
        cfg = sim.config
        args = types.SimpleNamespace(
            model=model, algorithm=method, dataset="ours", device="cpu", save_folder_name="unused", num_classes=10,
            batch_size=cfg.batch_size, local_learning_rate=cfg.lr, local_epochs=cfg.local_epochs, few_shot=0,
            learning_rate_decay_gamma=1.0, learning_rate_decay=False, mu=MU, plocal_epochs=PERSONAL_EPOCHS)
        self.method, self.data = method, sim.data.clients
        self.clients = [ref[METHODS[method]](args, k, d.n_train, d.n_test, train_slow=False, send_slow=False)
                        for k, d in enumerate(self.data)]
        for client, d in zip(self.clients, self.data):  # their loaders, over our tensors
            client.load_train_data = (lambda b=None, d=d: DataLoader(TensorDataset(d.x_train, d.y_train),
                                                                     cfg.batch_size, drop_last=True, shuffle=True))
            client.load_test_data = (lambda b=None, d=d: DataLoader(TensorDataset(d.x_test, d.y_test),
                                                                    cfg.batch_size, shuffle=True))
        shared = model.base if method == "fedrep" else model
        self.server = types.SimpleNamespace(global_model=copy.deepcopy(shared), uploaded_models=[],
                                            uploaded_weights=[])
        # their server's averaging, on a stand-in server (it calls self.add_parameters)
        self.server.add_parameters = types.MethodType(ref["Server"].add_parameters, self.server)
        self.aggregate = ref["Server"].aggregate_parameters

    def round(self, evaluate: bool) -> float:
        """Seconds of one round in their server's order: send, score (evaluated rounds), train,
        upload, average."""
        start = time.perf_counter()
        for client in self.clients:
            client.set_parameters(self.server.global_model)
        if evaluate:
            scores = [(client.test_metrics_personalized if self.method == "ditto" else client.test_metrics)()
                      for client in self.clients]
            self.acc = statistics.mean(correct / n for correct, n, _ in scores)
        for client in self.clients:
            if self.method == "ditto":
                client.ptrain()
            client.train()
        total = sum(d.n_train for d in self.data)
        self.server.uploaded_weights = [d.n_train / total for d in self.data]
        self.server.uploaded_models = [c.model.base if self.method == "fedrep" else c.model for c in self.clients]
        self.aggregate(self.server)
        return time.perf_counter() - start


def ours_round(sim: Simulation, scores: list[float]) -> float:
    """Seconds of one of our rounds; an evaluated round's mean accuracy goes to `scores`."""
    start = time.perf_counter()
    result = sim.run_round()
    seconds = time.perf_counter() - start
    if result.evaluated:
        scores.append(result.mean("acc"))
    return seconds


def measure(method: str, model: str, args: argparse.Namespace, ref: dict[str, type]) -> dict[str, object]:
    """Median over rounds of theirs / ours: rounds that only train, and evaluated rounds."""
    sim = Simulation(RunConfig(algorithm=method, model=model, rounds=args.rounds, seed=args.seed,
                               data_root=args.data_root, threads=1, **SETTING, **OURS_KNOBS[method]))
    theirs = Theirs(method, sim, ref)
    ratios: dict[bool, list[float]] = {False: [], True: []}
    scores: list[float] = []
    for rnd in range(1, args.rounds + 1):
        scored = rnd % 2 == 0  # ours: eval_every = 2
        if rnd % 4 in (1, 2):
            mine, other = ours_round(sim, scores), theirs.round(scored)
        else:
            other, mine = theirs.round(scored), ours_round(sim, scores)
        ratios[scored].append(other / mine)
    return {"train": statistics.median(ratios[False]), "evaluated": statistics.median(ratios[True]),
            "accuracy": f"{scores[-1]:.3f} / {theirs.acc:.3f}"}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.pfllib", description=__doc__.splitlines()[0])
    parser.add_argument("--ref", type=Path, required=True, help="checkout of github.com/TsingZ0/PFLlib")
    parser.add_argument("--data-root", required=True, help="folder with torchvision's FashionMNIST/raw")
    parser.add_argument("--models", nargs="+", default=["lenet", "cnn2"], choices=("lenet", "cnn2"))
    parser.add_argument("--methods", nargs="+", default=list(METHODS), choices=list(METHODS))
    parser.add_argument("--rounds", type=int, default=12, help="rounds per side (even: half of them evaluated)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=None, help="also write the table (Markdown) to this file")
    args = parser.parse_args(argv)
    if args.rounds < 4 or args.rounds % 2:
        parser.error(f"--rounds {args.rounds}: give an even number, at least 4 (odd rounds train, even ones score)")
    torch.set_num_threads(1)
    warnings.filterwarnings("ignore", message="Implicit dimension choice for softmax")  # their Ditto scoring
    ref = import_reference(args.ref)
    lines = [f"| model | method | PFLlib / ours, training | PFLlib / ours, evaluated round | mean accuracy after "
             f"{args.rounds} rounds, ours / theirs |", "|---|---|---|---|---|"]
    print("\n".join(lines), flush=True)
    for model in args.models:
        for method in args.methods:
            ratios = measure(method, model, args, ref)
            lines.append(f"| {model} | {method} | {ratios['train']:.2f} (target >= 1.0) | "
                         f"{ratios['evaluated']:.2f} (target >= 2.0) | {ratios['accuracy']} |")
            print(lines[-1], flush=True)
    caption = (f"Medians over {args.rounds} rounds per side of the per-round time ratio, the sides taking turns "
               f"every round, training rounds and evaluated rounds apart; PFLlib's clients from {args.ref}; "
               f"{machine_caption()}.")
    print(caption)
    write_report(args.out, lines, caption)
    return 0


if __name__ == "__main__":
    sys.exit(main())
