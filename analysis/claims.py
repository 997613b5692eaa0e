"""The papers' headline claims, tested on our sweeps with the seed as the unit: one verdict per
claim, sweep and data setting.

    python -m analysis.claims [RESULTS...] [--markdown] [--out FILE]

Each `Claim` quotes its paper, names the study (study.toml `name`) that can test it and says what
kind of claim it is (accuracy as a fraction: a margin of 0.01 is one percentage point, pp):

    superiority     A is more accurate than B: the one-sided paired t-test of A − B > 0
    noninferiority  A is not worse than B by the margin m or more: one-sided t-test of A − B > −m
    equivalence     A is comparable to B: two one-sided t-tests (TOST) of |A − B| < m
    best            A is more accurate than every other method of the setting but those the paper
                    calls comparable to it (`tied`): an intersection–union test, its p the largest
                    of the one-sided superiority p-values against each opponent
    less_mb         A's busiest node carries less traffic over the run than B's (MB, mean over the
                    seeds; traffic is deterministic given the configuration, so no test)

The data. From each sweep's trials (`analysis.load`): the finished trials, but those of the
selection stage (the seed a configuration was chosen on is not a fresh seed) and of a
pretraining stage (not a compared method); per data setting and method the configuration that
`analysis.common.chosen_trials` picks (validation accuracy where every trial has it, else the
declared configuration; test accuracy never picks); per seed its final accuracy (`acc_mean`, the
client mean at the round the sweep reports: the last evaluated one, or under report_round =
best_val the one with the best validation accuracy). A diverged run (`diverged`) is left out and
said in the row ("k of n seeds diverged"). A comparison is the per-seed difference over the
seeds both methods ran without diverging (`analysis.paired.difference`). Below `paired.MIN_SEEDS` (5) common seeds
there is no test: inconclusive, "fewer than 5 seeds".

Multiplicity. One paper's tested rows (its claims × sweeps × data settings, every row with a test;
rows without one are not counted) are one family: Holm's step-down correction (`paired.holm`)
runs within each paper, never across papers nor within a table. It runs over the same rows once
for each kind of test read below: the claims' own tests, the tests of the opposite, and (for
superiority claims) the equivalence tests. Verdicts, with alpha = 0.05 on Holm-adjusted p:

    holds           the claim's own test rejects
    opposite        significantly the other way: the two-sided paired t-test finds B better
                    (superiority, non-inferiority), the difference lies beyond ±m (equivalence:
                    `paired.outside`; a significant difference inside the margin is no objection),
                    or some opponent is better (best: the smallest two-sided p among the opponents
                    ahead of A, times the number of opponents, Bonferroni within the row)
    equivalent      (superiority only) no significant difference and TOST within ±m rejects: the
                    claim's margin is printed
    inconclusive    none of these; printed with the smallest true difference the study could have
                    detected with 80 % power (`paired.detectable`, two-sided, alpha = 0.05, before
                    any correction), or with the reason there is no test
    not rerun yet   no sweep of the claim's study at hand, or one not run under the fair protocol
                    (no trial of its selection stage, `stage` == "select": no method was tuned on
                    validation data); the test column says which

less_mb claims read "holds" or "opposite" (A carries as much or more) without a test.

The margin m is 1 pp (`MARGIN`) unless the study file declares its own (`margin`, before the study
runs: sweeps/spec.py); the claims tested on that study's sweeps then use it, and say so in their
type column.
"""
from __future__ import annotations

import argparse
import math
import sys
import tomllib
from dataclasses import dataclass, replace
from pathlib import Path

import pandas as pd

from fl_core.results import write_parquet

from . import paired
from .common import SELECT, chosen_trials, methods_order, selection_phrase, settings_order, stage_column
from .load import DamagedFile, diverged, find_sweeps, load_rounds, load_trials, unfinished
from .numbers import pct

HOLDS, OPPOSITE, EQUIVALENT, UNSURE, NOT_RUN = "holds", "opposite", "equivalent", "inconclusive", "not rerun yet"
SUPERIORITY, NONINFERIORITY, EQUIVALENCE, BEST, LESS_MB = "superiority", "noninferiority", "equivalence", "best", \
    "less_mb"
KINDS = (SUPERIORITY, NONINFERIORITY, EQUIVALENCE, BEST, LESS_MB)
MEASURE = "acc_mean"         # a trial's final accuracy: the client mean at its last evaluated round
PRETRAIN = "pretrain"        # a two-stage study's first stage: models to start from, not compared methods

