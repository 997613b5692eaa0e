"""The files a sweep's results live in, and how to read them: the one definition both the sweeps
(sweeps/parquet_sink.py writes them) and analysis (analysis/load.py reads them) use.

Layout under `<results>/<sweep>/`:
  rounds/<config_hash>.parquet            a finished trial: all its rows (round x client), one file
  rounds/<config_hash>-r<round>.parquet   journal: one file per round while the trial runs (and the
                                          whole layout of sweeps written before compaction existed)
  clients/<config_hash>.parquet           per-client label histograms of the trial's data
  masks/<config_hash>.parquet             mask-based methods: each client's final mask per tensor
                                          (bit-packed with np.packbits; np.unpackbits(bits)[:numel])
  trials.parquet                          one row per trial (config, final metrics, status, wall time)
Rows come from fl_core.results only (`round_rows`, `client_rows`, `mask_rows`, `trial_row`).

Reading (`read_rounds`, `read_sweep`, `read_files`): one listing of the folder picks, per hash,
the compacted file if it exists, else its journal files; the files are read as one pyarrow
dataset whose schema is the union of the files' schemas (methods write different columns, and a
column that is all None in one file is typed null there), with permissive type promotion. A file
that cannot be read raises `DamagedFile`, one line naming it and what to do (sweeps/damage.py).
"""
from __future__ import annotations

import os
import re
from collections.abc import Iterable, Sequence
from pathlib import Path

import pandas as pd

from .algorithms import METHOD_FACTS, method_facts
from .config import config_from_row
from .results import divergence, summarize_trial, trial_row

SORT_KEYS = ("config_hash", "round", "client")
_NAME = re.compile(r"^(?P<hash>[^.][^-]*?)(?:-r(?P<round>\d+))?\.parquet$")


class DamagedFile(ValueError):
    """Result files that cannot be read (a copy cut short, a disk that filled up, a crashed
    machine): the message names them and says what to do, in one line."""

    def __init__(self, files: Sequence[tuple[Path, str]]):
        self.files = [(Path(f), why) for f, why in files]
        first, why = self.files[0]
        more = f" (and {len(self.files) - 1} more: {', '.join(str(f) for f, _ in self.files[1:4])}" \
               f"{', ...' if len(self.files) > 4 else ''})" if len(self.files) > 1 else ""
        super().__init__(f"damaged results file {first}: {why}{more}; {advice(first)}")


def advice(path: Path) -> str:
    """What to do about a damaged file, by where it lies in a sweep folder."""
    if path.name == "trials.parquet":
        return ("delete it: analysis rebuilds the trials from their rows (status INCOMPLETE), and the sweep's "
                "--resume writes it again")
    return ("resume the sweep (its command with --resume NAME): the damaged file is set aside under "
            "damaged/ and its trial runs again")


def unreadable(path: Path) -> str | None:
    """Why a Parquet file cannot be read (its whole content is read), or None if it can."""
    import pyarrow.parquet as pq

    try:
        pq.ParquetFile(path).read()
    except FileNotFoundError:
        raise
    except Exception as err:  # noqa: BLE001 - pyarrow raises ArrowInvalid, OSError, ... for a damaged file
        text = str(err).split(". ")[0].strip().rstrip(".")
        return f"not a readable Parquet file ({text[:160]})"
    return None


# ---------------------------------------------------------------------------- layout
def round_path(sweep_dir: Path, config_hash: str, rnd: int) -> Path:
    return Path(sweep_dir) / "rounds" / f"{config_hash}-r{rnd:04d}.parquet"


def trial_path(sweep_dir: Path, config_hash: str) -> Path:
    return Path(sweep_dir) / "rounds" / f"{config_hash}.parquet"


def journal_files(sweep_dir: Path, config_hash: str) -> dict[int, Path]:
    """A trial's journal files: round -> path."""
    found = {}
    for path in (Path(sweep_dir) / "rounds").glob(f"{config_hash}-r*.parquet"):
        match = _NAME.match(path.name)
        if match and match["hash"] == config_hash and match["round"]:
            found[int(match["round"])] = path
    return dict(sorted(found.items()))


# ---------------------------------------------------------------------------- reading
def round_sources(sweep_dir: str | Path) -> dict[str, list[Path]]:
    """config hash -> the files holding its rows: the compacted file if there is one, else the
    journal files in round order. Temp files (names starting with '.') are never listed."""
    folder = Path(sweep_dir) / "rounds"
    compacted: dict[str, Path] = {}
    journal: dict[str, list[tuple[int, Path]]] = {}
    try:
        entries = list(os.scandir(folder))
    except FileNotFoundError:
        return {}
    for entry in entries:
        match = _NAME.match(entry.name)
        if not match:
            continue
        if match["round"] is None:
            compacted[match["hash"]] = Path(entry.path)
        else:
            journal.setdefault(match["hash"], []).append((int(match["round"]), Path(entry.path)))
    return {key: [compacted[key]] if key in compacted else [p for _, p in sorted(journal[key])]
            for key in sorted(set(compacted) | set(journal))}


