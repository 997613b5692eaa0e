"""The one result schema: round, client, trial and mask rows, and every summary statistic.

Rows are built here and nowhere else (the CLI, the sweeps, the MLflow sink and `analysis` use
these functions), so they cannot disagree. Every row carries the run's config columns: the
common knobs and the chosen method's own knobs only (never another method's), `config_hash`,
`seed`, `version`, and two labels, `method` (e.g. `FedSelect (layer B)`) and `setting` (e.g.
`digits, Dir(0.1)`), and the method's facts (`fl_core.algorithms.METHOD_FACTS`: which model its
accuracy measures, whether it has a server, whether it communicates), so readers need no name
lists of their own and never the method's code.

Statistics (defined once, here):
- over clients (one round of one trial): unweighted mean and population std (ddof = 0) over
  clients, NaN entries skipped, as the papers report; the test-sample-weighted mean beside it.
  Accuracies are over the seen clients; unseen ones (`pool = "unseen"`, held out of training)
  have their own `acc_unseen_mean`, measured after the last round;
- over seeds (a table cell): mean and sample std (ddof = 1; 0 for a single seed), `across_seeds`;
- traffic: MB = 10^6 bytes; `busiest_mb` = the largest up + down of any one client in the round.

pandas and numpy; torch is imported only through the method registry (labels of old rows,
the names of method knobs).
"""
from __future__ import annotations

import math
import os
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from . import __version__
from .algorithms import METHOD_FACTS

MB = 1e6
STANDARD_CLIENT_COLUMNS = frozenset({
    "round", "client", "participated", "acc_local", "acc_global", "acc", "acc_val", "acc_val_global", "loss",
    "n_train", "n_val", "n_test", "personal_fraction", "bytes_up", "bytes_down", "seconds", "round_seconds", "lr",
    "pool"})
SEED_DDOF = 1


# ---------------------------------------------------------------------------- statistics
def _finite(values: Sequence[float]) -> np.ndarray:
    array = np.asarray(values, dtype=np.float64)
    return array[~np.isnan(array)]


def client_mean(values: Sequence[float]) -> float:
    """Unweighted mean over clients (NaN entries skipped; NaN if none is left)."""
    array = _finite(values)
    return float(array.mean()) if array.size else math.nan


def client_std(values: Sequence[float]) -> float:
    """Population std over clients (ddof = 0; NaN entries skipped)."""
    array = _finite(values)
    return float(array.std(ddof=0)) if array.size else math.nan


def weighted_mean(values: Sequence[float], weights: Sequence[float]) -> float:
    v, w = np.asarray(values, dtype=np.float64), np.asarray(weights, dtype=np.float64)
    keep = ~np.isnan(v)
    return float((v[keep] * w[keep]).sum() / w[keep].sum()) if keep.any() and w[keep].sum() > 0 else math.nan


def across_seeds(values: Sequence[float]) -> tuple[float, float, int]:
    """(mean, sample std with ddof = 1 (0 for one seed), number of seeds) of per-seed results."""
    array = _finite(values)
    if not array.size:
        return math.nan, math.nan, 0
    return float(array.mean()), float(array.std(ddof=SEED_DDOF)) if array.size > 1 else 0.0, int(array.size)


