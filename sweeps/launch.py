"""Start (or resume) a validated sweep (`sweeps.plan.SweepPlan`) on Ray Tune and report where its
results are: data once per data setting and seed, resources checked against the cluster, one
Tuner per stage (sweeps/stages.py: a grid is one stage; a search or scheduler runs anchors,
select stages per data setting, then the confirm stage of their winners; a [pretraining] study
first runs its pretrain stage, and the next stage only if every pretraining completed), each with
the MLflow callback and its progress lines (sweeps/progress.py); then trials.parquet, a summary,
and the study's tables and figures (sweeps/summary.py). A resumed stage continues from its Tune
record (sweeps/tune_record.py).

Ctrl-C or SIGTERM at any point ends with trials.parquet (every trial, with its status), the
summary of what finished and the command that resumes the sweep; exit status 130 (SIGINT) or
143 (SIGTERM). How each moment is handled: sweeps/interrupts.py.
"""
from __future__ import annotations

import os
import sys
import time
from typing import Any, Callable

from fl_core import kernels
from fl_core.data import load_data

from . import damage, gpu_sharing, parquet_sink, probe, resources
from .allocator import allocator_env
from .errors import SweepError
from .folder import save_args
from .interrupts import Interrupted, Interrupts, exit_code, pause_for_tests, signal_name
from .mlflow_sink import MLflowSink
from .mlflow_view import fail_fast_on_servers
from .plan import SweepPlan, grid_space, progress_columns, reached_last_round, run_config, search_space
from .progress import StageProgress, TuneTable
from .spec import to_toml
from .stages import OBJECTIVE, Stage, best_completed, confirm_stage, data_configs
from .summary import DISK_ERRORS, resume_command, summary, tables_and_figures, tracking_uri
from .trainable import run_trial
from .tune_record import names_a_trial, restore_quietly, start_again
from .trials import TrialLedger, trials_table

METRIC_COLUMNS = {"round": "round", "acc_mean": "acc", OBJECTIVE: "objective",
                  "summary/personal_fraction_mean": "personal", "summary/mb_total": "MB"}




def launch(plan: SweepPlan, gpus: float | str) -> int:
    start = time.time()
    with Interrupts() as guard:
        try:
            return _launch(plan, gpus, guard)
        except OSError as err:
            if err.errno not in DISK_ERRORS:
                raise
            print(f"error: could not write {err.filename or plan.folder}: {err.strerror}; the trials' rows and "
                  f"states written so far are kept; when the disk has room, continue with: {resume_command(plan)}",
                  file=sys.stderr, flush=True)
            return 2
        except Interrupted as stop:  # before Tune ran, or a second signal while it ran
            with guard.hold(then_raise=False):
                if not (plan.folder / "sweep.json").exists():  # so that the resume command finds it
                    save_args(plan.folder, plan.args, plan.study, to_toml(plan.spec))
                trials, rows = trials_table(plan, [], interrupted=True)
                summary(plan, trials, rows, time.time() - start, stop.signum)
            return exit_code(stop.signum)


