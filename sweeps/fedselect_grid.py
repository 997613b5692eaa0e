"""FedSelect grid: personalization rate p x personalization limit α x Dirichlet α x local epochs,
plus FedAvg and Local anchors on the same data settings. Each federated run is one Ray Tune trial.
The study is the file studies/fedselect_grid.toml (studies/fedselect_grid_paper.toml with --preset
paper, studies/fedselect_grid_fmnist.toml with --preset fmnist); this script, the project's main
entry, runs it with flags over it: it is `python -m sweeps.run fedselect_grid`, the command every
study starts with.

    python sweeps/fedselect_grid.py                       # default study: digits, 96 trials, ~6 min on 2 cores
    python sweeps/fedselect_grid.py --pers-rate 0.1 0.25 0.5 --seeds 0 1 2
    python sweeps/fedselect_grid.py --dry-run             # the trials, without running them
    python sweeps/fedselect_grid.py --preset paper --gpus-per-trial 0.25
    python sweeps/fedselect_grid.py --preset fmnist --data-root ../shared/data   # Fashion-MNIST, 5 seeds
    python sweeps/fedselect_grid.py --resume              # continue the latest interrupted sweep
"""
from __future__ import annotations

import sys

if __name__ == "__main__":  # the main entry is `python -m sweeps.run fedselect_grid` by its file
    from sweeps.run import start
    sys.exit(start(["fedselect_grid", *sys.argv[1:]]))

# imported by tests and tools (the entry point above pins the kernels before torch loads, so it goes first)
from sweeps.spec import STUDIES  # noqa: E402
from sweeps.study import Study  # noqa: E402

# --preset paper / fmnist: the sibling files fedselect_grid_paper.toml / fedselect_grid_fmnist.toml
STUDY = Study(STUDIES / "fedselect_grid.toml", "sweeps/fedselect_grid.py")
