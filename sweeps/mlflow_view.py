"""What the MLflow UI (3.15 and later) shows first for a sweep: a saved view, and the link that opens it.

MLflow's runs page reads only its filter and sort from the URL (`searchFilter`, `orderByKey`,
`orderByAsc`, `startTime`, `lifecycleFilter`, `datasetsFilter`) plus `compareRunsMode`
(TABLE / CHART); the columns shown, which runs the charts draw and the chart cards live in the
browser's local storage, with no server-side default per experiment. The one way to hand them
over is a saved view: an experiment tag `mlflow.sharedViewState.<id>` holding a JSON envelope
`{name, createdAt, updatedAt, state}`, listed in the page's Views menu and opened by
`#/experiments/<id>/runs?viewStateShareKey=<id>` (the link must carry no filter or sort of its
own, or the page ignores the view). Each sweep gets one, named `sweep <name>`:
  filter   `tags.sweep = '<name>' and tags.role = 'trial'` (the trials, not the sweep's own run)
  sort     final `acc_val`, best first, where the trials have a validation split, else in the
           order they started: never by test accuracy (a sorted list is a selection)
  columns  acc_val (when the data has a validation split) and acc first, then the knobs that vary
           among the trials (the method first), then mb; each column as narrow as its header and
           values allow, and the Run Name and Created columns (which MLflow pins left) narrowed:
           at 1400 px the accuracy and the knobs are in view without scrolling (beside the
           Assistant panel MLflow 3.17 opens on a first visit, the accuracy and the first knobs)
  charts   every trial drawn (not MLflow's default of the first 10 runs); a section with acc at
           the last round (bar), acc per round (line) and the swept knobs -> acc (parallel
           coordinates); MLflow adds its own charts of the other metrics below.
`acc`, `acc_val` and `mb` are display copies the sink logs beside the exact `acc_mean`,
`acc_val_mean` and `mb_total` (`display_metrics`: rounded to 4, 4 and 2 decimals, short names, so
that a narrow column shows the whole value); a float knob of more than 4 significant digits is
logged as a param rounded to 4 (`param_text`; its exact value is the run's tag `exact.<knob>`,
and in Parquet).
`runs_view_url` builds either link; `sweep_view_url` looks the experiment up and prefers the view.
Importing this module needs neither Ray nor a tracking server.
"""
from __future__ import annotations

import base64
import json
import math
import os
import re
import time
import zlib
from typing import Any, Iterable
from urllib.parse import urlencode

VIEW_TAG_PREFIX = "mlflow.sharedViewState."
DEFAULT_UI = "http://127.0.0.1:5000"  # where `mlflow ui` listens unless told otherwise
FINAL_METRICS = ("acc_mean", "acc_val_mean", "mb_total")  # the summary keys a view shows, by their display copies
# summary key -> (the display copy's metric name, decimals it keeps)
DISPLAY_METRICS = {"acc_mean": ("acc", 4), "acc_val_mean": ("acc_val", 4), "mb_total": ("mb", 2)}
ACCURACY_FIRST = ("acc_val_mean", "acc_mean")  # the columns before the knobs, in this order
ORDER_BY, ORDER_NEUTRAL = "metrics.`acc_val`", "attributes.start_time"
PARAM_DIGITS = 4  # significant digits of a float knob's param
# MLflow's own ag-grid column ids of the runs table's two columns pinned left, and their widths in
# the view (MLflow's defaults: 190 and 150 px)
RUN_NAME_COLUMN, CREATED_COLUMN = "attributes.`Run Name`", "runDateAndNestInfo"
PINNED_WIDTHS = {RUN_NAME_COLUMN: 200, CREATED_COLUMN: 110}
# Knobs named in every run name and shown in every view of a method (FedSelect: p and α).
ALWAYS_NAMED = {"fedselect": ("pers_rate", "pers_limit")}
MAX_TAG_VALUE = 20000  # MLflow's limit on an experiment tag's value


def fail_fast_on_servers() -> None:
    """An unreachable server should cost seconds, not MLflow's default minutes of retries."""
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", "10")


def param_text(value: Any) -> str:
    """A knob's value as the param MLflow shows: a float with more than PARAM_DIGITS significant
    digits rounded to them (0.0031622776601683794 -> `0.003162`, 0.123456 -> `0.1235`), any other
    value as `str` (`0.5`, `1.0`, `1e-05`, `fedselect`)."""
    if isinstance(value, float) and math.isfinite(value):
        short = f"{value:.{PARAM_DIGITS}g}"
        return str(value) if float(short) == value else short
    return str(value)


