"""FedL2P's tables (Lee et al., NeurIPS 2023; `../shared/papers/fedl2p_neurips2023.txt`, digest §1):
the personalized accuracy of FedL2P, its baselines and its ablations (the paper's Tables 2-5 and 8
in one layout), and the policy FedL2P learned.

A FedL2P study pretrains a model (FedAvg or FedBABU; `stage` "pretrain") and then, starting from
it (`pretrained` = the pretraining's config hash), runs the personalization methods: FT (BN C/G/I)
(`ft`), L2P (`l2p`), FedL2P and its ablations (`fedl2p`), each fine-tuning for e = `ft_epochs`
epochs before a client is scored.

`tables/fedl2p.tex` (written by analysis.tables.build_tables when the results hold such trials,
or with `--table fedl2p`):
- rows: (data setting, [pretraining], [rounds], [clients], e). The pretraining (its method label,
  found by matching `pretrained` to the pretraining trials' `config_hash`) and the rounds appear
  only when the results hold more than one; the clients ("seen": they took part in training,
  "unseen": held out, scored once after the last round) only when some client was unseen. Rows
  never pool settings, pretrainings, round counts, pools or e;
- "Global Acc": the pretrained model before fine-tuning (`acc_global`), the client mean at the
  final round of every personalization trial of the row, averaged per seed (they share their
  seed's pretrained model), then mean ± std over seeds;
- then FT (BN C), FT (BN G), FT (BN I), L2P, FedL2P and the ablations present (BNNet, LRNet with
  β = 1 and β = 0, the IFT meta-gradient; FOMAML+ in sweeps made when IFT was the default): the
  personalized accuracy `acc`, the client mean at the final round of the pool (the last round where
  it has an accuracy), mean ± std over seeds, in %. A method that never ran has no column; a cell
  without a result is "--". A cell that differs significantly from FT (BN C) in its row (the paper's
  fine-tuning baseline) is marked "▲"/"▼"; bold: the best cell of each row (Global Acc excluded) and
  every one not significantly worse (analysis.stats: a paired t-test over 5 or more common seeds,
  none below; per-client accuracies of the row's pool give the descriptive interval of a difference
  over 2-4 seeds). A run that diverged (`diverged` in trials.parquet) is left out of its cell's
  numbers and tests, the cell counting it ("1 of 5 seeds diverged"), and is never bold. Where the
  study reports each run's round with the best mean validation accuracy (`report_round` =
  "best_val"), the seen clients are scored at that round (`reported_round`) instead of the final
  one, and the caption says so.
`tables/fedl2p_policy.tex`: per row of FedL2P, its ablations and L2P (seen clients): the learned
policy at the final round (mean β, share of tensors at rate 0, mean η), the hypergradient time per
client and round, and λ's traffic per client and round (up + down; L2P sends nothing).

Finished trials only; where a method ran several configurations in a row (another lr, say), the
one chosen without test data (`analysis.common.chosen_key`: validation accuracy where there is a
split, else the declared configuration). The seeds, the clients' means and
the formatting are the other tables' (`fl_core.results.across_seeds`, `analysis.render`).
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from analysis.common import TableError, chosen_key, config_knobs, counted, selection_phrase, settings_order
from analysis.load import diverged, load_rounds, reported_rounds, unfinished
from analysis.render import (MISSING, Caption, format_cell, latex_label, reported_round_text, unfinished_note,
                             write_table)
from analysis.stats import compare, final_accuracies, reported_rows
from fl_core.results import MB, across_seeds

PERSONALIZING = ("ft", "l2p", "fedl2p")  # the methods that fine-tune a pretrained model
META = ("l2p", "fedl2p")                 # those that learn a policy (λ)
GLOBAL = "Global Acc"
# the paper's Table 2/3 columns; FT (BN C) twice: ours (the client's statistics of its whole training
# split, fixed) and the authors' (batch statistics in fine-tuning, running estimates at evaluation)
METHODS = ("FT (BN C)", "FT (BN C, authors')", "FT (BN G)", "FT (BN I)", "L2P", "FedL2P")
# FedL2P (IFT): the meta-gradient ablation since FOMAML+ is the default; (FOMAML+): older sweeps' label
ABLATIONS = ("FedL2P (BNNet)", "FedL2P (LRNet, β = 1)", "FedL2P (LRNet, β = 0)", "FedL2P (IFT)", "FedL2P (FOMAML+)")
# the paper's baseline, fine-tuning with the client's BN statistics, as the authors run it and as we do;
# the marks are against those of them a table holds
REFERENCE = ("FT (BN C, authors')", "FT (BN C)")
UNKNOWN = "not in these results"        # a pretraining whose trial the results do not hold
LEVELS = {"setting": "Data setting", "pretraining": "Pretraining", "rounds": "Rounds", "pool": "Clients",
          "ft_epochs": "e"}
POOLS = ("seen", "unseen")
POLICY = {"beta": "β (mean)", "sparsity": "Sparsity (%)", "eta": "η (mean)", "hypergrad": "Hypergrad (s)",
          "lambda_kb": "λ traffic (KB)"}


# ---------------------------------------------------------------- choosing the trials

def personalizing(trials: pd.DataFrame) -> pd.Series:
    """True for the trials of a method that fine-tunes a pretrained model (FT, L2P, FedL2P)."""
    return trials["algorithm"].isin(PERSONALIZING) if "algorithm" in trials else pd.Series(False, index=trials.index)


def fedl2p_wanted(trials: pd.DataFrame) -> bool:
    """Whether the results hold a finished FT, L2P or FedL2P trial with an accuracy."""
    if trials.empty or not {"algorithm", "acc_mean"} <= set(trials.columns):
        return False
    return bool((personalizing(trials) & trials["acc_mean"].notna() & ~unfinished(trials)).any())


def pretraining_labels(trials: pd.DataFrame) -> pd.Series:
    """Per trial, its pretraining's method label (e.g. "FedAvg"), found by matching `pretrained`
    to the config hashes of the trials; where one setting holds two pretraining configurations of
    one method (another lr, say), they are numbered, "FedAvg (1)", "FedAvg (2)". "given weights"
    for a trial started from `init_weights`, `UNKNOWN` for a pretraining the results lack."""
    wanted = trials["pretrained"].fillna("") if "pretrained" in trials else pd.Series("", index=trials.index)
    pre = trials[trials["config_hash"].isin(set(wanted[wanted != ""]))].drop_duplicates("config_hash").copy()
    pre["key"] = _config_key(pre) if len(pre) else pd.Series(dtype=object)
    label = {}
    for _, group in pre.groupby(["setting", "method"], sort=True):
        keys = sorted(group["key"].unique())
        for h, k in zip(group["config_hash"], group["key"]):
            label[h] = group["method"].iloc[0] + (f" ({keys.index(k) + 1})" if len(keys) > 1 else "")
    return wanted.map(lambda h: label.get(h, UNKNOWN) if h else "given weights")


def _config_key(trials: pd.DataFrame) -> pd.Series:
    """A key shared by the seeds of one configuration: its knobs but the seed and the pretrained
    model (each seed has its own)."""
    knobs = [k for k in config_knobs(trials) if k != "init_weights"]
    return trials[knobs].astype(object).map(str).agg("|".join, axis=1)


def study_trials(trials: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(chosen, left out): the finished personalization trials, each with its `pretraining`
    label, one configuration per (setting, pretraining, rounds, e, method) (`common.chosen_key`:
    validation accuracy where there is a split, else the declared configuration; never test
    accuracy); and the unfinished ones left out."""
    trials = counted(trials, "mark")
    trials = trials.assign(pretraining=pretraining_labels(trials))
    mine = trials[personalizing(trials)]
    late = unfinished(mine)
    done = mine[~late].copy()
    if done.empty:
        raise TableError("fedl2p table: no finished FT, L2P or FedL2P trial")
    done["config_key"] = _config_key(done)
    done = done.astype({"rounds": int, "ft_epochs": int})  # whole numbers, also where Parquet read floats
    cell = ["setting", "pretraining", "rounds", "ft_epochs", "method"]
    knobs = config_knobs(done)
    keep = pd.Series(False, index=done.index)
    for _, group in done.groupby(cell, dropna=False, sort=False):  # chosen without test data, as every table
        keep[group.index] = group["config_key"] == chosen_key(group, knobs)
    return done[keep].reset_index(drop=True), mine[late]


