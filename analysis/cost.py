"""PerFedMask's table: accuracy before and after fine-tuning, per participation rate c, beside each
method's training cost (the poster's Tables 1-3 in one).

`tables/cost.tex` (written by analysis.tables.build_tables when the results hold methods that
report their training cost, or with `--table cost`):
- rows: methods (with several data settings: one block of rows per setting);
- per c (`participation`): accuracy before fine-tuning (`acc_global`: the model a device holds
  after the last round) and after (`acc`: its fine-tuned copy), final round (with `report_round`
  "best_val": each run's round with the best mean validation accuracy), mean ± std over seeds,
  in %; a cell that differs significantly from FedAvg+FT's in its column (the poster's baseline
  of fine-tuning after federated training) is marked "▲"/"▼" (a paired t-test over 5 or more
  common seeds; none below); bold: the best after-FT cell of each column and every one not
  significantly worse (analysis.stats);
- cost: trainable parameters (entries a device's local update changes: a frozen head and frozen
  groups are not counted), forward and backward FLOPs per training sample (torch's counter,
  convolutions and matrix products, 1 multiply-add = 2 FLOPs; no weight gradient for a frozen
  layer), each the mean over devices, from the clients' own rows.
A run that diverged is left out of its cell's numbers and tests, the cell counting it ("1 of 5
seeds diverged"; analysis.stats).
Finished trials only; where a method has several configurations in a cell, the one with the best
final accuracy (mean over seeds).
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from analysis.common import TableError, chosen_trials, counted, methods_order, selection_phrase, settings_order
from analysis.load import diverged, load_rounds, reported_rounds, unfinished
from analysis.numbers import pct
from analysis.render import MISSING, Caption, latex_label, reported_round_text, seeds_diverged, write_table
from analysis.stats import compare, final_accuracies
from fl_core.results import across_seeds, setting_label

COST = ("trainable_params", "fwd_mflops", "bwd_mflops")
REFERENCE = "fedavg_ft"   # the marks' reference: FedAvg+FT, under the label its knobs give it here


def reference_label(chosen: pd.DataFrame) -> tuple[str, ...]:
    """FedAvg+FT's label among the chosen trials (a study that holds it to the devices' limits
    names it "FedAvg+FT (weak ×0.5)"), or its plain name where it did not run."""
    labels = sorted(set(chosen.loc[chosen["algorithm"] == REFERENCE, "method"]))
    return tuple(labels[:1]) or ("FedAvg+FT",)


PARTS = {"Before FT": "acc_global", "After FT": "acc"}  # column part -> the accuracy it reports
# HeteroFL and Split-Mix under score_width = "full" (the PerFedMask authors' scoring): "After FT" is
# the full-width model; each device's own fine-tuned sub-model is this part (acc_device), untested
DEVICE_PART, DEVICE_COLUMN = "After FT, own width", "acc_device"
COST_HEADERS = {"trainable_params": "Params (K)", "fwd_mflops": "Fwd MFLOPs", "bwd_mflops": "Bwd MFLOPs"}


def cost_wanted(trials: pd.DataFrame) -> bool:
    """Whether some finished trial reported its training cost."""
    if trials.empty or "trainable_params_mean" not in trials.columns:
        return False
    return bool((trials["trainable_params_mean"].notna() & ~unfinished(trials)).any())


def _width_scored(chosen: pd.DataFrame) -> list[str]:
    """The methods whose trials report a device-width score beside the full-width one."""
    if f"{DEVICE_COLUMN}_mean" not in chosen:
        return []
    return list(dict.fromkeys(chosen.loc[chosen[f"{DEVICE_COLUMN}_mean"].notna(), "method"]))


def _c_label(c: float) -> str:
    return f"c = {c:g}"


def device_costs(sweeps, hashes) -> pd.DataFrame:
    """Per (config_hash, client): each cost's last reported value (a device reports its cost in
    the rounds it trains)."""
    rows = load_rounds(sweeps, columns=[*COST, "method", "setting"], trials=hashes)
    rows = rows.dropna(subset=["trainable_params"]).sort_values("round")
    return rows.groupby(["config_hash", "client"])[list(COST)].last().reset_index()


def _pm(values, marks: str = "", lost: int = 0) -> str | None:
    """The cell of the values (fractions) of its runs that did not diverge; `lost`: those that did."""
    mean, std, n = across_seeds(np.asarray(values, dtype=float))
    if n == 0:
        return seeds_diverged(lost, lost) if lost else None
    text = (pct(mean) if n == 1 else f"{pct(mean)} ± {pct(std)}") + marks
    return text + (f" ({seeds_diverged(lost, n + lost)})" if lost else "")


def accuracy_runs(sweeps, chosen: pd.DataFrame):
    """(runs, finals) for `analysis.stats.compare`: per trial and column part (before / after
    fine-tuning) its accuracy and whether it diverged, in the group (setting, c, part); the
    per-client finals, at each run's reported round, keyed by "<config hash>|<part>"."""
    rounds = load_rounds(sweeps, columns=["acc", "acc_global", "pool"], trials=chosen["config_hash"], labels=False)
    runs, finals = [], []
    for part, column in PARTS.items():
        runs.append(pd.DataFrame({"row": chosen["method"], "seed": chosen["seed"], "value": chosen[f"{column}_mean"],
                                  "column": [(s, _c_label(c), part) for s, c in zip(chosen["setting"],
                                                                                    chosen["participation"])],
                                  "run": chosen["config_hash"] + f"|{part}", "diverged": diverged(chosen)}))
        if column in rounds:
            finals.append(final_accuracies(rounds, column, reported=reported_rounds(chosen))
                          .assign(run=lambda f, p=part: f["run"] + f"|{p}"))
    return pd.concat(runs, ignore_index=True), pd.concat(finals, ignore_index=True) if finals else None


