"""DisPFL study: DisPFL (decentralized sparse PFL) swept over density x topology x regrowth, with
D-PSGD, FedAvg, FedSelect, Ditto and Local as anchors, on Dir(0.3) clients of equal size. The study is
studies/dispfl.toml; this script runs it with flags over it (`python sweeps/run.py
studies/dispfl.toml` is the same).

    python sweeps/dispfl.py                                     # digits, 39 runs
    python sweeps/dispfl.py --dataset mnist --data-root ../shared/data --samples-per-client 200 \\
        --density 0.5 --topology random --regrowth random --local-epochs 2 \\
        --algorithms dispfl --anchors dpsgd fedavg fedselect local          # the README's MNIST table
    python sweeps/dispfl.py --num-neighbours 2 5 10 --anneal-factor 0.3 0.5 --static-masks false true

Outputs as every study, plus tables/traffic.tex (final accuracy and busiest-node MB per method:
the server for FedAvg and FedSelect, the most loaded client for DisPFL and D-PSGD),
figures/accuracy_vs_busiest_traffic.png and figures/mask_hamming.png (client label similarity
next to the distance between the learned masks, the DisPFL paper's Fig. 6).
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

STUDY = Study(STUDIES / "dispfl.toml", "sweeps/dispfl.py")

if __name__ == "__main__":
    sys.exit(run_study(STUDY))