def final_scores(rounds: pd.DataFrame, reported: dict | None = None) -> pd.DataFrame:
    """Per (config_hash, pool): the client means of `acc` and `acc_global` at the pool's final
    round (the last one where some client of the pool has an accuracy: unseen clients are scored
    after the last round only), the seen clients at the `reported` round of a run where given
    (`analysis.load.reported_rounds`), and that round. Rows without `pool` are seen clients."""
    pool = rounds["pool"].fillna("seen") if "pool" in rounds else pd.Series("seen", index=rounds.index)
    scored = rounds.assign(pool=pool)[rounds["acc"].notna()]
    unseen = scored["pool"] == "unseen"
    final = pd.concat([reported_rows(scored[~unseen], reported), reported_rows(scored[unseen])])
    return final.groupby(["config_hash", "pool"], as_index=False).agg(
        acc=("acc", "mean"), acc_global=("acc_global", "mean"), round=("round", "first"))


def _shown_levels(chosen: pd.DataFrame, pools) -> list[str]:
    """The row-key columns: setting and e always; pretraining, rounds and clients where they vary."""
    levels = ["setting"]
    levels += [c for c in ("pretraining", "rounds") if chosen[c].nunique(dropna=False) > 1]
    levels += ["pool"] if "unseen" in set(pools) else []
    return levels + ["ft_epochs"]