def summarize(rows: pd.DataFrame, by: Sequence[str] = ("config_hash",)) -> pd.DataFrame:
    """Per-round summaries of one or many trials, vectorised: one row per (`by`..., round), with
    `mb_total` cumulative over each trial's rounds. This is the definition of every per-round
    statistic; `summarize_round` and `summarize_trial` are views of it."""
    by = [c for c in by if c in rows.columns]
    keys = [*by, "round"]
    up, down = rows["bytes_up"].astype(float), rows["bytes_down"].astype(float)
    seen = rows["pool"].ne("unseen") if "pool" in rows else pd.Series(True, index=rows.index)

    def only_seen(column):
        return rows[column].astype(float).where(seen)

    acc = only_seen("acc")
    weight = rows["n_test"].astype(float).where(acc.notna())
    frame = pd.DataFrame({k: rows[k] for k in keys}).assign(
        _acc=acc, _wacc=acc * weight, _w=weight, _up=up, _down=down, _sent=up + down,
        _local=only_seen("acc_local"), _global=only_seen("acc_global"),
        _val=only_seen("acc_val") if "acc_val" in rows else math.nan,
        _val_global=only_seen("acc_val_global") if "acc_val_global" in rows else math.nan,
        _unseen=rows["acc"].astype(float).where(~seen),
        _loss=rows["loss"].astype(float), _pf=rows["personal_fraction"].astype(float),
        _part=rows["participated"].astype(float) if "participated" in rows else 1.0,
        _secs=rows["round_seconds"].astype(float) if "round_seconds" in rows else math.nan)
    metrics = method_metric_columns(rows)
    for name in metrics:
        frame[f"_m_{name}"] = rows[name].astype(float)
    g = frame.groupby(keys, sort=True)
    out = pd.DataFrame({
        "acc_mean": g["_acc"].mean(),
        "acc_std": g["_acc"].std(ddof=0),
        "acc_weighted": g["_wacc"].sum(min_count=1) / g["_w"].sum(min_count=1),
        "acc_local_mean": g["_local"].mean(),
        "acc_global_mean": g["_global"].mean(),
        "acc_val_mean": g["_val"].mean(),
        "acc_val_global_mean": g["_val_global"].mean(),
        "acc_unseen_mean": g["_unseen"].mean(),
        "loss_mean": g["_loss"].mean(),
        "personal_fraction_mean": g["_pf"].mean(),
        "personal_fraction_std": g["_pf"].std(ddof=0),
        "participants": g["_part"].sum().astype(int),
        "mb_up": g["_up"].sum() / MB,
        "mb_down": g["_down"].sum() / MB,
        "mb_round": g["_sent"].sum() / MB,
        "busiest_mb": g["_sent"].max() / MB,
        "round_seconds": g["_secs"].first(),
        **{f"{name}_mean": g[f"_m_{name}"].mean() for name in metrics},
    }).reset_index()
    out.insert(out.columns.get_loc("busiest_mb"), "mb_total",
               out.groupby(by)["mb_round"].cumsum() if by else out["mb_round"].cumsum())
    return out


def summarize_round(rows: pd.DataFrame, mb_before: float = 0.0) -> dict[str, float]:
    """The summary of one round of one trial (`rows`: one per client), with `mb_total` counting
    `mb_before` from earlier rounds. The method's own metrics get a `<name>_mean`."""
    summary = summarize(rows, by=()).iloc[0].to_dict()
    summary["mb_total"] = mb_before + summary["mb_round"]
    return _plain(summary)


def summarize_trial(rows: pd.DataFrame) -> list[dict[str, float]]:
    """`summarize_round` for every round of one trial, in round order (cumulative MB)."""
    return [_plain(r) for r in summarize(rows, by=()).to_dict("records")]


def _plain(summary: dict[str, Any]) -> dict[str, Any]:
    """Python numbers (round and participants as ints) instead of numpy scalars."""
    out = {k: (v.item() if hasattr(v, "item") else v) for k, v in summary.items()}
    out["round"], out["participants"] = int(out["round"]), int(out["participants"])
    return out


def method_metric_columns(rows: pd.DataFrame) -> list[str]:
    """Columns a method reported through `LocalStats.metrics`: every numeric column that is not
    a standard column, a knob of any method, a label or an allowed context column."""
    known = STANDARD_CLIENT_COLUMNS | CONFIG_EXTRA_COLUMNS | ROW_CONTEXT_COLUMNS | known_config_columns(rows)
    return [c for c in rows.columns if c not in known and pd.api.types.is_numeric_dtype(rows[c])]


# ---------------------------------------------------------------------------- labels
# The papers' symbols for the knobs that have one (tables, run names); other knobs go by name.
KNOB_SYMBOLS = {"pers_rate": "p", "pers_limit": "α", "ditto_lambda": "λ", "fedpac_lambda": "λ"}


def setting_label(values: Mapping[str, Any]) -> str:
    """A data setting's display name, e.g. `digits, 2 shards`, `mnist, Dir(0.1)`, `digits, iid`,
    `digits, Dir(0.1) by class` (the `dirichlet_class` partition), `mnist_c, a client per domain`,
    `mnist_c, Dir(0.5) per domain`, `mnist, 3 shards, c = 0.1` (a tenth of the clients per round)."""
    partition = values["partition"]
    if partition == "shards":
        split = f"{int(values['shards_per_client'])} shards"
    elif partition == "dirichlet":
        split = f"Dir({float(values['dir_alpha']):g})"
    elif partition == "dirichlet_class":  # the per-class scheme: named apart from the papers' Dir(α)
        split = f"Dir({float(values['dir_alpha']):g}) by class"
    elif partition == "domain":
        split = "a client per domain"
    elif partition == "domain_dirichlet":
        split = f"Dir({float(values['dir_alpha']):g}) per domain"
    else:
        split = str(partition)
    return f"{values['dataset']}{_source_options(values)}, {split}{_unseen_text(values)}{_participation_text(values)}"