# The margin of every accuracy claim: 1 percentage point. It is wider than the gaps the PerFedMask
# poster itself calls "comparable" (88.43 vs 88.20 and 83.60 vs 84.27: 0.23 and 0.67 pp), narrower
# than every gap behind a win the claims below quote (the closest: PerFedMask over HeteroFL, 88.43
# vs 87.33 at c = 1: 1.1 pp), and of the order of the seed-to-seed spread of our Fashion-MNIST
# cells (std 0.7-2.4 pp in the archived cells without a diverged seed), so a narrower margin would
# need far more than 5 seeds to establish anything.
MARGIN = 0.01


@dataclass(frozen=True)
class Claim:
    paper: str
    text: str                    # the paper's wording
    paper_number: str            # the paper's figure for it, as the paper gives it
    studies: tuple[str, ...]     # the study names (study.toml `name`) that test it
    kind: str                    # one of KINDS
    method: str                  # A: a method label
    reference: str = ""          # B (every kind but best)
    margin: float = MARGIN       # m, accuracy as a fraction (superiority: for the "equivalent" verdict)
    tied: tuple[str, ...] = ()   # best: the methods the paper calls comparable to A (not opponents)
    source: str = ""             # where the claim is made: the paper (venue) and its table
    setting: str = ""            # only the data settings whose label contains this ("": every one)
    measure: str = MEASURE       # the trials' column compared (FedL2P's unseen pool: acc_unseen_mean)

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f"claim {self.text!r}: unknown kind {self.kind!r}; choose from {', '.join(KINDS)}")
        if not self.method or (self.kind != BEST) != bool(self.reference):
            raise ValueError(f"claim {self.text!r}: a {self.kind} claim names its method"
                             + (" and no reference" if self.kind == BEST else " and its reference"))
        if not 0 < self.margin < 1:
            raise ValueError(f"claim {self.text!r}: the margin is a fraction of accuracy in (0, 1), got {self.margin}")


LABEL_SKEW = ("fedselect_grid_fmnist", "baselines_fmnist")
FEDSELECT_T1 = "FedSelect (CVPR 2024), Table 1"
# The claims below are the original DisPFL paper's; our copy is a reproduction report, which
# neither states them nor compares with D-PSGD.
DISPFL = "DisPFL (Dai et al., ICML 2022), not in our copy (a reproduction report)"
PERFEDMASK = "PerFedMask (ICLR 2023 poster), its table of accuracy after fine-tuning"
PERFEDMASK_STUDIES = ("perfedmask_fmnist", "perfedmask_fmnist_c1")   # c = 0.1 and c = 1

