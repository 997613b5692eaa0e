"""Damaged result files: found before they are trusted, set aside, and their trials run again.

Every file a sweep writes is written atomically (a temp file, then a rename), so a killed process
never leaves half a file. A file can still be damaged from outside: a copy or a sync cut short, a
disk that filled up under another program, a machine that crashed before its page cache reached
the disk. Readers never trust such a file silently:

  - analysis (`sweeps.parquet_sink.read_files`) stops with `DamagedFile`: one line naming the file
    and what to do, exit status 2 from every `python -m analysis...` command;
  - `--resume` checks the sweep's files first (`set_aside`): every Parquet file is read whole, a
    trial state or a stage checkpoint must open as the zip archive torch writes. A damaged file and
    every other file of its trial move to `damaged/<time>/` in the sweep (kept, never deleted), the
    sweep prints one line per file, and the trial runs again from its first round;
  - a trial whose state opens but cannot be restored sets its files aside itself and starts over
    (`sweeps.trainable.run_trial`);
  - a trial that Tune counts as finished but whose rows are no longer all on disk (set aside, or
    deleted by hand) runs again, to the round Tune last saw it report (`behind`), in a repair
    experiment of its stage (`repair_stage`: `<stage>-repair-<time>`);
  - Tune's own record of a stage (`tune-<stage>/`) that cannot be restored is set aside and the
    stage starts again: its finished trials find their final state and only report it again.
Runs are deterministic per config hash, so the trial's rows come back identical.
"""
from __future__ import annotations

import json
import os
import time
import zipfile
from dataclasses import dataclass
from pathlib import Path

from .parquet_sink import round_sources, unreadable
from .plan import run_config
from .stages import Stage

TRIAL_FOLDERS = ("rounds", "clients", "masks", "state", "checkpoints")  # files named <config_hash>...


@dataclass(frozen=True)
class Damaged:
    path: Path          # where it was
    reason: str
    config_hash: str | None  # the trial it belongs to (None: trials.parquet)


def unreadable_state(path: Path) -> str | None:
    """Why a trial state or model checkpoint (torch.save's zip archive) cannot be opened, or None.
    Opening reads the archive's directory at its end: a file cut short fails here; damage inside
    is found when the trial restores it."""
    try:
        with zipfile.ZipFile(path) as archive:
            if not archive.namelist():
                return "an empty archive"
    except (zipfile.BadZipFile, OSError, ValueError) as err:
        return f"not a readable torch file ({str(err)[:120]})"
    return None


def unreadable_tune_record(tune_dir: Path) -> str | None:
    """Why Tune cannot restore the stage experiment in `tune_dir` from its files (the newest
    experiment_state JSON, which it reads on `fit`, and tuner.pkl), or None."""
    import pickle

    states = sorted(tune_dir.glob("experiment_state-*.json"))
    try:
        if states:
            json.loads(states[-1].read_text())
        pickle.loads((tune_dir / "tuner.pkl").read_bytes())
    except FileNotFoundError:
        return None  # nothing to restore from: Tune itself says so (can_restore)
    except Exception as err:  # noqa: BLE001 - JSON, pickle and the classes unpickled raise many types
        return f"{type(err).__name__}: {str(err)[:120]}"
    return None


def owner(path: Path) -> str:
    """The config hash a trial file is named by (`<hash>.parquet`, `<hash>-r0003.parquet`, `<hash>.pt`)."""
    return path.name.split(".")[0].split("-r")[0]


def scan(folder: Path) -> list[Damaged]:
    """Every damaged result file of the sweep in `folder`."""
    found = []
    trials = folder / "trials.parquet"
    if trials.exists() and (why := unreadable(trials)):
        found.append(Damaged(trials, why, None))
    for sub in TRIAL_FOLDERS:
        for path in sorted((folder / sub).glob("[!.]*")):
            if path.suffix == ".parquet":
                why = unreadable(path)
            elif path.suffix == ".pt":
                why = unreadable_state(path)
            else:
                continue
            if why:
                found.append(Damaged(path, why, owner(path)))
    return found


