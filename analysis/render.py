"""A table's numbers (per cell, over seeds) and how they are printed: LaTeX (pandas Styler, booktabs)
and a text preview.

A cell is "mean ± std" over seeds in % (one seed: the mean alone), "(n=k)" where its seed count
differs from the table's usual count, "--" where there is no result. A cell that includes a run
which did not reach its last round carries a dagger (LaTeX `$^\\dagger$`, preview "†"), explained
at the end of the caption together with the rounds those runs reached. A table that knows the runs
behind its cells (`Table.runs`, filled by `summarize`) gets its marks and bold from
`analysis.stats.compare`: "▲"/"▼" (and "△"/"▽" for a second reference) where a cell differs
significantly from a reference row of its column (a paired t-test over 5 or more common seeds;
fewer: no mark), bold on the best of its column (or of the table) and every cell not significantly
worse than it; the caption says which test and correction.
Without runs, bold is the best value as printed.

A run that diverged (`diverged` in trials.parquet) is a result, not a number: it is left out of
its cell's mean, std and n and of the tests, and the cell says "(k of n seeds diverged)" after
its numbers, or only "n of n seeds diverged" where every seed did; such a cell is never bold, and
the caption says so once (`analysis.stats.DIVERGED_NOTE`). The caption names the round the
accuracies are at: "Final" where every run reports its last round, else each run's round with
the best mean validation accuracy (`report_round` = best_val; `reported_round_text`).
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from fl_core.results import REPORT_ROUNDS, across_seeds

from .load import diverged as diverged_trials
from .load import report_rules
from .load import unfinished as unfinished_trials
from .numbers import MISSING, as_printed, pct
from .stats import LATEX_MARKS, Verdict, compare

UNFINISHED = ("mark", "drop")  # what a table does with trials that did not finish (see `summarize`)
DAGGER = "†"  # the mark of a cell with unfinished runs (LaTeX: $^\dagger$, see `_latex_text`)


@dataclass
class Table:
    """A table's numbers: `mean`, `std` and `n` (seeds) share one index and columns; `runs`, one row
    per run in a cell (`analysis.stats.compare`'s columns: row, column, seed, value, run),
    `references` (row labels the other rows are tested against) and `finals` (per-client final
    accuracies keyed by run, `analysis.stats.load_final_accuracies`) give the marks and bold."""
    name: str
    mean: pd.DataFrame
    std: pd.DataFrame
    n: pd.DataFrame
    caption: str = ""
    best: str = "column"  # "column": bold the best of each column; "table": the best cell overall
    row_title: str = ""   # the header of the row labels
    notes: list[str] = field(default_factory=list)
    marked: pd.DataFrame | None = None  # True where a cell includes unfinished runs (None: none does)
    footnote: str = ""                  # what the mark means, or what was left out; ends the caption
    runs: pd.DataFrame | None = None    # None: no tests, bold = the best value as printed
    references: tuple[str, ...] = ()
    finals: pd.DataFrame | None = None
    diverged: pd.DataFrame | None = None  # per cell, how many of its runs diverged (left out of mean, std, n)
    reported: str = ""                    # the round the accuracies are at (`reported_round_text`; "": the last)

    _verdict: tuple = field(default=(None, None), repr=False, compare=False)  # (inputs, Verdict): computed once

    def verdict(self) -> Verdict | None:
        """The paired comparisons of the table's cells (None without `runs`), computed once per
        `runs`, `finals`, `references` and `best` (the bootstrap intervals of a large table take a while)."""
        if self.runs is None:
            return None
        inputs = (id(self.runs), id(self.finals), self.references, self.best)
        if self._verdict[0] != inputs:
            self._verdict = (inputs, compare(self.runs, self.finals, self.references,
                                             best="group" if self.best == "column" else "table"))
        return self._verdict[1]

    def lost(self) -> pd.DataFrame:
        """Per cell, how many of its runs diverged (0 where `diverged` is not known)."""
        return self.diverged if self.diverged is not None else self.n * 0

    def seeds(self) -> pd.Series:
        """The seeds run per cell, diverged ones included (n counts the others), of the cells with some."""
        counts = (self.n + self.lost()).stack()
        return counts[counts > 0]

    @property
    def usual_n(self) -> int:
        """The most common number of seeds run behind a cell (0 when the table is empty)."""
        counts = self.seeds()
        return int(counts.mode().min()) if len(counts) else 0

    def seeds_uniform(self) -> bool:
        return self.seeds().nunique() <= 1

    def cells(self, pm: str = "±", dagger: str = DAGGER) -> pd.DataFrame:
        """The cell texts (`format_cell`: "mean ± std", then `dagger` where the cell includes
        unfinished runs, then the significance marks, then "(k of n seeds diverged)" or "(n=k)"
        when k differs from the usual count); None where there is no result."""
        usual = self.usual_n
        verdict = self.verdict()
        marks = verdict.frame("marks", self.mean.index, self.mean.columns, "") if verdict else None
        lost = self.lost()
        text = pd.DataFrame(None, index=self.mean.index, columns=self.mean.columns, dtype=object)
        for row in self.mean.index:
            for col in self.mean.columns:
                mark = dagger if self.marked is not None and bool(self.marked.loc[row, col]) else ""
                mark += marks.loc[row, col] if marks is not None else ""
                text.loc[row, col] = format_cell(self.mean.loc[row, col], self.std.loc[row, col],
                                                 int(self.n.loc[row, col]), usual, pm, mark, int(lost.loc[row, col]))
        text.index.name, text.columns.name = None, self.row_title
        return text

    def best_mask(self) -> pd.DataFrame:
        """True where a cell is bold: with `runs`, `analysis.stats.compare`'s bold; without, where it
        holds the best mean (of its column, or of the table) as printed, to 0.1%, and no run of it
        diverged."""
        verdict = self.verdict()
        if verdict is not None:
            return verdict.frame("bold", self.mean.index, self.mean.columns, False).astype(bool)
        shown = as_printed(self.mean).where(self.lost().eq(0))
        if self.best == "table":
            return shown.eq(shown.max().max()) & shown.notna()
        return shown.eq(shown.max(axis=0), axis=1) & shown.notna()

    def full_caption(self) -> str:
        seeds = self.usual_n
        if self.seeds_uniform():
            count = f"{seeds} seed{'s' if seeds != 1 else ''} per cell"
        else:
            count = f"{seeds} seed{'s' if seeds != 1 else ''} per cell unless marked (n=k)"
        verdict = self.verdict()
        bold = "" if verdict is not None else " best in bold;"
        legend = f"{accuracy_words(self.reported)}, mean ± std over seeds ({count});{bold} -- = no result."
        tests = verdict.caption() if verdict is not None else ""
        return " ".join(part for part in (self.caption, legend, tests, *self.notes, self.footnote) if part)


def summarize(trials: pd.DataFrame, rows: str, cols: str, name: str, row_order=None, col_order=None,
              mode: str = "mark", **extra) -> Table:
    """Mean, std and n over seeds (`across_seeds`) of `acc_mean` for each (rows, cols) cell;
    absent cells get n = 0; each cell's runs (`Table.runs`) for the paired tests. Runs that
    diverged (`analysis.load.diverged`) are left out of the numbers and the tests and counted per
    cell (`Table.diverged`). Unfinished trials (`analysis.load.unfinished`; a diverged one counts
    as diverged) are marked in their cells (`mode` "mark") or left out of them ("drop"); the rows
    and columns stay those of all the trials, and the table's footnote says what was marked or
    left out. The caption names the round the accuracies are at (`reported_round_text`)."""
    if mode not in UNFINISHED:
        raise ValueError(f"unknown mode {mode!r} for unfinished trials; choose from {', '.join(UNFINISHED)}")
    row_order = list(row_order) if row_order is not None else sorted(trials[rows].unique())
    col_order = list(col_order) if col_order is not None else sorted(trials[cols].unique())
    lost = diverged_trials(trials).to_numpy()
    late = (unfinished_trials(trials) & trials["acc_mean"].notna()).to_numpy() & ~lost  # no result: no cell

    def known(name):
        return trials[name] if name in trials else pd.Series(np.nan, index=trials.index)

    reached = list(zip(known("rounds_done")[late], known("rounds")[late]))
    keep = ~late if mode == "drop" else np.ones(len(trials), dtype=bool)
    table = Table(name, *seed_stats(trials[keep & ~lost], rows, cols, row_order, col_order), **extra)
    table.diverged = cell_counts(trials[keep & lost], rows, cols, row_order, col_order)
    table.reported = reported_round_text(trials)
    used = trials[keep & (trials["acc_mean"].notna().to_numpy() | lost)]
    table.runs = pd.DataFrame({"row": used[rows], "column": used[cols], "value": used["acc_mean"],
                               "seed": used["seed"] if "seed" in used else np.arange(len(used)),
                               "run": used["config_hash"] if "config_hash" in used else None,
                               "diverged": diverged_trials(used)})
    if mode == "mark" and late.any():
        table.marked = pd.Series(late, index=trials.index).groupby([trials[rows], trials[cols]]).any() \
            .unstack(cols, fill_value=False).reindex(index=row_order, columns=col_order, fill_value=False).astype(bool)
    table.footnote = unfinished_note(reached, dropped=mode == "drop")
    return table


def seed_stats(trials: pd.DataFrame, rows: str, cols: str, row_order, col_order) -> tuple[pd.DataFrame, ...]:
    """(mean, std, n) over seeds (`across_seeds`) of the trials' `acc_mean` per (rows, cols) cell,
    laid out as row_order x col_order (NaN, NaN, 0 where there is none)."""
    cells = {key: across_seeds(group.to_numpy()) for key, group in trials.groupby([rows, cols])["acc_mean"]}
    index = pd.MultiIndex.from_tuples(list(cells), names=[rows, cols]) if cells else \
        pd.MultiIndex.from_arrays([[], []], names=[rows, cols])
    stats = pd.DataFrame(list(cells.values()), columns=["mean", "std", "count"], index=index, dtype=float)

    def wide(column):
        return stats[column].unstack(cols).reindex(index=row_order, columns=col_order)

    return wide("mean"), wide("std"), wide("count").fillna(0).astype(int)


def cell_counts(trials: pd.DataFrame, rows: str, cols: str, row_order, col_order) -> pd.DataFrame:
    """How many of the trials fall in each (rows, cols) cell, laid out as row_order x col_order."""
    counts = pd.DataFrame(0, index=pd.Index(row_order, name=rows), columns=pd.Index(col_order, name=cols))
    for (row, col), size in trials.groupby([rows, cols]).size().items():
        if row in counts.index and col in counts.columns:
            counts.loc[row, col] = int(size)
    return counts


def format_cell(mean: float, std: float, n: int, usual_n: int, pm: str = "±", mark: str = "",
                diverged: int = 0) -> str | None:
    """"mean ± std" in % over the n seeds that did not diverge (one seed: the mean alone), then
    `mark`, then "(k of N seeds diverged)" where k = `diverged` > 0 (N: every seed run), else
    "(n=k)" where n differs from `usual_n`; only "k of k seeds diverged" where every seed did; None
    where there is no result."""
    if n == 0 or pd.isna(mean):
        return seeds_diverged(diverged, diverged) + mark if diverged else None
    text = pct(mean)
    if n > 1 and not pd.isna(std):
        text += f" {pm} {pct(std)}"
    text += mark
    if diverged:
        text += f" ({seeds_diverged(diverged, n + diverged)})"
    elif n != usual_n:
        text += f" (n={n})"
    return text


def seeds_diverged(diverged: int, seeds: int) -> str:
    """A cell's count of diverged runs, as the cells print it ("1 of 5 seeds diverged")."""
    return f"{diverged} of {seeds} seed{'s' if seeds != 1 else ''} diverged"


REPORTED_TEXT = {"last": "at the final round (report_round = last)",
                 "best_val": "at each run's round with the best mean validation accuracy (report_round = best_val)",
                 "best_val_global": "at each run's round with the best mean validation accuracy before fine-tuning "
                                    "(report_round = best_val_global)"}


def reported_round_text(trials: pd.DataFrame) -> str:
    """The round the trials' accuracies are at, for a caption (`analysis.load.report_rules`): ""
    where every trial reports its last round (the captions' own "final" wording), else
    `REPORTED_TEXT`'s phrase of each rule present, joined by "or" where the trials mix them."""
    rules = set(report_rules(trials))
    if rules <= {"last"}:
        return ""
    order = sorted(rules, key=lambda r: REPORT_ROUNDS.index(r) if r in REPORT_ROUNDS else len(REPORT_ROUNDS))
    return " or ".join(REPORTED_TEXT.get(rule, f"at the round of report_round = {rule}") for rule in order)


def accuracy_words(reported: str, what: str = "personalized accuracy (%)") -> str:
    """The start of a caption's legend: "Final personalized accuracy (%)" for runs at their last
    round (`reported` ""), else e.g. "Personalized accuracy (%) at each run's round with the best
    mean validation accuracy (report_round = best_val)"."""
    return f"Final {what}" if not reported else f"{what[0].upper()}{what[1:]} {reported}"


def to_latex(table: Table, label: str | None = None) -> str:
    """The table as LaTeX: booktabs rules, the bold cells in \\textbf, missing cells "--";
    labelled `tab:<label>` (default: the table's name; `latex_label` makes it unique)."""
    cells = latex_cells(table.cells())
    cells.columns.name = _latex_text(table.row_title)
    return frame_latex(cells, table.best_mask(), table.full_caption(), label or table.name)


def latex_label(name: str, trials: pd.DataFrame) -> str:
    """A table's LaTeX label key, unique per table and sweep: `<sweep>:<name>` (sweeps joined by
    "+" when a table pools several), `name` where the rows name no sweep."""
    sweeps = sorted(trials["sweep"].dropna().astype(str).unique()) if "sweep" in trials else []
    key = f"{'+'.join(sweeps)}:{name}" if sweeps else name
    return re.sub(r"[^A-Za-z0-9:+._-]", "-", key)


# What a document needs to \\input any table `analysis` writes (docs/analysis.md shows it; the
# tests compile every table kind in it): booktabs rules, amssymb's significance marks.
LATEX_PREAMBLE = "\\documentclass{article}\n\\usepackage{booktabs}\n\\usepackage{amssymb}\n"


def frame_latex(cells: pd.DataFrame, bold: pd.DataFrame, caption: str, name: str) -> str:
    """Cell texts (already LaTeX; None for "--") as a booktabs table, the cells where `bold` is
    True in \\textbf; the row and column labels and the plain-text `caption` are made LaTeX-safe.
    One left-aligned column per row level, a row label printed once per group without the
    multirow package (the preamble is `LATEX_PREAMBLE`), labelled `tab:<name>`."""
    styler = cells.style.format(na_rep=MISSING).format_index(_latex_text, axis=0) \
        .format_index(_latex_text, axis=1)
    styler = styler.apply(lambda _: np.where(bold.to_numpy(), "font-weight: bold;", ""), axis=None)
    columns = "l" * cells.index.nlevels + "c" * len(cells.columns)
    return styler.to_latex(hrules=True, convert_css=True, caption=_latex_text(caption), label=f"tab:{name}",
                           position_float="centering", column_format=columns, multirow_align="naive")


def frame_markdown(cells: pd.DataFrame, bold: pd.DataFrame, caption: str) -> str:
    """Cell texts (None for "--") as a Markdown table, the cells where `bold` is True in **bold**,
    the columns' name heading the row labels, then the caption as a paragraph."""
    text = cells.fillna(MISSING).astype(str)
    text = text.where(~bold.to_numpy(), "**" + text + "**")
    header = [cells.columns.name or "", *map(str, cells.columns)]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join([str(label), *row]) + " |" for label, row in zip(text.index, text.to_numpy().tolist())]
    return "\n".join(lines) + f"\n\n{caption}\n"


