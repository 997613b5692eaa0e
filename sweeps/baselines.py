"""Baselines study (the FedSelect paper's Table 1): every method x datasets x partitions x seeds.
The study is the file studies/baselines.toml; this script runs it with flags over it (same flags,
resources, sinks and resume as every study; `python sweeps/run.py studies/baselines.toml` is the same).

    python sweeps/baselines.py                          # digits; 2 shards per client and Dir(0.1)
    python sweeps/baselines.py --dataset digits mnist --data-root ../shared/data --seeds 0 1 2
    python sweeps/baselines.py --algorithms fedselect fedrep ditto --partition dirichlet --dir-alpha 0.1 0.5
    python sweeps/baselines.py --preset pfl --data-root ../shared/data   # Per-FedAvg ... MOON, Fashion-MNIST Dir(0.3)
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

STUDY = Study(STUDIES / "baselines.toml", "sweeps/baselines.py")

if __name__ == "__main__":
    sys.exit(run_study(STUDY))