def _row_order(frame: pd.DataFrame, levels: list[str]) -> list[tuple]:
    settings = {s: i for i, s in enumerate(settings_order(frame))}
    rank = {"setting": settings.get, "pool": lambda p: POOLS.index(p) if p in POOLS else len(POOLS)}
    keys = frame[levels].drop_duplicates().itertuples(index=False, name=None)
    return sorted(keys, key=lambda row: [rank.get(level, lambda v: v)(value) for level, value in zip(levels, row)])


def method_columns(methods) -> list[str]:
    """The method labels present, in the paper's order (Table 2/3, then the ablations of
    Tables 5 and 8), any other label after them alphabetically."""
    present = set(methods)
    known = [m for m in (*METHODS, *ABLATIONS) if m in present]
    return known + sorted(present - set(known))


# ---------------------------------------------------------------- the accuracy table

def fedl2p_table(sweeps, trials: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame, str, pd.DataFrame]:
    """(cell texts, bold mask, caption, summary rows) of `fedl2p.tex`; see the module docstring."""
    chosen, late = study_trials(trials)
    reported = reported_rounds(chosen)
    rounds = load_rounds(sweeps, columns=["acc", "acc_global", "pool", "method", "setting"],
                         trials=chosen["config_hash"])
    scores = final_scores(rounds, reported).merge(chosen.drop(columns=["round"], errors="ignore"), on="config_hash")
    if scores.empty:
        raise TableError("fedl2p table: no per-client accuracies for the chosen trials")
    levels = _shown_levels(chosen, scores["pool"])
    rows = _row_order(scores, levels)
    columns = [GLOBAL, *method_columns(scores["method"])]
    stats, runs = accuracy_cells(scores, levels)
    finals = pd.concat([final_accuracies(rounds, "acc", pool, reported).assign(run=lambda f, p=pool: f["run"] + f"|{p}")
                        for pool in POOLS])
    present = set(scores["method"])
    verdict = compare(runs, finals, tuple(m for m in REFERENCE if m in present), within="row")
    marks = verdict.lookup("marks")
    counts = [n + lost for (_, column), (_, _, n, lost) in stats.items() if column != GLOBAL and n + lost > 0]
    usual = int(pd.Series(counts).mode().min()) if counts else 0
    index = pd.MultiIndex.from_tuples(rows, names=[LEVELS[c] for c in levels])
    cells = pd.DataFrame(None, index=index, columns=columns, dtype=object)
    for i, row in enumerate(rows):  # positional writes: the row index is in table order, not sorted
        for j, column in enumerate(columns):
            mean, std, n, lost = stats.get((row, column), (np.nan, np.nan, 0, 0))
            cells.iat[i, j] = format_cell(mean, std, n, usual, mark=marks.get((row, column), ""), diverged=lost)
    bold = verdict.frame("bold", index, columns, False).astype(bool)
    caption = _caption(chosen, levels, usual, set(counts), late, verdict.caption())
    return cells, bold, caption, verdict.summary("fedl2p")


