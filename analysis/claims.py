"""The papers' headline claims, checked against our sweeps: one verdict per claim and data setting.

    python -m analysis.claims RESULTS... [--markdown] [--out FILE]

Each claim names the study that can test it, the table and the comparison of that table it rests
on, and the paper's own numbers (copied from the paper; ../shared/papers/DIGEST.md). The verdict is
read from the table's statistics (`<sweep>/tables/summary.parquet`, written by analysis.tables,
rebuilt here when missing), so it is the very test and correction the table's marks show
(analysis.stats: a paired t-test over 5+ seeds, else Wilcoxon over (client, seed) pairs;
Benjamini-Hochberg within the table):

    better      A is significantly better than the reference B: holds; significantly worse: does
                not hold; neither: inconclusive (no significant difference)
    best        A is the only bold cell (every other cell significantly worse than it): holds; A
                bold with others (ties within noise): inconclusive; A not bold: does not hold.
                Methods the paper itself calls comparable to A (`tied`) may be bold beside it; a
                table with nothing but A and those is not run (there is nothing to beat)
    ref_best    the reference is the only bold cell of the column: holds; bold with others:
                inconclusive; not bold: does not hold
    less_mb     A's busiest node carries less traffic over the run than B's (MB, mean over the
                finished runs; traffic is deterministic given the configuration, so no test): holds
                or does not

A claim whose study is not among RESULTS is listed as "not run".
"""
from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from fl_core.results import write_parquet
from sweeps.spec import load_spec

from .load import DamagedFile, find_sweeps, load_rounds, load_trials
from .stats import SUMMARY

HOLDS, FAILS, UNSURE, NOT_RUN = "holds", "does not hold", "inconclusive", "not run"


@dataclass(frozen=True)
class Claim:
    paper: str
    text: str
    paper_number: str            # the paper's figure for it, as the paper gives it
    studies: tuple[str, ...]     # the study names (study.toml `name`) that test it
    table: str
    kind: str                    # better | best | ref_best | less_mb
    row: str = ""                # A (a method label, a table row)
    reference: str = ""          # B
    tied: tuple[str, ...] = ()   # best: rows the paper calls comparable to A (bold beside it is no objection)
    columns: str = ""            # only the table's columns whose name contains this (e.g. "After FT")
    transposed: bool = False     # the table's methods are its columns and its settings its rows (fedl2p)


CLAIMS = (
    Claim("FedSelect", "FedSelect beats FedAvg", "CIFAR-10: 82.25 vs 27.70 (Table 1)",
          ("fedselect_grid_fmnist", "baselines_fmnist"), "methods", "better", "FedSelect", "FedAvg"),
    Claim("FedSelect", "FedSelect beats Local (local training only)", "CIFAR-10: 82.25 vs 74.60 (Table 1)",
          ("fedselect_grid_fmnist", "baselines_fmnist"), "methods", "better", "FedSelect", "Local"),
    Claim("FedSelect", "FedSelect is the best of all methods", "CIFAR-10: 82.25, next LG-FedAvg 77.65 (Table 1)",
          ("baselines_fmnist",), "methods", "best", "FedSelect"),
    Claim("FedSelect", "GradSelect beats every ablation (least changed, random, layers A-D)",
          "CIFAR-10: 82.25, next Layer A 79.96 (Table 3)", ("ablation_fmnist",), "ablation", "ref_best",
          reference="FedSelect"),
    Claim("DisPFL", "DisPFL beats D-PSGD, the dense decentralized baseline", "not in our copy of the paper",
          ("dispfl_fmnist",), "traffic", "better", "DisPFL", "D-PSGD"),
    Claim("DisPFL", "DisPFL is as accurate as centralized FedAvg or better", "not in our copy of the paper",
          ("dispfl_fmnist",), "methods", "better", "DisPFL", "FedAvg"),
    Claim("DisPFL", "DisPFL's busiest node carries less traffic than FedAvg's server",
          "not in our copy of the paper", ("dispfl_fmnist",), "traffic", "less_mb", "DisPFL", "FedAvg"),
    Claim("DisPFL", "DisPFL's busiest node carries less traffic than D-PSGD's", "not in our copy of the paper",
          ("dispfl_fmnist",), "traffic", "less_mb", "DisPFL", "D-PSGD"),
    Claim("FedSelect", "FedSelect beats FedAvg under feature shift",
          "CIFAR10-C: 72.05 vs 21.35; OfficeHome: 80.51 vs 74.35 (Table 1)", ("feature_shift_fmnist",), "methods",
          "better", "FedSelect", "FedAvg"),
    Claim("FedSelect", "FedSelect beats Local under feature shift",
          "CIFAR10-C: 72.05 vs 69.50; OfficeHome: 80.51 vs 75.60 (Table 1)", ("feature_shift_fmnist",), "methods",
          "better", "FedSelect", "Local"),
    Claim("PerFedMask", "PerFedMask beats FedAvg+FT after fine-tuning", "CIFAR-10: 88.43 vs 84.99 (c = 1), "
          "83.60 vs 71.19 (c = 0.1)", ("perfedmask_fmnist",), "cost", "better", "PerFedMask", "FedAvg+FT",
          columns="After FT"),
    Claim("PerFedMask", "PerFedMask is comparable to FedBABU and beats the other baselines after fine-tuning",
          "CIFAR-10: 88.43, FedBABU 88.20, next HeteroFL 87.33 (c = 1); 83.60, FedBABU 84.27, next Split-Mix "
          "77.76 (c = 0.1)", ("perfedmask_fmnist",), "cost", "best", "PerFedMask", tied=("FedBABU",),
          columns="After FT"),
    Claim("FedL2P", "FedL2P beats FT (BN C)", "CIFAR-10, Dir(0.1), e = 5: 80.33 vs 68.04 (Table 2)",
          ("fedl2p_fmnist",), "fedl2p", "better", "FedL2P", "FT (BN C)", transposed=True),
)


