"""FedSelect beside the authors' code: our `fedselect_mode=faithful` against lapisrocks/fedselect.

The reference (github.com/lapisrocks/fedselect; measured at commit 0949f8a5) is run unmodified
from a checkout given with --ref: this script imports its modules and calls its
`fedselect_algorithm` with our data. Everything it needs is adapted from outside, at run time:
  - data: it gets our client partition (the same tensors as our run) as a TensorDataset and index
    lists, and all clients take part, in index order;
  - batches: with --order shared (default) its training loader replays the batch orders our
    trainer draws (the same seeds), so both see the same batches; --order own keeps its own
    shuffling DataLoader (seeded by its own `setup_seed`);
  - device: `torch.cuda.is_available` answers False, so it runs on the CPU;
  - model: its own is torchvision's ResNet-18 with a 3-channel stem, which cannot take 28x28x1
    images, so both run our registered model (LeNet for 28x28) from the same initial weights;
  - its progress bars and prints are silenced (--verbose keeps them), the all-pairs
    evaluation after the last round (its returned cross-client matrix) is skipped, and its diagnostic
    `eval_layer_sparsity(mask, "fc.weight")`, which names the ResNet's head, answers a
    placeholder when the model has no `fc.weight` (it only feeds a print).
It runs in a worker thread that pauses after each round's evaluation, so the two alternate round
by round in one process and their seconds per round are measured side by side.

Per round it prints the mean client accuracy of both (theirs scored per sample as ours, and as
the reference reports it: a mean over test batches), their difference, the agreement of the
personal masks (share of selectable entries), the largest difference of the trained parameters,
and the seconds of each.

    # the full setting: Fashion-MNIST, 2 shards per client, 10 clients of 100 images, 3 seeds
    # (about 15 CPU seconds per round for the two together; the reference takes ~1.2-1.8x ours)
    .venv/bin/python -m benchmarks.parity.fedselect --ref REF --data-root ../shared/data --seeds 0 1 2
    # --order own: independent batch orders; --weighting samples: ours averages with weights 1/K
    # (the same mean as the reference's sum / count, but the last bits differ and the runs drift)
    # speed: ours, the reference and the pure compute of the work, round by round, on random
    # CIFAR-shaped data (no download; ResNet-18 takes about 7 minutes)
    .venv/bin/python -m benchmarks.parity.fedselect --ref REF --setting cifar-cnn --timing --order own
    .venv/bin/python -m benchmarks.parity.fedselect --ref REF --setting cifar-resnet18 --timing --order own
    # the tiny synthetic run whose numbers tests/test_parity_fedselect.py pins:
    .venv/bin/python -m benchmarks.parity.fedselect --ref REF --setting tiny --pins
"""
from __future__ import annotations

import argparse
import importlib
import sys
import threading
import time
from pathlib import Path

import numpy as np
import torch

from benchmarks.fixtures import machine_caption, random_federated, write_report
from benchmarks.parity.report import ReplayLoader, Round, print_summary, save
from benchmarks.round_overhead import pure_compute
from fl_core.client_state import PackedMask
from fl_core.config import PRECISIONS, RunConfig
from fl_core.models import build_model
from fl_core.simulation import Simulation

ROOT = Path(__file__).resolve().parents[2]

# The settings: our knobs (the reference's flag for each is in `reference_args`).
SETTINGS = {
    "fmnist": dict(dataset="fmnist", partition="shards", shards_per_client=2, num_clients=10, samples_per_client=100,
                   rounds=40, local_epochs=5, batch_size=32, lr=0.1, pers_rate=0.25, pers_limit=0.8, mask_every=3),
    "tiny": dict(dataset="synthetic", partition="shards", shards_per_client=3, num_clients=5, rounds=5,
                 local_epochs=2, batch_size=16, lr=0.05, pers_rate=0.3, pers_limit=0.6, mask_every=1),
    # speed settings (use with --timing): random CIFAR-shaped images, 2 classes per client (ResNet-18
    # at lr 0.01: at 0.1 the reference's own batch order diverged to NaN in round 3)
    "cifar-cnn": dict(dataset="cifar10", model="cnn2", partition="shards", shards_per_client=2, num_clients=10,
                      samples_per_client=100, rounds=6, local_epochs=1, batch_size=32, lr=0.1, pers_rate=0.25,
                      pers_limit=0.8, mask_every=1),
    "cifar-resnet18": dict(dataset="cifar10", model="resnet18", partition="shards", shards_per_client=2, num_clients=10,
                           samples_per_client=100, rounds=6, local_epochs=1, batch_size=32, lr=0.01, pers_rate=0.25,
                           pers_limit=0.8, mask_every=1),
}
RANDOM_SHAPE = {"cifar-cnn": (3, 32, 32), "cifar-resnet18": (3, 32, 32)}  # data made here, no download


