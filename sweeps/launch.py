"""Start (or resume) a validated sweep (`sweeps.plan.SweepPlan`) on Ray Tune and report where its
results are: data once per data setting, resources checked against the cluster, the Tuner with
the MLflow callback, then trials.parquet, a summary, and the study's tables and figures."""
from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Any

import pandas as pd

from fl_core.data import load_data
from fl_core.results import trial_row, write_parquet

from . import resources
from .folder import save_args
from .mlflow_sink import MLflowSink, default_tracking_uri, fail_fast_on_servers
from .parquet_sink import read_trial
from .plan import SweepPlan, run_config
from .trainable import run_trial

METRIC_COLUMNS = {"round": "round", "acc_mean": "acc", "summary/personal_fraction_mean": "personal",
                  "summary/mb_total": "MB"}
SETTING_KNOBS = ("algorithm", "dataset", "partition", "shards_per_client", "dir_alpha")  # in `method`/`setting`
TRIAL_INFO = ("resumed_from_round", "started_at", "reported_at", "gpus_assigned", "threads", "device",
              "data_from_driver")


def launch(plan: SweepPlan, gpus: float | str) -> int:
    import ray

    # Data once per distinct data spec, on the driver (a missing file fails here, before Ray starts).
    datasets: dict[str, Any] = {}
    for config in plan.configs:
        key = config.data_key()
        if key not in datasets:
            datasets[key] = load_data(config)
    print(f"[sweep] {len(plan.configs)} {'trials' if plan.search == 'grid' else 'configurations'} over "
          f"{len(datasets)} data setting(s)", flush=True)

    os.environ.setdefault("RAY_AIR_NEW_OUTPUT", "0")  # use the classic progress table with our columns
    started_ray = not ray.is_initialized()
    if started_ray:
        ray.init(address=plan.args.address, include_dashboard=False, configure_logging=True,
                 logging_level="WARNING", log_to_driver=True)
    try:
        request = resources.resolve(plan.args.cpus_per_trial, gpus, ray.cluster_resources())
        print(f"[sweep] each trial: {request.cpus:g} CPU, {request.gpus:g} GPU; cluster: "
              f"{ray.cluster_resources().get('CPU', 0):g} CPU, {ray.cluster_resources().get('GPU', 0):g} GPU", flush=True)
        refs = {key: ray.put(data) for key, data in datasets.items()}
        save_args(plan.folder, plan.args)
        return _tune(plan, request, refs)
    finally:
        if started_ray:
            ray.shutdown()


def _tune(plan: SweepPlan, request: resources.TrialResources, refs: dict[str, Any]) -> int:
    from ray import tune

    args, folder = plan.args, plan.folder
    trainable = tune.with_resources(
        tune.with_parameters(run_trial, data_refs=refs, sweep_dir=str(folder), sweep=folder.name, resources=request,
                             checkpoint_every=args.checkpoint_every, crash_at_round=args.inject_crash_at_round),
        request.as_tune())
    tune_dir = folder / "tune"
    tracking_uri = args.tracking_uri or default_tracking_uri(folder.parent)
    if args.resume and tune_dir.exists() and tune.Tuner.can_restore(str(tune_dir)):
        print(f"[sweep] resuming {folder.name} from {tune_dir}", flush=True)
        tuner = tune.Tuner.restore(str(tune_dir), trainable=trainable, resume_errored=True)
    else:
        fail_fast_on_servers()
        sink = MLflowSink(tracking_uri, plan.study, folder.name, folder, folder.parent / "mlartifacts",
                          sweep_params={k: v for k, v in vars(args).items() if k not in ("resume",)})
        tuner = tune.Tuner(trainable, param_space=plan.param_space, tune_config=_tune_config(args),
                           run_config=tune.RunConfig(
                               name="tune", storage_path=str(folder),
                               failure_config=tune.FailureConfig(max_failures=args.max_failures),
                               callbacks=[sink], verbose=args.verbose,
                               progress_reporter=tune.CLIReporter(
                                   parameter_columns=plan.columns, metric_columns=METRIC_COLUMNS,
                                   max_report_frequency=10, max_column_length=12, sort_by_metric=False)))
    start = time.time()
    grid = tuner.fit()
    elapsed = time.time() - start
    trials, rows = trials_table(grid, folder)
    _summary(plan, trials, rows, tracking_uri, elapsed)
    _tables_and_figures(folder)
    return 0 if (trials.status == "COMPLETED").all() else 1