def accuracy_cells(scores: pd.DataFrame, levels: list[str]) -> tuple[dict, pd.DataFrame]:
    """(stats, runs) of the accuracy table's cells: (row, column) -> (mean, std, n, diverged) over
    the seeds of the runs that did not diverge (`analysis.load.diverged`; the diverged counted),
    Global Acc per seed over its runs (they share their seed's pretrained model); and per row and
    method its runs for `analysis.stats.compare`."""
    stats, runs = {}, []
    lost = diverged(scores)
    for row, group in scores.groupby(levels, sort=False):
        row = row if isinstance(row, tuple) else (row,)
        per_seed = group[~lost[group.index]].groupby("seed")["acc_global"].mean()
        stats[(row, GLOBAL)] = (*across_seeds(per_seed.to_numpy()), 0)
        for method, part in group.groupby("method"):
            out = lost[part.index]
            stats[(row, method)] = (*across_seeds(part.loc[~out, "acc"].to_numpy()), int(out.sum()))
            runs.append(pd.DataFrame({"row": [row] * len(part), "column": method, "seed": part["seed"].to_numpy(),
                                      "value": part["acc"].to_numpy(), "diverged": out.to_numpy(),
                                      "run": (part["config_hash"] + "|" + part["pool"]).to_numpy()}))
    return stats, pd.concat(runs, ignore_index=True)


def _caption(chosen: pd.DataFrame, levels: list[str], usual: int, seeds: set, late: pd.DataFrame,
             tests: str) -> Caption:
    """`fedl2p_table`'s caption; `seeds`: the numbers of seeds run behind the compared cells."""
    count = f"{usual} seed{'s' if usual != 1 else ''} per cell" + ("" if len(seeds) <= 1 else " unless marked (n=k)")
    when = reported_round_text(chosen) or "at the final round"
    parts = ["FedL2P and its baselines by data setting.",
             f"Personalized accuracy (%) after fine-tuning the pretrained model for e epochs, {when}, mean over "
             f"clients, then mean ± std over seeds ({count}).", tests,
             "Global Acc: the pretrained model before fine-tuning (not compared)."]
    if "pool" in levels:
        parts.append("Seen clients took part in training; unseen ones were held out and scored after the last round.")
    if "pretraining" not in levels:
        parts.append(f"Pretraining: {chosen['pretraining'].iloc[0]}.")
    if "rounds" not in levels:
        parts.append(f"Rounds: {int(chosen['rounds'].iloc[0])}.")
    dropped = list(late.reindex(columns=["rounds_done", "rounds"]).itertuples(index=False, name=None))
    parts.append(f"Each method, where it has several configurations, at {selection_phrase(chosen)}; finished "
                 f"trials only; {MISSING} = no result.")
    parts.append(unfinished_note(dropped, dropped=True))
    return Caption(parts)


# ---------------------------------------------------------------- the policy table

def policy_summary(rounds: pd.DataFrame) -> pd.DataFrame:
    """Per trial (`config_hash`) of FedL2P, an ablation or L2P: the mean over seen clients at the
    final round of `beta_mean`, `sparsity` and `eta_mean` (the evaluated policy), and over every
    client-round in which a client ran its meta iterations (`hypergrad_seconds` present) the mean
    hypergradient seconds and the mean λ traffic in KB (`bytes_up + bytes_down`)."""
    seen = rounds["pool"].fillna("seen").ne("unseen") if "pool" in rounds else pd.Series(True, index=rounds.index)
    rows = rounds[seen]
    with_policy = rows[rows["beta_mean"].notna()]
    final = with_policy[with_policy["round"] == with_policy.groupby("config_hash")["round"].transform("max")]
    policy = final.groupby("config_hash").agg(beta=("beta_mean", "mean"), sparsity=("sparsity", "mean"),
                                              eta=("eta_mean", "mean"))
    meta = rounds[rounds["hypergrad_seconds"].notna()]
    sent = (meta["bytes_up"].astype(float) + meta["bytes_down"].astype(float)) / (MB / 1e3)
    work = pd.DataFrame({"hypergrad": meta["hypergrad_seconds"].astype(float), "lambda_kb": sent}) \
        .groupby(meta["config_hash"]).mean()
    return policy.join(work, how="outer").reset_index()