def display_metrics(summary: dict[str, Any]) -> dict[str, float]:
    """The display copies of a round's summary: short names, rounded (`DISPLAY_METRICS`); keys the
    summary lacks or did not measure (NaN) are left out."""
    out = {}
    for key, (name, decimals) in DISPLAY_METRICS.items():
        value = summary.get(key)
        if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
            out[name] = round(float(value), decimals)
    return out


def column_width(header: str, value_chars: int) -> int:
    """A column just wide enough for its header and for values of `value_chars` characters (7 px a
    character at MLflow's 13 px font, 36 px of padding and sort mark), at most 160 px."""
    return min(160, 7 * max(len(header), value_chars) + 36)


def view_id(sweep: str) -> str:
    """The saved view's id: a tag-key and URL safe form of the sweep's name."""
    return "sweep-" + re.sub(r"[^A-Za-z0-9_.-]", "_", sweep)


def trials_filter(sweep: str) -> str:
    return f"tags.sweep = '{sweep}' and tags.role = 'trial'"


def swept_knobs(configs: Iterable[Any]) -> list[str]:
    """The knobs worth a column: the method when several run, each method's always-named knobs,
    and every other knob that takes more than one value among the trials that have it."""
    dicts = [(c.algorithm, c.semantic_dict()) for c in configs]
    values: dict[str, set[str]] = {}
    for _, d in dicts:
        for key, value in d.items():
            values.setdefault(key, set()).add(repr(value))
    named = [k for algorithm in dict.fromkeys(a for a, _ in dicts) for k in ALWAYS_NAMED.get(algorithm, ())]
    varying = [k for k, seen in values.items() if len(seen) > 1]
    first = ["algorithm"] if "algorithm" in varying else []
    return list(dict.fromkeys([*first, *named, *varying]))


def final_metrics(configs: Iterable[Any]) -> list[str]:
    """The summary keys the view shows (by their display copies): acc_mean, acc_val_mean where a
    trial has a validation split, mb_total."""
    with_val = any(getattr(c, "val_fraction", 0) for c in configs)
    return [m for m in FINAL_METRICS if m != "acc_val_mean" or with_val]


def order_of(metrics: list[str]) -> tuple[str, bool]:
    """(orderByKey, ascending) of a sweep's runs: validation accuracy, best first, when the view
    shows it; else the start order."""
    return (ORDER_BY, False) if "acc_val_mean" in metrics else (ORDER_NEUTRAL, True)


def view_state(sweep: str, knobs: list[str], metrics: list[str]) -> dict[str, Any]:
    """The runs page state of the sweep's view (search facets and UI state, as MLflow keeps them);
    `metrics` are summary keys (`final_metrics`), shown by their display copies."""
    first = [m for m in ACCURACY_FIRST if m in metrics]
    columns = [*(f"metrics.`{DISPLAY_METRICS[m][0]}`" for m in first), *(f"params.`{k}`" for k in knobs),
               *(f"metrics.`{DISPLAY_METRICS[m][0]}`" for m in metrics if m not in first)]
    widths = {**PINNED_WIDTHS, **{c: column_width(c.split("`")[1], 6 if c.startswith("metrics") else 7)
                                  for c in columns}}
    acc = DISPLAY_METRICS["acc_mean"][0]
    section = "sweep-summary"
    card = {"metricSectionId": section, "deleted": False, "isGenerated": False}
    charts = [
        {**card, "uuid": "sweep-acc-final", "type": "BAR", "metricKey": acc},  # the last round's value
        {**card, "uuid": "sweep-acc-rounds", "type": "LINE", "metricKey": acc,
         "selectedMetricKeys": [acc], "xAxisKey": "step", "selectedXAxisMetricKey": "",
         "xAxisScaleType": "linear", "scaleType": "linear", "lineSmoothness": 0, "range": {}, "yAxisKey": "metric",
         "yAxisExpressions": [], "ignoreOutliers": False, "useGlobalXaxisKey": True, "useGlobalLineSmoothing": True},
    ]
    parallel = [k for k in knobs if k not in ("algorithm", "seed")]
    if parallel:
        charts.append({**card, "uuid": "sweep-knobs", "type": "PARALLEL", "selectedParams": parallel,
                       "selectedMetrics": [acc], "showAllRuns": False})
    return {
        "searchFilter": trials_filter(sweep), "orderByKey": order_of(metrics)[0], "orderByAsc": order_of(metrics)[1],
        "selectedColumns": columns, "columnOrder": [*PINNED_WIDTHS, *columns], "columnWidths": widths,
        "runsHiddenMode": "SHOW_ALL",  # the charts draw every trial, not the first 10 runs
        "compareRunCharts": charts,
        "compareRunSections": [{"uuid": section, "name": f"Sweep {sweep}", "display": True, "isReordered": False,
                                "deleted": False, "isGenerated": False, "cardHeight": 480}],
    }