def _latex_text(text: str) -> str:
    """Plain caption or label text made LaTeX-safe: special characters escaped, then `math_symbols`."""
    text = str(text)
    for char in "%_&#{}$":
        text = text.replace(char, "\\" + char)
    return math_symbols(text)


GREEK_LETTERS = {"α": "alpha", "β": "beta", "γ": "gamma", "δ": "delta", "ε": "epsilon", "ζ": "zeta", "η": "eta",
                 "θ": "theta", "κ": "kappa", "λ": "lambda", "μ": "mu", "ν": "nu", "ξ": "xi", "π": "pi", "ρ": "rho",
                 "σ": "sigma", "τ": "tau", "φ": "phi", "χ": "chi", "ψ": "psi", "ω": "omega", "Δ": "Delta"}
# Every symbol a table's text may hold, as LaTeX that pdflatex takes with the default (OT1) font
# encoding: no Unicode symbol reaches the file, and < > | (which OT1 prints as ¡ ¿ —) go in math.
LATEX_SYMBOLS = {"±": r"$\pm$", DAGGER: r"$^\dagger$", **LATEX_MARKS, "→": r"$\to$", "≤": r"$\le$", "≥": r"$\ge$",
                 "×": r"$\times$", "−": "$-$", "·": r"$\cdot$", "≈": r"$\approx$", "…": r"\dots{}", "–": "--",
                 "—": "---", "<": "$<$", ">": "$>$", "|": r"$|$",
                 **{char: f"$\\{name}$" for char, name in GREEK_LETTERS.items()}}


