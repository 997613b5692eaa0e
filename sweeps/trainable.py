"""The Tune trainable: one full federated run per trial.

It turns the trial's Tune config into its `RunConfig` (`sweeps.plan.run_config`), takes the data
from the object store (loaded once per sweep on the driver, keyed by `config.data_key()`),
resumes from the trial's saved state if there is one, and then per round: writes the round's rows
(`fl_core.results.round_rows`) to its Parquet journal file, saves the simulation state (every
`checkpoint_every` rounds and at the last round) and reports the round's summary
(`fl_core.results.summarize_round`). After the last round it compacts the trial's rows into one
file and writes its final masks (see sweeps/parquet_sink.py). Batch orders depend only on (seed,
round, client), so a resumed trial ends with exactly the metrics of an uninterrupted one.

What is reported to Tune each round:
  round                    Tune's time attribute (ASHA's rungs)
  acc_mean                 the last evaluated round's mean test accuracy (rounds skipped by
                           `eval_every` carry it over; NaN before any): what tables report
  objective                what selection maximises (Tune's metric, Optuna's and ASHA's): the
                           mean *validation* accuracy when the trial has a validation split, else
                           acc_mean (sweeps.stages.objective_of), carried over the same way
  summary                  the full `summarize_round` dict of this round (NaN where not measured)
  done                     the trial has run all its rounds
  provenance               where this process picked the run up and what it was given (PROVENANCE)

Checkpoints between stages (sweeps/stages.py): every trial reads and writes models in the sweep's
`checkpoints/` folder (its `checkpoint_dir`, unless the study set one; not part of the hash). A
trial of the pretrain stage writes its final model there as `<config_hash>.pt` when it finishes
(`fl_core.checkpoints.save_model`; again on the resume path of a finished trial if the file is
missing, never over an existing one); the trials of the next stage only read it (`pretrained`).

Where the state lives: one file per trial, `<sweep>/state/<config_hash>.pt`, replaced atomically,
rather than Tune checkpoints. Reason: when the driver is killed (SIGKILL), Tune's last experiment
snapshot can name a trial checkpoint that `CheckpointConfig(num_to_keep)` has already deleted, and
`Tuner.restore` then fails for that trial; keeping every checkpoint instead costs one state per
round. With one file per trial, a retry (`FailureConfig`), a `--resume` after SIGINT and one after
SIGKILL all continue from the newest saved round. Once a trial has finished and its rows (and
masks) are written, its state is replaced by a record of a few bytes that holds its last report
(`_prune`): a resume reports it again without the clients' models, which were most of a sweep's
disk. A pretraining keeps its whole state (a lost model is rewritten from it).

A round's state is saved after its report returns, which with Tune's synchronous reporting means
after the driver has acted on it (a scheduler's decision included): a report lost to an
interrupted driver is made again by the resumed trial, so ASHA sees every round exactly once, as in
an uninterrupted sweep (sweeps/asha.py). A trial's last round is saved before its report.
"""
from __future__ import annotations

import logging
import math
import time
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import ray
import torch
from ray import tune

from fl_core import kernels
from fl_core.checkpoints import checkpoint_path, save_model, torch_save_atomic
from fl_core.data import FederatedData, load_data
from fl_core.results import (REPORT_ROUND_KEYS, client_rows, fell_to_chance, lost_losses, mask_rows, round_rows,
                             summarize_round)
from fl_core.simulation import Simulation

from . import damage, parquet_sink
from .plan import run_config
from .resources import TrialResources
from .stages import OBJECTIVE, objective_of

PROVENANCE = ("resumed_from_round", "started_at", "gpus_assigned", "device", "threads", "config_hash",
              "data_from_driver", "reported_at", "node_id", "kernels", "cpu_isa", "chance")


def _selection(progress: dict[str, Any], summary: dict[str, Any], selected_on: str,
               report_round: str) -> tuple[float, float]:
    """(objective, chosen_by) after this round. The objective is the latest validation accuracy
    (carried over rounds that do not evaluate), or under a best-validation rule the one of the
    round that rule reports so far: the round whose `REPORT_ROUND_KEYS` value (`chosen_by`) is
    the best yet, the earliest of equal ones (fl_core.results.reported_round)."""
    before = progress.get("selection", math.nan)
    by_before = progress.get("chosen_by", before)  # a state saved before `chosen_by`: best_val's own value
    measured = summary[selected_on]
    if math.isnan(measured):
        return before, by_before
    key = REPORT_ROUND_KEYS.get(report_round)
    if key is None:
        return measured, math.nan
    by = summary[key]
    if math.isnan(before) or by > by_before or (math.isnan(by_before) and not math.isnan(by)):
        return measured, by
    return before, by_before


def _trained(progress: dict[str, Any], rows: pd.DataFrame) -> list[int]:
    """The clients that have had a finite training loss so far."""
    finite = rows.loc[np.isfinite(rows["loss"].astype(float).to_numpy()), "client"]
    return sorted(set(progress.get("trained_clients", ())) | {int(c) for c in finite})


