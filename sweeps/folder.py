"""A sweep's folder and its saved flags (`sweep.json`), for starting and for `--resume`.

Kept apart from `sweeps.study` (flags, trials) and `sweeps.launch` (Ray) so that both can use it
without importing each other.
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from .errors import SweepError

# Flags that may change when a sweep is resumed (where and how it runs, not what it computes).
# sweep.json format: 2 = Tune configs are validated flat configs (engine v2); 3 = the results
# semantics of fl_core.config.RESULTS_REVISION 3 (papers' Dirichlet, test sets under caps, method
# protocols): a sweep of an older format would mix two semantics under one hash, so it is not resumed.
SWEEP_FORMAT = 3
RESUME_OVERRIDES = ("address", "cpus_per_trial", "gpus_per_trial", "max_failures", "resume", "name", "results",
                    "max_concurrent", "verbose")


def sweep_folder(study: str, args: argparse.Namespace) -> Path:
    """`<results>/<name>`: a new folder, or on --resume the named (or latest) sweep of `study`."""
    results = args.results.resolve()
    if args.resume:
        if args.name:
            folder = results / args.name
        else:
            found = sorted(results.glob(f"{study}-*/sweep.json"), key=lambda p: p.stat().st_mtime)
            if not found:
                raise SweepError(f"--resume: no {study} sweep under {results}")
            folder = found[-1].parent
        if not (folder / "sweep.json").exists():
            raise SweepError(f"--resume: {folder} holds no sweep (no sweep.json)")
        return folder
    name = args.name or f"{study}-{time.strftime('%Y%m%d-%H%M%S')}"
    folder = results / name
    if (folder / "sweep.json").exists():
        raise SweepError(f"sweep {name!r} already exists in {results}; use --resume to continue it or another --name")
    return folder


def save_args(folder: Path, args: argparse.Namespace) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    saved = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()}
    (folder / "sweep.json").write_text(json.dumps(saved | {"sweep_format": SWEEP_FORMAT}, indent=1))


def load_args(folder: Path, current: argparse.Namespace, defaults: argparse.Namespace) -> argparse.Namespace:
    """The flags the sweep was started with (over the parser's `defaults`, for flags added since);
    the RESUME_OVERRIDES come from the `current` command line."""
    saved = vars(defaults) | json.loads((folder / "sweep.json").read_text())
    found = saved.pop("sweep_format", None)
    if found != SWEEP_FORMAT:
        raise SweepError(f"--resume: {folder.name} was written by an older version (sweep format {found or 1}, now "
                         f"{SWEEP_FORMAT}) whose results differ for the same knobs, and cannot be resumed; start it "
                         f"again under another --name (its results stay readable by analysis)")
    for key in RESUME_OVERRIDES:
        saved[key] = getattr(current, key)
    saved["results"] = Path(saved["results"])
    saved["name"] = folder.name
    return argparse.Namespace(**saved)