def _launch(plan: SweepPlan, gpus: float | str, guard: Interrupts) -> int:
    import ray

    started_ray = not ray.is_initialized()
    # GPU sharing (sweeps/gpu_sharing.py), decided before any data or Ray: an impossible --gpu-sharing mps
    # fails here; a daemon can serve only the workers of a Ray this sweep starts on this machine
    choose = gpu_sharing.chooser(plan.args.gpu_sharing, own_ray=started_ray and plan.args.address is None)
    daemon = gpu_sharing.daemon_for(choose(gpu_sharing.asked_fraction(gpus), has_gpus=True), plan.folder.name)
    if plan.args.resume:  # damaged files are set aside and their trials run again (sweeps/damage.py)
        damage.set_aside(plan.folder, say=lambda line: print(line, flush=True))
    print(f"[sweep] kernels: {kernel_line(plan.args.reproducible)}", flush=True)
    allocator, preload = allocator_env()  # a bad FL_CORE_ALLOCATOR fails here, before any data is read
    # Data once per distinct data spec, on the driver (a missing file fails here, before Ray starts).
    datasets: dict[str, Any] = {}
    for config in data_configs(plan.spec, list(plan.stages)):
        key = config.data_key()
        if key not in datasets:
            datasets[key] = load_data(config)
    stages = (", ".join(s.name for s in plan.stages)
              + (", tune-confirm" if plan.spec.selects and len(plan.spec.seeds) > 1 else ""))
    print(f"[sweep] {plan.study}: {len(plan.configs)} planned trials"
          + (f" + {sum(plan.spec.num_samples for s in plan.stages if s.searched)} sampled"
             if plan.search == "optuna" else "")
          + f"; {len(datasets)} client datasets (data settings x seeds); stages: {stages}", flush=True)
    measured = auto_probe(plan, gpus, datasets)  # before the MPS daemon: the driver's CUDA context is not its client

    # Tune's classic output engine: the one that prints through our progress reporter (its new engine,
    # RAY_AIR_NEW_OUTPUT=1, ignores a passed reporter and prints its own tables)
    os.environ["RAY_AIR_NEW_OUTPUT"] = "0"
    try:
        if daemon is not None:  # started before ray.init: the Ray it starts gives its workers the driver's
            daemon.start()      # environment, where the daemon's pipe folder now is (CUDA_MPS_PIPE_DIRECTORY)
        if started_ray:
            if plan.args.address is None:
                loopback_only()
            with guard.hold():  # a half-started Ray would outlive the driver
                ray.init(address=plan.args.address, include_dashboard=False, configure_logging=True,
                         logging_level="WARNING", log_to_driver=True, runtime_env=worker_env(plan.args, preload))
                guard.reinstall()
        request = trial_resources(plan, gpus, measured, ray.cluster_resources())
        print(f"[sweep] each trial: {request.cpus:g} CPU, {request.gpus:g} GPU; cluster: "
              f"{ray.cluster_resources().get('CPU', 0):g} CPU, {ray.cluster_resources().get('GPU', 0):g} GPU; "
              f"workers' allocator: {allocator if started_ray else 'as the running Ray started them'}", flush=True)
        sharing = choose(request.gpus, has_gpus=ray.cluster_resources().get("GPU", 0) > 0)
        if daemon is not None and not sharing.own_daemon:  # auto on a cluster without GPUs: none to share
            daemon.stop()
        if sharing.mode:
            print(f"[sweep] GPU sharing: {sharing.text(str(daemon.pipe) if sharing.own_daemon else None)}", flush=True)
        refs = {key: ray.put(data) for key, data in datasets.items()}
        pause_for_tests("start")
        save_args(plan.folder, plan.args, plan.study, to_toml(plan.spec))
        return _tune(plan, request, refs, guard, sharing)
    finally:
        with guard.hold(then_raise=False):
            try:
                if started_ray:
                    ray.shutdown()
            finally:
                if daemon is not None:  # after Ray: its workers, the daemon's clients, have ended
                    daemon.stop()


def auto_probe(plan: SweepPlan, gpus: float | str,
               datasets: dict[str, Any]) -> Callable[[], tuple[float, float]] | None:
    """For `--gpus-per-trial auto`, the probe of the first stage's first configuration on one CPU
    thread and on the GPU (sweeps/probe.py), run now; None when it is not needed (a number asked
    for, or a resumed sweep that recorded its choice)."""
    if gpus != "auto" or (plan.args.resume and probe.load_choice(plan.folder) is not None):
        return None
    config = plan.stages[0].configs[0][1]
    return probe.measure_now(config, datasets.get(config.data_key()))