def study_name(sweep: Path) -> str:
    try:
        return load_spec(sweep / "study.toml").name
    except Exception:  # noqa: BLE001 - a folder without a readable study file tests no claim
        return ""


def summary_of(sweep: Path) -> pd.DataFrame:
    """The sweep's tables/summary.parquet, built first (analysis.tables) when it is missing."""
    path = sweep / "tables" / SUMMARY
    if not path.exists():
        from .tables import build_tables

        build_tables([sweep])
    return pd.read_parquet(path) if path.exists() else pd.DataFrame()


def _pct(value) -> str:
    return "--" if pd.isna(value) else f"{100 * value:.1f}"


def _cell(summary: pd.DataFrame, row: str, column: str) -> pd.DataFrame:
    return summary[(summary["row"] == row) & (summary["column"] == column)]


def judge(claim: Claim, summary: pd.DataFrame, column: str, mb: pd.Series | None = None) -> dict:
    """One claim in one column (data setting) of its table: ours, the verdict and the test behind it."""
    part = summary[(summary["table"] == claim.table) & (summary["column"] == column)]
    if claim.kind == "less_mb":
        a, b = (mb.get((m, column)) if mb is not None else None for m in (claim.row, claim.reference))
        if a is None or b is None or pd.isna(a) or pd.isna(b):
            return {"ours": "--", "verdict": NOT_RUN, "test": ""}
        return {"ours": f"{a:.1f} vs {b:.1f} MB", "verdict": HOLDS if a < b else FAILS,
                "test": "traffic is deterministic: no test"}
    target = claim.reference if claim.kind == "ref_best" else claim.row
    mine = _cell(part, target, column)
    if mine.empty:
        return {"ours": "--", "verdict": NOT_RUN, "test": f"{target} not in the table"}
    first = mine.iloc[0]
    ours = f"{_pct(first['mean'])} ± {_pct(first['std'])} (n={int(first['n'])})"
    if claim.kind == "better":
        against = mine[mine["reference"] == claim.reference]
        ref = _cell(part, claim.reference, column)
        if against.empty or ref.empty:
            return {"ours": ours, "verdict": NOT_RUN, "test": f"{claim.reference} not in the table"}
        test = against.iloc[0]
        ours += f" vs {_pct(ref.iloc[0]['mean'])}"
        verdict = {"better": HOLDS, "worse": FAILS}.get(test["marked"], UNSURE)
        detail = "no test possible" if pd.isna(test["p_adjusted"]) else \
            f"{test['test']}, {int(test['pairs'])} pairs, p = {test['p_adjusted']:.2g} (BH-adjusted)"
        return {"ours": ours, "verdict": verdict, "test": detail}
    bold = part.drop_duplicates("row").set_index("row")["bold"].astype(bool)
    if not [r for r in bold.index if r != target and r not in claim.tied]:   # a sweep of A (and its peers) only
        peers = f" (only {', '.join(claim.tied)})" if claim.tied else ""
        return {"ours": ours, "verdict": NOT_RUN, "test": f"nothing else to beat in the table{peers}"}
    others = [r for r in bold.index if r != target and bold[r] and r not in claim.tied]
    verdict = FAILS if not bold.get(target, False) else (UNSURE if others else HOLDS)
    tied = [r for r in claim.tied if bold.get(r, False)]
    detail = "bold = best and not significantly worse than it; " + (
        f"also bold: {', '.join(others)}" if others else "no other cell bold") + (
        f" (bold beside it as the paper's comparable: {', '.join(tied)})" if tied else "")
    return {"ours": ours, "verdict": verdict, "test": detail}


