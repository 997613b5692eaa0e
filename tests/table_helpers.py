"""Helpers for tests/test_tables.py: hand-made trial rows, reading a LaTeX table back, and a small
sweep of round rows in which chosen trials stop early (no Ray)."""
from __future__ import annotations

import re

import pandas as pd

from fl_core.result_files import trials_from_rounds
from sweep_helpers import V1_KNOBS
from sweeps import parquet_sink


def trial(algorithm="fedselect", seed=0, acc=0.5, partition="shards", dataset="synthetic", shards=3, alpha=0.3,
          pers_rate=0.25, pers_limit=0.8, epochs=1, variant="gradselect", block=None, status="COMPLETED"):
    return {"algorithm": algorithm, "dataset": dataset, "partition": partition, "shards_per_client": shards,
            "dir_alpha": alpha, "local_epochs": epochs, "pers_rate": pers_rate, "pers_limit": pers_limit,
            "fedselect_variant": variant, "layer_block": block, "seed": seed, "status": status, "acc_mean": acc}


def body_rows(latex: str) -> dict[str, list[str]]:
    """The body rows of a table: label -> cell texts. A table split into stacked tabulars (too wide
    for one) has its rows joined again: each part repeats the row labels (its `l` columns), taken
    once. Rules and a group's header row (`\\multicolumn`) are not rows."""
    rows: dict[str, list[str]] = {}
    for part, (spec, body) in enumerate(re.findall(r"\\begin\{tabular\}\{([^}]*)\}(.*?)\\end\{tabular\}", latex, re.S)):
        keys = spec.count("l")
        body = body.split("\\midrule", 1)[1].split("\\bottomrule")[0]
        for line in body.strip().splitlines():
            if not line.rstrip().endswith("\\\\") or line.startswith("\\multicolumn"):
                continue
            label, *cells = [c.strip() for c in line.rstrip().removesuffix("\\\\").split(" & ")]
            rows[label] = rows.get(label, []) + cells[keys - 1:] if part else cells
    return rows


def header(latex: str) -> list[str]:
    line = latex.split("\\toprule")[1].split("\\midrule")[0].strip()
    return [c.strip() for c in line.removesuffix("\\\\").split(" & ")]


# Final-round accuracy of each client per (algorithm, seed): Local has one seed, so that leaving
# it out empties its cell. Round r of R scores 0.05 * (R - r) less.
SWEEP_ACC = {("fedselect", 0): [0.9, 0.8, 0.7], ("fedselect", 1): [1.0, 0.9, 0.8],
             ("fedavg", 0): [0.5, 0.4, 0.3], ("fedavg", 1): [0.6, 0.5, 0.4], ("local", 0): [0.7, 0.7, 0.7]}


def write_sweep(folder, stopped=None, rounds=5, with_trials=True, acc=None):
    """A small sweep of round rows (the schema of `write_v1_sweep`, `rounds` rounds configured);
    `stopped`: (algorithm, seed) -> the last round that trial wrote. With `with_trials`, also
    trials.parquet as the launcher writes it: COMPLETED, or STOPPED for a trial that stopped early.
    `acc`: the clients' final accuracies per (algorithm, seed) or (algorithm, seed, partition)
    (default `SWEEP_ACC`; the partition: V1_KNOBS')."""
    stopped = stopped or {}
    for n, ((algorithm, seed, *partition), final) in enumerate((acc or SWEEP_ACC).items()):
        key = f"{n:012x}"
        knobs = V1_KNOBS | {"algorithm": algorithm, "seed": seed, "rounds": rounds} | \
            ({"partition": partition[0]} if partition else {})
        if algorithm != "fedselect":
            knobs |= {"pers_rate": 0.0, "pers_limit": 0.0}
        for rnd in range(1, stopped.get((algorithm, seed), rounds) + 1):
            rows = [knobs | {"config_hash": key, "sweep": folder.name, "round": rnd, "client": k,
                             "acc": acc - 0.05 * (rounds - rnd), "acc_local": acc, "acc_global": acc, "loss": 0.5,
                             "n_train": 40, "n_test": 10, "personal_fraction": 0.0, "bytes_up": 1000,
                             "bytes_down": 1000, "seconds": 0.1, "round_seconds": 0.3} for k, acc in enumerate(final)]
            parquet_sink.write_round(folder, key, rnd, pd.DataFrame(rows))
    if with_trials:
        trials = trials_from_rounds(parquet_sink.read_rounds(folder), status="COMPLETED")
        trials.loc[trials["rounds_done"] < rounds, "status"] = "STOPPED"
        trials.to_parquet(folder / "trials.parquet", index=False)
    return folder


# What the methods table of the finished `write_sweep` prints without its per-client rows (2 seeds:
# no paired test, bold as printed); unchanged by the marking of unfinished trials (the last
# sentence, the models evaluated, came later). A table of the column: the title alone fits the
# caption's 3 lines with the legend, which the note under the table takes with the rest.
FINISHED_LATEX = (r"""\begin{table}
\centering
\caption{Methods by data setting.}
\label{tab:methods}
\begin{tabular}{lc}
\toprule
Method & synthetic, 3 shards \\
\midrule
FedSelect & \bfseries 85.0 $\pm$ 7.1 \\
FedAvg & 45.0 $\pm$ 7.1 \\
Local & 70.0 (n=1) \\
\bottomrule
\end{tabular}
\par\smallskip
{\footnotesize\raggedright Final personalized accuracy (\%), mean $\pm$ std over seeds (2 seeds per cell """
                  r"unless marked (n=k)); -- = no result. $^{\blacktriangle}$/$^{\blacktriangledown}$: significantly "
                  r"better/worse than FedAvg, $^{\vartriangle}$/$^{\triangledown}$: than Local, in the same column. "
                  r"Bold: the best of its column and every cell that prints its value. Cells share fewer than 5 seeds "
                  r"(1--2 in common): no test and no mark, as a test over so few seeds has too little power and the "
                  r"clients of one run are not independent samples. Local epochs = 1. FedSelect at p = 0.25, $\alpha$ "
                  r"""= 0.8. Model evaluated: FedSelect, Local: after local training; FedAvg: after the broadcast.\par}
\end{table}
""")


def docs_sandbox(tmp_path, monkeypatch):
    """scripts/reproduce.py pointed at a docs/results folder and a README under tmp_path (the
    README holding the generated block's markers); returns (docs/results, README)."""
    from scripts import reproduce

    docs, readme = tmp_path / "docs-results", tmp_path / "README.md"
    start, end = reproduce.readme_markers(docs / "default" / reproduce.README_TABLE)
    readme.write_text(f"top\n{start}\n{end}\n")
    monkeypatch.setattr(reproduce, "DOCS_RESULTS", docs)
    monkeypatch.setattr(reproduce, "README", readme)
    return docs, readme
