"""The MLflow view of a sweep (sweeps/mlflow_view.py): the link the summary prints, the saved view
written on the experiment, and the tags that let its filter pick the trials. Read back through
MlflowClient on a temporary sqlite store; no Ray cluster (the sink is driven with stand-in trials)."""
from __future__ import annotations

import json
from types import SimpleNamespace
from urllib.parse import parse_qs, urlsplit

import pytest

from sweeps import mlflow_view as view

from conftest import tiny

STUDY = "view_study"


def _query(url: str) -> tuple[str, dict[str, str]]:
    """(the path inside the page's #fragment, its query parameters, one value each)."""
    fragment = urlsplit(url).fragment
    path, _, query = fragment.partition("?")
    return path, {k: v[0] for k, v in parse_qs(query, strict_parsing=True).items()}


def _grid():
    """A small grid: FedSelect over p and α on two Dir α, and one FedAvg anchor per Dir α."""
    configs = [tiny(partition="dirichlet", dir_alpha=a, pers_rate=p, pers_limit=0.6)
               for a in (0.1, 0.5) for p in (0.25, 0.5)]
    return configs + [tiny(algorithm="fedavg", partition="dirichlet", dir_alpha=a) for a in (0.1, 0.5)]


def test_runs_view_url_filters_the_sweep_and_never_sorts_by_test_accuracy():
    url = view.runs_view_url("7", "grid-1", mode="CHART", host="http://127.0.0.1:5001/")
    assert url.startswith("http://127.0.0.1:5001/#/experiments/7/runs?")
    path, query = _query(url)
    assert path == "/experiments/7/runs"
    assert query == {"searchFilter": "tags.sweep = 'grid-1' and tags.role = 'trial'",
                     "orderByKey": "attributes.start_time", "orderByAsc": "true", "compareRunsMode": "CHART"}
    # the saved view: nothing else that would make the page ignore it
    _, query = _query(view.runs_view_url("7", "grid 1/b", saved_view=True))
    assert query == {"viewStateShareKey": "sweep-grid_1_b", "compareRunsMode": "TABLE"}
    assert _query(view.runs_view_url("7", None))[1] == {"compareRunsMode": "TABLE"}
    assert view.runs_view_url("7", "s").startswith(view.DEFAULT_UI + "/#/")


def test_ui_host_is_the_tracking_server_or_mlflow_ui():
    assert view.ui_host("http://tracker:8080/") == "http://tracker:8080"
    assert view.ui_host("sqlite:////tmp/x/mlflow.db") == "http://127.0.0.1:5000"


def test_swept_knobs_and_final_metrics():
    configs = _grid()
    assert view.swept_knobs(configs) == ["algorithm", "pers_rate", "pers_limit", "dir_alpha"]
    # FedSelect alone with one p and α: its knobs are still the columns, the method is not
    assert view.swept_knobs([tiny(), tiny(seed=1)]) == ["pers_rate", "pers_limit", "seed"]
    assert view.final_metrics(configs) == ["acc_mean", "mb_total"]
    assert view.final_metrics([tiny(val_fraction=0.2)]) == ["acc_mean", "acc_val_mean", "mb_total"]


def test_view_state_columns_charts_and_envelope_round_trip():
    state = view.view_state("g", ["algorithm", "pers_rate", "seed"], ["acc_mean", "mb_total"])
    # the accuracy first (its short display copy), then the knobs, then the traffic
    assert state["selectedColumns"] == ["metrics.`acc`", "params.`algorithm`", "params.`pers_rate`", "params.`seed`",
                                        "metrics.`mb`"]
    assert state["columnOrder"] == ["attributes.`Run Name`", "runDateAndNestInfo", *state["selectedColumns"]]
    assert state["runsHiddenMode"] == "SHOW_ALL"
    assert (state["orderByKey"], state["orderByAsc"]) == ("attributes.start_time", True)  # no split: start order
    validated = view.view_state("g", ["algorithm"], ["acc_mean", "acc_val_mean", "mb_total"])
    assert validated["selectedColumns"] == ["metrics.`acc_val`", "metrics.`acc`", "params.`algorithm`", "metrics.`mb`"]
    assert (validated["orderByKey"], validated["orderByAsc"]) == ("metrics.`acc_val`", False)  # the column shown
    charts = {c["type"]: c for c in state["compareRunCharts"]}
    assert charts["BAR"]["metricKey"] == charts["LINE"]["metricKey"] == "acc"
    assert charts["PARALLEL"]["selectedParams"] == ["pers_rate"]  # the method and the seed are no axes
    sections = {s["uuid"] for s in state["compareRunSections"]}
    assert {c["metricSectionId"] for c in state["compareRunCharts"]} == sections
    small = view.view_envelope("sweep g", state, 1, 2)
    assert json.loads(small)["name"] == "sweep g" and not json.loads(small)["state"].startswith("deflate;")
    assert view.read_view(small) == state
    big = dict(state, selectedColumns=[f"params.`knob_{i}`" for i in range(2000)])
    packed = view.view_envelope("sweep g", big, 1, 2)
    assert len(packed) <= view.MAX_TAG_VALUE and json.loads(packed)["state"].startswith("deflate;")
    assert view.read_view(packed) == big


