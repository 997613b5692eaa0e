"""Reading sweep results for analysis: Parquet only (never MLflow, never Ray).

Every function takes one or more paths; each is a sweep folder (holding `trials.parquet` or
`rounds/`) or a results folder holding sweep folders. Layout: sweeps/parquet_sink.py.
"""
from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import numpy as np
import pandas as pd

PathLike = str | Path


def find_sweeps(paths: PathLike | Iterable[PathLike]) -> list[Path]:
    """The sweep folders named by `paths` (a sweep folder itself, or a folder of sweeps)."""
    paths = [paths] if isinstance(paths, (str, Path)) else list(paths)
    found: list[Path] = []
    for path in map(Path, paths):
        if not path.exists():
            raise FileNotFoundError(f"no results at {path}")
        if (path / "rounds").is_dir() or (path / "trials.parquet").exists():
            found.append(path)
        else:
            found += sorted(p.parent for p in path.glob("*/rounds") if p.is_dir())
    if not found:
        raise FileNotFoundError(f"no sweep results (rounds/ or trials.parquet) under {', '.join(map(str, paths))}")
    return found


def _concat(frames: list[pd.DataFrame]) -> pd.DataFrame:
    frames = [f for f in frames if not f.empty]
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


def _folder(sweep: Path, name: str) -> pd.DataFrame:
    files = sorted((sweep / name).glob("*.parquet"))  # temp files start with "." and are skipped
    return _concat([pd.read_parquet(f) for f in files])


def load_rounds(paths) -> pd.DataFrame:
    """One row per (trial, round, client) of every sweep."""
    return _concat([_folder(s, "rounds") for s in find_sweeps(paths)])


def load_trials(paths) -> pd.DataFrame:
    """One row per trial; from trials.parquet, or rebuilt from the last round of each trial for a
    sweep that has not finished (status `INCOMPLETE`)."""
    frames = []
    for sweep in find_sweeps(paths):
        if (sweep / "trials.parquet").exists():
            frames.append(pd.read_parquet(sweep / "trials.parquet"))
            continue
        rounds = _folder(sweep, "rounds")
        if rounds.empty:
            continue
        last = rounds[rounds["round"] == rounds.groupby("config_hash")["round"].transform("max")]
        summary = last.groupby("config_hash").agg(acc_mean=("acc", "mean"), acc_std=("acc", "std"),
                                                  rounds_done=("round", "max"))
        config = last.drop_duplicates("config_hash").set_index("config_hash")
        keep = [c for c in config.columns if c not in last.columns.difference(config.columns)]
        frames.append(config[keep].join(summary).reset_index().assign(status="INCOMPLETE"))
    return _concat(frames)


def load_clients(paths) -> pd.DataFrame:
    """Per-client label histograms of every trial."""
    return _concat([_folder(s, "clients") for s in find_sweeps(paths)])


def load_masks(paths) -> pd.DataFrame:
    """Final masks of mask-based trials: one row per (trial, client, tensor); `mask` is a bool array."""
    frame = _concat([_folder(s, "masks") for s in find_sweeps(paths)])
    if not frame.empty:
        frame["mask"] = [np.unpackbits(np.frombuffer(b, dtype=np.uint8))[:n].astype(bool)
                         for b, n in zip(frame.bits, frame.numel)]
    return frame


METHOD_NAMES = {"fedselect": "FedSelect", "fedavg": "FedAvg", "local": "Local", "fedavg_ft": "FedAvg+FT",
                "fedper": "FedPer", "fedrep": "FedRep", "fedbabu": "FedBABU", "lg_fedavg": "LG-FedAvg",
                "ditto": "Ditto", "fedpac": "FedPAC", "lotteryfl": "LotteryFL"}
VARIANT_NAMES = {"personalize_least": "personalize least", "random": "random"}


def method_label(row) -> str:
    """A method's display name, FedSelect ablations included (e.g. `FedSelect (layer B)`)."""
    name = METHOD_NAMES.get(row["algorithm"], row["algorithm"])
    variant = row.get("fedselect_variant", "gradselect") if hasattr(row, "get") else "gradselect"
    if row["algorithm"] != "fedselect" or variant in (None, "gradselect") or pd.isna(variant):
        return name
    if variant == "layer":
        return f"FedSelect (layer {row['layer_block']})"
    return f"FedSelect ({VARIANT_NAMES.get(variant, variant)})"


def setting_label(row) -> str:
    """A data setting's display name, e.g. `digits, 2 shards` or `mnist, Dir(0.1)`."""
    if row["partition"] == "shards":
        split = f"{int(row['shards_per_client'])} shards"
    elif row["partition"] == "dirichlet":
        split = f"Dir({row['dir_alpha']:g})"
    else:
        split = "iid"
    return f"{row['dataset']}, {split}"
