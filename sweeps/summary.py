"""What a sweep prints when it ends, and its tables and figures: the per-setting summary of the
chosen configurations (`best_per_setting`), where the results are (Parquet, MLflow), and the
command that resumes it."""
from __future__ import annotations

import errno
import os
import shlex
import sys
from pathlib import Path

import pandas as pd

from analysis.common import (VALIDATED, chosen_key, config_keys, config_knobs, final_rows, methods_order,
                             selection_basis, settings_order)
from analysis.load import diverged  # the tables' rule: a diverged run is a result, not a number
from analysis.stats import mean_ci  # the one definition of the interval, beside the tables'

from .interrupts import signal_name
from .mlflow_sink import default_tracking_uri, log_sweep_tables
from .plan import SweepPlan
from .spec import budget_line
from .trials import UNFINISHED, status_counts

SETTING_KNOBS = ("algorithm", "dataset", "partition", "shards_per_client", "dir_alpha")  # in `method`/`setting`
SETTING_COLUMNS = {"setting", *SETTING_KNOBS[1:]}  # what analysis.common.settings_order orders by
DISK_ERRORS = (errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES)  # the disk refused a write


def tracking_uri(plan: SweepPlan) -> str:
    return plan.args.tracking_uri or default_tracking_uri(plan.folder.parent)


def resume_command(plan: SweepPlan) -> str:
    return f"{plan.command} --resume {shlex.quote(plan.folder.name)} --results {shlex.quote(str(plan.args.results))}"


def summary(plan: SweepPlan, trials: pd.DataFrame, rows: int, elapsed: float, stopped_by: int | None = None,
            sharing: str = "") -> None:
    folder = plan.folder
    done = trials[trials.status == "COMPLETED"]
    how = f"stopped by {signal_name(stopped_by)} after" if stopped_by is not None else "in"
    print(f"\n[sweep] {folder.name}: {len(done)}/{len(trials)} trials completed ({status_counts(trials)}) {how} "
          f"{elapsed:.0f} s; {rows} Parquet rows (trial x round x client)"
          + (f"; GPU sharing: {sharing}" if sharing else ""))
    if "stage" in done and plan.spec.selects:  # select runs are not results (analysis.common.final_rows)
        done = final_rows(done)
    pretrained = done[done["stage"] == "pretrain"] if "stage" in done else done.iloc[:0]
    done = done.drop(index=pretrained.index)
    if not pretrained.empty:  # the first stage of a two-stage study: its own short table
        print("[sweep] pretraining (the models the other trials start from), per data setting; final mean test "
              "accuracy over clients, mean ± std over seeds and the 95% CI of the mean (t interval over seeds):")
        print(best_per_setting(pretrained, []).to_string(index=False, na_rep="-"))
    if not done.empty:
        knobs = [k for k in plan.knobs if k in done.columns and k not in (*SETTING_KNOBS, "seed", "algorithm")]
        bases = {selection_basis(cell) for _, cell in done.groupby(["setting", "method"], dropna=False, sort=False)}
        if plan.spec.selects:
            print(f"[sweep] {budget_line(plan.spec)}")
            how = "selected configuration confirmed on every seed"
        elif bases == {VALIDATED}:  # "best" only where validation accuracy chose, never test accuracy
            how = "best configuration by validation accuracy (mean over seeds)"
        elif VALIDATED in bases:
            how = ("configuration chosen by validation accuracy (mean over seeds) where its data setting has a "
                   "validation split, else the declared one (run on the most seeds; ties: the first of its grid); "
                   "test accuracy never selects")
        else:
            how = ("declared configuration (run on the most seeds; ties: the first of its grid), as the tables "
                   "show it: no validation split to select on, and test accuracy never selects")
        when = {"last": "final", "best_val": "at each run's best-validation round",
                "best_val_global": "at each run's best-validation round before fine-tuning"}[plan.spec.report_round]
        print(f"[sweep] per data setting, each method's {how}; {when} mean personalized test accuracy over clients, "
              f"mean ± std over seeds and the 95% CI of the mean (t interval over seeds; diverged runs left out); "
              f"completed trials only:")
        print(best_per_setting(done, knobs).to_string(index=False, na_rep="-"))
    print(f"[sweep] Parquet: {folder / 'rounds'} (read with sweeps.parquet_sink.read_sweep('{folder}'))")
    print(f"[sweep] trials:  {folder / 'trials.parquet'}")
    print(f"[sweep] MLflow:  {mlflow_ui_line(tracking_uri(plan))}")
    from .mlflow_view import final_metrics, sweep_view_url  # None when the store cannot be read: no link, no failure
    link = sweep_view_url(tracking_uri(plan), plan.study, folder.name)
    if link:  # the view's order (sweeps/mlflow_view.py): validation accuracy ranks, test accuracy never
        with_val = "acc_val_mean" in final_metrics(c for stage in plan.stages for _, c in stage.configs)
        order = "highest validation accuracy first" if with_val else "in start order: no validation split to rank by"
        print(f"[sweep] this sweep's trials in MLflow ({order}): {link}")
    full = trials["error"].fillna("").str.contains("|".join(os.strerror(e) for e in DISK_ERRORS), regex=True) \
        if "error" in trials else pd.Series(False, index=trials.index)
    if full.any():  # a trial failed because the disk refused its write: say so, once
        print(f"[sweep] {int(full.sum())} trial(s) failed writing their results "
              f"({trials.loc[full, 'error'].iloc[0][:160]}); their rows and states up to the last written round are "
              f"kept: free space, then continue with --resume", flush=True)
    if stopped_by is not None or trials.status.isin([*UNFINISHED, "ERROR"]).any():  # what --resume would run
        print(f"[sweep] continue with: {resume_command(plan)}", flush=True)