def trial_resources(plan: SweepPlan, gpus: float | str, measured: Callable[[], tuple[float, float]] | None,
                    cluster: dict[str, float]) -> resources.TrialResources:
    """The request each trial makes, checked against `cluster`: `--gpus-per-trial auto` decided by
    the probe's figures (`measured`, from `auto_probe`), or as recorded on --resume (sweeps/probe.py)."""
    if gpus == "auto":
        gpus = probe.auto_gpus(plan.folder, plan.args.resume, cluster, plan.args.cpus_per_trial, measured,
                               say=lambda line: print(line, flush=True))
    return resources.resolve(plan.args.cpus_per_trial, gpus, cluster)


def kernel_line(reproducible: bool) -> str:
    """The driver's kernels (it loads the data), checked against the mode (fl_core/kernels.py): the
    trials' workers inherit its environment, and check their own."""
    try:
        line = kernels.require(reproducible)
    except kernels.KernelError as err:
        raise SweepError(str(err)) from None
    if not reproducible:
        return f"{line} (the CPU's own: {kernels.OPT_OUT})"
    reason = kernels.unavailable()
    return f"{line} (reproducible mode unavailable: {reason})" if reason else f"{line} (reproducible mode)"


def worker_env(args, preload: dict[str, str]) -> dict | None:
    """Ray's runtime environment for the trials' workers: the allocator's variables (`preload`,
    sweeps/allocator.py) and, for a cluster this driver joins (`--address`), whose workers were not
    started from this process, the kernel pins (the GPU's even where the CPU's cannot be pinned)."""
    env = dict(preload)
    if args.address is not None and args.reproducible:
        env |= dict(kernels.CUDA_PINS) | ({} if kernels.unavailable() else dict(kernels.PINS))
    return {"env_vars": env} if env else None


def loopback_only() -> None:
    """Make the Ray this driver starts listen on 127.0.0.1 only. Ray 2.60 binds its servers (GCS,
    raylet, workers, object manager) to the node's address, which on Linux is the machine's own
    (every interface for some); as on macOS and Windows, where Ray keeps single-machine clusters
    on loopback, the node address becomes 127.0.0.1 when cluster support is switched off
    (`RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0`, read by Ray when imported: set in the environment the
    raylet and workers inherit, and in the constant this process already read). Joining a cluster
    (`--address`) leaves Ray's own behaviour."""
    from ray._private import ray_constants

    os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
    ray_constants.ENABLE_RAY_CLUSTER = False


def _tune(plan: SweepPlan, request: resources.TrialResources, refs: dict[str, Any], guard: Interrupts,
          sharing: gpu_sharing.Sharing) -> int:
    """Run the stages in order (sweeps/stages.py); after the last select stage, the confirm stage
    of its winners. An interrupt stops after the stage it came in. The summary says how the trials
    shared their GPUs (`sharing`)."""
    from ray import tune

    args, folder = plan.args, plan.folder
    trainable = tune.with_resources(
        tune.with_parameters(run_trial, data_refs=refs, sweep_dir=str(folder), sweep=folder.name, resources=request,
                             checkpoint_every=args.checkpoint_every, crash_at_round=args.inject_crash_at_round,
                             reproducible=args.reproducible, report_round=plan.spec.report_round),
        request.as_tune())
    TrialLedger.seen = {}
    start = time.time()
    ran, repaired, stopped = _run_stages(plan, trainable, guard)
    elapsed = time.time() - start
    finished = ran[:-1] if stopped is not None else ran  # an interrupted select stage has no winner yet
    with guard.hold(then_raise=False):  # the results are written whatever comes now
        trials, rows = trials_table(plan, ran + repaired, interrupted=stopped is not None,
                                    selected=set(winners(finished)))
        if stopped is None:  # every stage ran: one schema per folder for any Parquet reader
            parquet_sink.unify_schema(folder)
        summary(plan, trials, rows, elapsed, stopped, sharing=sharing.text() if sharing.mode else "")
    if guard.signum is not None:
        if stopped is None:  # it came while the summary was written: every trial had ended
            print(f"[sweep] {signal_name(guard.signum)}: tables and figures skipped; write them with: "
                  f"{resume_command(plan)}", flush=True)
        return exit_code(guard.signum)
    try:
        pause_for_tests("tables")
        tables_and_figures(folder, plan)
    except Interrupted as stop:
        with guard.hold(then_raise=False):
            print(f"\n[sweep] {signal_name(stop.signum)} while writing the tables and figures; trials.parquet and "
                  f"the Parquet rows are complete")
            print(f"[sweep] write them with: python -m analysis.tables {folder}")
            print(f"[sweep] or continue with: {resume_command(plan)}", flush=True)
        return exit_code(stop.signum)
    return 0 if trials.status.isin(["COMPLETED", "STOPPED"]).all() else 1  # stopped early: a scheduler's normal outcome