def _lost(progress: dict[str, Any], rows: pd.DataFrame) -> bool:
    """Whether the training loss has been lost by this round: the trial row's rule
    (`fl_core.results.lost_losses`) on this round's rows, with the clients that had a finite loss
    in an earlier round (a client the round did not sample, or one that trained nothing, has NaN
    without diverging). Once lost, always lost."""
    before = rows["client"].isin(progress.get("trained_clients", ()))
    return bool(progress.get("lost")) or bool(lost_losses(rows, before).any())


def state_path(sweep_dir: str | Path, config_hash: str) -> Path:
    return Path(sweep_dir) / "state" / f"{config_hash}.pt"


def checkpoints_folder(sweep_dir: str | Path) -> Path:
    """Where the trials of a sweep write and read the models handed from one stage to the next."""
    return Path(sweep_dir) / "checkpoints"


def run_trial(config: dict[str, Any], *, data_refs: dict[str, Any], sweep_dir: str, sweep: str,
              resources: TrialResources, checkpoint_every: int = 1, crash_at_round: int | None = None,
              reproducible: bool = True, report_round: str = "last") -> None:
    """Tune function trainable (wrapped with `tune.with_parameters` by the launcher). `reproducible`:
    the trial refuses to run unless its process runs the pinned kernels (fl_core/kernels.py).
    `report_round` "best_val" / "best_val_global": the objective is the validation accuracy of the
    round the trial would report so far (`_selection`), else the latest."""
    logging.getLogger("ray").setLevel(logging.WARNING)
    kernels_used = kernels.require(reproducible)
    started_at = time.time()
    folder = Path(sweep_dir)
    use_cuda = resources.gpus > 0 and torch.cuda.is_available()
    run = run_config(config)
    run = run.replace(device="cuda" if use_cuda else "cpu", threads=resources.threads,
                      checkpoint_dir=run.checkpoint_dir or str(checkpoints_folder(folder)))
    hands_on = config.get("trial", config).get("stage") == "pretrain"  # writes its final model
    ref = data_refs.get(run.data_key())
    data: FederatedData = ray.get(ref) if ref is not None else load_data(run)
    key = run.config_hash()
    saved = state_path(folder, key)
    context = {"sweep": sweep, "trial_id": tune.get_context().get_trial_id()}
    sim, progress = _restored(run, data, folder, saved)
    if not saved.exists():
        parquet_sink.write_clients(folder, key, client_rows(sim.data, run, **context))
    if sim.completed == run.rounds or progress.get("finished"):  # finished before an interruption: report it again
        if not progress.get("finished"):
            _finish(folder, sim, hands_on)  # repair what an interruption left unwritten, then prune
            _prune(folder, sim, saved, progress, hands_on)
        if progress["last_report"]:
            tune.report(progress["last_report"])
        return

    provenance = {"resumed_from_round": sim.completed, "started_at": started_at,
                  "gpus_assigned": float(len(ray.get_gpu_ids())), "device": str(sim.device),
                  "threads": float(torch.get_num_threads()), "config_hash": key, "data_from_driver": ref is not None,
                  "node_id": ray.get_runtime_context().get_node_id(),  # the Ray node the trial ran on (last run)
                  "kernels": kernels_used, "cpu_isa": kernels.machine_isa(), "chance": 1.0 / data.num_classes}
    selected_on = objective_of(run)
    stop_after = config.get("trial", config).get("stop_after")  # a repair run: to the round Tune saw last
    for result in sim.run():
        rows = pd.DataFrame(round_rows(result, run, sim.model_name, **context))
        parquet_sink.write_round(folder, key, result.round, rows)
        done = result.round == run.rounds
        report, progress = _reported(progress, rows, result.round, done, provenance, (selected_on, report_round))
        if done:  # saved first: a finished trial is never run again (its last report is repeated)
            sim.save(saved, **progress)
            _finish(folder, sim, hands_on)
            _prune(folder, sim, saved, progress, hands_on)
        tune.report(report)  # returns once the driver has acted on it (Tune's synchronous reporting)
        if not done and (result.round % checkpoint_every == 0 or result.round == stop_after):
            sim.save(saved, **progress)  # after the report: a round whose report was lost runs again
        if crash_at_round == result.round:
            _crash_once(folder, key, result.round)
        if stop_after is not None and result.round >= stop_after and not done:
            return


