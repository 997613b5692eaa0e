"""A stage's Tune record (its folder under the sweep): restored when a sweep resumes, or started
again when Tune saved no trial in it (sweeps/launch.py decides which)."""
from __future__ import annotations

import json
import logging
import shutil
import time
from pathlib import Path

from . import damage


def restore_quietly(tune_dir: Path, trainable):
    """`tune.Tuner.restore` of a stage's experiment without Tune's warning per unstarted trial.

    Restoring reads every trial's metrics; trials that never started have none, and Tune warns
    once per such trial (57 lines for a sweep stopped early). They are expected here: the resumed
    sweep runs them, and its progress table counts them. Errors still show."""
    from ray import tune

    quiet = logging.getLogger("ray.tune.analysis.experiment_analysis")
    level = quiet.level
    quiet.setLevel(logging.ERROR)
    try:
        return tune.Tuner.restore(str(tune_dir), trainable=trainable, resume_errored=True)
    finally:
        quiet.setLevel(level)


def names_a_trial(tune_dir: Path) -> bool:
    """Whether Tune's record of a stage (its newest experiment state, the one a restore reads) names
    at least one trial. It names none when the sweep stopped after the stage's Tuner was created
    (tuner.pkl) and before Tune saved a trial: a Ctrl-C in the stage's first moments (no state, or
    a state of no trial), a kill before Tune's first snapshot. Ray 2.60 cannot restore such a record:
    the restore fails (no state file; `trials[0]` of no trials) and Tune starts the experiment again
    without its param space, with trials of an empty config; so the stage starts again instead."""
    states = sorted(tune_dir.glob("experiment_state-*.json"))  # Tune restores the newest (the last name)
    return bool(states) and bool(json.loads(states[-1].read_text()).get("trial_data"))


def start_again(folder: Path, tune_dir: Path) -> None:
    """Clear Tune's record of a stage that names no trial (`names_a_trial`), so that the stage starts
    as new: Tune's files, and its ASHA's record of trials that are not in it (sweeps/asha.py). A
    folder of bookkeeping only is removed; one that holds trial folders (Tune wrote them, then was
    killed before it saved them in its state) is set aside under damaged/, as a damaged record is.
    The trials' rows and states are elsewhere: a trial that ran reports again from its saved state."""
    name = tune_dir.name
    if any(p.is_dir() and p.name != "asha" for p in tune_dir.iterdir()):
        aside = damage.move_aside(folder, [tune_dir], time.strftime("%Y%m%d-%H%M%S"))
        where = f"; its Tune folder is set aside under {aside.relative_to(folder)}/"
    else:
        shutil.rmtree(tune_dir)
        where = ""
    print(f"[sweep] {name}: Tune's record names no trial (the sweep stopped before Tune saved one){where}; "
          f"the stage starts again", flush=True)