# What each study changes from the paper it tests, in one phrase (the page's table of sweeps); the
# scale (dataset, model, clients) is read from the sweep's trials.
DIFFERS = {
    "fedselect_grid_fmnist": "Fashion-MNIST and LeNet for CIFAR-10 and ResNet-18; 2 local epochs, 60 rounds",
    "baselines_fmnist": "Fashion-MNIST and LeNet for CIFAR-10 and ResNet-18; 40 rounds; 7 of the table's methods",
    "ablation_fmnist": "Fashion-MNIST and LeNet for CIFAR-10 and ResNet-18; 40 rounds; blocks B and C left out",
    "feature_shift_fmnist": "Fashion-MNIST under 4 synthetic corruptions and LeNet-BN for CIFAR10-C / OfficeHome and "
                            "ResNet-18; 60 rounds",
    "dispfl_fmnist": "Fashion-MNIST and a small CNN for CIFAR and ResNet-18; 20 clients, not 100; far fewer rounds",
    "perfedmask_fmnist": "Fashion-MNIST and LeNet for CIFAR-10 and PreResNet-18; 100 images a device; 50 rounds",
    "perfedmask_fmnist_c1": "Fashion-MNIST and LeNet for CIFAR-10 and PreResNet-18; 100 images a device; 20 rounds",
    "fedl2p_fmnist": "Fashion-MNIST (and its corruptions) and LeNet-BN for CIFAR-10 and ResNet-18; 16 clients, "
                     "40 meta rounds, not 500",
    "fedl2p_table1": "Fashion-MNIST and LeNet-BN for CIFAR-10 and ResNet-18; 16 clients, 40 meta rounds, not 500; "
                     "alphas 1000 and 0.1 of four",
}
FEDL2P_NAMES = {"FedL2P (IFT)": "FedL2P (IFT, the paper's meta-gradient)", "FedL2P": "FedL2P (FOMAML+)"}
# FedL2P's rows: (its table, the clients, its number (what differs from ours), our setting, the measure)
FEDL2P_TABLES = (
    ("Table 2", ", under label skew", "CIFAR-10, Dir(0.1), e = 5: 80.33 vs 68.04", "(clean)", MEASURE),
    ("Table 3", ", under feature shift", "CIFAR-10-C, Dir(0.1), e = 15: 89.23 vs 87.25 (ours: e = 5, 4 corruptions)",
     "fmnist_c, ", MEASURE),
    ("Table 4", " on clients unseen in meta-training", "Speech Commands, unseen pool, e = 5: 87.85 vs 62.76", "",
     "acc_unseen_mean"),
)
CLAIMS = (
    # FedSelect [S4]: "FedSelect outperforms recent state-of-the-art PFL algorithms under challenging
    # client data heterogeneity settings"; m = 1 pp (MARGIN) only decides "equivalent"
    Claim("FedSelect", "FedSelect outperforms FedAvg", "CIFAR-10: 82.25 vs 27.70", LABEL_SKEW,
          SUPERIORITY, "FedSelect", "FedAvg", source=FEDSELECT_T1),
    Claim("FedSelect", "FedSelect outperforms Local (local training only)", "CIFAR-10: 82.25 vs 74.60",
          LABEL_SKEW, SUPERIORITY, "FedSelect", "Local", source=FEDSELECT_T1),
    Claim("FedSelect", "In all cases, FedSelect achieves state-of-the-art results: above every baseline",
          "CIFAR-10: 82.25, next LG-FedAvg 77.65", ("baselines_fmnist",), BEST, "FedSelect",
          source=FEDSELECT_T1),
    Claim("FedSelect", "GradSelect outperforms every ablation (least changed, random, layers A-D)",
          "CIFAR-10: 82.25, next Layer A 79.96", ("ablation_fmnist",), BEST, "FedSelect",
          source="FedSelect (CVPR 2024), Table 3"),
    Claim("FedSelect", "FedSelect outperforms FedAvg under feature shift (robust to real-world distributional shifts)",
          "CIFAR10-C: 72.05 vs 21.35; OfficeHome: 80.51 vs 74.35", ("feature_shift_fmnist",),
          SUPERIORITY, "FedSelect", "FedAvg", source=FEDSELECT_T1),
    Claim("FedSelect", "FedSelect outperforms Local under feature shift",
          "CIFAR10-C: 72.05 vs 69.50; OfficeHome: 80.51 vs 75.60", ("feature_shift_fmnist",),
          SUPERIORITY, "FedSelect", "Local", source=FEDSELECT_T1),
    # DisPFL: its numbers are not in our copy (a reproduction report); "as accurate as FedAvg or
    # better" is a non-inferiority claim at m = 1 pp, the same margin as "comparable" elsewhere
    Claim("DisPFL", "DisPFL outperforms D-PSGD, the dense decentralized baseline", "not in our copy of the paper",
          ("dispfl_fmnist",), SUPERIORITY, "DisPFL", "D-PSGD", source=DISPFL),
    Claim("DisPFL", "DisPFL is as accurate as centralized FedAvg or better", "not in our copy of the paper",
          ("dispfl_fmnist",), NONINFERIORITY, "DisPFL", "FedAvg", source=DISPFL),
    Claim("DisPFL", "DisPFL's busiest node carries less traffic than FedAvg's server", "not in our copy of the paper",
          ("dispfl_fmnist",), LESS_MB, "DisPFL", "FedAvg", source=DISPFL),
    Claim("DisPFL", "DisPFL's busiest node carries less traffic than D-PSGD's", "not in our copy of the paper",
          ("dispfl_fmnist",), LESS_MB, "DisPFL", "D-PSGD", source=DISPFL),
    # PerFedMask [S2]: "PerFedMask has comparable performance to FedBABU and outperforms the other
    # baselines in terms of test accuracy after fine-tuning" (every method's accuracy is after
    # fine-tuning); "comparable" at m = 1 pp holds the poster's own gaps (0.23, 0.67 pp). The
    # baselines' labels are those of the studies as the authors run them (the devices' limits).
    Claim("PerFedMask", "PerFedMask outperforms FedAvg+FT in test accuracy after fine-tuning",
          "CIFAR-10: 88.43 vs 84.99 (c = 1), 83.60 vs 71.19 (c = 0.1)", PERFEDMASK_STUDIES, SUPERIORITY,
          "PerFedMask", "FedAvg+FT (weak ×0.5)", source=PERFEDMASK),
    Claim("PerFedMask", "PerFedMask has comparable performance to FedBABU after fine-tuning",
          "CIFAR-10: 88.43 vs 88.20 (c = 1), 83.60 vs 84.27 (c = 0.1)", PERFEDMASK_STUDIES, EQUIVALENCE,
          "PerFedMask", "FedBABU (weak ×0.5)", source=PERFEDMASK),
    Claim("PerFedMask", "PerFedMask outperforms the other baselines in terms of test accuracy after fine-tuning",
          "CIFAR-10: 88.43, next HeteroFL 87.33 (c = 1); 83.60, next Split-Mix 77.76 (c = 0.1)",
          PERFEDMASK_STUDIES, BEST, "PerFedMask", tied=("FedBABU (weak ×0.5)",), source=PERFEDMASK),
    # FedL2P [S1]: "applying FedL2P ... in most cases outperforming FT" against "the most commonly used
    # FT approach, BN C", which the paper's numbers run in the authors' mode (FT (BN C, authors')).
    # Each row is tested for the paper's meta-gradient (FedL2P (IFT)) and for FOMAML+ (FedL2P)
    *(Claim("FedL2P", f"{FEDL2P_NAMES[method]} outperforms FT (BN C), the most commonly used fine-tuning{where}",
            number, ("fedl2p_fmnist",), SUPERIORITY, method, "FT (BN C, authors')",
            source=f"FedL2P (NeurIPS 2023), {table}", setting=setting, measure=measure)
      for table, where, number, setting, measure in FEDL2P_TABLES for method in ("FedL2P (IFT)", "FedL2P")),
    # Table 1: one sweep per pretraining (its name says which), Dir(1000) and Dir(0.1)
    Claim("FedL2P", "FedL2P complements the pretraining method: FedL2P (IFT) outperforms FT (BN C) after FedAvg, "
          "FedBABU and Per-FedAvg (HF) pretraining", "CIFAR-10, e = 15, Dir(1000) / Dir(0.1): FedAvg 65.13 vs 63.04 / "
          "80.28 vs 79.15; FedBABU 66.49 vs 65.00 / 79.58 vs 79.50; Per-FedAvg (HF) 47.58 vs 34.58 / 77.68 vs 77.31 "
          "(ours: e = 5)", ("fedl2p_table1",), SUPERIORITY, "FedL2P (IFT)", "FT (BN C, authors')",
          source="FedL2P (NeurIPS 2023), Table 1"),
    Claim("FedL2P", "FedL2P (IFT) outperforms FT (BN C) with each client's statistics of its whole training split, "
          "fixed (ours: stronger than the authors')", "not in the paper (its FT (BN C) is the authors' mode)",
          ("fedl2p_fmnist",), SUPERIORITY, "FedL2P (IFT)", "FT (BN C)", source="FedL2P (NeurIPS 2023), Tables 2-3"),
)


