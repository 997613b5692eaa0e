"""Parquet results of a sweep: written so that nothing is lost or duplicated, read fast at scale.

The layout of the folder and the readers: fl_core/result_files.py.

Compaction. A trial writes each round to its journal file, atomically (temp file + rename), and a
round always goes to the same name: a trial retried or resumed from an earlier checkpoint
rewrites (replaces) the rounds after it, never duplicates them. When the trial has every round
(after the state file records the last one), `compact_trial` reads its journal files, checks
that they are exactly rounds 1..R, writes them as one file `rounds/<hash>.parquet` atomically and
then deletes the journal files. The same call runs on the resume path of a trial whose state says
it is finished, so a crash anywhere in between is repaired on the next attempt:
  - crash before the compacted file is renamed into place: journal only, compaction redone;
  - crash after, before the journal files are deleted: readers take the compacted file and ignore
    that hash's journal files; the next call deletes them;
  - a worker killed in the middle of writing a round leaves a temp file (`.<hash>-r<round>...tmp`):
    readers never list it, and compaction deletes it with the journal.
A compacted file is only written for a trial whose state is final, so no later run of that trial
writes journal files again (trials stopped early by a scheduler keep their journal files).

One schema. Each trial writes the columns of its own method (its knobs, its metrics), so while a
sweep runs its files differ. When the sweep ends (every stage done, also after a resume),
`unify_schema` rewrites every file of rounds/, clients/ and masks/ that lacks a column of its
folder's union schema, adding that column as nulls of the union's type (a narrower type is
promoted: int to double, null to the type others have). A finished sweep is then one table per
folder for any reader: pandas and pyarrow.dataset (which take the first file's schema), Polars
(which refuses files with extra columns) and DuckDB read every column and every row.
"""
from __future__ import annotations

import os
from pathlib import Path

import pandas as pd

from fl_core.results import write_parquet
from fl_core.result_files import (SORT_KEYS, DamagedFile, advice, journal_files, latest_sweep,  # noqa: F401
                                  read_files, read_rounds, read_sweep, read_trial, round_path, round_sources,
                                  sweep_folders, trial_path, unreadable)
# (re-exported: the sweeps' and the users' `sweeps.parquet_sink.read_sweep` and friends)


# ---------------------------------------------------------------------------- writing
def write_round(sweep_dir: Path, config_hash: str, rnd: int, rows: pd.DataFrame) -> Path:
    """One round of one trial (a journal file), atomically; a rewrite replaces it."""
    return write_parquet(rows, round_path(sweep_dir, config_hash, rnd))


def compact_trial(sweep_dir: Path, config_hash: str, rounds: int) -> Path | None:
    """Merge a finished trial's journal files (rounds 1..`rounds`) into its one file, then delete
    them. Idempotent; returns the compacted file, or None if the journal is incomplete (the
    journal files are then left as they are)."""
    target = trial_path(sweep_dir, config_hash)
    journal = journal_files(sweep_dir, config_hash)
    if not target.exists():
        if list(journal) != list(range(1, rounds + 1)):
            return None
        try:
            frames = [pd.read_parquet(path) for path in journal.values()]
        except FileNotFoundError:  # another attempt of this trial compacted it meanwhile
            return target if target.exists() else None
        write_parquet(pd.concat(frames, ignore_index=True), target)
    for path in journal.values():
        path.unlink(missing_ok=True)
    for path in target.parent.glob(f".{config_hash}-r*.tmp"):  # a write cut short by a kill
        path.unlink(missing_ok=True)
    return target


def unify_schema(sweep_dir: str | Path) -> int:
    """Give every Parquet file of the sweep's rounds/, clients/ and masks/ its folder's union
    schema (see the module docstring); each rewrite is atomic. A file that cannot be read is left
    as it is (reading the sweep names it: `DamagedFile`). Returns the files rewritten."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    rewritten = 0
    for name in ("rounds", "clients", "masks"):
        files = sorted(p for p in (Path(sweep_dir) / name).glob("*.parquet")
                       if not p.name.startswith(".") and unreadable(p) is None)
        schemas = [pq.read_schema(f).remove_metadata() for f in files]
        if len(files) < 2 or all(s.equals(schemas[0]) for s in schemas):
            continue
        union = pa.unify_schemas(schemas, promote_options="permissive")
        for path, schema in zip(files, schemas):
            if schema.equals(union):
                continue
            table = pq.read_table(path)
            columns = [table.column(f.name).cast(f.type) if f.name in table.column_names
                       else pa.nulls(table.num_rows, f.type) for f in union]
            tmp = path.with_name(f".{path.name}.unify.tmp")
            pq.write_table(pa.Table.from_arrays(columns, schema=union), tmp)
            os.replace(tmp, path)
            rewritten += 1
    return rewritten


def write_clients(sweep_dir: Path, config_hash: str, rows: list[dict]) -> Path:
    return write_parquet(pd.DataFrame(rows), Path(sweep_dir) / "clients" / f"{config_hash}.parquet")


def write_masks(sweep_dir: Path, config_hash: str, rows: list[dict]) -> Path | None:
    """A trial's final masks (rows of `fl_core.results.mask_rows`); nothing for maskless methods."""
    if not rows:
        return None
    return write_parquet(pd.DataFrame(rows), Path(sweep_dir) / "masks" / f"{config_hash}.parquet")