def load_reference(path: Path):
    """The reference's `fedselect` module (and with it lottery_ticket and utils), imported from `path`."""
    sys.path.insert(0, str(path))
    module = importlib.import_module("fedselect")
    if Path(module.__file__).resolve().parent != path.resolve():
        raise SystemExit(f"imported {module.__file__}, not the reference's fedselect.py under {path}")
    return module


def reference_args(ref, knobs: dict, seed: int):
    """The reference's own argument parser, given our knobs as its command-line flags."""
    p100 = round(knobs["pers_rate"] * 100, 10)
    if p100 / 100 != knobs["pers_rate"] or knobs["pers_limit"] * 100 != int(round(knobs["pers_limit"] * 100)):
        raise SystemExit("pers_rate and pers_limit must be whole percentages (the reference reads them as percents)")
    flags = {"--lr": knobs["lr"], "--local_bs": knobs["batch_size"], "--la_epochs": knobs["local_epochs"],
             "--com_rounds": knobs["rounds"], "--lth_epoch_iters": knobs["mask_every"], "--prune_percent": p100,
             "--prune_target": int(round(knobs["pers_limit"] * 100)), "--num_users": knobs["num_clients"],
             "--frac": 1.0, "--seed": seed}
    argv = sys.argv
    try:
        sys.argv = ["fedselect.py"] + [str(x) for kv in flags.items() for x in kv]
        return ref.lth_args_parser()
    finally:
        sys.argv = argv