# ---------------------------------------------------------------- the data

def study_file(sweep: Path) -> dict:
    """The study.toml the sweep saved (checked by the sweep when it ran); {} where there is none or
    it cannot be read: such a folder tests no claim."""
    try:
        return tomllib.loads((sweep / "study.toml").read_text())
    except (OSError, tomllib.TOMLDecodeError):
        return {}


def study_name(sweep: Path) -> str:
    return str(study_file(sweep).get("name", ""))


def study_margin(sweep: Path) -> float | None:
    """The margin the sweep's study file declared for its claims (`margin`, checked by the sweep
    when it read the file), if any."""
    margin = study_file(sweep).get("margin")
    return float(margin) if margin is not None else None


def fair_protocol(trials: pd.DataFrame) -> bool:
    """Whether some method of the sweep was tuned on validation data: a selection stage ran."""
    return bool((stage_column(trials) == SELECT).any())


def compared_trials(trials: pd.DataFrame) -> pd.DataFrame:
    """The trials the claims compare (module docstring): finished, neither selection nor
    pretraining stage, one configuration per (setting, method) by `chosen_trials`."""
    stage = stage_column(trials)
    keep = trials[~stage.isin([SELECT, PRETRAIN]) & ~unfinished(trials)]
    return chosen_trials(keep) if len(keep) else keep


def scale(chosen: pd.DataFrame, setting: str) -> str:
    """The setting's size as run, from its trials' columns: e.g. "fmnist, lenet, 10 clients x 100
    images" (what a frame lacks is left out)."""
    from fl_core.data.catalog import input_shape_of
    from fl_core.models import resolve_model_name

    here = chosen[chosen["setting"] == setting]
    if not len(here) or "dataset" not in here:
        return ""
    first = here.iloc[0].to_dict()
    parts = [str(first["dataset"])]
    if isinstance(first.get("model"), str):
        size = first.get("image_size")
        try:
            shape = input_shape_of(first["dataset"], None if pd.isna(size) else int(size))
            parts.append(resolve_model_name(first["model"], shape))
        except (KeyError, ValueError):
            parts.append(first["model"])
        width = first.get("model_width")
        if width is not None and pd.notna(width) and width != 1:
            parts[-1] += f" at width {width:g}"
    if pd.notna(first.get("num_clients")):
        images = first.get("samples_per_client")
        parts.append(f"{int(first['num_clients'])} clients" + (f" x {int(images)} images" if pd.notna(images) else ""))
    return ", ".join(parts)


