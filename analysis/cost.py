"""PerFedMask's table: accuracy before and after fine-tuning, per participation rate c, beside each
method's training cost (the poster's Tables 1-3 in one).

`tables/cost.tex` (written by analysis.tables.build_tables when the results hold methods that
report their training cost, or with `--table cost`):
- rows: methods (with several data settings: one block of rows per setting);
- per c (`participation`): accuracy before fine-tuning (`acc_global`: the model a device holds
  after the last round) and after (`acc`: its fine-tuned copy), final round, mean ± std over seeds,
  in %, the best after-FT cell of each column in bold;
- cost: trainable parameters (entries a device's local update changes: a frozen head and frozen
  groups are not counted), forward and backward FLOPs per training sample (torch's counter,
  convolutions and matrix products, 1 multiply-add = 2 FLOPs; no weight gradient for a frozen
  layer), each the mean over devices, from the clients' own rows.
Finished trials only; where a method has several configurations in a cell, the one with the best
final accuracy (mean over seeds).
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from analysis.load import load_rounds, unfinished
from analysis.plots import best_trials
from analysis.render import MISSING, write_grouped_table
from analysis.tables import TableError, _methods_order, _settings_order, counted
from fl_core.results import across_seeds, setting_label

COST = ("trainable_params", "fwd_mflops", "bwd_mflops")
COST_HEADERS = {"trainable_params": "Params (K)", "fwd_mflops": "Fwd MFLOPs", "bwd_mflops": "Bwd MFLOPs"}


def cost_wanted(trials: pd.DataFrame) -> bool:
    """Whether some finished trial reported its training cost."""
    if trials.empty or "trainable_params_mean" not in trials.columns:
        return False
    return bool((trials["trainable_params_mean"].notna() & ~unfinished(trials)).any())


def _c_label(c: float) -> str:
    return f"c = {c:g}"


def device_costs(sweeps, hashes) -> pd.DataFrame:
    """Per (config_hash, client): each cost's last reported value (a device reports its cost in
    the rounds it trains)."""
    rows = load_rounds(sweeps, columns=[*COST, "method", "setting"], trials=hashes)
    rows = rows.dropna(subset=["trainable_params"]).sort_values("round")
    return rows.groupby(["config_hash", "client"])[list(COST)].last().reset_index()


def _pm(values) -> str | None:
    mean, std, n = across_seeds(np.asarray(values, dtype=float) * 100)
    return None if n == 0 else f"{mean:.1f}" if n == 1 else f"{mean:.1f} ± {std:.1f}"


def cost_table(sweeps, trials: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame, str]:
    """(cell texts, bold mask, caption); see the module docstring."""
    trials = counted(trials, "drop")
    late = unfinished(trials)
    finished = trials[~late & trials.get("trainable_params_mean", pd.Series(np.nan, index=trials.index)).notna()]
    if finished.empty:
        raise TableError("cost table: no finished trial reported its training cost (trainable_params)")
    finished = finished.assign(participation=finished["participation"].astype(float))
    rates = sorted(finished["participation"].unique(), reverse=True)
    chosen = pd.concat([best_trials(finished[finished["participation"] == c]) for c in rates])
    # the data setting without its participation rate (c is this table's column groups)
    chosen["setting"] = [setting_label(row | {"participation": 1.0}) for row in chosen.to_dict("records")]
    # A device's cost does not depend on c or the seed, but under c < 1 only sampled devices
    # report it: pool the method's trials, one value per device, then average over devices.
    devices = device_costs(sweeps, chosen["config_hash"]).merge(chosen[["config_hash", "setting", "method"]])
    cost_of = devices.groupby(["setting", "method", "client"])[list(COST)].first().groupby(["setting", "method"]).mean()
    settings, methods = _settings_order(chosen), _methods_order(chosen)
    many = len(settings) > 1
    index = pd.MultiIndex.from_product([settings, methods]) if many else pd.Index(methods)
    columns = pd.MultiIndex.from_tuples([(_c_label(c), part) for c in rates for part in ("Before FT", "After FT")]
                                        + [("Cost", COST_HEADERS[k]) for k in COST])
    cells = pd.DataFrame(None, index=index, columns=columns, dtype=object)
    bold = pd.DataFrame(False, index=index, columns=columns)
    for setting in settings:
        for method in methods:
            row = (setting, method) if many else method
            mine = chosen[(chosen["setting"] == setting) & (chosen["method"] == method)]
            for c in rates:
                at = mine[mine["participation"] == c]
                cells.loc[row, (_c_label(c), "Before FT")] = _pm(at["acc_global_mean"]) if len(at) else None
                cells.loc[row, (_c_label(c), "After FT")] = _pm(at["acc_mean"]) if len(at) else None
            if (setting, method) in cost_of.index:
                cost = cost_of.loc[(setting, method)]
                cells.loc[row, ("Cost", "Params (K)")] = f"{cost['trainable_params'] / 1e3:.1f}"
                cells.loc[row, ("Cost", "Fwd MFLOPs")] = f"{cost['fwd_mflops']:.3f}"
                cells.loc[row, ("Cost", "Bwd MFLOPs")] = f"{cost['bwd_mflops']:.3f}"
        for c in rates:  # bold: the best mean after fine-tuning per setting and c
            at = chosen[(chosen["setting"] == setting) & (chosen["participation"] == c)]
            means = at.groupby("method")["acc_mean"].mean()
            if len(means):
                best = means.idxmax()
                bold.loc[(setting, best) if many else best, (_c_label(c), "After FT")] = True
    seeds = chosen.groupby(["setting", "method", "participation"])["seed"].nunique()
    n = f"{seeds.min()}" if seeds.min() == seeds.max() else f"{seeds.min()}-{seeds.max()}"
    dropped = int(late.sum())
    caption = (f"Accuracy (%) of the devices' models after the last round, before and after fine-tuning, mean ± std "
               f"over seeds ({n} per cell), best after fine-tuning in bold; c = share of devices per round. "
               f"Cost, mean over devices: trainable parameters (a frozen head and frozen layer groups excluded) and "
               f"FLOPs per training sample (1 multiply-add = 2 FLOPs; convolutions and matrix products; no weight "
               f"gradient for a frozen layer). Each method at its best configuration; finished trials only"
               + (f" ({dropped} unfinished left out)" if dropped else "") + f"; {MISSING} = no result.")
    return cells, bold, caption


def write_cost_table(sweeps, trials: pd.DataFrame, out, markdown: bool = False, echo: bool = False) -> Path:
    """Write `<out>/cost.tex` (and with `markdown` `<out>/cost.md`); returns the .tex file."""
    cells, bold, caption = cost_table(sweeps, trials)
    return write_grouped_table("cost", cells, bold, caption, out, markdown, echo)
