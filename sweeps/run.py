"""Start a study: the one command every study runs with (`fl-study` is the same).

    python -m sweeps.run fedselect_grid                      # studies/fedselect_grid.toml
    python -m sweeps.run fedl2p --preset fmnist --data-root ../shared/data
    python -m sweeps.run fedl2p_fmnist --data-root ../shared/data   # the same study, named by its file
    python -m sweeps.run baselines --help                    # the study's flags, its own ones included
    python -m sweeps.run my_study.toml --rounds 5 --seeds 0 --lr 0.05 0.1
    python -m sweeps.run fedl2p_fmnist --resume              # the latest sweep of that study

STUDY is a file (`*.toml`) or the name of one in studies/. `python sweeps/fedselect_grid.py`, the
main entry, is `python -m sweeps.run fedselect_grid`. A study with flags of its own (FedL2P's
--pretraining, the ablation's --variants) has a module beside this one, `sweeps/<stem>.py`, whose
`STUDY` declares them (`python sweeps/<stem>.py` is `python -m sweeps.run <stem>`). A study's
sibling files `studies/<stem>_<preset>.toml` are its presets (--preset), so `fedl2p_fmnist` is
`fedl2p --preset fmnist`.

`--help` (before any study) prints this and the studies, to stdout; with no study named at all,
the command prints one line of usage and one error to stderr and exits 2.
"""
from __future__ import annotations

import importlib
import sys
from pathlib import Path

USAGE = "usage: python -m sweeps.run STUDY [--FLAG VALUE ...]   (fl-study is the same command)"


def resolve(name: str):
    """(Study, arguments it implies) for a study file or a study name (see the module docstring)."""
    from fl_core.knobs import did_you_mean
    from sweeps.errors import SweepError
    from sweeps.spec import STUDIES
    from sweeps.study import Study, study_of_file

    if name.endswith(".toml") or "/" in name:
        return study_of_file(name), []
    if not (STUDIES / f"{name}.toml").exists():
        known = study_names()
        raise SweepError(f"no study {name!r}{did_you_mean(name, known)}: give a .toml file or one of the studies "
                         f"in {STUDIES}: {', '.join(known)}")
    parts = name.split("_")
    for cut in range(len(parts), 0, -1):  # the longest prefix with a module of its own
        stem = "_".join(parts[:cut])
        if (Path(__file__).parent / f"{stem}.py").exists():
            study = getattr(importlib.import_module(f"sweeps.{stem}"), "STUDY", None)
            if isinstance(study, Study):
                return study, ([] if stem == name else ["--preset", name.removeprefix(f"{stem}_")])
    return Study(STUDIES / f"{name}.toml", f"-m sweeps.run {name}"), []


def study_named(name: str):
    """The Study `python -m sweeps.run NAME` starts, without the preset a sibling file's name implies."""
    return resolve(name)[0]


def study_names() -> list[str]:
    """The names `python -m sweeps.run` takes: the study files in studies/, by their stem."""
    from sweeps.spec import STUDIES

    return sorted(p.stem for p in STUDIES.glob("*.toml"))


def overview(width: int = 118) -> str:
    """What `python -m sweeps.run --help` prints: the usage, this module's docstring and one line
    per study (its description's first sentence, or the study and preset it starts)."""
    from fl_core.knobs import shorten
    from sweeps.errors import SweepError
    from sweeps.spec import STUDIES, load_spec

    lines = [USAGE, "", __doc__.strip(), "", f"studies ({STUDIES}; STUDY --help: a study's flags):"]
    for name in study_names():
        try:
            study, implied = resolve(name)
            about = load_spec(STUDIES / f"{name}.toml").description.split("\n")[0]
            text = (f"({study.spec.stem} {' '.join(implied)}) " if implied else "") + about
        except SweepError as err:  # one bad file does not hide the others
            text = f"cannot be read: {err}"
        head = f"  {name:<24} "
        lines.append(head + shorten(text, width - len(head)))
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    """The command (`python -m sweeps.run`, or `fl-study`); `argv` given: called from Python, where
    torch may be loaded already (the kernels are then as the process has them)."""
    return start(sys.argv[1:]) if argv is None else run(argv)


def start(argv: list[str]) -> int:
    """A process's first call: a signal from here until the sweep starts is one line and its exit
    status, and the reproducible mode's pins go into the environment before torch loads."""
    from sweeps.interrupts import while_starting
    while_starting()
    from fl_core.kernels import pin_from_argv
    pin_from_argv(argv)  # fl_core/kernels.py
    return run(argv)


def run(argv: list[str]) -> int:
    """Resolve the study (argv[0]) and run it with the rest of `argv` as its flags."""
    from sweeps.errors import SweepError
    from sweeps.study import run_study

    if argv and argv[0] in ("-h", "--help"):
        if len(argv) == 1:
            sys.stdout.write(overview())
            return 0
        argv = [argv[1], "--help", *argv[2:]]  # `--help STUDY [METHOD|all]`: that study's help
    if not argv or argv[0].startswith("-"):
        print(f"{USAGE}\nerror: name the study first (e.g. fedselect_grid or studies/x.toml); "
              "`python -m sweeps.run --help` lists the studies", file=sys.stderr)
        return 2
    try:
        study, implied = resolve(argv[0])
        study.name  # reads the file: a missing or bad one is one error here
    except SweepError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    return run_study(study, implied + argv[1:])


if __name__ == "__main__":
    sys.exit(main())
