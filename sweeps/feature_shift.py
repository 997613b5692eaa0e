"""Feature-shift study: FedSelect, FedAvg, Local, FedAvg+FT, FedBN, FedRep, LG-FedAvg and Ditto on
`mnist_c` (real MNIST under four corruptions, one domain each) with one client per domain and
with Dir(0.5) clients inside each domain, 3 seeds. The study is studies/feature_shift.toml; this
script runs it with flags over it (`python sweeps/run.py studies/feature_shift.toml` is the same).

    python sweeps/feature_shift.py --data-root ../shared/data          # the README's table, ~10 min
    python sweeps/feature_shift.py --dataset digits_c                  # offline, no MNIST files needed
    python sweeps/feature_shift.py --data-root ../shared/data --corruptions clean,fog,snow --severity 5
    python sweeps/feature_shift.py --data-root ../shared/data --unseen-domains fog   # FedL2P's unseen domain

Outputs as every study: Parquet rounds and trials, MLflow runs, tables/methods.tex (final accuracy,
mean ± std over seeds, one column per data setting) and figures/accuracy_vs_round.png.
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

STUDY = Study(STUDIES / "feature_shift.toml", "sweeps/feature_shift.py")

if __name__ == "__main__":
    sys.exit(run_study(STUDY))