def math_symbols(text: str) -> str:
    """The symbols of a cell or caption text (`LATEX_SYMBOLS`: ±, †, the significance marks,
    arrows, Greek letters, ...) as LaTeX; one pass, so no replacement is replaced again."""
    return "".join(LATEX_SYMBOLS.get(char, char) for char in str(text))


def latex_cells(cells: pd.DataFrame) -> pd.DataFrame:
    """Plain cell texts (None: no result) with `math_symbols`."""
    return cells.map(math_symbols, na_action="ignore")


def preview(table: Table) -> str:
    """A plain-text rendering (bold cells starred)."""
    cells = table.cells().fillna(MISSING)
    cells = cells.where(~table.best_mask(), cells + " *")
    return f"[{table.name}] {table.full_caption()}  (* = bold)\n{cells.to_string()}"


def to_markdown(table: Table) -> str:
    """A Markdown (GitHub) table, best cells in bold, then the caption as a paragraph."""
    cells = table.cells().fillna(MISSING)
    cells = cells.where(~table.best_mask(), "**" + cells + "**")
    header = [table.row_title or "", *map(str, cells.columns)]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join([str(row), *cells.loc[row].tolist()]) + " |" for row in cells.index]
    return "\n".join(lines) + f"\n\n{table.full_caption()}\n"