def per_seed(chosen: pd.DataFrame, setting: str, method: str, measure: str = MEASURE) -> pd.Series:
    """One method's reported accuracy per seed in one setting (indexed by seed); a diverged run
    (`diverged`) is a result of its own, not a number: left out (`diverged_note` says so)."""
    mine = chosen[(chosen["setting"] == setting) & (chosen["method"] == method)]
    if measure not in mine:
        return pd.Series(dtype=float)
    return mine[~diverged(mine)].groupby("seed")[measure].mean().dropna()


def diverged_note(chosen: pd.DataFrame, setting: str, methods) -> str:
    """e.g. "; FedPAC: 1 of 5 seeds diverged (left out)", for each of `methods` with a diverged run."""
    here = chosen[chosen["setting"] == setting]
    notes = [f"{m}: {int(diverged(part).sum())} of {part['seed'].nunique()} seeds diverged (left out)"
             for m in methods if len(part := here[here["method"] == m]) and diverged(part).any()]
    return "".join(f"; {n}" for n in notes)


def busiest_mb(sweep: Path, chosen: pd.DataFrame) -> pd.Series:
    """(method, setting) -> the busiest node's total MB over the run, mean over the chosen trials."""
    from .traffic import busiest_node_mb

    load = busiest_node_mb(load_rounds([sweep], trials=chosen["config_hash"]))
    final = load.loc[load.groupby("config_hash")["round"].idxmax()].set_index("config_hash")["busiest_node_mb"]
    return chosen.assign(mb=chosen["config_hash"].map(final)).groupby(["method", "setting"])["mb"].mean()


# ---------------------------------------------------------------- one row: a claim in a setting

def interval(d: paired.Difference) -> str:
    """A − B and its 95 % interval, in percentage points."""
    if d.n == 0:
        return "--"
    if not math.isfinite(d.ci_low):
        return pct(d.mean, sign=True)
    return f"{pct(d.mean, sign=True)} [{pct(d.ci_low, sign=True)}, {pct(d.ci_high, sign=True)}]"


def untested(reason: str, verdict: str = UNSURE) -> dict:
    """A row without a test (no Holm family member); the reason is its test column."""
    return {"verdict": verdict, "test": reason}


def too_few() -> dict:
    return {"verdict": UNSURE, "test": "no test", "note": f"(fewer than {paired.MIN_SEEDS} seeds)"}


def own_p(claim: Claim, d: paired.Difference) -> float:
    """The p-value of the claim's own test (module docstring)."""
    if claim.kind == NONINFERIORITY:
        return paired.noninferior(d, claim.margin)
    if claim.kind == EQUIVALENCE:
        return paired.equivalence(d, claim.margin)
    return paired.noninferior(d, 0.0)   # superiority: the one-sided test of A − B > 0


TEST_NAMES = {SUPERIORITY: "one-sided paired t-test", NONINFERIORITY: "non-inferiority t-test",
              EQUIVALENCE: "TOST", BEST: "intersection–union test"}


def pair_row(claim: Claim, a: pd.Series, b: pd.Series) -> dict:
    """A claim of A against B in one setting: ours, the difference, and the raw p-values."""
    if a.empty or b.empty:
        return untested(f"no {claim.method if a.empty else claim.reference} trials in this setting")
    d = paired.difference(a, b)
    row = versus(a, b, d)
    if d.n < paired.MIN_SEEDS:
        return row | too_few()
    opposite = paired.outside(d, claim.margin) if claim.kind == EQUIVALENCE else d.p
    return row | {"p_claim": own_p(claim, d), "p_opposite": opposite, "sd": d.sd, "mean": d.mean,
                  "p_equivalence": paired.equivalence(d, claim.margin) if claim.kind == SUPERIORITY else math.nan}