def _given(values: Mapping[str, Any], name: str) -> Any:
    """A knob's value in a row, or its default where the row predates the knob (absent or NaN)."""
    from .config import ADDED_KNOBS

    value = values.get(name)
    return ADDED_KNOBS[name] if value is None or (isinstance(value, float) and math.isnan(value)) else value


def _source_options(values: Mapping[str, Any]) -> str:
    """The dataset options that differ from their defaults, e.g. ` (severity 5; clean,fog)`: two
    settings that differ only there never share a table column."""
    from .config import ADDED_KNOBS

    given = {name: _given(values, name) for name in ("severity", "corruptions", "image_size", "domainnet_classes")}
    changed = {name: v for name, v in given.items() if v != ADDED_KNOBS[name]}
    parts = []
    if "severity" in changed:
        parts.append(f"severity {int(changed['severity'])}")
    if "corruptions" in changed:
        parts.append(str(changed["corruptions"]).replace(" ", ""))
    if "image_size" in changed:
        parts.append(f"{int(changed['image_size'])} px")
    if "domainnet_classes" in changed:
        parts.append(f"{changed['domainnet_classes']} classes")
    return f" ({'; '.join(parts)})" if parts else ""


def _participation_text(values: Mapping[str, Any]) -> str:
    """`, c = 0.1` when only a share of the clients takes part in each round (PerFedMask's c): the
    same data under another participation rate is another federation, never one table column."""
    share = values.get("participation")
    if share is None or (isinstance(share, float) and math.isnan(share)) or float(share) >= 1.0:
        return ""
    return f", c = {float(share):g}"


def _unseen_text(values: Mapping[str, Any]) -> str:
    held = [f"unseen {d}" for d in str(_given(values, "unseen_domains")).split(",") if d.strip()]
    if int(_given(values, "unseen_clients")):
        held.append(f"{int(_given(values, 'unseen_clients'))} unseen clients")
    return f", {', '.join(held)}" if held else ""


def add_labels(frame: pd.DataFrame) -> pd.DataFrame:
    """Fill the `method` and `setting` columns of rows written before they existed (results of
    engine v1): `method` from the algorithm and its knobs, `setting` from the data knobs."""
    from .algorithms import get_algorithm, params_class

    frame = frame.copy()
    if "setting" not in frame or frame["setting"].isna().any():
        labels = frame.apply(setting_label, axis=1) if len(frame) else pd.Series(dtype=object)
        frame["setting"] = frame["setting"].fillna(labels) if "setting" in frame else labels

    def method(row) -> str:
        cls = params_class(row["algorithm"])
        own = {f: row[f] for f in cls.__dataclass_fields__ if f in row and not _missing(row[f])}
        return cls(**own).label(get_algorithm(row["algorithm"]).display)

    if len(frame) and ("method" not in frame or frame["method"].isna().any()):
        labels = frame.apply(method, axis=1)
        frame["method"] = frame["method"].fillna(labels) if "method" in frame else labels
    return frame


def _missing(value: Any) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value))


# ---------------------------------------------------------------------------- rows
# Columns a caller may add to rows besides config and numbers (`round_rows(..., **context)`).
ROW_CONTEXT_COLUMNS = frozenset({"sweep", "trial_id", "status", "wall_seconds", "model", "kernels", "cpu_isa"})
CONFIG_EXTRA_COLUMNS = frozenset({"config_hash", "version", "method", "setting", "data_key", *METHOD_FACTS})


def known_config_columns(rows: pd.DataFrame | None = None) -> frozenset[str]:
    """Every knob name of every registered method and the common knobs (so that a method metric
    is never mistaken for a config column, whichever method wrote the rows), and with `rows` the
    knobs their `method_knobs` column names (a method outside the registry)."""
    from .config import COMMON_KNOBS, knob_owners
    return frozenset(COMMON_KNOBS) | frozenset(knob_owners()) | listed_knobs(rows)


def listed_knobs(rows: pd.DataFrame | None) -> frozenset[str]:
    """The method knob names the rows' `method_knobs` column lists (empty without the column)."""
    if rows is None or "method_knobs" not in rows:
        return frozenset()
    return frozenset(name for text in rows["method_knobs"].dropna().unique() for name in str(text).split())