def cost_table(sweeps, trials: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame, str, pd.DataFrame]:
    """(cell texts, bold mask, caption, summary rows); see the module docstring."""
    trials = counted(trials, "drop")
    late = unfinished(trials)
    finished = trials[~late & trials.get("trainable_params_mean", pd.Series(np.nan, index=trials.index)).notna()]
    if finished.empty:
        raise TableError("cost table: no finished trial reported its training cost (trainable_params)")
    finished = finished.assign(participation=finished["participation"].astype(float))
    rates = sorted(finished["participation"].unique(), reverse=True)
    chosen = pd.concat([chosen_trials(finished[finished["participation"] == c]) for c in rates])
    # the data setting without its participation rate (c is this table's column groups)
    chosen["setting"] = [setting_label(row | {"participation": 1.0}) for row in chosen.to_dict("records")]
    # A device's cost does not depend on c or the seed, but under c < 1 only sampled devices
    # report it: pool the method's trials, one value per device, then average over devices.
    devices = device_costs(sweeps, chosen["config_hash"]).merge(chosen[["config_hash", "setting", "method"]])
    cost_of = devices.groupby(["setting", "method", "client"])[list(COST)].first().groupby(["setting", "method"]).mean()
    settings, methods = settings_order(chosen), methods_order(chosen)
    many = len(settings) > 1
    index = pd.MultiIndex.from_product([settings, methods], names=["Data setting", "Method"]) if many \
        else pd.Index(methods, name="Method")
    width_scored = _width_scored(chosen)
    parts = {**PARTS, DEVICE_PART: DEVICE_COLUMN} if width_scored else PARTS
    columns = pd.MultiIndex.from_tuples([(_c_label(c), part) for c in rates for part in parts]
                                        + [("Cost", COST_HEADERS[k]) for k in COST])
    cells = pd.DataFrame(None, index=index, columns=columns, dtype=object)
    verdict = compare(*accuracy_runs(sweeps, chosen), references=reference_label(chosen),
                      ranked=[(s, _c_label(c), "After FT") for s in settings for c in rates])
    marks, bolds = verdict.lookup("marks"), verdict.lookup("bold")
    bold = pd.DataFrame(False, index=index, columns=columns)
    for setting in settings:
        for method in methods:
            row = (setting, method) if many else method
            mine = chosen[(chosen["setting"] == setting) & (chosen["method"] == method)]
            for c, part in [(c, part) for c in rates for part in parts]:
                at, key = mine[mine["participation"] == c], (method, (setting, _c_label(c), part))
                lost = diverged(at)
                values = at.loc[~lost, f"{parts[part]}_mean"].dropna()
                cells.loc[row, (_c_label(c), part)] = (_pm(values, marks.get(key, ""), int(lost.sum()))
                                                       if len(at) and (len(values) or lost.any()) else None)
                bold.loc[row, (_c_label(c), part)] = bool(bolds.get(key, False))
            if (setting, method) in cost_of.index:
                cost = cost_of.loc[(setting, method)]
                cells.loc[row, ("Cost", "Params (K)")] = f"{cost['trainable_params'] / 1e3:.1f}"
                cells.loc[row, ("Cost", "Fwd MFLOPs")] = f"{cost['fwd_mflops']:.3f}"
                cells.loc[row, ("Cost", "Bwd MFLOPs")] = f"{cost['bwd_mflops']:.3f}"
    seeds = chosen.groupby(["setting", "method", "participation"])["seed"].nunique()
    n = f"{seeds.min()}" if seeds.min() == seeds.max() else f"{seeds.min()}-{seeds.max()}"
    dropped, when = int(late.sum()), reported_round_text(chosen) or "after the last round"
    caption = Caption([
        "Accuracy before and after fine-tuning, and training cost.",
        f"Accuracy (%) of the devices' models {when}, before and after fine-tuning, mean ± std over seeds ({n} per "
        "cell); c = share of devices per round.", verdict.caption("after fine-tuning"),
        "Cost, mean over devices: trainable parameters (a frozen head and frozen layer groups excluded) and FLOPs per "
        "training sample (1 multiply-add = 2 FLOPs; convolutions and matrix products; no weight gradient for a frozen "
        "layer).",
        f"Each method at one configuration per cell, chosen without test data ({selection_phrase(chosen)}); finished "
        "trials only" + (f" ({dropped} unfinished left out)" if dropped else "") + f"; {MISSING} = no result.",
        f"\"full width\": scored on the full-width model, as the PerFedMask authors score HeteroFL and Split-Mix FL "
        f"(\"{DEVICE_PART}\": each device's own fine-tuned sub-model, untested)." if width_scored else ""])
    return cells, bold, caption, verdict.summary("cost")


def write_cost_table(sweeps, trials: pd.DataFrame, out, markdown: bool = False, echo: bool = False,
                     summaries: list | None = None) -> Path:
    """Write `<out>/cost.tex` (and with `markdown` `<out>/cost.md`); returns the .tex file. The
    table's summary rows (`analysis.stats.Verdict.summary`) are appended to `summaries`."""
    cells, bold, caption, summary = cost_table(sweeps, trials)
    if summaries is not None:
        summaries.append(summary)
    return write_table("cost", cells, bold, caption, out, markdown, echo, latex_label("cost", trials))