def trial_files(folder: Path, config_hash: str) -> list[Path]:
    """Every file the trial `config_hash` wrote in the sweep (rows, journal, data, masks, state, model)."""
    return [p for sub in TRIAL_FOLDERS for p in sorted((folder / sub).glob(f"{config_hash}*"))
            if owner(p) == config_hash]


def move_aside(folder: Path, paths: list[Path], stamp: str) -> Path:
    """Move `paths` (inside the sweep `folder`) under `damaged/<stamp>/`, keeping their sub-folders."""
    target = folder / "damaged" / stamp
    for path in paths:
        dest = target / path.relative_to(folder)
        dest.parent.mkdir(parents=True, exist_ok=True)
        os.replace(path, dest)
    return target


def set_aside(folder: Path, say=print) -> list[Damaged]:
    """`--resume`'s check: damaged files, and every file of their trials, moved under damaged/ so that
    those trials run again; one line each through `say`. Returns what was damaged."""
    found = scan(folder)
    if not found:
        return []
    stamp = time.strftime("%Y%m%d-%H%M%S")
    for damaged in found:
        say(f"[sweep] damaged: {damaged.path.relative_to(folder)} ({damaged.reason}); set aside under "
            f"damaged/{stamp}/" + ("; trials.parquet is written again at the end" if damaged.config_hash is None
                                   else f"; trial {damaged.config_hash} runs again"))
    hashes = {d.config_hash for d in found if d.config_hash}
    paths = {d.path for d in found if d.config_hash is None}
    paths |= {p for key in hashes for p in trial_files(folder, key)}
    move_aside(folder, sorted(paths), stamp)
    return found


def rounds_on_disk(folder: Path) -> dict[str, int]:
    """config hash -> the rounds its rows hold (a compacted file: all of them; else the journal's
    rounds 1..n without a gap)."""
    out = {}
    for key, files in round_sources(folder).items():
        if len(files) == 1 and "-r" not in files[0].name:
            out[key] = -1  # compacted: every round (the caller knows how many)
            continue
        rounds = sorted(int(f.stem.rsplit("-r", 1)[1]) for f in files)
        out[key] = next((i for i, r in enumerate(rounds, 1) if r != i), len(rounds) + 1) - 1
    return out


def behind(folder: Path, reported: list[tuple[str, int, int]]) -> dict[str, int]:
    """Of the trials Tune counts as ended without an error, as (config hash, last round reported,
    rounds configured), those whose rows on disk stop before that round: hash -> the round to
    run them to again."""
    disk = rounds_on_disk(folder)
    out = {}
    for key, last, rounds in reported:
        have = disk.get(key, 0)
        have = rounds if have == -1 else have
        if last > have:
            out[key] = last
    return out


def repair_stage(folder: Path, stage: Stage, grid) -> Stage | None:
    """The trials of a stage that Tune counts as ended without an error but whose rows on disk
    stop before the round it last saw them report (their files were damaged and set aside, or
    deleted): a stage that runs them again, each to that round, from round 1."""
    reported = {}
    for result in grid:
        if result.error is None and result.config and (result.metrics or {}).get("round"):
            run = run_config(result.config)
            reported[run.config_hash()] = (run, int(result.metrics["round"]), _kind_of(result.config))
    late = behind(folder, [(key, last, run.rounds) for key, (run, last, _) in reported.items()])
    if not late:
        return None
    stamp = time.strftime("%Y%m%d-%H%M%S")
    for key in late:  # what is left of them (a state without its rows) is set aside: they start over
        leftover = trial_files(folder, key)
        if leftover:
            move_aside(folder, leftover, stamp)
    print(f"[sweep] {stage.name}: {len(late)} trial(s) ended but their rows are not all on disk "
          f"({', '.join(sorted(late))}); running them again", flush=True)
    return Stage(name=f"{stage.name}-repair-{stamp}", kind="repair",
                 configs=tuple((reported[key][2], reported[key][0]) for key in sorted(late)),
                 stop_after={key: late[key] for key in sorted(late)})


def _kind_of(config: dict) -> str:
    return config.get("trial", config).get("stage") or "grid"