def mlflow_ui_line(uri: str) -> str:
    """How to see the runs: a tracking server shows them itself (its address); a file or database
    store needs `mlflow ui` started on it."""
    if uri.startswith(("http://", "https://")):
        return f"the tracking server's UI at {uri.rstrip('/')} (it already runs)"
    return f"{mlflow_command()} ui --backend-store-uri {uri}"


def mlflow_command() -> str:
    """The `mlflow` executable of this environment (the venv's, which is not on PATH unless the
    venv is activated), else plain `mlflow`."""
    beside = Path(sys.executable).parent / "mlflow"
    return str(beside) if beside.exists() else "mlflow"


def best_per_setting(done: pd.DataFrame, knobs: list[str]) -> pd.DataFrame:
    """Per data setting (and local epochs where they vary), each method's configuration of the
    swept knobs `knobs`, chosen by the tables' rule (`analysis.common.chosen_key`: the best mean
    validation accuracy over seeds where the cell has a validation split, else the declared one,
    run on the most seeds, ties to the grid's first point; never test accuracy), with its final
    test accuracy (mean ± std over seeds), in the tables' order (settings, then the registry's
    order of methods: nothing here is ranked by test accuracy).
    Runs that diverged (analysis.load.diverged) are left out of the accuracy, its interval and
    `seeds`, and counted in `diverged`. `95% CI`: the t interval of the mean over seeds
    (analysis.stats.mean_ci)."""
    cell = ["setting"] + (["local_epochs"] if "local_epochs" in done and done["local_epochs"].nunique() > 1 else [])
    keys = [*cell, "method", *[k for k in knobs if k not in (*cell, "method")]]
    done = done.assign(config_key=config_keys(done))
    ran = done[done["acc_mean"].notna()]
    swept = config_knobs(done)
    chosen = {chosen_key(part, swept) for _, part in ran.groupby([*cell, "method"], dropna=False, sort=False)}
    done = done[done["config_key"].isin(chosen)]
    lost = diverged(done)
    grouped = done.assign(acc_mean=done["acc_mean"].where(~lost), lost=lost).groupby(keys, dropna=False, sort=False)
    stats = grouped["acc_mean"].agg(["mean", "std", "count"]).reset_index()
    stats["mb"] = grouped["mb_total"].mean().to_numpy()
    stats["lost"] = grouped["lost"].sum().to_numpy()
    stats["ci"] = [mean_ci(values) for _, values in grouped["acc_mean"]]  # the groups in the order of agg
    settings = settings_order(done) if SETTING_COLUMNS <= set(done.columns) else sorted(done["setting"].unique())
    methods = methods_order(done) if "algorithm" in done else list(dict.fromkeys(done["method"]))
    order = {"setting": settings, "method": methods}   # the tables' order, never accuracy
    stats = stats.sort_values([*cell, "method"], kind="stable",
                              key=lambda col: col.map({v: i for i, v in enumerate(order[col.name])})
                              if col.name in order else col)
    stats["acc"] = [f"{m:.4f} ± {sd:.4f}" if n > 1 else f"{m:.4f}" if n else "-" for m, sd, n in
                    zip(stats["mean"], stats["std"], stats["count"])]
    stats["95% CI"] = [f"[{low:.4f}, {high:.4f}]" if n > 1 else "-"
                       for (low, high), n in zip(stats["ci"], stats["count"])]
    stats["seeds"] = stats["count"].astype(int)
    stats["diverged"] = stats["lost"].astype(int)
    stats["mb_total"] = stats["mb"].round(2)
    shown = stats[[*keys, "acc", "95% CI", "seeds", "diverged", "mb_total"]]
    return shown.astype(object).where(shown.notna(), "-")


def tables_and_figures(folder: Path, plan: SweepPlan | None = None) -> None:
    """The study's LaTeX (and Markdown) tables and figures from its Parquet results (analysis/); with the `plan`,
    the tables folder (with summary.parquet) also goes to the sweep's MLflow run."""
    try:
        from analysis.plots import build_plots
        from analysis.tables import build_tables

        tables = build_tables([folder], markdown=True)  # .md beside each .tex: for a README, an issue, the docs
        figures = build_plots([folder])
    except Exception as err:  # noqa: BLE001 - the results are safe; a failed figure must not fail the sweep
        print(f"WARNING: building tables/figures failed ({type(err).__name__}: {err}); "
              f"retry with python -m analysis.tables {folder}", file=sys.stderr)
        return
    for path in [*tables.values(), *figures]:
        print(f"[sweep] wrote {path}")
    if plan is not None and tables and log_sweep_tables(tracking_uri(plan), plan.study, folder.name, folder / "tables"):
        print("[sweep] tables and summary.parquet logged to the sweep's MLflow run (artifacts tables/)")