def read_files(files: Sequence[Path], columns: Sequence[str] | None = None, sort: Sequence[str] = ()) -> pd.DataFrame:
    """Parquet files as one frame through a pyarrow dataset with the union of their schemas
    (missing columns read as null; null-typed and narrower numeric columns are promoted), rows
    in file order. `columns`: only these (those present); `sort`: keys the rows must be sorted by
    (those present): checked, and sorted only if they are not (files written by this module,
    listed by `round_sources`, already are). The method's facts (`METHOD_FACTS`) of rows written
    before they were columns are filled in (`with_method_facts`)."""
    if not files:
        return pd.DataFrame()
    facts = [f for f in METHOD_FACTS if columns is None or f in columns]
    helper = ["algorithm"] if facts and columns is not None and "algorithm" not in columns else []
    table = _read_table(files, None if columns is None else [*columns, *helper])
    keys = [k for k in sort if k in table.column_names]
    if keys and not is_sorted(table, keys):
        table = table.sort_by([(k, "ascending") for k in keys])
    frame = with_method_facts(table.to_pandas(), facts)
    return frame.drop(columns=[c for c in helper if c in frame])


def _read_table(files: Sequence[Path], columns: Sequence[str] | None):
    import pyarrow.dataset as ds
    import pyarrow.fs as pafs

    factory = ds.FileSystemDatasetFactory(pafs.LocalFileSystem(), [str(f) for f in files], ds.ParquetFileFormat())
    try:
        schema = factory.inspect(promote_options="permissive", fragments=None).remove_metadata()
        dataset = factory.finish(schema)
        names = [c for c in columns if c in schema.names] if columns is not None else None
        return dataset.to_table(columns=names)
    except FileNotFoundError:
        raise
    except Exception as err:  # noqa: BLE001 - pyarrow raises several types for damaged files and clashing columns
        damaged = [(Path(f), why) for f in files if (why := unreadable(Path(f))) is not None]
        if damaged:
            raise DamagedFile(damaged) from None
        raise ValueError(f"the Parquet files under {Path(files[0]).parent} do not share one schema: {err}") from err


def with_method_facts(frame: pd.DataFrame, facts: Sequence[str] = METHOD_FACTS) -> pd.DataFrame:
    """`frame` with the columns `facts` (of `METHOD_FACTS`) filled where a row lacks them (written
    before they were columns) from its `algorithm`'s class; left empty for a method that does not
    import here (an external one). Rows without `algorithm` are left as they are."""
    if frame.empty or "algorithm" not in frame:
        return frame
    for fact in facts:
        missing = frame[fact].isna() if fact in frame else pd.Series(True, index=frame.index)
        if missing.any():
            known = {name: _facts_of(name).get(fact) for name in frame.loc[missing, "algorithm"].dropna().unique()}
            filled = frame.loc[missing, "algorithm"].map(known)
            column = frame[fact].astype(object) if fact in frame else pd.Series(None, index=frame.index, dtype=object)
            column[missing] = filled
            frame[fact] = column.infer_objects() if column.notna().all() else column
    return frame


def _facts_of(algorithm: str) -> dict[str, object]:
    try:
        return method_facts(algorithm)
    except KeyError:  # an external method that does not import here
        return {}


def is_sorted(table, keys: Sequence[str]) -> bool:
    """Whether the rows are in ascending lexicographic order of `keys` (vectorised, no copy)."""
    import pyarrow.compute as pc

    if table.num_rows < 2:
        return True
    ordered = None
    for key in reversed(keys):
        column = table.column(key)
        after, before = column.slice(1), column.slice(0, table.num_rows - 1)
        greater = pc.greater(after, before)
        ordered = greater if ordered is None else pc.or_(greater, pc.and_(pc.equal(after, before), ordered))
    return bool(pc.all(pc.fill_null(ordered, False)).as_py())


def read_rounds(sweep_dir: str | Path, columns: Sequence[str] | None = None, trials: Iterable[str] | None = None,
                attempts: int = 3) -> pd.DataFrame:
    """Every (trial, round, client) row of a sweep, sorted by trial, round and client.
    `columns`: read only these; `trials`: only these config hashes. A listing that a running
    trial changes underneath (it compacted its journal meanwhile) is taken again."""
    for attempt in range(attempts):
        sources = round_sources(sweep_dir)
        if trials is not None:
            wanted = set(trials)
            sources = {k: v for k, v in sources.items() if k in wanted}
        try:
            return read_files([f for files in sources.values() for f in files], columns, SORT_KEYS)
        except FileNotFoundError:
            if attempt == attempts - 1:
                raise
    raise AssertionError("unreachable")


def read_trial(sweep_dir: str | Path, config_hash: str) -> pd.DataFrame:
    """One trial's rows (compacted or journal), sorted by round and client."""
    return read_rounds(sweep_dir, trials=[config_hash])


def is_sweep_folder(path: str | Path) -> bool:
    """Whether `path` holds a sweep's results (its rounds/ or its trials.parquet)."""
    return (Path(path) / "rounds").is_dir() or (Path(path) / "trials.parquet").exists()