def busiest_mb(sweep: Path) -> pd.Series:
    """(method, setting) -> the busiest node's total MB over the run, mean over the trials."""
    from .load import unfinished
    from .traffic import busiest_node_mb

    trials = load_trials([sweep])
    trials = trials[~unfinished(trials)]  # a run cut short has carried less
    rounds = load_rounds([sweep], trials=trials["config_hash"])
    load = busiest_node_mb(rounds)
    final = load.loc[load.groupby("config_hash")["round"].idxmax()].set_index("config_hash")["busiest_node_mb"]
    trials = trials.assign(mb=trials["config_hash"].map(final))
    return trials.groupby(["method", "setting"])["mb"].mean()


def check_claims(paths) -> pd.DataFrame:
    """One row per (claim, data setting) of the sweeps at `paths`; a claim without its study: not run."""
    sweeps, summaries = {}, {}  # summaries: read (or built) once per sweep, not once per claim
    for sweep in find_sweeps(paths):
        sweeps.setdefault(study_name(sweep), []).append(sweep)
    rows = []
    for claim in CLAIMS:
        found = [s for name in claim.studies for s in sweeps.get(name, [])]
        base = {"paper": claim.paper, "claim": claim.text, "paper_number": claim.paper_number}
        if not found:
            rows.append(base | {"study": ", ".join(claim.studies), "setting": "", "ours": "",
                                "verdict": NOT_RUN, "test": ""})
            continue
        for sweep in found:
            if sweep not in summaries:
                summaries[sweep] = summary_of(sweep)
            summary = summaries[sweep]
            if claim.transposed:  # judge reads methods from `row` and settings from `column`
                summary = summary.rename(columns={"row": "column", "column": "row"})
            mb = busiest_mb(sweep) if claim.kind == "less_mb" else None
            columns = summary.loc[summary["table"] == claim.table, "column"].unique() if not summary.empty else []
            columns = [c for c in columns if claim.columns in c]
            if not len(columns):
                rows.append(base | {"study": sweep.name, "setting": "", "ours": "", "verdict": NOT_RUN,
                                    "test": f"no {claim.table} table"})
            for column in columns:
                rows.append(base | {"study": sweep.name, "setting": column} | judge(claim, summary, column, mb))
    return pd.DataFrame(rows)


def to_markdown(table: pd.DataFrame) -> str:
    header = ["Paper", "Claim", "Paper's number", "Sweep", "Setting", "Ours (mean ± std, vs reference)", "Verdict",
              "Test"]
    keys = ["paper", "claim", "paper_number", "study", "setting", "ours", "verdict", "test"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for row in table[keys].astype(str).to_numpy().tolist():
        row[6] = f"**{row[6]}**"
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m analysis.claims", description=__doc__.split("\n")[0])
    parser.add_argument("results", nargs="+", help="sweep folders or folders of sweeps")
    parser.add_argument("--markdown", action="store_true", help="print a Markdown table (default: plain text)")
    parser.add_argument("--out", type=Path, default=None, help="also write the table to this file (.md or .parquet)")
    args = parser.parse_args(argv)
    try:
        table = check_claims(args.results)
    except (FileNotFoundError, DamagedFile) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    text = to_markdown(table) if args.markdown else table.to_string(index=False)
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
