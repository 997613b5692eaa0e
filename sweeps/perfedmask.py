"""PerFedMask study: PerFedMask (device-aware frozen layer groups from the mask problem P^mask, a
frozen random head, fine-tuning after training) against FedBABU, FedProx, FedNova, HeteroFL and
FedAvg+FT, every method fine-tuned alike, at c = 1 and c = 0.1 of the devices per round, plus
PerFedMask's ν ablation (the share of devices able to train the whole model), 3 seeds. The study
is studies/perfedmask.toml; this script runs it with flags over it (`python sweeps/run.py
studies/perfedmask.toml` is the same).

    python sweeps/perfedmask.py --data-root ../shared/data        # MNIST, 51 runs (the README's table)
    python sweeps/perfedmask.py --dataset digits                  # offline without MNIST files
    python sweeps/perfedmask.py --data-root ../shared/data --slim-ratios 8-4-2-1 --mask-solver exact
    python sweeps/perfedmask.py --data-root ../shared/data --algorithms perfedmask --anchors fedbabu \\
        --full-share 0.2 0.6 1.0 --participation 1.0                # the ν ablation alone

Outputs as every study, plus tables/cost.tex: per method, accuracy before and after fine-tuning at
each c, trainable parameters and forward/backward FLOPs per training sample, mean over devices
(the poster's three tables in one; analysis/cost.py).
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

STUDY = Study(STUDIES / "perfedmask.toml", "sweeps/perfedmask.py")

if __name__ == "__main__":
    sys.exit(run_study(STUDY))