def _run_stages(plan: SweepPlan, trainable, guard: Interrupts) -> tuple[list, list, int | None]:
    """The stages' Tune runs in order, each with its repair run where results were damaged, and
    after the last select stage the confirm stage of its winners: (ran, repaired, the signal
    that stopped them or None). A pretraining that did not complete ends the sweep's stages."""
    stages, ran, repaired = list(plan.stages), [], []
    stopped = None
    while len(ran) < len(stages):
        stage = stages[len(ran)]
        tuner = _tuner(plan, stage, trainable)
        with guard.tune():
            pause_for_tests(f"fit {stage.name}")  # test hook: the stage's Tuner exists (tuner.pkl), Tune not run
            ran.append((stage, tuner.fit()))
            repair = damage.repair_stage(plan.folder, stage, ran[-1][1])
            if repair is not None and guard.signum is None:
                repaired.append((repair, _tuner(plan, repair, trainable).fit()))
        stopped = guard.signum
        if stopped is not None:
            break
        if stage.kind == "pretrain" and not all_completed(ran[-1][1]):
            print(f"[sweep] {stage.name}: not every pretraining completed (see trials.parquet); the next stage "
                  f"starts from their models and does not run without them", flush=True)
            break
        if len(ran) == len(stages) and plan.spec.selects and stage.kind != "confirm":
            for group in without_winner(ran):
                print(f"[sweep] {group}: no configuration reached its last round without diverging on the search "
                      f"seed, so none is confirmed (trials.parquet: status, diverged_why)", flush=True)
            confirm = confirm_stage(plan.spec, list(winners(ran).values()))
            if confirm is not None:
                stages.append(confirm)
    return ran, repaired, stopped


def all_completed(grid) -> bool:
    """Whether every trial of a stage's Tune results reached its final round without an error."""
    return all(r.error is None and r.config and reached_last_round(run_config(r.config), r.metrics or {})
               for r in grid)


def stage_winner(grid) -> Any:
    """The best completed trial's RunConfig of a select stage's Tune results (None: none finished)."""
    return best_completed([(run_config(r.config), r.metrics or {}) for r in grid if r.config])


def without_winner(ran: list[tuple[Stage, Any]]) -> list[str]:
    """The groups of the select stages that ran and have no configuration to confirm."""
    return [stage.group for stage, grid in ran if stage.kind == "select" and stage_winner(grid) is None]


def winners(ran: list[tuple[Stage, Any]]) -> dict[str, Any]:
    """config hash -> RunConfig of each finished select stage's best completed trial."""
    out = {}
    for stage, grid in ran:
        if stage.kind == "select":
            best = stage_winner(grid)
            if best is not None:
                out[best.config_hash()] = best
    return out