class ReferenceRun:
    """The reference's `fedselect_algorithm` in a worker thread that stops after each round's
    evaluation; `step()` runs one round and returns what was recorded of it."""

    def __init__(self, ref, model, args, data, seed: int, shared_order: bool, verbose: bool,
                 record: bool = True) -> None:
        self.ref, self.k = ref, len(data.clients)
        lottery = sys.modules["lottery_ticket"]
        self.resume, self.paused = threading.Semaphore(0), threading.Semaphore(0)
        self.rounds, self.masks, self.error, self.rnd, self.updates = [], {}, None, 1, 0
        self.started = 0.0
        originals = {"eval": ref.cross_client_eval, "delta": ref.delta_update, "loaders": ref.prepare_dataloaders,
                     "sparsity": lottery.eval_layer_sparsity}
        first_index, offset = {}, 0
        for k, d in enumerate(data.clients):
            first_index[offset] = k
            offset += d.n_train

        def loaders(dataset_train, idxs_train, dataset_test, idxs_test, args_):
            train, test = originals["loaders"](dataset_train, idxs_train, dataset_test, idxs_test, args_)
            if shared_order:
                k = first_index[int(idxs_train[0])]
                d = data.clients[k]
                train = ReplayLoader(d.x_train, d.y_train, k, self.rnd, seed, args_.local_bs, ("personal", "global"))
            return train, test

        def delta_update(*a, **kw):
            mask = originals["delta"](*a, **kw)
            self.masks[self.updates % self.k] = {n: m.ne(0).cpu().clone() for n, m in mask.items() if "weight" in n}
            self.updates += 1
            return mask

        def cross_client_eval(model_, states, *a, no_cross=True, **kw):
            if not no_cross:  # the all-pairs matrix it returns after the last round: unused here, skipped
                return torch.zeros(len(states), len(states))
            accs = originals["eval"](model_, states, *a, no_cross=no_cross, **kw)  # one round done
            seconds = time.perf_counter() - self.started
            self.rounds.append(dict(seconds=seconds, reported=torch.diag(accs).tolist(),
                                    states=({i: {n: t.clone() for n, t in s.items()} for i, s in states.items()}
                                            if record else None),
                                    masks={i: dict(m) for i, m in self.masks.items()}))
            self.rnd += 1
            self.paused.release()
            self.resume.acquire()
            self.started = time.perf_counter()
            return accs

        def sparsity(mask, name):
            return originals["sparsity"](mask, name) if name in mask else ("(no such layer)", name)

        self.patched = [(ref, "cross_client_eval", cross_client_eval), (ref, "prepare_dataloaders", loaders),
                        (lottery, "eval_layer_sparsity", sparsity)]
        if record:  # the masks it selects (copies made inside its timed round: off when timing)
            self.patched.append((ref, "delta_update", delta_update))
        if not verbose:
            progress = ref.tqdm
            quiet = lambda *a, **kw: None  # noqa: E731
            self.patched += [(ref, "tqdm", lambda *a, **kw: progress(*a, **kw, disable=True)),
                             (ref, "print", quiet), (lottery, "print", quiet)]
        self.saved = [(module, name, module.__dict__.get(name)) for module, name, _ in self.patched]
        for module, name, value in self.patched:
            setattr(module, name, value)

        x_train = torch.cat([d.x_train for d in data.clients])
        x_test = torch.cat([d.x_test for d in data.clients])
        train = torch.utils.data.TensorDataset(x_train, torch.cat([d.y_train for d in data.clients]))
        test = torch.utils.data.TensorDataset(x_test, torch.cat([d.y_test for d in data.clients]))
        users_train, users_test, a, b = {}, {}, 0, 0
        for k, d in enumerate(data.clients):
            users_train[k], users_test[k] = np.arange(a, a + d.n_train), np.arange(b, b + d.n_test)
            a, b = a + d.n_train, b + d.n_test
        labels = np.array([np.flatnonzero(h) for h in data.train_hist], dtype=object)
        ref.setup_seed(seed)

        def run():
            return ref.fedselect_algorithm(model, args, train, test, users_train, users_test, labels,
                                           list(range(self.k)))

        self.thread = threading.Thread(target=self._work, args=(run,), daemon=True)
        self.thread.start()

    def _work(self, run) -> None:
        self.resume.acquire()
        self.started = time.perf_counter()
        try:
            run()
        except BaseException as e:  # handed to the main thread
            self.error = e
            self.paused.release()

    def step(self) -> dict:
        self.updates = 0
        self.resume.release()
        self.paused.acquire()
        if self.error is not None:
            raise RuntimeError("the reference failed") from self.error
        return self.rounds[-1]

    def finish(self) -> None:
        self.resume.release()  # lets it return
        self.thread.join()
        for module, name, value in self.saved:  # the reference's modules as they were
            if value is None:
                delattr(module, name)
            else:
                setattr(module, name, value)


def next_masks(sim: Simulation) -> list[dict[str, torch.Tensor]]:
    """Each client's mask for its next round (held back until the broadcast, which the last round skips)."""
    return [PackedMask.from_dict(c.extra.next_mask) if c.extra.next_mask is not None else c.mask for c in sim.clients]


def mask_digest(mask: dict[str, torch.Tensor]) -> dict[str, list[int]]:
    """Per tensor: [personal entries, sum of their flat indices] (a compact fingerprint of which)."""
    return {n: [int(m.sum()), int(m.reshape(-1).nonzero().sum())] for n, m in sorted(mask.items())}


