"""Parquet results of a sweep, written so that nothing is lost or duplicated.

Layout under `<results>/<sweep>/`:
  rounds/<config_hash>-r<round>.parquet   one file per trial x round, one row per client
  clients/<config_hash>.parquet           per-client label histograms of the trial's data
  masks/<config_hash>.parquet             mask-based methods: each client's final mask per tensor
                                          (bit-packed with np.packbits; np.unpackbits(bits)[:numel])
  trials.parquet                          one row per trial (config, final metrics, status, wall time)

Each file is written atomically (temp file + rename). A trial's round is always written to the
same file name, so a retried or resumed trial that repeats a round replaces its rows.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from fl_core.results import write_parquet


def round_path(sweep_dir: Path, config_hash: str, rnd: int) -> Path:
    return sweep_dir / "rounds" / f"{config_hash}-r{rnd:04d}.parquet"


def write_round(sweep_dir: Path, config_hash: str, rnd: int, rows: pd.DataFrame) -> Path:
    return write_parquet(rows, round_path(sweep_dir, config_hash, rnd))


def round_files(sweep_dir: Path, config_hash: str) -> list[Path]:
    """A trial's round files, in round order."""
    return sorted((Path(sweep_dir) / "rounds").glob(f"{config_hash}-r*.parquet"))


def write_clients(sweep_dir: Path, config_hash: str, rows: list[dict]) -> Path:
    return write_parquet(pd.DataFrame(rows), sweep_dir / "clients" / f"{config_hash}.parquet")


def write_masks(sweep_dir: Path, config_hash: str, masks: list[dict | None]) -> Path | None:
    """Each client's final mask (dict tensor name -> bool tensor), one row per (client, tensor)."""
    rows = [{"config_hash": config_hash, "client": k, "tensor": name, "shape": list(m.shape), "numel": m.numel(),
             "bits": np.packbits(m.cpu().numpy().reshape(-1)).tobytes()}
            for k, mask in enumerate(masks) if mask for name, m in mask.items()]
    if not rows:
        return None
    return write_parquet(pd.DataFrame(rows), Path(sweep_dir) / "masks" / f"{config_hash}.parquet")


def _read_folder(folder: Path) -> pd.DataFrame:
    files = sorted(folder.glob("*.parquet"))  # temp files start with "." and are not matched
    if not files:
        return pd.DataFrame()
    return pd.concat([pd.read_parquet(f) for f in files], ignore_index=True)


def read_rounds(sweep_dir: str | Path) -> pd.DataFrame:
    """Every (trial, round, client) row of a sweep, sorted by trial, round and client."""
    frame = _read_folder(Path(sweep_dir) / "rounds")
    if frame.empty:
        return frame
    return frame.sort_values(["config_hash", "round", "client"], ignore_index=True)


def read_sweep(sweep_dir: str | Path) -> pd.DataFrame:
    """The tidy table of a sweep: one row per (trial, round, client), with the trial's status and
    wall time joined from trials.parquet when the sweep has finished."""
    sweep_dir = Path(sweep_dir)
    rounds = read_rounds(sweep_dir)
    trials_file = sweep_dir / "trials.parquet"
    if rounds.empty or not trials_file.exists():
        return rounds
    trials = pd.read_parquet(trials_file, columns=["config_hash", "status", "wall_seconds"])
    return rounds.merge(trials, on="config_hash", how="left")