def test_params_are_rounded_for_display_and_metrics_get_short_rounded_copies():
    assert view.param_text(10 ** -2.5) == "0.003162" and view.param_text(0.123456) == "0.1235"
    assert [view.param_text(v) for v in (0.5, 1.0, 1e-05, 0.25, 3, "fedselect", None)] == \
        ["0.5", "1.0", "1e-05", "0.25", "3", "fedselect", "None"]  # short values stay as str() writes them
    summary = {"round": 3, "acc_mean": 0.9038461538461539, "acc_val_mean": float("nan"), "mb_total": 3.7322399999,
               "acc_std": 0.1}
    assert view.display_metrics(summary) == {"acc": 0.9038, "mb": 3.73}  # NaN (not measured) left out
    assert view.display_metrics({"acc_val_mean": 0.55557}) == {"acc_val": 0.5556}
    assert all(len(name) <= 7 for name, _ in view.DISPLAY_METRICS.values())


def test_the_accuracy_and_the_knobs_of_the_default_grid_fit_a_laptop_screen():
    """At 1400 px MLflow 3.17's side navigation takes about 200 px and the row checkbox about 75 px:
    the pinned Run Name and Created columns, the accuracy and every swept knob of the default grid
    fit in what is left (1100 px); each column is at least as wide as its header and its values."""
    state = view.view_state("g", ["algorithm", "pers_rate", "pers_limit", "dir_alpha", "local_epochs"],
                            ["acc_mean", "mb_total"])
    widths = state["columnWidths"]
    assert set(widths) == set(state["columnOrder"])
    upto_knobs = state["columnOrder"][:state["columnOrder"].index("params.`local_epochs`") + 1]
    assert sum(widths[c] for c in upto_knobs) <= 1100
    for column in state["selectedColumns"]:
        header = column.split("`")[1]
        assert 7 * max(len(header), 6) + 36 <= widths[column] <= 160, column
    assert widths["attributes.`Run Name`"] < 320 and widths["runDateAndNestInfo"] < 150  # MLflow's 190 and 150


def test_saved_view_on_the_experiment_and_the_printed_link(tmp_path):
    from mlflow import MlflowClient

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = MlflowClient(tracking_uri=uri)
    experiment_id = client.create_experiment(STUDY, artifact_location=(tmp_path / "art").as_uri())
    key = view.save_sweep_view(client, experiment_id, "grid-1", _grid())
    tag = client.get_experiment(experiment_id).tags[view.VIEW_TAG_PREFIX + key]
    envelope = json.loads(tag)
    assert envelope["name"] == "sweep grid-1" and envelope["createdAt"] == envelope["updatedAt"]
    state = view.read_view(tag)
    assert state["searchFilter"] == "tags.sweep = 'grid-1' and tags.role = 'trial'"
    assert state["selectedColumns"][:5] == ["metrics.`acc`", "params.`algorithm`", "params.`pers_rate`",
                                            "params.`pers_limit`", "params.`dir_alpha`"]
    # saved again (a resumed sweep): same view, first creation time kept
    view.save_sweep_view(client, experiment_id, "grid-1", _grid()[:2])
    again = json.loads(client.get_experiment(experiment_id).tags[view.VIEW_TAG_PREFIX + key])
    assert again["createdAt"] == envelope["createdAt"] and again["updatedAt"] >= envelope["updatedAt"]
    # a later stage (e.g. a confirm stage varying only the seed) keeps the columns of the earlier ones
    assert view.read_view(json.dumps(again))["selectedColumns"] == state["selectedColumns"]

    _, query = _query(view.sweep_view_url(uri, STUDY, "grid-1"))
    assert query == {"viewStateShareKey": key, "compareRunsMode": "TABLE"}
    _, query = _query(view.sweep_view_url(uri, STUDY, "no-view", mode="CHART"))  # no view: filter in the URL
    assert query["searchFilter"] == "tags.sweep = 'no-view' and tags.role = 'trial'"
    assert view.sweep_view_url(uri, "no_such_study", "grid-1") is None
    assert view.sweep_view_url("http://127.0.0.1:9", STUDY, "grid-1") is None  # nothing listens: no link, no error