def best_row(claim: Claim, a: pd.Series, rivals: dict[str, pd.Series]) -> dict:
    """A best claim in one setting: the intersection–union test over every opponent, shown against
    the one it rests on (the largest one-sided p; without a test, the closest mean)."""
    if not rivals:
        return untested("no other method to beat in this setting")
    diffs = {name: paired.difference(a, b) for name, b in rivals.items()}
    n = min(d.n for d in diffs.values())
    if n < paired.MIN_SEEDS:
        shown = min(diffs, key=lambda name: diffs[name].mean if diffs[name].n else -math.inf)
        return versus(a, rivals[shown], diffs[shown], f"{shown}, the closest of {len(rivals)}") | \
            {"seeds": n} | too_few()
    one_sided = {name: paired.noninferior(d, 0.0) for name, d in diffs.items()}
    shown = max(one_sided, key=one_sided.get)
    ahead = [d.p for d in diffs.values() if d.mean < 0]   # opponents better than A on average
    d = diffs[shown]
    return versus(a, rivals[shown], d, f"{shown}, the least beaten of {len(rivals)}") | \
        {"seeds": n, "p_claim": one_sided[shown], "p_opposite": min(1.0, len(diffs) * min(ahead)) if ahead else 1.0,
         "sd": d.sd, "mean": d.mean, "p_equivalence": math.nan}


def versus(a: pd.Series, b: pd.Series, d: paired.Difference, name: str = "") -> dict:
    """Ours (A's and B's means over their common seeds, %) and A − B with its interval (pp)."""
    common = a.index.intersection(b.index)
    return {"ours": f"{pct(a[common].mean())} vs {pct(b[common].mean())}" + (f" ({name})" if name else ""),
            "difference": interval(d), "seeds": d.n}


def traffic_row(claim: Claim, mb: pd.Series, setting: str) -> dict:
    a, b = (mb.get((m, setting), math.nan) for m in (claim.method, claim.reference))
    if not (math.isfinite(a) and math.isfinite(b)):
        return untested(f"no {claim.method if not math.isfinite(a) else claim.reference} traffic in this setting")
    return {"ours": f"{a:.1f} vs {b:.1f} MB", "difference": f"{a - b:+.1f} MB",
            "verdict": HOLDS if a < b else OPPOSITE, "test": "traffic is deterministic: no test"}


def setting_row(claim: Claim, chosen: pd.DataFrame, setting: str, mb: pd.Series | None) -> dict:
    """One claim in one data setting of a sweep run under the fair protocol."""
    if claim.kind == LESS_MB:
        return traffic_row(claim, mb, setting)
    a = per_seed(chosen, setting, claim.method, claim.measure)
    if claim.kind != BEST:
        row = pair_row(claim, a, per_seed(chosen, setting, claim.reference, claim.measure))
        return with_divergence(row, chosen, setting, (claim.method, claim.reference))
    if a.empty:
        return untested(f"no {claim.method} trials in this setting")
    here = chosen[chosen["setting"] == setting]
    rivals = [m for m in methods_order(here) if m != claim.method and m not in claim.tied]
    row = best_row(claim, a, {m: per_seed(chosen, setting, m, claim.measure) for m in rivals})
    return with_divergence(row, chosen, setting, (claim.method, *rivals))


def with_divergence(row: dict, chosen: pd.DataFrame, setting: str, methods) -> dict:
    """The row with its methods' diverged seeds said after ours (never averaged in)."""
    note = diverged_note(chosen, setting, methods)
    return row | {"ours": f"{row.get('ours', '')}{note}"} if note else row


def sweep_rows(claim: Claim, sweep: Path, data: dict) -> list[dict]:
    """A claim's rows in one sweep: one per data setting holding one of its methods."""
    if not data["fair"]:
        return [{"setting": ""} | untested("not run under the fair protocol: no selection stage (no method tuned "
                                          "on validation data)", NOT_RUN)]
    chosen = data["chosen"]
    mine = chosen[chosen["method"].isin([claim.method, claim.reference])]
    mb = busiest_mb(sweep, chosen) if claim.kind == LESS_MB and len(mine) else None
    rows = [{"setting": s, "scale": scale(chosen, s)} | setting_row(claim, chosen, s, mb)
            for s in settings_order(mine) if claim.setting in s] if len(mine) else []
    names = " or ".join(m for m in (claim.method, claim.reference) if m)
    return rows or [{"setting": ""} | untested(f"no {names} trials in this sweep")]


def sweep_data(sweep: Path) -> dict:
    """What every claim reads of one sweep: whether it ran under the fair protocol, the chosen
    trials, and how they were chosen."""
    trials = load_trials([sweep])
    fair = fair_protocol(trials)
    chosen = compared_trials(trials) if fair else trials.iloc[:0]
    return {"fair": fair, "chosen": chosen,
            "selection": selection_phrase(chosen) if len(chosen) else ""}


def kind_text(claim: Claim) -> str:
    m = f"{100 * claim.margin:g} pp"
    tied = f", {', '.join(claim.tied)} comparable" if claim.tied else ""
    return {SUPERIORITY: f"superiority (equivalent: ±{m})", NONINFERIORITY: f"non-inferiority, m = {m}",
            EQUIVALENCE: f"equivalence, ±{m}", BEST: f"best (intersection–union{tied})",
            LESS_MB: "less traffic"}[claim.kind]