def _tune_config(args):
    from ray import tune

    # reuse_actors: a fresh trial process spends ~4.5 s importing torch and Ray Tune; reusing the
    # process of a finished trial (same resources) makes later trials start in a fraction of that.
    kwargs: dict[str, Any] = {"metric": "acc_mean", "mode": "max", "reuse_actors": True}
    if args.max_concurrent:
        kwargs["max_concurrent_trials"] = args.max_concurrent
    if args.search == "optuna":
        from ray.tune.search.optuna import OptunaSearch
        kwargs["search_alg"] = OptunaSearch(seed=args.seeds[0])
        kwargs["num_samples"] = args.num_samples
    if args.scheduler == "asha":
        from ray.tune.schedulers import ASHAScheduler
        kwargs["scheduler"] = ASHAScheduler(time_attr="round", max_t=args.rounds,
                                            grace_period=max(1, args.rounds // 4), reduction_factor=2)
    return tune.TuneConfig(**kwargs)


def trials_table(grid, folder: Path) -> tuple[pd.DataFrame, int]:
    """One row per trial (`fl_core.results.trial_row`: config columns, final summary from the
    trial's Parquet rows) with status, wall time and provenance, written atomically; and the
    number of Parquet rows read (trial x round x client)."""
    rows, count = [], 0
    for result in grid:
        config = run_config(result.config)
        rounds = read_trial(folder, config.config_hash())
        count += len(rounds)
        metrics = result.metrics or {}
        if result.error is not None:
            status = "ERROR"
        elif metrics.get("done"):
            status = "COMPLETED"
        else:
            status = "STOPPED"  # stopped early by the scheduler, or the sweep was interrupted
        info = {k: metrics.get(k) for k in TRIAL_INFO}
        row = trial_row(config, rounds, sweep=folder.name,
                        trial_id=metrics.get("trial_id"), status=status,
                        wall_seconds=float(metrics.get("time_total_s", 0.0)),
                        error=None if result.error is None else str(result.error)[:500], **info)
        rows.append({"rounds_done": 0} | row)
    trials = pd.DataFrame(rows)
    write_parquet(trials, folder / "trials.parquet")
    return trials, count


def _summary(plan: SweepPlan, trials: pd.DataFrame, rows: int, tracking_uri: str, elapsed: float) -> None:
    folder, args = plan.folder, plan.args
    done = trials[trials.status == "COMPLETED"]
    print(f"\n[sweep] {folder.name}: {len(done)}/{len(trials)} trials completed in {elapsed:.0f} s; "
          f"{rows} Parquet rows (trial x round x client)")
    if len(done) < len(trials):
        print(f"[sweep] not completed: {trials.status.value_counts().to_dict()}; continue with: "
              f"python sweeps/{plan.study}.py --resume --name {folder.name} --results {args.results}")
    if not done.empty:
        knobs = [k for k in plan.knobs if k in done.columns and k not in SETTING_KNOBS and k != "seed"]
        print("[sweep] best configurations per data setting (final mean personalized accuracy over clients, "
              "mean ± std over seeds; completed trials only):")
        print(best_per_setting(done, knobs).to_string(index=False, na_rep="-"))
    print(f"[sweep] Parquet: {folder / 'rounds'} (read with sweeps.parquet_sink.read_sweep('{folder}'))")
    print(f"[sweep] trials:  {folder / 'trials.parquet'}")
    print(f"[sweep] MLflow:  mlflow ui --backend-store-uri {tracking_uri}")


def best_per_setting(done: pd.DataFrame, knobs: list[str], top: int = 3) -> pd.DataFrame:
    """Per data setting, the `top` configurations (method and swept knobs) by final accuracy
    averaged over their seeds: a configuration is ranked only against others on the same data,
    and never by one lucky seed."""
    keys = ["setting", "method", *[k for k in knobs if k not in ("setting", "method")]]
    grouped = done.groupby(keys, dropna=False, sort=False)
    stats = grouped["acc_mean"].agg(["mean", "std", "count"]).reset_index()
    stats["mb"] = grouped["mb_total"].mean().to_numpy()
    stats = stats.sort_values(["setting", "mean"], ascending=[True, False], kind="stable")
    stats = stats.groupby("setting", sort=False).head(top)
    stats["acc"] = [f"{m:.4f} ± {sd:.4f}" if n > 1 else f"{m:.4f}" for m, sd, n in
                    zip(stats["mean"], stats["std"], stats["count"])]
    stats["seeds"] = stats["count"].astype(int)
    stats["mb_total"] = stats["mb"].round(2)
    shown = stats[[*keys, "acc", "seeds", "mb_total"]]
    return shown.astype(object).where(shown.notna(), "-")


def _tables_and_figures(folder: Path) -> None:
    """The study's LaTeX tables and figures from its Parquet results (analysis/)."""
    try:
        from analysis.plots import build_plots
        from analysis.tables import build_tables

        tables = build_tables([folder])
        figures = build_plots([folder])
    except Exception as err:  # noqa: BLE001 - the results are safe; a failed figure must not fail the sweep
        print(f"WARNING: building tables/figures failed ({type(err).__name__}: {err}); "
              f"retry with python -m analysis.tables {folder}", file=sys.stderr)
        return
    for path in [*tables.values(), *figures]:
        print(f"[sweep] wrote {path}")