def knob_columns(frame: pd.DataFrame) -> list[str]:
    """The columns of `frame` that are knobs of its runs, common or a method's, a method outside
    the registry included (its rows name its knobs in `method_knobs`), in column order. Every
    reader that tells configurations apart (tables, summaries, MLflow) asks this."""
    known = known_config_columns(frame)
    return [c for c in frame.columns if c in known]


def config_columns(config) -> dict[str, Any]:
    """The config columns of every row of a run (see the module docstring)."""
    cols = config.semantic_dict()
    cols |= {"config_hash": config.config_hash(), "version": __version__, "method": config.label(),
             "setting": setting_label(cols), "data_key": config.data_key()}
    return cols | config.method_facts()


def round_rows(result, config, model: str, **context: Any) -> list[dict[str, Any]]:
    """One row per client of one round: config columns, `context` (e.g. sweep, trial_id), the
    resolved model name, the round's wall time and lr, and the client's numbers."""
    unknown = sorted(set(context) - ROW_CONTEXT_COLUMNS)
    if unknown:
        raise ValueError(f"context column(s) {', '.join(unknown)} are not in ROW_CONTEXT_COLUMNS")
    base = config_columns(config) | context | {"model": model, "round_seconds": result.seconds, "lr": result.lr}
    return [base | row for row in result.rows()]


def client_rows(data, config, **context: Any) -> list[dict[str, Any]]:
    """One row per client: its realised train, validation and test label histograms."""
    base = config_columns(config) | context
    rows = [base | {"client": k, "pool": data.pool(k), "n_train": int(data.train_hist[k].sum()),
                    "n_val": int(data.val_hist[k].sum()), "n_test": int(data.test_hist[k].sum()),
                    "train_label_hist": data.train_hist[k].tolist(),
                    "val_label_hist": data.val_hist[k].tolist(), "test_label_hist": data.test_hist[k].tolist()}
            for k in range(len(data.clients))]
    if getattr(data, "domain_hist", None) is not None:  # feature shift: the client's domain, its (domain, label) counts
        for k, row in enumerate(rows):
            row["domain"] = data.client_domain(k) or "mixed"
            row["train_domain_label_hist"] = data.domain_hist[k].reshape(-1).tolist()  # domain-major, num_classes each
    return rows


def mask_rows(config, masks: Sequence[Mapping[str, Any] | None]) -> list[dict[str, Any]]:
    """Each client's final mask per tensor, bit-packed (np.unpackbits(bits)[:numel] restores it)."""
    base = {"config_hash": config.config_hash(), "seed": config.seed, "version": __version__}
    rows = []
    for k, mask in enumerate(masks):
        for name, m in (mask or {}).items():
            flat = m.detach().cpu().numpy().reshape(-1)
            rows.append(base | {"client": k, "tensor": name, "shape": list(m.shape), "numel": int(flat.size),
                                "bits": np.packbits(flat).tobytes()})
    return rows


# Which evaluated round a trial's accuracies come from: its last, or the one with the best mean
# validation accuracy of the model each rule names (the summary column it is read from).
REPORT_ROUND_KEYS = {"best_val": "acc_val_mean",                # the evaluated (personalized) model
                     "best_val_global": "acc_val_global_mean"}  # the model before fine-tuning (PerFedMask's authors)
REPORT_ROUNDS = ("last", *REPORT_ROUND_KEYS)
ACCURACY_KEYS = ("acc_mean", "acc_std", "acc_weighted", "acc_local_mean", "acc_global_mean", "acc_val_mean",
                 "acc_val_global_mean")
LEARNED, COLLAPSED = 2.0, 1.25          # x chance: a run that reached the first and ends at the second collapsed


def reported_round(history: Sequence[Mapping[str, Any]], report_round: str = "last") -> Mapping[str, Any] | None:
    """The round summary a trial reports: its last evaluated round ("last"), or the evaluated
    round with the best mean validation accuracy of the model the rule names (`REPORT_ROUND_KEYS`;
    the earliest of equal ones, the last evaluated round where none has a validation accuracy);
    None before any evaluation."""
    if report_round not in REPORT_ROUNDS:
        raise ValueError(f"report_round={report_round!r}; choose one of {', '.join(REPORT_ROUNDS)}")
    evaluated = [h for h in history if not math.isnan(h["acc_mean"])]
    key = REPORT_ROUND_KEYS.get(report_round)
    validated = [h for h in evaluated if key is not None and not math.isnan(h.get(key, math.nan))]
    if validated:
        return max(validated, key=lambda h: (h[key], -h["round"]))
    return evaluated[-1] if evaluated else None