POLICY_FORMAT = {"beta": "{:.3f}", "sparsity": "{:.1f}", "eta": "{:.3g}", "hypergrad": "{:.2f}", "lambda_kb": "{:.1f}"}


def policy_table(sweeps, trials: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame, str]:
    """(cell texts, bold mask (none bold), caption) of `fedl2p_policy.tex`; see the module docstring."""
    chosen, _ = study_trials(trials)
    chosen = chosen[chosen["algorithm"].isin(META)]
    if chosen.empty:
        raise TableError("fedl2p policy table: no finished FedL2P or L2P trial")
    rounds = load_rounds(sweeps, columns=["pool", "participated", "beta_mean", "eta_mean", "sparsity",
                                          "hypergrad_seconds", "bytes_up", "bytes_down", "method", "setting"],
                         trials=chosen["config_hash"])
    for column in ("beta_mean", "eta_mean", "sparsity", "hypergrad_seconds"):
        if column not in rounds:
            rounds[column] = np.nan
    summary = policy_summary(rounds).merge(chosen, on="config_hash")
    if summary.empty:
        raise TableError("fedl2p policy table: the chosen trials report no policy")
    summary["sparsity"] = 100 * summary["sparsity"]
    levels = [c for c in _shown_levels(chosen, ["seen"]) if c != "pool"] + ["method"]
    keys = _row_order(summary, levels[:-1])  # the accuracy table's order, then the methods'
    order = {m: i for i, m in enumerate(method_columns(summary["method"]))}
    pairs = summary[levels].drop_duplicates().itertuples(index=False, name=None)
    rows = sorted(pairs, key=lambda r: (keys.index(r[:-1]), order[r[-1]]))
    index = pd.MultiIndex.from_tuples(rows, names=[LEVELS.get(c, "Method") for c in levels])
    cells = pd.DataFrame(None, index=index, columns=list(POLICY.values()), dtype=object)
    means = summary.groupby(levels)[list(POLICY)].mean()  # over seeds
    for i, row in enumerate(rows):
        for j, key in enumerate(POLICY):
            value = means.loc[row, key]
            cells.iat[i, j] = None if pd.isna(value) else POLICY_FORMAT[key].format(value)
    caption = Caption(["FedL2P's learned policy and its cost, mean over seeds.",
                       "At the final round, mean over seen clients: β (BN mixing: 1 = the client's statistics), "
                       "sparsity (share of parameter tensors with learning rate 0) and η (learning rate, mean over "
                       "tensors) of the policy each client is scored with.",
                       "Over every client-round of meta-training: the hypergradient time (K meta steps, s) and λ's "
                       "traffic (up + down, 1 KB = 1,000 bytes; L2P sends nothing).",
                       f"Each method at the configuration of table fedl2p; {MISSING} = no result."])
    return cells, pd.DataFrame(False, index=index, columns=cells.columns), caption


# ---------------------------------------------------------------- writing

def write_fedl2p_tables(sweeps, trials: pd.DataFrame, out, markdown: bool = False, echo: bool = False,
                        summaries: list | None = None) -> dict[str, Path]:
    """Write `fedl2p.tex` and, when FedL2P or L2P ran, `fedl2p_policy.tex` (with `markdown` also
    their .md); returns name -> .tex file. The accuracy table's summary rows
    (`analysis.stats.Verdict.summary`) are appended to `summaries`."""
    *table, summary = fedl2p_table(sweeps, trials)
    if summaries is not None:
        summaries.append(summary)
    written = {"fedl2p": write_table("fedl2p", *table, out, markdown, echo, latex_label("fedl2p", trials))}
    chosen, _ = study_trials(trials)
    if chosen["algorithm"].isin(META).any():
        written["fedl2p_policy"] = write_table("fedl2p_policy", *policy_table(sweeps, trials), out, markdown, echo,
                                               latex_label("fedl2p_policy", trials))
    return written