def _reported(progress: dict[str, Any], rows: pd.DataFrame, rnd: int, done: bool, provenance: dict[str, Any],
              selection_rule: tuple[str, str]) -> tuple[dict[str, Any], dict[str, Any]]:
    """Round `rnd`'s report to Tune and the trial's progress after it (what a resume continues
    from): the mean accuracy, the objective the search selects on, and whether the run diverged."""
    summary = summarize_round(rows, progress["mb_total"])
    accuracy = progress["objective"] if math.isnan(summary["acc_mean"]) else summary["acc_mean"]
    selection, chosen_by = _selection(progress, summary, *selection_rule)
    lost = _lost(progress, rows)
    before_tuning = summary.get("acc_global_mean", math.nan)  # the model a fine-tuning method starts from
    peak = max(progress.get("peak", 0.0), 0.0 if math.isnan(before_tuning) else before_tuning)
    diverged = lost or fell_to_chance(peak, summary["acc_mean"], provenance["chance"])
    report = {"round": rnd, "acc_mean": accuracy, OBJECTIVE: selection, "done": done,
              "summary": summary, "diverged": diverged, **provenance, "reported_at": time.time()}
    return report, {"mb_total": summary["mb_total"], "objective": accuracy, "selection": selection,
                    "chosen_by": chosen_by, "last_report": report, "lost": lost,
                    "trained_clients": _trained(progress, rows),
                    "peak": max(peak, 0.0 if math.isnan(accuracy) else accuracy)}


def _prune(folder: Path, sim: Simulation, saved: Path, progress: dict[str, Any], hands_on: bool) -> None:
    """A finished trial whose outputs are all written keeps, instead of its full state (every
    client's model: most of a sweep's disk), a record of a few bytes that says it finished and
    holds its last report: all a resume needs to report it again. Kept whole: a pretraining's
    state (a lost model is rewritten from it), and any state whose outputs are not all there."""
    key = sim.config.config_hash()
    masks = (folder / "masks" / f"{key}.parquet").exists()  # `_finish` wrote them, if the method has any
    if parquet_sink.trial_path(folder, key).exists() and not hands_on:
        torch_save_atomic({"finished": True, "completed": sim.completed, "masks": masks,
                           "extra": progress | {"finished": True}}, saved)


def _finished_record(folder: Path, key: str, state: dict[str, Any]) -> dict[str, Any] | None:
    """The progress a pruned state (`_prune`) holds, if the outputs it vouches for are still there
    (None: they are not, and the trial runs again from round 1)."""
    if not state.get("finished"):
        return None
    whole = parquet_sink.trial_path(folder, key).exists() and (
        not state.get("masks") or (folder / "masks" / f"{key}.parquet").exists())
    return state["extra"] if whole else None


def _restored(run, data: FederatedData, folder: Path, saved: Path) -> tuple[Simulation, dict[str, Any]]:
    """The trial's simulation and progress, from its saved state where it has one (a finished
    trial's pruned record: its progress, `finished` set); a state that cannot be restored, or a
    record whose outputs went missing, is set aside with the trial's files, and the trial runs
    again from round 1."""
    sim = Simulation(run, data)
    progress: dict[str, Any] = {"mb_total": 0.0, "objective": math.nan, "selection": math.nan, "last_report": None}
    if not saved.exists():
        return sim, progress
    key = run.config_hash()
    try:
        state = torch.load(saved, map_location="cpu", weights_only=True)
        if state.get("finished"):
            record = _finished_record(folder, key, state)
            if record is None:
                raise ValueError("a finished trial's record, but its rows or masks are missing")
            return sim, record
        sim.load_state_dict(state)
        return sim, state.get("extra", {})
    except Exception as err:  # noqa: BLE001 - a damaged file fails in torch's reader or in unpickling
        aside = damage.move_aside(folder, damage.trial_files(folder, key), time.strftime("%Y%m%d-%H%M%S"))
        logging.getLogger(__name__).warning("trial %s: its state %s cannot be restored (%s: %s); its files are "
                                            "set aside under %s and it runs again from round 1", key, saved,
                                            type(err).__name__, str(err)[:160], aside)
        return Simulation(run, data), progress


def _finish(folder: Path, sim: Simulation, hands_on: bool = False) -> None:
    """A finished trial: its rows in one file, its final masks, and for a pretraining (`hands_on`)
    its final model for the next stage (all idempotent: nothing written is written again)."""
    key = sim.config.config_hash()
    if hands_on and not checkpoint_path(sim.config, key).exists():
        save_model(sim.config, sim.model_name, sim.final_model())
    if parquet_sink.compact_trial(folder, key, sim.config.rounds) is None:
        logging.getLogger(__name__).warning("trial %s: journal incomplete, rows left uncompacted", key)
    if not (folder / "masks" / f"{key}.parquet").exists():
        parquet_sink.write_masks(folder, key, mask_rows(sim.config, [c.mask for c in sim.clients]))


def _crash_once(sweep_dir: Path, config_hash: str, rnd: int) -> None:
    """Test hook (`--inject-crash-at-round`): fail each trial once, right after this round."""
    marker = sweep_dir / "injected-crashes" / config_hash
    if not marker.exists():
        marker.parent.mkdir(parents=True, exist_ok=True)
        marker.touch()
        raise RuntimeError(f"injected crash after round {rnd} (test hook)")
