"""How fast is a large sweep read back? A synthetic sweep in the real layout, then the readers timed.

The sweep: `--trials` trials x `--rounds` rounds x `--clients` clients (default 1000 x 200 x 10 =
2 million rows), rows built by `fl_core.results.round_rows` (the trainable's rows, with random
numbers) for a mix of methods, so the files have different columns (FedSelect's knobs, LotteryFL's
own metrics, ...) and null-typed ones (e.g. `samples_per_client`). Finished trials are compacted
(one file each); `--unfinished` trials are left as per-round journal files (an interrupted sweep),
and a few finished trials get a stale journal file that readers must ignore. trials.parquet holds
`fl_core.results.trial_row`s (of the final round only, to keep the set-up short).

Timed: `sweeps.parquet_sink.read_sweep` (all columns; a few columns), `analysis.load.load_rounds`
and `analysis.load.load_trials`; and, for comparison, reading `--journal-trials` trials from the
one-file-per-round layout (engine v1, and a trial that has not finished) against their compacted
files. Every read is checked for its row count and for no duplicated (trial, round, client).

    .venv/bin/python -m benchmarks.read_sweep [--trials 1000] [--rounds 200] [--clients 10] [--keep DIR]
"""
from __future__ import annotations

import argparse
import json
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd


from analysis.load import load_rounds, load_trials
from fl_core.config import RunConfig
from fl_core.results import round_rows, trial_row, write_parquet
from fl_core.simulation import ClientRound, RoundResult
from sweeps import parquet_sink as sink

METHODS = [{"algorithm": "fedselect", "pers_rate": 0.1}, {"algorithm": "fedselect", "pers_rate": 0.5},
           {"algorithm": "fedavg"}, {"algorithm": "local"}, {"algorithm": "lotteryfl"},
           {"algorithm": "fedselect", "fedselect_variant": "layer", "layer_block": "B"}, {"algorithm": "ditto"}]


def trial_frame(config: RunConfig, rng: np.random.Generator, name: str, trial: int) -> pd.DataFrame:
    """All rows of one trial: round_rows of a synthetic round 1, repeated for every round with
    fresh random numbers."""
    clients = [ClientRound(client=k, participated=True, acc_local=0.5, acc_global=0.5, acc=0.5, acc_val=float("nan"),
                           loss=1.0, n_train=100, n_val=0, n_test=20, personal_fraction=0.0, bytes_up=10_000,
                           bytes_down=10_000, seconds=0.01,
                           metrics=({"lottery_sparsity": 0.0, "lottery_val_acc": 0.5}
                                    if config.algorithm == "lotteryfl" else {}))
               for k in range(config.num_clients)]
    one = pd.DataFrame(round_rows(RoundResult(round=1, clients=clients, seconds=0.1, lr=config.lr), config, "lenet",
                                  sweep=name, trial_id=f"trial_{trial:05d}"))
    rows = one.iloc[np.tile(np.arange(len(one)), config.rounds)].reset_index(drop=True)
    n = len(rows)
    rows["round"] = np.repeat(np.arange(1, config.rounds + 1), config.num_clients)
    for column in ("acc", "acc_local", "acc_global", "loss", "personal_fraction", "seconds"):
        rows[column] = rng.random(n)
    return rows