COLUMNS = ("paper", "source", "claim", "type", "paper_number", "study", "setting", "scale", "differs", "ours",
           "difference", "seeds", "test", "holm_p", "verdict", "note", "kind", "margin", "mean", "sd", "p_claim",
           "p_opposite", "p_equivalence", "selection")


def check_claims(paths=(), claims=CLAIMS) -> pd.DataFrame:
    """One row per (claim, sweep, data setting) of the sweeps at `paths` (none: every claim is
    not rerun yet), with its verdict (module docstring)."""
    by_study: dict[str, list[Path]] = {}
    for sweep in find_sweeps(paths) if paths else []:
        by_study.setdefault(study_name(sweep), []).append(sweep)
    loaded: dict[Path, dict] = {}
    rows = []
    for claim in claims:
        base = {"paper": claim.paper, "source": claim.source, "claim": claim.text, "type": kind_text(claim),
                "kind": claim.kind, "paper_number": claim.paper_number, "margin": claim.margin}
        found = [s for name in claim.studies for s in by_study.get(name, [])]
        if not found:
            rows.append(base | {"study": "", "setting": ""}
                        | untested(f"no sweep of study {' or '.join(claim.studies)} at hand", NOT_RUN))
        for sweep in found:
            data = loaded.setdefault(sweep, sweep_data(sweep))
            mine = claim if (m := study_margin(sweep)) is None else replace(claim, margin=m)  # declared by the study
            rows += [base | {"study": sweep.name, "selection": data["selection"], "margin": mine.margin,
                             "type": kind_text(mine), "differs": DIFFERS.get(study_name(sweep), "")} | row
                     for row in sweep_rows(mine, sweep, data)]
    return decide(pd.DataFrame(rows).reindex(columns=list(COLUMNS)))


# ---------------------------------------------------------------- Holm within a paper, verdicts

def decide(table: pd.DataFrame) -> pd.DataFrame:
    """Holm within each paper over its tested rows, once per kind of test, then each tested row's
    verdict (rows without a test keep theirs)."""
    table = table.astype({c: float for c in ("p_claim", "p_opposite", "p_equivalence", "mean", "sd", "holm_p")}
                         | {c: object for c in ("verdict", "test", "note")})
    for paper, part in table.groupby("paper", sort=False):
        for column in ("p_claim", "p_opposite", "p_equivalence"):
            table.loc[part.index, "holm_" + column] = paired.holm(part[column].to_numpy())
        table.loc[part.index, "family"] = int(part["p_claim"].notna().sum())
    for i, row in table[table["p_claim"].notna()].iterrows():
        for key, value in verdict_of(row).items():
            table.at[i, key] = value
    return table


def verdict_of(row: pd.Series) -> dict:
    """The verdict of a tested row from its Holm-adjusted p-values (module docstring)."""
    alpha, kind = paired.ALPHA, row["kind"]
    size = int(row["family"])
    family = f"Holm over {row['paper']}'s {size} test{'s' if size > 1 else ''}"
    if row["holm_p_claim"] < alpha:
        return {"verdict": HOLDS, "holm_p": row["holm_p_claim"], "test": f"{TEST_NAMES[kind]}; {family}"}
    against = kind in (EQUIVALENCE, BEST) or row["mean"] < 0
    if against and row["holm_p_opposite"] < alpha:
        test = {BEST: "two-sided paired t-tests, Bonferroni over the opponents",
                EQUIVALENCE: f"t-test of a difference beyond ±{100 * row['margin']:g} pp"
                }.get(kind, "two-sided paired t-test")
        return {"verdict": OPPOSITE, "holm_p": row["holm_p_opposite"], "test": f"{test}; {family}"}
    if kind == SUPERIORITY and row["holm_p_opposite"] >= alpha and row["holm_p_equivalence"] < alpha:
        margin = f"±{100 * row['margin']:g} pp"
        return {"verdict": EQUIVALENT, "holm_p": row["holm_p_equivalence"], "note": f"within {margin}",
                "test": f"TOST {margin}; {family}"}
    power = paired.detectable(row["sd"], int(row["seeds"]))
    return {"verdict": UNSURE, "holm_p": row["holm_p_claim"], "test": f"{TEST_NAMES[kind]}; {family}",
            "note": f"(detectable at 80 % power: ≥ {pct(power)} pp)" if math.isfinite(power) else ""}


# ---------------------------------------------------------------- the page