def sweep_folders(results: str | Path = "results", study: str | None = None) -> list[Path]:
    """The sweep folders directly under `results`, oldest first by when each was last started or
    resumed (a sweep rewrites its sweep.json then; a folder without one, e.g. a copy of the data
    alone, by its newest file at the top). `study`: only the sweeps of that study (as recorded in
    sweep.json; a folder that records none counts when its name is `<study>-...`)."""
    found = []
    for folder in (p for p in Path(results).iterdir() if p.is_dir()) if Path(results).is_dir() else ():
        if not is_sweep_folder(folder) and not (folder / "sweep.json").exists():
            continue
        if study is not None:
            owner = recorded_study(folder)
            if owner != study and not (owner is None and folder.name.startswith(f"{study}-")):
                continue
        stamp = folder / "sweep.json"
        when = stamp.stat().st_mtime if stamp.exists() else max(p.stat().st_mtime for p in folder.iterdir())
        found.append((when, folder.name, folder))
    return [folder for _, _, folder in sorted(found)]


def recorded_study(folder: str | Path) -> str | None:
    """The study a sweep's sweep.json records (None: no file, unreadable, or written before it was)."""
    import json

    try:
        return json.loads((Path(folder) / "sweep.json").read_text()).get("study")
    except (OSError, ValueError, AttributeError):
        return None


def latest_sweep(results: str | Path = "results", study: str | None = None) -> Path:
    """The sweep under `results` started (or resumed) last, of `study` if given: the folder to
    read after a run without guessing its dated name (`read_sweep(latest_sweep())`). A
    ValueError naming the folder when it holds no sweep (of that study)."""
    found = sweep_folders(results, study)
    if not found:
        others = [p.name for p in sweep_folders(results)] if study is not None else []
        raise ValueError(f"no {'sweep' if study is None else study + ' sweep'} in {Path(results)}"
                         + (f" (sweeps there: {', '.join(others[-5:])})" if others else "")
                         + "; a sweep writes its folder under --results (default: results)")
    return found[-1]


def read_sweep(sweep_dir: str | Path, columns: Sequence[str] | None = None) -> pd.DataFrame:
    """The tidy table of a sweep: one row per (trial, round, client), with the trial's status and
    wall time joined from trials.parquet when the sweep has finished. A folder that is not a sweep
    (no rounds/ and no trials.parquet: a results folder, a typo) is a ValueError naming it and the
    sweeps below it (`latest_sweep(folder)` names the newest)."""
    sweep_dir = Path(sweep_dir)
    if not is_sweep_folder(sweep_dir):
        below = [p.name for p in sweep_folders(sweep_dir)] if sweep_dir.is_dir() else []
        raise ValueError(f"{sweep_dir} is not a sweep folder (no rounds/ or trials.parquet); "
                         + (f"sweeps in it: {', '.join(below)}; the newest is latest_sweep({str(sweep_dir)!r})"
                            if below else "no sweep below it either"))
    if columns is not None:
        columns = list(dict.fromkeys([*SORT_KEYS, *columns]))
    rounds = read_rounds(sweep_dir, columns)
    trials_file = sweep_dir / "trials.parquet"
    if rounds.empty or not trials_file.exists():
        return rounds
    trials = read_files([trials_file], ["config_hash", "status", "wall_seconds"])
    trials = trials.drop_duplicates("config_hash", keep="last").set_index("config_hash")
    for column in trials.columns:
        rounds[column] = rounds["config_hash"].map(trials[column])
    return rounds


def trials_from_rounds(rounds: pd.DataFrame, status: str = "INCOMPLETE") -> pd.DataFrame:
    """Trial rows (`fl_core.results.trial_row`) rebuilt from the round rows of a sweep without
    trials.parquet (one that has not finished); each keeps the hash and version its rows carry."""
    rows = []
    for _, group in rounds.groupby("config_hash", sort=True):
        first = group.iloc[0]
        kept = {k: first[k] for k in ("config_hash", "version", "sweep") if k in group}
        rows.append(trial_row(config_from_row(first), group, status=status) | kept)
    return pd.DataFrame(rows)


def rejudged(trials: pd.DataFrame, rounds: pd.DataFrame, chance: float | None = None) -> pd.DataFrame:
    """`trials` with `diverged` and `diverged_why` judged again from each trial's round rows by the
    current rule (`fl_core.results.divergence`), for sweeps written under an earlier one. `chance`
    (1 / number of classes) is a row's own `chance` where it has one, else this argument; a row
    with neither is judged on its losses alone, and a row without round rows keeps its verdict."""
    out = trials.copy()
    if "diverged" not in out:
        out["diverged"], out["diverged_why"] = False, ""
    out["diverged"] = out["diverged"].astype(object)
    out["diverged_why"] = out["diverged_why"].astype(object)
    groups = dict(tuple(rounds.groupby("config_hash", sort=False))) if len(rounds) else {}
    for index, row in out.iterrows():
        group = groups.get(row["config_hash"])
        if group is None:
            continue
        own = row.get("chance")
        why = divergence(group, summarize_trial(group), chance if own is None or pd.isna(own) else float(own))
        out.at[index, "diverged"], out.at[index, "diverged_why"] = bool(why), why
    out["diverged"] = out["diverged"].astype(bool)
    return out
