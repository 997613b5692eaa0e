"""Run any study file (sweeps/spec.py; the project's are in studies/), with flags over it.

    python sweeps/run.py studies/fedselect_asha.toml
    python sweeps/run.py studies/fedselect_optuna.toml --dry-run
    python sweeps/run.py my_study.toml --rounds 5 --seeds 0 --lr 0.05 0.1
    python sweeps/run.py my_study.toml --resume            # the latest sweep of that study
"""
from __future__ import annotations

import sys
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make the repository importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main(argv: list[str] | None = None) -> int:
    """The command (`python sweeps/run.py`, or `fl-study`); `argv` given: called from Python."""
    if argv is None:  # a signal from here until the sweep starts: one line, its exit status
        from sweeps.interrupts import while_starting
        while_starting()
        from fl_core.kernels import pin_from_argv
        pin_from_argv(sys.argv[1:])  # the reproducible mode, before torch loads (fl_core/kernels.py)
    from sweeps.errors import SweepError
    from sweeps.study import run_study, study_of_file

    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0].startswith("-"):
        print(__doc__.strip() + "\n\nerror: give the study file first (e.g. studies/fedselect_grid.toml); "
              "`python sweeps/run.py STUDY.toml --help` lists its flags", file=sys.stderr)
        return 2
    try:
        study = study_of_file(argv[0])
        study.name  # reads the file: a missing or bad one is one error here
    except SweepError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    return run_study(study, argv[1:])


if __name__ == "__main__":
    sys.exit(main())
