"""Reading sweep results for analysis: Parquet only (never MLflow, never Ray).

Every function takes one or more paths; each is a sweep folder (holding `trials.parquet` or
`rounds/`) or a results folder holding sweep folders. The layout and the reader (a pyarrow dataset
over the union of the files' schemas; per trial the compacted file, else its per-round journal
files) are fl_core/result_files.py's. Rows and statistics are fl_core.results'.

Sweeps written by engine v1 load the same way: their one-file-per-(trial, round) layout is the
journal layout; their rows carry every method's knobs and no `method`, `setting` (filled here by
`fl_core.results.add_labels`, once per trial) or, in trials.parquet, `version` (left empty). Their
config hashes are the old ones (the hash changed with engine v2), consistent within the sweep.
"""
from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path

import numpy as np
import pandas as pd

from fl_core.results import add_labels
from fl_core.result_files import DamagedFile, read_files, read_rounds, trials_from_rounds  # noqa: F401 (DamagedFile: for the CLIs)

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
    if len(frames) == 1:  # one sweep: no copy
        return frames[0]
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


def _folder(sweep: Path, name: str) -> pd.DataFrame:
    files = sorted(p for p in (sweep / name).glob("*.parquet") if not p.name.startswith("."))
    return read_files(files)


def labelled(frame: pd.DataFrame) -> pd.DataFrame:
    """`frame` with `method` and `setting` filled where missing (rows of engine v1), computed once
    per config hash."""
    if frame.empty or ({"method", "setting"} <= set(frame.columns)
                       and not frame["method"].isna().any() and not frame["setting"].isna().any()):
        return frame
    if "config_hash" not in frame:
        return add_labels(frame)
    firsts = add_labels(frame.drop_duplicates("config_hash")).set_index("config_hash")
    frame = frame.copy()
    for column in ("method", "setting"):
        filled = frame["config_hash"].map(firsts[column])
        frame[column] = frame[column].fillna(filled) if column in frame else filled
    return frame


def is_gradselect(frame: pd.DataFrame) -> pd.Series:
    """Rows of FedSelect itself (the `gradselect` variant), not of its ablations or other methods."""
    variant = frame["fedselect_variant"] if "fedselect_variant" in frame else pd.Series(None, index=frame.index)
    return (frame["algorithm"] == "fedselect") & (variant.isna() | (variant == "gradselect"))


def load_rounds(paths, columns: Sequence[str] | None = None, trials: Iterable[str] | None = None,
                labels: bool = True) -> pd.DataFrame:
    """One row per (trial, round, client) of every sweep, labelled (unless `labels` is False: rows
    of engine v1 need their knob columns for that). `columns`: read only these (plus the keys);
    `trials`: only these config hashes."""
    if columns is not None:
        columns = list(dict.fromkeys(["config_hash", "round", "client", *columns]))
    wanted = None if trials is None else set(trials)
    rows = _concat([read_rounds(s, columns, wanted) for s in find_sweeps(paths)])
    return labelled(rows) if labels else rows


def load_trials(paths) -> pd.DataFrame:
    """One row per trial, labelled; from trials.parquet, or rebuilt from the rows of a sweep that
    has not finished (status `INCOMPLETE`)."""
    frames = []
    for sweep in find_sweeps(paths):
        if (sweep / "trials.parquet").exists():
            frames.append(read_files([sweep / "trials.parquet"]))
        else:
            frames.append(trials_from_rounds(read_rounds(sweep)))
    return labelled(_concat(frames))


FINISHED_STATUSES = ("COMPLETED", "INCOMPLETE")  # INCOMPLETE: rebuilt from rows; its rounds decide


def unfinished(trials: pd.DataFrame) -> pd.Series:
    """True for each trial that did not run all its rounds: its status is neither COMPLETED nor
    INCOMPLETE (ERROR, STOPPED by a scheduler or an interrupted sweep, anything else), or its last
    recorded round (`rounds_done`) is below its configured `rounds`. A trial rebuilt from the rows
    of a sweep without trials.parquet (INCOMPLETE) is judged by its rounds alone; where a frame
    has no round columns, by its status alone."""
    flag = pd.Series(False, index=trials.index)
    if "status" in trials:
        flag |= ~trials["status"].isin(FINISHED_STATUSES)
    if {"rounds_done", "rounds"} <= set(trials.columns):
        done, planned = (pd.to_numeric(trials[c], errors="coerce") for c in ("rounds_done", "rounds"))
        flag |= (done < planned).fillna(False).astype(bool)
    return flag


def diverged(frame: pd.DataFrame) -> pd.Series:
    """True for each run (a trial row, or a row of `analysis.stats.compare`'s runs) whose `diverged`
    is set (fl_core.results.divergence: its training loss was lost, or its accuracy fell to chance
    after learning); False where the column is missing or empty (sweeps older than it)."""
    if "diverged" not in frame:
        return pd.Series(False, index=frame.index)
    return frame["diverged"].astype(object).where(frame["diverged"].notna(), False).astype(bool)


def report_rules(trials: pd.DataFrame) -> pd.Series:
    """Each trial's `report_round` (fl_core.results.REPORT_ROUNDS: "last", "best_val", ...), "last"
    where the column is missing or empty (sweeps older than it reported their last round)."""
    if "report_round" not in trials:
        return pd.Series("last", index=trials.index, dtype=object)
    return trials["report_round"].astype(object).where(trials["report_round"].notna(), "last")


def reported_rounds(trials: pd.DataFrame) -> dict[str, int]:
    """config hash -> `reported_round` of each trial whose rule is not "last" (its accuracies are
    those of that round, not of its last one); empty for trials that report their last round."""
    if not {"config_hash", "reported_round"} <= set(trials.columns):
        return {}
    best = trials[report_rules(trials).ne("last") & trials["reported_round"].notna()]
    return {h: int(r) for h, r in zip(best["config_hash"], best["reported_round"])}


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