def run_seed(ref, knobs: dict, seed: int, opts) -> list[dict]:
    shape = RANDOM_SHAPE.get(opts.setting)
    data = random_federated(knobs["num_clients"], shape, knobs["samples_per_client"], 100, seed=seed) if shape else None
    config = RunConfig(algorithm="fedselect", fedselect_mode="faithful", seed=seed, threads=opts.threads,
                       data_root=opts.data_root, weighting=opts.weighting, precision=opts.precision,
                       eval_models="acc" if opts.timing else "all", **knobs)
    sim = Simulation(config, data=data)
    if opts.timing:
        return time_seed(ref, knobs, seed, opts, sim)
    algo, data = sim.algorithm, sim.data
    model = build_model(sim.model_name, data.input_shape, data.num_classes)
    model.load_state_dict({n: t.clone() for n, t in sim.clients[0].state.items()})
    theirs = ReferenceRun(ref, model, reference_args(ref, knobs, seed), data, seed, opts.order == "shared",
                          opts.verbose)
    trained, update = {}, algo.local_update

    def recording_update(k, client, d, rnd):
        stats = update(k, client, d, rnd)
        trained[k] = {n: t.clone() for n, t in client.state.items()}
        return stats

    algo.local_update = recording_update
    rows = []
    for rnd in range(1, config.rounds + 1):
        if rnd % 2:  # alternate who goes first
            t0 = time.perf_counter()
            ours = sim.run_round()
            ours_s = time.perf_counter() - t0
            rec = theirs.step()
        else:
            rec = theirs.step()
            t0 = time.perf_counter()
            ours = sim.run_round()
            ours_s = time.perf_counter() - t0
        ours_masks = next_masks(sim)
        row = dict(round=rnd, ours_s=ours_s, theirs_s=rec["seconds"], ours=[], theirs=[], reported=rec["reported"],
                   agree=0, entries=0, max_param_diff=0.0, ours_masks=[], theirs_masks=[],
                   n_test=[d.n_test for d in data.clients])
        for k, d in enumerate(data.clients):
            row["ours"].append(ours.clients[k].acc_local)
            row["theirs"].append(sim.trainer.evaluate(rec["states"][k], d.x_test, d.y_test) / d.n_test)
            row["max_param_diff"] = max(row["max_param_diff"],
                                        *((trained[k][n] - rec["states"][k][n]).abs().max().item()
                                          for n in algo.param_names))
            mine = ours_masks[k]
            their = rec["masks"].get(k, {n: torch.zeros_like(m) for n, m in mine.items()})
            row["agree"] += sum(int((mine[n] == their[n]).sum()) for n in mine)
            row["entries"] += sum(m.numel() for m in mine.values())
            row["ours_masks"].append(mask_digest(mine))
            row["theirs_masks"].append(mask_digest(their))
        rows.append(row)
        print(f"seed {seed} round {rnd:3d}  ours {np.mean(row['ours']):.4f}  theirs {np.mean(row['theirs']):.4f}  "
              f"diff {np.mean(row['ours']) - np.mean(row['theirs']):+.4f}  "
              f"(theirs reported {np.mean(row['reported']):.4f})  "
              f"masks agree {row['agree'] / row['entries']:.6f}  max|dθ| {row['max_param_diff']:.2e}  "
              f"s/round ours {ours_s:.2f} theirs {rec['seconds']:.2f}", flush=True)
    theirs.finish()
    return rows


def time_seed(ref, knobs: dict, seed: int, opts, sim: Simulation) -> list[dict]:
    """Seconds per round of ours, of the reference and of the pure compute of its work (the same
    SGD steps, a personal and a global pass per epoch, and one evaluation pass, in a tight loop),
    taking turns. Nothing is copied out of either run inside its timed round: ours scores only the
    reported model (`eval_models=acc`), as the reference does."""
    data = sim.data
    model = build_model(sim.model_name, data.input_shape, data.num_classes)
    model.load_state_dict({n: t.clone() for n, t in sim.clients[0].state.items()})
    theirs = ReferenceRun(ref, model, reference_args(ref, knobs, seed), data, seed, opts.order == "shared",
                          opts.verbose, record=False)
    rows = []
    for rnd in range(1, sim.config.rounds + 1):
        turns = {"ours": lambda: sim.run_round(), "theirs": theirs.step,
                 "pure": lambda: pure_compute(sim, passes=2 * sim.config.local_epochs, eval_passes=1)}
        order = list(turns)[rnd % 3:] + list(turns)[:rnd % 3]  # who goes first rotates
        seconds, done = {}, {}
        for who in order:
            t0 = time.perf_counter()
            done[who] = turns[who]()
            seconds[who] = time.perf_counter() - t0
        seconds["theirs"] = done["theirs"]["seconds"]  # its round, from its own clock (the pause excluded)
        rows.append(dict(round=rnd, ours_s=seconds["ours"], theirs_s=seconds["theirs"], pure_s=seconds["pure"],
                         ours=[c.acc for c in done["ours"].clients], theirs=done["theirs"]["reported"],
                         reported=done["theirs"]["reported"]))
        print(f"seed {seed} round {rnd:3d}  s/round ours {seconds['ours']:.2f}  theirs {seconds['theirs']:.2f}  "
              f"pure {seconds['pure']:.2f}  theirs/ours {seconds['theirs'] / seconds['ours']:.2f}  "
              f"ours/pure {seconds['ours'] / seconds['pure']:.2f}  (acc ours {np.mean(rows[-1]['ours']):.3f}, "
              f"theirs {np.mean(rows[-1]['theirs']):.3f})", flush=True)
    theirs.finish()
    return rows