def view_envelope(name: str, state: dict[str, Any], created_ms: int, updated_ms: int) -> str:
    """The tag value MLflow's UI reads: the state as JSON text, or deflated (its `deflate;<base64>`
    form) when the plain text would not fit in a tag."""
    text = json.dumps(state, separators=(",", ":"))
    envelope = json.dumps({"name": name, "createdAt": created_ms, "updatedAt": updated_ms, "state": text})
    if len(envelope) > MAX_TAG_VALUE:
        packed = "deflate;" + base64.b64encode(zlib.compress(text.encode())).decode()
        envelope = json.dumps({"name": name, "createdAt": created_ms, "updatedAt": updated_ms, "state": packed})
    return envelope


def read_view(value: str) -> dict[str, Any]:
    """The state inside a view tag's value (the inverse of `view_envelope`)."""
    text = json.loads(value)["state"]
    if text.startswith("deflate;"):
        text = zlib.decompress(base64.b64decode(text[len("deflate;"):])).decode()
    return json.loads(text)


def save_sweep_view(client, experiment_id: str, sweep: str, configs: list[Any]) -> str:
    """Write (or refresh) the sweep's saved view on its experiment; returns the view's id."""
    key = view_id(sweep)
    now = int(time.time() * 1000)
    old = client.get_experiment(experiment_id).tags.get(VIEW_TAG_PREFIX + key)
    try:
        created = int(json.loads(old)["createdAt"]) if old else now
    except (ValueError, KeyError, TypeError):
        created = now
    knobs, metrics = swept_knobs(configs), final_metrics(configs)
    if old:  # a staged sweep saves its view once per stage: keep the columns earlier stages showed
        try:
            shown = read_view(old)["selectedColumns"]
        except (ValueError, KeyError, TypeError):
            shown = []
        knobs = list(dict.fromkeys([*(c[len("params.`"):-1] for c in shown if c.startswith("params.`")), *knobs]))
        earlier = {c[len("metrics.`"):-1] for c in shown if c.startswith("metrics.`")}  # display or summary names
        metrics = [m for m in FINAL_METRICS if m in metrics or {m, DISPLAY_METRICS[m][0]} & earlier]
    state = view_state(sweep, knobs, metrics)
    value = view_envelope(f"sweep {sweep}", state, created, now)
    client.set_experiment_tag(experiment_id, VIEW_TAG_PREFIX + key, value)
    return key


def runs_view_url(experiment_id: str, sweep: str | None, mode: str = "TABLE", host: str = DEFAULT_UI,
                  saved_view: bool = False) -> str:
    """The runs page of one sweep: its saved view (`saved_view=True`), else the same filter and
    sort spelled in the URL (any MLflow 2.x/3.x, columns left as the browser has them; the start
    order, as the link cannot know whether the trials have a validation split); with no sweep, the
    experiment's whole runs page."""
    if sweep is None:
        query = {"compareRunsMode": mode}
    elif saved_view:
        query = {"viewStateShareKey": view_id(sweep), "compareRunsMode": mode}
    else:
        query = {"searchFilter": trials_filter(sweep), "orderByKey": ORDER_NEUTRAL, "orderByAsc": "true",
                 "compareRunsMode": mode}
    return f"{host.rstrip('/')}/#/experiments/{experiment_id}/runs?{urlencode(query)}"


def ui_host(tracking_uri: str) -> str:
    """Where the UI of a store is: a tracking server serves its own; a file or database store is
    shown by `mlflow ui`, on port 5000 by default."""
    return tracking_uri.rstrip("/") if tracking_uri.startswith(("http://", "https://")) else DEFAULT_UI


def sweep_view_url(tracking_uri: str, study: str, sweep: str, mode: str = "TABLE",
                   host: str | None = None) -> str | None:
    """The link to print for a sweep of `study` (None when the experiment cannot be read)."""
    fail_fast_on_servers()
    try:
        from mlflow import MlflowClient
        experiment = MlflowClient(tracking_uri=tracking_uri).get_experiment_by_name(study)
    except Exception:  # noqa: BLE001 - a link is a convenience; an unreachable store must not matter
        return None
    if experiment is None:
        return None
    saved = VIEW_TAG_PREFIX + view_id(sweep) in experiment.tags
    return runs_view_url(experiment.experiment_id, sweep, mode, host or ui_host(tracking_uri), saved_view=saved)
