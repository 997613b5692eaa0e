"""A sweep's folder and its saved flags (`sweep.json`), for starting and for `--resume`.

Kept apart from `sweeps.study` (flags, trials) and `sweeps.launch` (Ray) so that both can use it
without importing each other.
"""
from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

from fl_core.result_files import recorded_study as saved_study  # the study a sweep.json records (or None)
from fl_core.result_files import sweep_folders

from .errors import SweepError
from .spec import STUDIES

# sweep.json format: 2 = Tune configs are validated flat configs (engine v2); 3 = the results
# semantics of fl_core.config.RESULTS_REVISION 3; 4 = the study is a file (study.toml beside
# sweep.json) and selection runs in stages (sweeps/stages.py). A sweep of an older format is not
# resumed (its plan cannot be rebuilt, or would mix two semantics under one hash).
SWEEP_FORMAT = 4
# Flags that may change when a sweep is resumed (where and how it runs, not what it computes).
RESUME_OVERRIDES = ("address", "cpus_per_trial", "gpus_per_trial", "gpu_sharing", "max_failures", "resume", "name",
                    "results", "max_concurrent", "verbose")


def sweep_folder(study: str, args: argparse.Namespace) -> Path:
    """`<results>/<name>`: a new folder, or on --resume the named sweep (`--resume NAME` or
    `--name NAME --resume`) or the latest sweep of `study`, whatever its name."""
    results = args.results.resolve()
    if args.resume:
        name = resume_name(args)
        if name is None:
            return latest_resumable(study, results)
        folder = results / name
        if not (folder / "sweep.json").exists():
            mine = [p.name for p in study_sweeps(study, results)]
            raise SweepError(f"--resume {name}: no sweep {name!r} in {results}"
                             + (f" (sweeps of {study} there: {', '.join(mine[-5:])})" if mine else ""))
        owner = saved_study(folder)
        if owner is not None and owner != study:
            raise SweepError(f"--resume {name}: {name!r} is a sweep of the {owner} study, not of {study}; "
                             f"resume it with {study_command(owner)} --resume {name}")
        return folder
    name = args.name or f"{study}-{time.strftime('%Y%m%d-%H%M%S')}"
    folder = results / name
    if (folder / "sweep.json").exists():
        raise SweepError(f"sweep {name!r} already exists in {results}; use --resume to continue it or another --name")
    return folder


def resume_name(args: argparse.Namespace) -> str | None:
    """The sweep --resume asks for: `--resume NAME`, else `--name`, else None (the latest)."""
    given = args.resume if isinstance(args.resume, str) else None
    if given and args.name and given != args.name:
        raise SweepError(f"--resume {given} and --name {args.name} name two sweeps; give the name once")
    return given or args.name


def study_command(study: str) -> str:
    """The command that runs the study named `study`: by its name when studies/ holds its file."""
    return f"python -m sweeps.run {study if (STUDIES / f'{study}.toml').exists() else 'STUDY_FILE.toml'}"


def study_sweeps(study: str, results: Path) -> list[Path]:
    """The sweep folders of `study` under `results` that can be resumed (they have sweep.json),
    oldest first (`fl_core.result_files.sweep_folders`: by when sweep.json was last written, at
    each start and resume). Sweeps that record no study (sweep format 3 before it was recorded)
    count if their name is `<study>-...`."""
    return [p for p in sweep_folders(results, study) if (p / "sweep.json").exists()]


def latest_resumable(study: str, results: Path) -> Path:
    """What `--resume` alone continues: the newest sweep of `study` under `results`."""
    found = study_sweeps(study, results)
    if not found:
        raise SweepError(f"--resume: no {study} sweep under {results}; start one, or give --results")
    return found[-1]


def save_args(folder: Path, args: argparse.Namespace, study: str | None = None, spec_text: str | None = None) -> None:
    """sweep.json (the run flags, the study's name, the format) and, when given, study.toml (the
    resolved study spec), each replaced atomically: a killed driver leaves the old file or the new."""
    folder.mkdir(parents=True, exist_ok=True)
    if spec_text is not None:
        atomic_write(folder / "study.toml", spec_text)
    saved = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()}
    recorded = {"sweep_format": SWEEP_FORMAT} | ({"study": study} if study else {})
    atomic_write(folder / "sweep.json", json.dumps(saved | recorded, indent=1))


def atomic_write(path: Path, text: str) -> None:
    """Replace `path` with `text` so that a killed writer leaves the old file or the new, never half of one."""
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def load_args(folder: Path, current: argparse.Namespace, names: tuple[str, ...]) -> argparse.Namespace:
    """The run flags (`names`) the sweep was started with; the RESUME_OVERRIDES come from the
    `current` command line, and flags added since it was saved from `current` too."""
    saved = json.loads((folder / "sweep.json").read_text())
    found = saved.pop("sweep_format", None)
    saved.pop("study", None)
    if found != SWEEP_FORMAT or not (folder / "study.toml").exists():
        raise SweepError(f"--resume: {folder.name} was written by an older version (sweep format {found or 1}, now "
                         f"{SWEEP_FORMAT}) and cannot be resumed; start it again under another --name (its results "
                         f"stay readable by analysis)")
    values = {k: saved[k] if k in saved and k not in RESUME_OVERRIDES else getattr(current, k) for k in names}
    values["results"] = Path(values["results"])
    values["name"] = folder.name
    return argparse.Namespace(**values)