def divergence(rounds: pd.DataFrame, history: Sequence[Mapping[str, Any]], chance: float | None = None) -> str:
    """Why a run diverged, "" when it did not: a training loss that became infinite, or NaN in a
    client that took part in the round and had a finite loss before (a NaN loss alone means the
    client did not train that round, as every client a round did not sample), or, given `chance`
    (1 / number of classes), a mean accuracy that ended at or below COLLAPSED x chance after the
    run had learned: its mean accuracy, or that of its model after the communication step
    (`acc_global`: the model a fine-tuning method starts from), reached LEARNED x chance. A method
    scored once, at its last round (FedL2P, FT), is thus seen to collapse too."""
    rows = rounds.sort_values("round", kind="stable")
    loss = rows["loss"].astype(float)
    finite = pd.Series(np.isfinite(loss.to_numpy()), index=rows.index)
    before = finite.groupby(rows["client"]).transform(lambda f: f.shift(fill_value=False).cummax())
    bad = loss[lost_losses(rows, before)]
    if len(bad):
        return f"training loss {bad.iloc[0]} at round {int(rows.loc[bad.index[0], 'round'])}"
    accuracy = [h["acc_mean"] for h in history if not math.isnan(h["acc_mean"])]
    learned = [a for h in history for a in (h["acc_mean"], h.get("acc_global_mean", math.nan)) if not math.isnan(a)]
    if chance and accuracy and fell_to_chance(max(learned), accuracy[-1], chance):
        return f"fell to chance: mean accuracy {accuracy[-1]:.3f} after {max(learned):.3f} (chance {chance:.3f})"
    return ""


def lost_losses(rows: pd.DataFrame, trained_before: pd.Series) -> pd.Series:
    """Per row (a client in a round), whether its training loss is lost: infinite, or NaN in a
    client that took part in the round after a finite loss of its own (`trained_before`). The one
    rule of `divergence` and of a running trial's per-round report (sweeps/trainable.py)."""
    loss = rows["loss"].astype(float)
    took_part = rows["participated"].fillna(True).astype(bool) if "participated" in rows else True
    return np.isinf(loss) | (loss.isna() & trained_before & took_part)


def fell_to_chance(peak: float, accuracy: float, chance: float) -> bool:
    """Whether a run whose best mean accuracy so far is `peak` has collapsed at `accuracy`: it had
    learned (peak >= LEARNED x chance) and is back at chance (accuracy <= COLLAPSED x chance)."""
    return peak >= LEARNED * chance and not math.isnan(accuracy) and accuracy <= COLLAPSED * chance


def trial_row(config, rounds: pd.DataFrame, report_round: str = "last", chance: float | None = None,
              **info: Any) -> dict[str, Any]:
    """One row per trial: config columns, the final round's summary with the accuracies of the
    reported round (`reported_round`; `report_round` names the rule), whether the run diverged
    (`diverged`, `diverged_why`: `divergence`, judged with `chance`, kept as a column) and `info`
    (status, wall time, provenance)."""
    row = config_columns(config)
    if len(rounds):
        history = summarize_trial(rounds)
        final = dict(history[-1])
        reported = reported_round(history, report_round)
        if reported is not None:
            final |= {key: reported[key] for key in ACCURACY_KEYS}
        why = divergence(rounds, history, chance)
        row |= {k: v for k, v in final.items() if k != "round"} | {
            "rounds_done": final["round"], "report_round": report_round,
            "reported_round": reported["round"] if reported is not None else math.nan,
            "diverged": bool(why), "diverged_why": why, "chance": math.nan if chance is None else chance}
    return row | info


# ---------------------------------------------------------------------------- files
def results_problem(path: Path, flag: str = "--results") -> str | None:
    """Why `path` cannot hold the results (None when it can): a file where a folder must be, or a
    folder this user cannot write in."""
    existing = path
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        return f"{flag} {path}: {existing} is a file, not a folder"
    if not os.access(existing, os.W_OK | os.X_OK):
        return f"{flag} {path}: cannot write in {existing} (permission denied)"
    return None


def write_parquet(frame: pd.DataFrame, path: str | os.PathLike) -> Path:
    """Write atomically: a unique temp file in the same folder, then rename over the target."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")
    try:
        frame.to_parquet(tmp, index=False)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return path
