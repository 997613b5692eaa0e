"""trials.parquet: one row per trial of a sweep, whatever state the sweep ended in.

A row is `fl_core.results.trial_row` (config columns, the final summary from the trial's
Parquet rows) with its status, wall time and provenance. Statuses:
  COMPLETED     ran all its rounds
  STOPPED       stopped early by the scheduler (ASHA)
  ERROR         failed (after its retries)
  INTERRUPTED   the sweep was stopped (Ctrl-C, SIGTERM) while it ran; `--resume` continues it
  NOT_STARTED   the sweep was stopped before it started (for a grid: every planned trial that
                Tune had not even created yet is listed, from the plan)

Each row also says which stage of the sweep the trial belongs to (`stage`: pretrain, grid, anchor, select,
confirm; sweeps/stages.py), the metric its stage selects on (`objective`), and for select trials
whether it won its stage (`selected`).

Where the status comes from: Tune's trial objects as they were at the last step of the tuning
loop (`TrialLedger`, a Tune callback), because Tune marks the trials it was running TERMINATED
when it stops them on an interrupt, like the ones a scheduler stopped. A Tune trial that never
reported has no config in its `Result` (that is None), so its config is taken from the ledger or
the plan. Without Tune (an interrupt before `fit`), the status comes from the rows on disk.
"""
from __future__ import annotations

import math
from typing import Any

import pandas as pd
from ray import tune

from fl_core.results import trial_row, write_parquet

from . import parquet_sink
from .parquet_sink import read_trial
from .plan import SweepPlan, reached_last_round, run_config
from .stages import axis_knobs, group_name, objective_of

TRIAL_INFO = ("resumed_from_round", "started_at", "reported_at", "gpus_assigned", "threads", "device",
              "data_from_driver", "node_id", "kernels", "cpu_isa")
UNFINISHED = ("INTERRUPTED", "NOT_STARTED")


class TrialLedger(tune.Callback):
    """Remembers, at the end of every step of Tune's loop, each trial's status and config, for
    every stage the driver ran (each stage is a Tuner of its own: a stage's trials stay known when
    the next one runs, so a trial its scheduler stopped reads STOPPED even when a later stage is
    interrupted). Kept in a class attribute: on `Tuner.restore` Tune unpickles its own copy of the
    callback."""

    seen: dict[str, tuple[str, dict]] = {}

    def on_step_end(self, iteration: int, trials: list, **info) -> None:
        TrialLedger.seen.update({str(t.path): (t.status, t.config) for t in trials})


def trials_table(plan: SweepPlan, ran=(), interrupted: bool = False, selected: set[str] = frozenset()
                 ) -> tuple[pd.DataFrame, int]:
    """Every trial's row (see the module docstring), written atomically to trials.parquet; and the
    number of Parquet rows read (trial x round x client). `ran`: (stage, Tune ResultGrid) of each
    stage that ran; `selected`: config hashes of the select stages' winners (column `selected`).
    Trials known from neither Tune nor the plan (a search's samples when the sweep was stopped
    before Tune ran again) keep their row of the previous trials.parquet."""
    rows: dict[str, dict[str, Any]] = {}
    count: dict[str, int] = {}  # a trial run again (a repair stage) replaces its earlier row
    for _stage, grid in ran:
        for result in grid:
            status_then, config = TrialLedger.seen.get(str(result.path), (None, None))
            config = result.config or config
            if config is None:  # never reported and unknown to the ledger: the plan lists it below
                continue
            run = run_config(config)
            rounds = read_trial(plan.folder, run.config_hash())
            metrics = result.metrics or {}
            status = _tune_status(metrics, result.error, status_then, len(rounds), interrupted,
                                  reached_last_round(run, metrics))
            rows[run.config_hash()] = _row(plan, run, rounds, status, metrics, result.error, _stage_of(config))
            count[run.config_hash()] = len(rounds)
    planned = [(kind, run) for stage in plan.stages if not stage.searched for kind, run in stage.configs]
    for kind, run in planned:  # trials Tune had not created (or no Tune at all): from the plan and the disk
        if run.config_hash() not in rows:
            rounds = read_trial(plan.folder, run.config_hash())
            rows[run.config_hash()] = _row(plan, run, rounds, _disk_status(run, rounds), {}, None, kind)
            count[run.config_hash()] = len(rounds)
    order = dict.fromkeys(run.config_hash() for _, run in planned) | dict.fromkeys(rows)  # plan order first
    rows = {key: rows[key] for key in order}
    trials = pd.DataFrame(list(rows.values())) if rows else pd.DataFrame({"config_hash": [], "status": []})
    previous = plan.folder / "trials.parquet"
    if previous.exists() and parquet_sink.unreadable(previous) is None:  # damaged: set aside on --resume
        old = pd.read_parquet(previous)
        trials = pd.concat([trials, old[~old["config_hash"].isin(trials["config_hash"])]], ignore_index=True)
    if len(trials):
        trials["selected"] = trials["config_hash"].isin(selected) & (trials["stage"] == "select")
    write_parquet(trials, plan.folder / "trials.parquet")
    return trials, sum(count.values())


def _stage_of(config: dict) -> str | None:
    return config.get("trial", config).get("stage")


def _tune_status(metrics: dict, error, status_then: str | None, rows: int, interrupted: bool, last: bool) -> str:
    if error is not None:
        return "ERROR"
    if last:  # its final round (Tune's own `done` is also set for trials a scheduler stopped)
        return "COMPLETED"
    if not metrics:
        return "INTERRUPTED" if rows else "NOT_STARTED"  # rows: it ran before an earlier interrupt
    if status_then is None:  # no ledger (a sweep started by an older version): best guess
        return "INTERRUPTED" if interrupted else "STOPPED"
    return "STOPPED" if status_then == "TERMINATED" else "INTERRUPTED"


def _disk_status(run, rounds: pd.DataFrame) -> str:
    if rounds.empty:
        return "NOT_STARTED"
    return "COMPLETED" if int(rounds["round"].max()) >= run.rounds else "INTERRUPTED"


def _row(plan: SweepPlan, run, rounds: pd.DataFrame, status: str, metrics: dict, error, stage: str | None
         ) -> dict[str, Any]:
    info = {k: metrics.get(k) for k in TRIAL_INFO}
    wall = metrics.get("time_total_s")
    row = trial_row(run, rounds, report_round=plan.spec.report_round, chance=metrics.get("chance"),
                    sweep=plan.folder.name, trial_id=metrics.get("trial_id"), status=status,
                    wall_seconds=float(wall) if wall is not None else math.nan,
                    error=None if error is None else str(error)[:500], stage=stage or "grid",
                    objective=objective_of(run), **info)
    if plan.spec.selects:  # the seed selection ran on: its select rows are never results (analysis.common)
        row["search_seed"] = plan.spec.search_seed
        row["search_budget"] = search_budget(plan, run) if stage in ("select", "confirm") else None
    return {"rounds_done": 0} | row


def search_budget(plan: SweepPlan, run) -> int | None:
    """How many configurations selection tried for this trial's (data setting, method): Optuna's
    `num_samples`, or the size of the method's grid under a scheduler; None when none matches."""
    for stage in plan.stages:
        if stage.kind == "select" and stage.group == group_name(run, axis_knobs(plan.spec)):
            return plan.spec.num_samples if stage.searched else len(stage.configs)
    return None


def status_counts(trials: pd.DataFrame) -> str:
    """e.g. '3 COMPLETED, 1 INTERRUPTED, 4 NOT_STARTED' (most common first)."""
    return ", ".join(f"{n} {status}" for status, n in trials["status"].value_counts().items()) or "none"