def test_sink_tags_trials_so_the_view_filter_finds_them(tmp_path):
    """The sink (driven as Tune would, with stand-in trials) writes role=trial on every trial's run
    and the sweep's view; the view's filter returns exactly the trials, never the sweep's run."""
    pytest.importorskip("ray")
    from mlflow import MlflowClient

    from sweeps.mlflow_sink import MLflowSink

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    sink = MLflowSink(uri, STUDY, "grid-2", tmp_path / "grid-2", tmp_path / "art", sweep_params={"rounds": 3})
    trials = [SimpleNamespace(trial_id=f"t{i}", config={"trial": {"run": c.to_dict()}}) for i, c in enumerate(_grid())]
    sink.setup()
    for trial in trials:
        sink.on_trial_start(0, trials, trial)
    sink.on_experiment_end(trials)
    assert sink.enabled
    client = MlflowClient(tracking_uri=uri)
    experiment = client.get_experiment_by_name(STUDY)
    state = view.read_view(experiment.tags[view.VIEW_TAG_PREFIX + view.view_id("grid-2")])
    found = client.search_runs([experiment.experiment_id], state["searchFilter"])
    assert sorted(r.data.tags["trial_id"] for r in found) == [t.trial_id for t in trials]
    assert all(r.data.tags["role"] == "trial" for r in found)
    everything = client.search_runs([experiment.experiment_id], "tags.sweep = 'grid-2'")
    assert len(everything) == len(trials) + 1  # and the sweep's own run, left out by the view
    for run in found:  # every column of the view is a param the trial logged, or one it has no knob for
        columns = [c[len("params.`"):-1] for c in state["selectedColumns"] if c.startswith("params.")]
        logged = [c for c in columns if c in run.data.params]
        assert logged == (columns if run.data.params["algorithm"] == "fedselect" else ["algorithm", "dir_alpha"])


def test_the_summary_points_a_server_store_at_its_own_ui_and_a_file_store_at_mlflow_ui():
    from sweeps.summary import mlflow_ui_line

    assert mlflow_ui_line("http://127.0.0.1:5099/") == ("the tracking server's UI at http://127.0.0.1:5099 "
                                                        "(it already runs)")
    line = mlflow_ui_line("sqlite:///results/mlflow.db")
    assert line.endswith("ui --backend-store-uri sqlite:///results/mlflow.db") and "mlflow" in line


def test_sink_logs_rounded_params_and_short_rounded_metrics_beside_the_exact_ones(tmp_path):
    pytest.importorskip("ray")
    from mlflow import MlflowClient

    from sweeps.mlflow_sink import MLflowSink

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    sink = MLflowSink(uri, STUDY, "lr", tmp_path / "lr", tmp_path / "art", sweep_params={"rounds": 3})
    config = tiny(lr=10 ** -2.5)
    trial = SimpleNamespace(trial_id="t0", config={"trial": {"run": config.to_dict()}})
    sink.setup()
    sink.on_trial_start(0, [trial], trial)
    summary = {"round": 1, "acc_mean": 0.9038461538461539, "acc_val_mean": float("nan"), "mb_total": 3.7322399999}
    sink.on_trial_result(0, [trial], trial, {"round": 1, "summary": summary, "config_hash": config.config_hash()})
    assert sink.enabled
    client = MlflowClient(tracking_uri=uri)
    run = client.search_runs([client.get_experiment_by_name(STUDY).experiment_id], "tags.trial_id = 't0'")[0]
    assert run.data.params["lr"] == "0.003162" and run.data.tags["exact.lr"] == repr(10 ** -2.5)
    assert run.data.params["pers_rate"] == "0.3" and "exact.pers_rate" not in run.data.tags  # short: as it was
    assert run.data.metrics["acc"] == 0.9038 and run.data.metrics["acc_mean"] == summary["acc_mean"]  # exact kept
    assert run.data.metrics["mb"] == 3.73 and run.data.metrics["mb_total"] == summary["mb_total"]
    assert "acc_val" not in run.data.metrics and "acc_val_mean" not in run.data.metrics  # NaN: not measured


def test_a_view_saved_before_the_short_names_keeps_its_columns_under_them(tmp_path):
    """A staged sweep started before the display copies existed has a view naming acc_mean: its
    next stage's view shows acc (and the knobs the earlier view showed)."""
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}")
    experiment_id = client.create_experiment(STUDY, artifact_location=(tmp_path / "art").as_uri())
    old = {"selectedColumns": ["params.`lr`", "metrics.`acc_mean`", "metrics.`mb_total`"]}
    client.set_experiment_tag(experiment_id, view.VIEW_TAG_PREFIX + view.view_id("staged"),
                              view.view_envelope("sweep staged", old, 1, 1))
    view.save_sweep_view(client, experiment_id, "staged", [tiny(seed=0), tiny(seed=1)])
    state = view.read_view(client.get_experiment(experiment_id).tags[view.VIEW_TAG_PREFIX + view.view_id("staged")])
    assert state["selectedColumns"] == ["metrics.`acc`", "params.`lr`", "params.`pers_rate`", "params.`pers_limit`",
                                        "params.`seed`", "metrics.`mb`"]
