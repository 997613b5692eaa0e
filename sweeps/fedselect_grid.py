"""FedSelect grid: personalization rate p x personalization limit α x Dirichlet α x local epochs,
plus FedAvg and Local anchors on the same data settings. Each federated run is one Ray Tune trial.
The study is the file studies/fedselect_grid.toml (studies/fedselect_grid_paper.toml with --preset
paper, studies/fedselect_grid_fmnist.toml with --preset fmnist); this script runs it with flags over
it, like `python sweeps/run.py STUDY.toml`.

    python sweeps/fedselect_grid.py                       # default study: digits, 96 trials, ~6 min on 2 cores
    python sweeps/fedselect_grid.py --pers-rate 0.1 0.25 0.5 --seeds 0 1 2
    python sweeps/fedselect_grid.py --dry-run             # the trials, without running them
    python sweeps/fedselect_grid.py --preset paper --gpus-per-trial 0.25
    python sweeps/fedselect_grid.py --preset fmnist --data-root ../shared/data   # Fashion-MNIST, 5 seeds
    python sweeps/fedselect_grid.py --resume              # continue the latest interrupted sweep
"""
from __future__ import annotations

import sys
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make the repository importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
if __name__ == "__main__":  # a signal from here until the sweep starts: one line, its exit status
    from sweeps.interrupts import while_starting
    while_starting()
    from fl_core.kernels import pin_from_argv
    pin_from_argv(sys.argv[1:])  # the reproducible mode, before torch loads (fl_core/kernels.py)

from sweeps.spec import STUDIES  # noqa: E402
from sweeps.study import Study, run_study  # noqa: E402

# --preset paper / fmnist: the sibling files fedselect_grid_paper.toml / fedselect_grid_fmnist.toml
STUDY = Study(STUDIES / "fedselect_grid.toml", "sweeps/fedselect_grid.py")

if __name__ == "__main__":
    sys.exit(run_study(STUDY))
