"""Result rows and atomic Parquet writes (pandas/pyarrow only; shared by the CLI and the sweeps).

Every row carries the config (the DESIGN.md names), its hash, the seed and the package version.
"""
from __future__ import annotations

import os
import uuid
from pathlib import Path
from typing import Any

import pandas as pd

from . import __version__
from .config import NON_SEMANTIC, RunConfig
from .data import FederatedData
from .simulation import RoundResult, client_round_dict


def config_columns(config: RunConfig) -> dict[str, Any]:
    cols = {k: v for k, v in config.to_dict().items() if k not in NON_SEMANTIC}
    cols["config_hash"] = config.config_hash()
    cols["version"] = __version__
    return cols


def round_rows(result: RoundResult, config: RunConfig, model: str) -> list[dict[str, Any]]:
    """One row per client of one round: metrics plus the config columns."""
    base = config_columns(config) | {"model": model}
    return [base | row for row in client_round_dict(result)]


def client_rows(data: FederatedData, config: RunConfig) -> list[dict[str, Any]]:
    """One row per client: its realised train and test label histograms."""
    base = config_columns(config)
    return [base | {"client": k, "n_train": int(data.train_hist[k].sum()), "n_test": int(data.test_hist[k].sum()),
                    "train_label_hist": data.train_hist[k].tolist(), "test_label_hist": data.test_hist[k].tolist()}
            for k in range(len(data.clients))]


def write_parquet(frame: pd.DataFrame, path: str | os.PathLike) -> Path:
    """Write atomically: a unique temp file in the same folder, then rename over the target."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")
    try:
        frame.to_parquet(tmp, index=False)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return path