def unfinished_note(reached: list[tuple[float, float]], dropped: bool = False) -> str:
    """The caption's sentence on runs that did not finish; `reached` holds, per such run, (its last
    recorded round, its configured rounds), NaN where unknown. `dropped`: the runs were left out of
    the cells instead of marked."""
    if not reached:
        return ""
    where = rounds_reached(reached)
    if dropped:
        runs = f"{len(reached)} run{'s' if len(reached) != 1 else ''}"
        return f"Left out: {runs} that did not finish (reached {where})."
    return (f"{DAGGER} = includes runs that did not finish (stopped early, failed or still running), each at "
            f"the last round it reached: {where}.")


def rounds_reached(reached: list[tuple[float, float]]) -> str:
    """E.g. "round 3 of 5; rounds 4, 7 of 20" (grouped by the configured rounds), and "round
    unknown for k runs" for runs whose results do not say."""
    by_total: dict[int, set[int]] = {}
    unknown = 0
    for done, total in reached:
        if pd.isna(done) or pd.isna(total):
            unknown += 1
        else:
            by_total.setdefault(int(total), set()).add(int(done))
    parts = [f"round{'s' if len(done) > 1 else ''} {', '.join(map(str, sorted(done)))} of {total}"
             for total, done in sorted(by_total.items())]
    if unknown:
        parts.append(f"round unknown for {unknown} run{'s' if unknown != 1 else ''}")
    return "; ".join(parts)