# The page shows its evidence first: a verdict table of narrow columns (a row per claim, sweep and
# data setting, numbered), each caption above its table; then what stands behind each row (by its
# number), where each claim is made, and what each sweep changes from the paper and how it chose
# its configurations, each said once rather than in every row.
VERDICTS = (("#", "row"), ("Claim", "claim"), ("Sweep", "study"), ("Setting", "setting"), ("Verdict", "verdict"),
            ("A − B, 95 % CI (pp)", "difference"), ("Holm p", "holm_p"), ("Seeds", "seeds"))
DETAILS = (("#", "row"), ("Ours, A vs B (%)", "ours"), ("Test", "test"), ("Type", "type"), ("Scale", "scale"))
SOURCES = (("Claim", "claim"), ("Source", "source"), ("Paper's number", "paper_number"))
SWEEPS = (("Sweep", "study"), ("Differs from the paper", "differs"), ("Configurations compared", "selection"))
HEADER = tuple(h for h, _ in VERDICTS)
NBSP = "\u00a0"
KEYS = ("claim", "study", "setting", "difference", "holm_p", "seeds", "ours", "test", "type", "source",
        "paper_number", "scale", "differs")  # the plain-text output's columns, before the verdict
CAPTIONS = {
    "verdicts": "**Verdicts.** One row per claim, sweep and data setting: the verdict, the difference A − B "
                "between the claim's method and its reference (percentage points, mean over the common seeds, "
                "95 % t interval), the p-value behind the verdict after Holm's correction within the paper, and "
                "the seeds compared. The tables below give each row's numbers and test (by #), each claim's "
                "source and each sweep's differences from the paper.",
    "details": "**Behind each row.** Our accuracies of A and B (%, mean over the common seeds), the test and "
               "its Holm family, the claim's type (its margin), and the scale the sweep ran at.",
    "sources": "**Where each claim is made.** The paper and table, and the paper's own number.",
    "sweeps": "**The sweeps.** What each changes from the paper it tests, and how it chose the configuration "
              "of each method it compares (never on test accuracy).",
}


def cell(row: dict, key: str) -> str:
    value = row[key]
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return ""
    if key in ("seeds", "row"):
        return f"{int(value)}"
    if key == "verdict":
        note = cell(row, "note")
        return f"**{value}**" + (f" {note}" if note else "")
    if key == "difference":  # one unit on the page: a line break never splits the interval
        return str(value).replace(" ", NBSP)
    return f"{value:.2g}" if key == "holm_p" else str(value)


def markdown_table(rows: list[dict], columns: tuple[tuple[str, str], ...], caption: str) -> list[str]:
    """A caption paragraph, then its table (one line per row), then a blank line."""
    lines = [caption, "", "| " + " | ".join(h for h, _ in columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(cell(row, k).replace("|", "\\|") for _, k in columns) + " |" for row in rows]
    return lines + [""]


def to_markdown(table: pd.DataFrame) -> str:
    """The claims page: the verdict table first, then each row's details (by its number), each
    claim's source, and each sweep's differences from the paper and how it chose its configurations."""
    table = table.reindex(columns=list(COLUMNS)).astype(object)
    rows = [row | {"row": i} for i, row in enumerate(table.to_dict("records"), 1)]
    sources = list({(r["claim"], cell(r, "source"), cell(r, "paper_number")): r for r in rows}.values())
    sweeps = list({cell(r, "study"): r for r in rows if cell(r, "study")}.values())
    lines = markdown_table(rows, VERDICTS, CAPTIONS["verdicts"]) + markdown_table(rows, DETAILS, CAPTIONS["details"])
    lines += markdown_table(sources, SOURCES, CAPTIONS["sources"])
    if sweeps:
        lines += markdown_table(sweeps, SWEEPS, CAPTIONS["sweeps"])
    return "\n".join(lines).rstrip("\n") + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m analysis.claims", description=__doc__.split("\n")[0])
    parser.add_argument("results", nargs="*", help="sweep folders or folders of sweeps (none: every claim is "
                                                   "not rerun yet)")
    parser.add_argument("--markdown", action="store_true", help="print a Markdown table (default: plain text)")
    parser.add_argument("--out", type=Path, default=None, help="also write the table to this file (.md or .parquet)")
    args = parser.parse_args(argv)
    try:
        table = check_claims(args.results)
    except (FileNotFoundError, DamagedFile, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    text = to_markdown(table) if args.markdown else table[list(KEYS) + ["verdict", "note"]].to_string(index=False)
    print(text)
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        if args.out.suffix == ".parquet":
            write_parquet(table, args.out)
        else:
            args.out.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
