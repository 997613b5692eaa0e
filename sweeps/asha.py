"""ASHA whose rungs survive a stopped driver, so that `--resume` stops the trials an uninterrupted
sweep stops.

Tune pickles a stage's scheduler once, when the experiment is created (tuner.pkl), and
`Tuner.restore` unpickles that copy: Ray 2.60's ASHA then starts its rungs empty, and a resumed
select stage compares its trials against nobody (every trial recorded before the interrupt is
forgotten; the first ones after it always continue). `ResumableASHA` writes its rungs, the
metric value of each trial at each milestone, to a JSON file after every decision (atomically)
and reads them back when it is unpickled. It also remembers the last round it acted on per trial
and lets a round it has already judged pass (a trial resumed from a state older than its last
report repeats that report; Ray's ASHA would record the repeat in a lower rung). The trials save
their state only after the driver has acted on a report (sweeps/trainable.py), so no report is
lost either. The resumed stage then makes the decisions an uninterrupted one makes on the same
sequence of results. That sequence is Tune's to choose: with several trials at once it depends on
timing, and even with one at a time (`--max-concurrent 1`) Tune does not promise the start order
(in one test run a fresh stage started its three trials in reverse order), interrupted or not.

Where the record lives (`rungs_path`): `<stage>/asha/rungs.json`, in a folder of its own inside
the stage's Tune experiment folder, never beside Tune's files. A restored Tune copies every
`.json` and `.pkl` file at the top of the experiment folder into its staging folder and, at every
snapshot of its experiment state, copies that folder back over the experiment folder; a record
kept there (the first version's `<stage>/asha_rungs.json`) was replaced by its copy from the
moment of the interrupt, so every decision of the resumed stage was lost from it (a second
interrupt then restored the stale rungs). A sweep started with that name moves to the new one
when its scheduler is restored. The record goes with the stage's Tune folder when that folder is
set aside (sweeps/launch.py), so a stage started again never reads rungs of trial ids it does
not have.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

from ray.tune.schedulers import ASHAScheduler

LEGACY_NAME = "asha_rungs.json"  # the first version's record, beside Tune's files (see the module docstring)


def rungs_path(tune_dir: str | Path) -> Path:
    """Where the ASHA of the stage whose Tune experiment is `tune_dir` keeps its rungs."""
    return Path(tune_dir) / "asha" / "rungs.json"


class ResumableASHA(ASHAScheduler):
    def __init__(self, rungs_file: str | Path, **kwargs) -> None:
        super().__init__(**kwargs)
        self.rungs_file = str(rungs_file)
        self.judged: dict[str, int] = {}  # trial id -> the last round acted on

    def on_trial_result(self, tune_controller, trial, result: dict) -> str:
        rnd = result.get(self._time_attr)
        if rnd is not None and rnd <= self.judged.get(trial.trial_id, 0):
            return self.CONTINUE  # a repeated report: decided when it first came
        action = super().on_trial_result(tune_controller, trial, result)
        if rnd is not None:
            self.judged[trial.trial_id] = rnd
        self.save_rungs()
        return action

    def on_trial_complete(self, tune_controller, trial, result: dict) -> None:
        rnd = (result or {}).get(self._time_attr)
        if rnd is not None and rnd <= self.judged.get(trial.trial_id, 0):
            self._trial_info.pop(trial.trial_id, None)  # judged already: only forget the trial, as Ray does
        else:
            super().on_trial_complete(tune_controller, trial, result)
            if rnd is not None:
                self.judged[trial.trial_id] = rnd
        self.save_rungs()

    def rungs(self) -> list[list[list]]:
        """Per bracket, per rung: [milestone, {trial id: metric value (signed for max/min)}]."""
        return [[[milestone, dict(recorded)] for milestone, recorded in bracket._rungs] for bracket in self._brackets]

    def save_rungs(self) -> None:
        path = Path(self.rungs_file)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.tmp")
        tmp.write_text(json.dumps({"rungs": self.rungs(), "num_stopped": self._num_stopped, "judged": self.judged}))
        os.replace(tmp, path)

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        path = Path(self.rungs_file)
        if path.name == LEGACY_NAME:  # a sweep started before the record had a folder of its own
            self.rungs_file = str(rungs_path(path.parent))
            if Path(self.rungs_file).exists():
                path = Path(self.rungs_file)
        if not path.exists():
            return
        saved = json.loads(path.read_text())
        for bracket, rungs in zip(self._brackets, saved["rungs"]):
            for (milestone, recorded), (saved_milestone, values) in zip(bracket._rungs, rungs):
                if milestone == saved_milestone:
                    recorded.clear()
                    recorded.update(values)
        self._num_stopped = saved["num_stopped"]
        self.judged = dict(saved.get("judged", {}))