def grouped_markdown(cells: pd.DataFrame, bold: pd.DataFrame, caption: str) -> str:
    """A table with two-level columns (group, part) as Markdown: `group: part` headers, bold cells
    in `**`, rows named by the index (a tuple index joined with " / ")."""
    text = cells.fillna(MISSING).where(~bold, "**" + cells.fillna(MISSING) + "**")
    rows = [" / ".join(map(str, r)) if isinstance(r, tuple) else str(r) for r in text.index]
    header = ["Method", *(f"{group}: {part}" for group, part in cells.columns)]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join([r, *values]) + " |" for r, values in zip(rows, text.to_numpy().tolist())]
    return "\n".join(lines) + f"\n\n{caption}\n"


def write_grouped_table(name: str, cells: pd.DataFrame, bold: pd.DataFrame, caption: str, out,
                        markdown: bool = False, echo: bool = False, label: str | None = None) -> Path:
    """Write `<out>/<name>.tex` (booktabs, each column group centred over its parts) and with
    `markdown` `<out>/<name>.md`; with `echo` print a preview. Returns the .tex file."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{name}.tex"
    latex = latex_cells(cells)
    latex.columns.names = [None, None]
    latex = frame_latex(latex, bold, caption, label or name)
    path.write_text(re.sub(r"\\multicolumn\{(\d+)\}\{r\}", r"\\multicolumn{\1}{c}", latex))
    if markdown:
        path.with_suffix(".md").write_text(grouped_markdown(cells, bold, caption))
    if echo:
        print(grouped_markdown(cells, bold, caption) if markdown else f"[{name}] {caption}\n{cells.fillna(MISSING)}",
              end="\n\n")
    return path