WHO = ("ours", "theirs", "pure")   # the three timed sides of a round


def time_summary(runs: dict[int, list[dict]], first: int) -> list[str]:
    """Two views, printed and returned as a Markdown table: the mean over rounds 1-4 (how issue 24
    measured it), and medians over the rounds from `first`, the first with personal entries to
    train. Before it ours skips the personal pass (the reference runs it on an empty mask), so only
    the later rounds compare the same work."""
    early = [r for rs in runs.values() for r in rs if r["round"] <= 4]  # issue 24's measure: mean of rounds 1-4
    rows = [r for rs in runs.values() for r in rs if r["round"] >= first]
    if not rows:
        raise SystemExit(f"no round from round {first} on: give --rounds {first} or more")
    views = [("mean of rounds 1-4", {w: float(np.mean([r[f"{w}_s"] for r in early])) for w in WHO}, None),
             (f"median of rounds {first}+ ({len(rows)} rounds)", {w: float(np.median([r[f"{w}_s"] for r in rows]))
                                                               for w in WHO}, rows)]
    lines = ["| rounds | ours s | reference s | pure s | reference / ours (target ≥ 2 on ResNet-18) | ours / pure | "
             "reference / pure |", "|---|---|---|---|---|---|---|"]
    for name, sec, per_round in views:
        # the later view: medians of the rounds' ratios; the early one: ratios of the means
        ratio = (lambda a, b: float(np.median([r[f"{a}_s"] / r[f"{b}_s"] for r in per_round]))) if per_round \
            else (lambda a, b: sec[a] / sec[b])
        lines.append(f"| {name} | {sec['ours']:.2f} | {sec['theirs']:.2f} | {sec['pure']:.2f} | "
                     f"{ratio('theirs', 'ours'):.2f} | {ratio('ours', 'pure'):.2f} | {ratio('theirs', 'pure'):.2f} |")
    print("\n" + "\n".join(lines))
    return lines


