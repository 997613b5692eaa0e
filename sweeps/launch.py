"""Start (or resume) a validated sweep on Ray Tune and report where its results are."""
from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import Any

import pandas as pd

from fl_core.config import NON_SEMANTIC, RunConfig
from fl_core.results import write_parquet
from fl_core.simulation import load_data

from . import resources
from .mlflow_sink import MLflowSink, default_tracking_uri, fail_fast_on_servers
from .parquet_sink import read_rounds
from .study import Study, save_args
from .trainable import data_key, run_trial, trial_config

METRIC_COLUMNS = {"round": "round", "acc_mean": "acc", "personal_fraction_mean": "personal", "mb_total": "MB"}


def launch(study: Study, args: argparse.Namespace, folder: Path, configs: list[RunConfig], gpus: float | str) -> int:
    import ray

    # Data once per distinct setting, on the driver (a missing file fails here, before Ray starts).
    datasets: dict[str, Any] = {}
    for config in configs:
        key = data_key(config)
        if key not in datasets:
            datasets[key] = load_data(config)
    print(f"[sweep] {len(configs)} trials over {len(datasets)} data setting(s)", flush=True)

    os.environ.setdefault("RAY_AIR_NEW_OUTPUT", "0")  # use the classic progress table with our columns
    started_ray = not ray.is_initialized()
    if started_ray:
        ray.init(address=args.address, include_dashboard=False, configure_logging=True,
                 logging_level="WARNING", log_to_driver=True)
    try:
        request = resources.resolve(args.cpus_per_trial, gpus, ray.cluster_resources())
        print(f"[sweep] each trial: {request.cpus:g} CPU, {request.gpus:g} GPU; cluster: "
              f"{ray.cluster_resources().get('CPU', 0):g} CPU, {ray.cluster_resources().get('GPU', 0):g} GPU", flush=True)
        refs = {key: ray.put(data) for key, data in datasets.items()}
        save_args(folder, args)
        return _tune(study, args, folder, request, refs)
    finally:
        if started_ray:
            ray.shutdown()


def _tune(study: Study, args: argparse.Namespace, folder: Path, request: resources.TrialResources,
          refs: dict[str, Any]) -> int:
    from ray import tune

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
        sink = MLflowSink(tracking_uri, study.name, folder.name, folder, folder.parent / "mlartifacts",
                          sweep_params={k: v for k, v in vars(args).items() if k not in ("resume",)})
        tuner = tune.Tuner(trainable, param_space=_param_space(study, args),
                           tune_config=_tune_config(args),
                           run_config=tune.RunConfig(
                               name="tune", storage_path=str(folder),
                               failure_config=tune.FailureConfig(max_failures=args.max_failures),
                               callbacks=[sink], verbose=args.verbose,
                               progress_reporter=_reporter(study, args)))
    start = time.time()
    grid = tuner.fit()
    elapsed = time.time() - start
    trials = _trials_table(grid, folder)
    _summary(study, args, folder, trials, tracking_uri, elapsed)
    _tables_and_figures(folder)
    return 0 if (trials.status == "COMPLETED").all() else 1


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


def _param_space(study: Study, args: argparse.Namespace) -> dict:
    from ray import tune

    if args.search == "optuna":
        return study.search_space(args)
    return {"trial": tune.grid_search(study.grid(args))}


def _columns(study: Study, args: argparse.Namespace) -> dict[str, str]:
    """Progress-table columns that exist in every trial's config (Tune fails on missing ones)."""
    if args.search == "optuna":
        space = study.search_space(args)
        return {k: v for k, v in (study.columns | {"data": "data"}).items() if k in space}
    return {"trial/" + k: v for k, v in study.columns.items()}


def _tune_config(args: argparse.Namespace):
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


def _reporter(study: Study, args: argparse.Namespace):
    from ray import tune

    return tune.CLIReporter(parameter_columns=_columns(study, args), metric_columns=METRIC_COLUMNS, max_report_frequency=10,
                            max_column_length=12, sort_by_metric=False)


def _trials_table(grid, folder: Path) -> pd.DataFrame:
    """One row per trial: config, final metrics, status, wall time; written atomically."""
    rows = []
    for result in grid:
        config = RunConfig.from_dict(trial_config(result.config))
        metrics = result.metrics or {}
        if result.error is not None:
            status = "ERROR"
        elif metrics.get("done"):
            status = "COMPLETED"
        else:
            status = "STOPPED"  # stopped early by the scheduler, or the sweep was interrupted
        row = {k: v for k, v in config.to_dict().items() if k not in NON_SEMANTIC}
        row |= {"config_hash": config.config_hash(), "sweep": folder.name, "status": status,
                "rounds_done": int(metrics.get("round", 0)), "wall_seconds": float(metrics.get("time_total_s", 0.0)),
                "device": metrics.get("device"), "data_from_driver": metrics.get("data_from_driver"), "error": None if result.error is None else str(result.error)[:500]}
        for key in ("acc_mean", "acc_std", "acc_weighted", "acc_local_mean", "acc_global_mean",
                    "personal_fraction_mean", "mb_total", "resumed_from_round", "started_at", "reported_at",
                    "gpus_assigned", "threads"):
            row[key] = float(metrics[key]) if key in metrics else None
        rows.append(row)
    trials = pd.DataFrame(rows)
    write_parquet(trials, folder / "trials.parquet")
    return trials


def _summary(study: Study, args: argparse.Namespace, folder: Path, trials: pd.DataFrame, tracking_uri: str,
             elapsed: float) -> None:
    rounds = read_rounds(folder)
    done = trials[trials.status == "COMPLETED"]
    print(f"\n[sweep] {folder.name}: {len(done)}/{len(trials)} trials completed in {elapsed:.0f} s; "
          f"{len(rounds)} Parquet rows (trial x round x client)")
    if len(done) < len(trials):
        print(f"[sweep] not completed: {trials.status.value_counts().to_dict()}; continue with: "
              f"python sweeps/{study.name}.py --resume --name {folder.name} --results {args.results}")
    if not done.empty:
        cols = ["algorithm", *[c for c in study.columns if c != "algorithm"], "seed", "acc_mean", "acc_std",
                "personal_fraction_mean", "mb_total"]
        best = done.sort_values("acc_mean", ascending=False)[[c for c in cols if c in done.columns]].head(5)
        print("[sweep] best configurations (final mean personalized accuracy over clients):")
        print(best.to_string(index=False, float_format=lambda v: f"{v:.4g}"))
    print(f"[sweep] Parquet: {folder / 'rounds'} (read with sweeps.parquet_sink.read_sweep('{folder}'))")
    print(f"[sweep] trials:  {folder / 'trials.parquet'}")
    print(f"[sweep] MLflow:  mlflow ui --backend-store-uri {tracking_uri}")
