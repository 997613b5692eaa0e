"""The trial ledger (sweeps/trials.py) remembers the trials of every stage a driver ran, so that a
trial a scheduler stopped in an earlier stage reads STOPPED, not INTERRUPTED, when a later stage is
interrupted (seen on a DisPFL sweep stopped during its third search stage)."""
from __future__ import annotations

from types import SimpleNamespace

from sweeps.trials import TrialLedger


def test_the_ledger_keeps_every_stage_it_has_seen():
    TrialLedger.seen = {}
    first = [SimpleNamespace(path=f"/s/tune-select-0/t{i}", status="TERMINATED", config={"i": i}) for i in range(2)]
    second = [SimpleNamespace(path="/s/tune-select-1/t0", status="RUNNING", config={"i": 9})]
    ledger = TrialLedger()
    ledger.on_step_end(0, first)
    ledger.on_step_end(0, second)       # the next stage's Tuner: the first stage's trials stay known
    assert TrialLedger.seen["/s/tune-select-0/t1"] == ("TERMINATED", {"i": 1})
    assert TrialLedger.seen["/s/tune-select-1/t0"][0] == "RUNNING" and len(TrialLedger.seen) == 3
    TrialLedger.seen = {}