def summary(runs: dict[int, list[dict]]) -> None:
    final = {who: [np.mean(rows[-1][who]) for rows in runs.values()] for who in ("ours", "theirs", "reported")}
    diffs = [a - b for a, b in zip(final["ours"], final["theirs"])]
    print(f"\nfinal accuracy over seeds {list(runs)} (mean ± std over seeds):")
    for who in final:
        print(f"  {who:9s} {np.mean(final[who]):.4f} "
              f"± {np.std(final[who], ddof=1) if len(runs) > 1 else float('nan'):.4f}")
    print(f"  ours - theirs: {np.mean(diffs):+.4f} (per seed {['%+.4f' % x for x in diffs]})")
    agree = [rows[-1]["agree"] / rows[-1]["entries"] for rows in runs.values()]
    print(f"  final mask agreement per seed: {agree}")
    ours_s, theirs_s = (np.array([r[f"{who}_s"] for rows in runs.values() for r in rows]) for who in ("ours", "theirs"))
    print(f"  seconds per round, mean / median of {len(ours_s)} rounds: ours {ours_s.mean():.2f} / "
          f"{np.median(ours_s):.2f}, theirs {theirs_s.mean():.2f} / {np.median(theirs_s):.2f}; theirs / ours, "
          f"median of the rounds' ratios: {np.median(theirs_s / ours_s):.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ref", type=Path, required=True, help="checkout of github.com/lapisrocks/fedselect")
    parser.add_argument("--setting", choices=sorted(SETTINGS), default="fmnist")
    parser.add_argument("--data-root", default=None, help="folder with torchvision's FashionMNIST/raw")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0])
    parser.add_argument("--order", choices=("shared", "own"), default="shared",
                        help="shared: the reference replays our batch orders; own: its own shuffling DataLoader")
    for knob in ("rounds", "local_epochs", "batch_size", "mask_every"):
        parser.add_argument("--" + knob.replace("_", "-"), type=int, default=None)
    for knob in ("lr", "pers_rate", "pers_limit"):
        parser.add_argument("--" + knob.replace("_", "-"), type=float, default=None)
    parser.add_argument("--weighting", choices=("uniform", "samples"), default="uniform",
                        help="ours: uniform = the reference's sum / count; samples = weights n_k / n (1/K here: "
                             "the same mean, rounded differently)")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads (both run in this process)")
    parser.add_argument("--precision", choices=PRECISIONS, default="fp32",
                        help="ours only (the reference and the pure compute stay float32): bf16 = our rounds under "
                             "bfloat16 autocast (the precision knob)")
    parser.add_argument("--out", type=Path, default=None, help="--timing: also write its summary here (Markdown)")
    parser.add_argument("--json", type=Path, default=None,
                        help="write every round's numbers here (benchmarks/parity/report.py)")
    parser.add_argument("--pins", action="store_true", help="print the numbers tests/test_parity_fedselect.py pins")
    parser.add_argument("--verbose", action="store_true", help="keep the reference's progress bars and prints")
    parser.add_argument("--timing", action="store_true", help="time the rounds against each other and the pure "
                        "compute; no copies for comparison (see `time_seed`)")
    opts = parser.parse_args()
    knobs = dict(SETTINGS[opts.setting])
    knobs.update({k: v for k in knobs if (v := getattr(opts, k, None)) is not None})
    torch.set_num_threads(opts.threads)
    ref = load_reference(opts.ref)
    real_cuda_check = torch.cuda.is_available
    torch.cuda.is_available = lambda: False  # the reference picks its device with this
    try:
        runs = {seed: run_seed(ref, knobs, seed, opts) for seed in opts.seeds}
    finally:
        torch.cuda.is_available = real_cuda_check
    if opts.timing:
        lines = time_summary(runs, first=knobs["mask_every"] + 2)  # the mask grows in round mask_every + 1
        write_report(opts.out, lines, f"`{' '.join(['python -m benchmarks.parity.fedselect', *sys.argv[1:]])}`, "
                     f"ours in {opts.precision}. {machine_caption()}.")
        return
    summary(runs)
    rounds = {seed: [Round(r["round"], float(np.mean(r["ours"])), float(np.mean(r["theirs"])), r["ours_s"],
                           r["theirs_s"])
                     for r in rows] for seed, rows in runs.items()}
    print_summary(rounds)
    if opts.json:
        save(opts.json, "FedSelect, faithful mode", "lapisrocks/fedselect @ 0949f8a",
             f"mean client accuracy after local training, {knobs['dataset']} {knobs['shards_per_client']} shards, "
             f"{knobs['num_clients']} clients, LeNet, batch order {opts.order}", rounds,
             knobs | {"order": opts.order, "weighting": opts.weighting})
    if opts.pins:  # theirs: accuracy per round and client; masks after the last round
        for seed, rows in runs.items():
            print(f"seed {seed} theirs correct test samples:",
                  [[round(a * n) for a, n in zip(r["theirs"], r["n_test"])] for r in rows])
            print(f"seed {seed} theirs masks:", rows[-1]["theirs_masks"])

if __name__ == "__main__":
    main()