def _tuner(plan: SweepPlan, stage: Stage, trainable):
    """A new Tune experiment for the stage, or the one in its folder (a resumed sweep)."""
    from ray import tune

    folder, args = plan.folder, plan.args
    tune_dir = folder / stage.name
    if tune_dir.exists() and tune.Tuner.can_restore(str(tune_dir)):
        problem = damage.unreadable_tune_record(tune_dir)
        if problem is None and names_a_trial(tune_dir):
            print(f"[sweep] resuming {folder.name}/{stage.name}", flush=True)
            return restore_quietly(tune_dir, trainable)
        if problem is None:
            start_again(folder, tune_dir)
        else:
            aside = damage.move_aside(folder, [tune_dir], time.strftime("%Y%m%d-%H%M%S"))
            print(f"[sweep] damaged: Tune's record of {stage.name} cannot be restored ({problem}); set aside under "
                  f"{aside.relative_to(folder)}/; the stage starts again (its finished trials report from their "
                  f"saved states)", flush=True)
    print(f"[sweep] stage {stage.name}" + (f" [{stage.group}]" if stage.group else "") + ": "
          + (f"Optuna, {plan.spec.num_samples} configurations" if stage.searched else f"{len(stage.configs)} trials")
          + (", ASHA" if stage.kind == "select" and plan.spec.scheduler == "asha" else ""), flush=True)
    fail_fast_on_servers()
    configs = [c for _, c in stage.configs]
    columns = progress_columns(configs, plan.named)
    if stage.searched:
        space, shown = search_space(configs[0], stage.domains, columns)
    else:
        space, shown = grid_space(stage.configs, columns, stage.stop_after)
    sweep_params = {k: v for k, v in vars(args).items() if k != "resume"} | {
        "study_file": plan.spec.source, "search": plan.spec.search, "scheduler": plan.spec.scheduler,
        "seeds": list(plan.spec.seeds)}
    sink = MLflowSink(tracking_uri(plan), plan.study, folder.name, folder, folder.parent / "mlartifacts",
                      sweep_params=sweep_params)
    return tune.Tuner(trainable, param_space=space, tune_config=_tune_config(plan, stage),
                      run_config=tune.RunConfig(
                          name=stage.name, storage_path=str(folder),
                          failure_config=tune.FailureConfig(max_failures=args.max_failures),
                          callbacks=[sink, TrialLedger()], verbose=args.verbose,
                          progress_reporter=progress_reporter(stage, args.verbose, shown)))


def progress_reporter(stage: Stage, verbose: int, shown: dict[str, str]):
    """What the stage prints while it runs (sweeps/progress.py): at verbose 2 Tune's table (the
    knobs `shown` and METRIC_COLUMNS), else our one-line progress (Tune calls no reporter at 0)."""
    if verbose >= 2:
        return TuneTable(parameter_columns=shown, metric_columns=METRIC_COLUMNS, max_report_frequency=10,
                         max_column_length=12, sort_by_metric=False)
    return StageProgress(f"{stage.name} ({stage.kind})" + (f" [{stage.group}]" if stage.group else ""))


def _tune_config(plan: SweepPlan, stage: Stage):
    from ray import tune

    # reuse_actors: a fresh trial process spends ~4.5 s importing torch and Ray Tune; reusing the
    # process of a finished trial (same resources) makes later trials start in a fraction of that.
    kwargs: dict[str, Any] = {"metric": OBJECTIVE, "mode": "max", "reuse_actors": True}
    if plan.args.max_concurrent:
        kwargs["max_concurrent_trials"] = plan.args.max_concurrent
    if stage.searched:
        from ray.tune.search.optuna import OptunaSearch
        # an independent, reproducible sampler per select stage (stage i: search seed + 1000 i)
        index = [s.name for s in plan.stages].index(stage.name)
        kwargs["search_alg"] = OptunaSearch(seed=plan.spec.search_seed + 1000 * index)
        kwargs["num_samples"] = plan.spec.num_samples
    if stage.kind == "select" and plan.spec.scheduler == "asha":
        from .asha import ResumableASHA, rungs_path  # its rungs survive an interrupted driver
        rounds = max(c.rounds for _, c in stage.configs)
        kwargs["scheduler"] = ResumableASHA(rungs_path(plan.folder / stage.name), time_attr="round",
                                            max_t=rounds, grace_period=max(1, rounds // 4), reduction_factor=2)
    return tune.TuneConfig(**kwargs)