def write_sweep(folder: Path, trials: int, rounds: int, clients: int, unfinished: int, journal: int) -> dict:
    """The synthetic sweep under `folder`; returns what was written (for the checks)."""
    rng = np.random.default_rng(0)
    trial_rows, written, journal_keys = [], 0, []
    for i in range(trials):
        method = METHODS[i % len(METHODS)]
        config = RunConfig(**method, dataset="digits", num_clients=clients, rounds=rounds, seed=i // len(METHODS))
        key = config.config_hash()
        rows = trial_frame(config, rng, folder.name, i)
        if i < unfinished:  # interrupted: half its rounds, as journal files
            rows = rows[rows["round"] <= rounds // 2]
            for rnd, part in rows.groupby("round"):
                sink.write_round(folder, key, int(rnd), part)
        else:
            write_parquet(rows, sink.trial_path(folder, key))
            if i % 200 == unfinished:  # a crash between compaction and cleanup: a stale journal file
                sink.write_round(folder, key, 1, rows[rows["round"] == 1].assign(acc=-1.0))
            if len(journal_keys) < journal:
                journal_keys.append((key, rows))
        written += len(rows)
        final = rows[rows["round"] == rows["round"].max()]
        trial_rows.append(trial_row(config, final, sweep=folder.name,
                                    status="STOPPED" if i < unfinished else "COMPLETED", wall_seconds=60.0))
    write_parquet(pd.DataFrame(trial_rows), folder / "trials.parquet")
    # The same first `journal` finished trials in the one-file-per-round layout, in a folder of their own.
    old = folder.parent / f"{folder.name}-journal"
    for key, rows in journal_keys:
        for rnd, part in rows.groupby("round"):
            sink.write_round(old, key, int(rnd), part)
    return {"rows": written, "journal": old, "journal_rows": sum(len(r) for _, r in journal_keys),
            "journal_keys": [k for k, _ in journal_keys]}


def timed(what: str, fn, expect_rows: int):
    start = time.perf_counter()
    frame = fn()
    seconds = time.perf_counter() - start
    assert len(frame) == expect_rows, (what, len(frame), expect_rows)
    if {"config_hash", "round", "client"} <= set(frame.columns):
        assert not frame.duplicated(["config_hash", "round", "client"]).any(), what
        assert not (frame["acc"] < 0).any() if "acc" in frame else True, f"{what}: read a stale journal file"
    print(f"  {what:<58s} {seconds:7.2f} s   {len(frame):>9,d} rows x {frame.shape[1]:>3d} columns")
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trials", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=200)
    parser.add_argument("--clients", type=int, default=10)
    parser.add_argument("--unfinished", type=int, default=5, help="trials left as per-round journal files")
    parser.add_argument("--journal-trials", type=int, default=20,
                        help="finished trials also written one file per round, for the comparison")
    parser.add_argument("--keep", type=Path, default=None,
                        help="write the sweep here and keep it; a later run with the same --keep reuses it")
    args = parser.parse_args()

    base = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="read_sweep-"))
    folder = base / "synthetic-sweep"
    try:
        start = time.perf_counter()
        saved = base / "written.json"
        if saved.exists():  # --keep of an earlier run: reuse its sweep
            info = json.loads(saved.read_text())
            info["journal"] = Path(info["journal"])
            how = "reused"
        else:
            info = write_sweep(folder, args.trials, args.rounds, args.clients, args.unfinished, args.journal_trials)
            saved.write_text(json.dumps(info | {"journal": str(info["journal"])}))
            how = f"written in {time.perf_counter() - start:.0f} s"
        files = sum(len(f) for f in sink.round_sources(folder).values())
        size = sum(p.stat().st_size for p in (folder / "rounds").iterdir()) / 1e6
        trials = len(sink.round_sources(folder))
        print(f"synthetic sweep: {trials} trials x {args.rounds} rounds x {args.clients} clients "
              f"({args.unfinished} unfinished) = {info['rows']:,d} rows in {files:,d} files, {size:.0f} MB ({how})")
        rows = info["rows"]
        timed("sweeps.parquet_sink.read_sweep(folder)", lambda: sink.read_sweep(folder), rows)
        timed("read_sweep(folder, columns=[acc, method, setting, round])",
              lambda: sink.read_sweep(folder, columns=["acc", "method", "setting"]), rows)
        timed("analysis.load.load_rounds(folder)", lambda: load_rounds(folder), rows)
        timed("analysis.load.load_trials(folder)", lambda: load_trials(folder), trials)
        n, jrows = len(info["journal_keys"]), info["journal_rows"]
        if n:
            per_round = timed(f"{n} trials, one file per round ({n * args.rounds:,d} files)",
                              lambda: sink.read_rounds(info["journal"]), jrows)
            compacted = timed(f"the same {n} trials compacted ({n} files)",
                              lambda: sink.read_rounds(folder, trials=info["journal_keys"]), jrows)
            print(f"  compaction speeds up reading these trials {per_round / compacted:.0f}x")
    finally:
        if not args.keep:
            shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
