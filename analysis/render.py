"""A table's numbers (per cell, over seeds) and how they are printed: LaTeX (booktabs, a float laid
out for a two-column paper: `frame_latex`), Markdown (`frame_markdown`) and a text preview.

A cell is "mean ± std" over seeds in % (one seed: the mean alone), "(n=k)" where its seed count
differs from the table's usual count, "--" where there is no result. A cell that includes a run
which did not reach its last round carries a dagger (LaTeX `$^\\dagger$`, preview "†"), explained
at the end of the caption's note together with the rounds those runs reached. A table that knows the runs
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

    def full_caption(self) -> Caption:
        """The caption's sentences (`Caption`): the title (`caption`), what a cell holds, the tests,
        the notes and the footnote on unfinished runs."""
        seeds = self.usual_n
        if self.seeds_uniform():
            count = f"{seeds} seed{'s' if seeds != 1 else ''} per cell"
        else:
            count = f"{seeds} seed{'s' if seeds != 1 else ''} per cell unless marked (n=k)"
        verdict = self.verdict()
        bold = "" if verdict is not None else " best in bold;"
        legend = f"{accuracy_words(self.reported)}, mean ± std over seeds ({count});{bold} -- = no result."
        tests = verdict.caption() if verdict is not None else ""
        return Caption([self.caption, legend, tests, *self.notes, self.footnote])


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


def latex_label(name: str, trials: pd.DataFrame) -> str:
    """A table's LaTeX label key, unique per table and sweep: `<sweep>:<name>` (sweeps joined by
    "+" when a table pools several), `name` where the rows name no sweep."""
    sweeps = sorted(trials["sweep"].dropna().astype(str).unique()) if "sweep" in trials else []
    key = f"{'+'.join(sweeps)}:{name}" if sweeps else name
    return re.sub(r"[^A-Za-z0-9:+._-]", "-", key)


# What a document needs to \\input any table `analysis` writes (docs/analysis.md shows it; the
# tests compile every table kind in it, in its two-column form): booktabs rules, amssymb's marks.
LATEX_PREAMBLE = "\\documentclass{article}\n\\usepackage{booktabs}\n\\usepackage{amssymb}\n"


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


def preview(table: Table) -> str:
    """A plain-text rendering (bold cells starred)."""
    cells = table.cells().fillna(MISSING)
    cells = cells.where(~table.best_mask(), cells + " *")
    return f"[{table.name}] {table.full_caption()}  (* = bold)\n{cells.to_string()}"


def to_latex(table: Table, label: str | None = None) -> str:
    """The table as LaTeX (`frame_latex`), labelled `tab:<label>` (default: the table's name;
    `latex_label` makes it unique)."""
    return frame_latex(table.cells(), table.best_mask(), table.full_caption(), label or table.name)


def to_markdown(table: Table) -> str:
    """The table as Markdown (`frame_markdown`): its caption, the table (best cells in bold), its note."""
    return frame_markdown(table.cells(), table.best_mask(), table.full_caption())


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


def in_order(frame: pd.DataFrame, orders: dict[str, list]) -> pd.DataFrame:
    """`frame`'s rows sorted, stably, by each column of `orders` in turn, a value by its place in the
    column's list (e.g. `analysis.common.settings_order`, then `methods_order`); a value the list
    lacks after those it holds, by its text."""
    ranks = []
    for column, order in orders.items():
        place = {value: i for i, value in enumerate(order)}
        ranks.append([(place.get(v, len(place)), str(v)) for v in frame[column]])
    return frame.iloc[sorted(range(len(frame)), key=lambda i: tuple(rank[i] for rank in ranks))]


# ----------------------------------------------------------------------------- laid out for a paper
#
# Every table is sized for a two-column paper (the article class with `twocolumn`, 10 pt): a `table`
# float where it fits the column, a `table*` across both columns where it fits the text width, and
# otherwise the same `table*` with its value columns split over tabulars stacked under one caption
# (the row labels repeated in each). Widths are estimated from Computer Modern's metrics, so that
# no TeX is needed to choose; tests/test_latex_layout.py compiles every kind of table and finds no
# overfull box. A MultiIndex's first level (the data setting) groups the rows: a header row per
# group in LaTeX, the label in the group's first row in Markdown; every other row label is printed
# only where it changes. The caption keeps the table's title and as many of the sentences after it
# as fit `CAPTION_LINES` lines; the rest is the note under the table (LaTeX: footnote size after
# the tabulars; Markdown: a paragraph after the caption).

COLUMN_WIDTH, TEXT_WIDTH = 229.87, 469.75  # pt: \columnwidth and \textwidth of a two-column article, letter paper
TABCOLSEP = 6.0                            # pt of space on each side of a tabular column
FIT = 0.96                                 # the share of a width an estimated table may take (estimates: within 2 %)
CAPTION_LINES, CAPTION_FILL = 3, 0.9       # a caption's lines, and the share of each its words are sure to fill
CAPTION_LEAD = "Table 99: "                # what LaTeX prints before a caption's text
BOLD = 1.15                                # Computer Modern's bold is about this much wider
# pt per character of Computer Modern Roman at 10 pt (cmr10's metrics), keyed by width
CMR10 = {2.78: " !',.:;[]_`il", 3.06: "fj", 3.33: "-", 3.61: "I", 3.89: "()t", 3.92: "r", 3.94: "s", 4.44: "cez",
         4.72: "?", 5.0: "0123456789\"$*/^ago{}~\\", 5.14: "J", 5.28: "kqvxy", 5.56: "bdhnpuS", 6.11: "Z", 6.25: "L",
         6.53: "F", 6.81: "EP", 7.08: "B", 7.22: "CTw", 7.36: "R", 7.5: "AHNUVXY", 7.64: "D", 7.78: "&+=@KOQ",
         7.85: "G", 8.33: "#%m", 9.17: "M", 10.28: "W"}
# and of the symbols `math_symbols` writes as LaTeX (the marks and the dagger as superscripts)
SYMBOL_WIDTHS = {**{char: 6.0 for char in GREEK_LETTERS}, "Δ": 8.33, "±": 7.78, DAGGER: 4.0, "▲": 6.0, "▼": 6.0,
                 "△": 6.0, "▽": 6.0, "→": 10.0, "≤": 7.78, "≥": 7.78, "×": 7.78, "−": 7.78, "·": 2.78, "≈": 7.78,
                 "…": 13.4, "–": 5.0, "—": 10.0, "<": 7.78, ">": 7.78, "|": 2.78}
CHAR_WIDTHS = {char: width for width, chars in CMR10.items() for char in chars} | SYMBOL_WIDTHS
WIDE = 10.0                                # any other character


def text_width(text: str, bold: bool = False) -> float:
    """The width in pt of a plain (not yet LaTeX) text set in Computer Modern at 10 pt, estimated."""
    return sum(CHAR_WIDTHS.get(char, WIDE) for char in str(text)) * (BOLD if bold else 1.0)


class Caption(str):
    """A caption made of sentences (`parts`); as a text, all of them. The first is the table's title
    and always stays in the caption; `split_caption` moves what does not fit to the note."""

    parts: tuple[str, ...]

    def __new__(cls, parts):
        parts = tuple(str(part).strip() for part in parts if part and str(part).strip())
        made = super().__new__(cls, " ".join(parts))
        made.parts = parts
        return made


def caption_parts(caption: str) -> tuple[str, ...]:
    """A caption's sentences: a `Caption`'s parts, any other text as one."""
    return caption.parts if isinstance(caption, Caption) else tuple(p for p in (str(caption).strip(),) if p)


def split_caption(caption: str, width: float) -> tuple[str, str]:
    """(caption, note) of a float `width` pt wide: the title and the sentences after it while
    `CAPTION_LEAD` and they fill at most `CAPTION_LINES` lines to `CAPTION_FILL` (`text_width`);
    the sentences left, in their order, make the note."""
    parts = caption_parts(caption)
    kept = min(1, len(parts))
    while kept < len(parts) and \
            text_width(CAPTION_LEAD + " ".join(parts[:kept + 1])) <= CAPTION_LINES * CAPTION_FILL * width:
        kept += 1
    return " ".join(parts[:kept]), " ".join(parts[kept:])


def key_text(value) -> str:
    """A row label as printed: a float as `g` (1.0 -> "1"), anything else as its text."""
    return f"{value:g}" if isinstance(value, (float, np.floating)) else str(value)


@dataclass
class Grid:
    """A table's texts as printed: `groups`, per row its group's label (the first level of a
    MultiIndex; None without); `keys`, per row its other labels ("" where the row above has the same
    up to that level); `tops` (a two-level header's upper labels, else None) and `titles` per value
    column; `values` and `bold` per row and value column."""
    group_title: str
    groups: list
    key_titles: list[str]
    keys: list[list[str]]
    tops: list
    titles: list[str]
    values: list[list[str]]
    bold: list[list[bool]]


def grid(cells: pd.DataFrame, bold: pd.DataFrame) -> Grid:
    """The `Grid` of cell texts (None: no result, printed `MISSING`) and where they are bold; the
    labels' titles are the index's names (one level: the columns' name)."""
    rows = [[key_text(v) for v in (row if isinstance(row, tuple) else (row,))] for row in cells.index]
    grouped = cells.index.nlevels > 1
    titles = [str(name or "") for name in cells.index.names]
    if not grouped:
        titles = [str(cells.index.name or cells.columns.name or "")]
    shown, above = [], None
    for row in rows:  # a label only where it, or one before it, differs from the row above's
        same = [above is not None and row[:i + 1] == above[:i + 1] for i in range(len(row))]
        shown.append(["" if s else text for s, text in zip(same, row)][int(grouped):])
        above = row
    two = cells.columns.nlevels > 1
    values = [[MISSING if v is None or (not isinstance(v, str) and pd.isna(v)) else str(v) for v in row]
              for row in cells.to_numpy(dtype=object).tolist()]
    return Grid(titles[0] if grouped else "", [row[0] for row in rows] if grouped else [None] * len(rows),
                titles[int(grouped):], shown, [str(c[0]) for c in cells.columns] if two else [None] * cells.shape[1],
                [str(c[1] if two else c) for c in cells.columns], values, np.asarray(bold, dtype=bool).tolist())


def _spans(tops: list) -> list[tuple[object, list[int]]]:
    """(upper label, its value columns) of each run of columns under one upper label (None: one each)."""
    out: list[tuple[object, list[int]]] = []
    for j, top in enumerate(tops):
        if out and top is not None and out[-1][0] == top:
            out[-1][1].append(j)
        else:
            out.append((top, [j]))
    return out


@dataclass
class Layout:
    """How a `Grid` is printed: in `float` ("table" or "table*") of line `width` pt, its value
    columns in `parts` (one tabular each, stacked)."""
    float: str
    width: float
    parts: list[list[int]]


def column_widths(table: Grid) -> tuple[float, list[tuple[list[int], float]]]:
    """Estimated widths in pt (`text_width`, `TABCOLSEP` on each side): of the row labels' columns
    together, and of each span of value columns (`_spans`; at least its upper label's width)."""
    pad = 2 * TABCOLSEP
    keys = sum(max([text_width(t)] + [text_width(row[i]) for row in table.keys]) + pad
               for i, t in enumerate(table.key_titles))
    column = [max([text_width(t)] + [text_width(row[j], bold[j]) for row, bold in zip(table.values, table.bold)]) + pad
              for j, t in enumerate(table.titles)]
    return keys, [(cols, max(sum(column[j] for j in cols), text_width(top) + pad if top is not None else 0.0))
                  for top, cols in _spans(table.tops)]


def table_width(table: Grid) -> float:
    """The table's estimated width in one tabular, pt: its columns, or a group's header row where wider."""
    keys, spans = column_widths(table)
    floor = max([text_width(g) + 2 * TABCOLSEP for g in table.groups if g is not None], default=0.0)
    return max(keys + sum(width for _, width in spans), floor)


def fits_across(cells: pd.DataFrame) -> bool:
    """Whether plain cell texts (`grid`, none bold) fit one tabular across both columns (`TEXT_WIDTH`)."""
    return table_width(grid(cells, pd.DataFrame(False, index=cells.index, columns=cells.columns))) <= FIT * TEXT_WIDTH


def table_layout(table: Grid) -> Layout:
    """The narrowest float the table fits (estimated: `table_width`, `FIT`): the column, else both
    columns, else both columns with its value columns split into as few stacked parts as fit, as
    even as the spans of a two-level header allow (a span is never split)."""
    keys, spans = column_widths(table)
    need = table_width(table)
    every = [j for cols, _ in spans for j in cols]
    for name, width in (("table", COLUMN_WIDTH), ("table*", TEXT_WIDTH)):
        if need <= FIT * width:
            return Layout(name, width, [every])
    room = FIT * TEXT_WIDTH - keys
    greedy: list[list] = [[]]
    for span in spans:
        if greedy[-1] and sum(w for _, w in greedy[-1]) + span[1] > room:
            greedy.append([])
        greedy[-1].append(span)
    size = -(-len(spans) // len(greedy))
    even = [spans[i:i + size] for i in range(0, len(spans), size)]
    fits = len(even) == len(greedy) and all(sum(w for _, w in part) <= room for part in even)
    return Layout("table*", TEXT_WIDTH, [[j for cols, _ in part for j in cols] for part in (even if fits else greedy)])


def tabular_latex(table: Grid, columns: list[int]) -> str:
    """One booktabs tabular of the table's row labels and its value `columns`: a left-aligned column
    per label level, the values centred, an upper header over each span (`\\cmidrule` under it), a
    header row per group (`\\midrule` between groups), bold cells in `\\bfseries`."""
    keys = len(table.key_titles)
    lines = [f"\\begin{{tabular}}{{{'l' * keys}{'c' * len(columns)}}}", "\\toprule"]
    spans = _spans([table.tops[j] for j in columns])
    if any(top is not None for top, _ in spans):
        first = keys + 1
        heads, rules = [""] * keys, []
        for top, cols in spans:
            heads.append(f"\\multicolumn{{{len(cols)}}}{{c}}{{{_latex_text(top or '')}}}")
            rules.append(f"\\cmidrule(lr){{{first}-{first + len(cols) - 1}}}")
            first += len(cols)
        lines += [" & ".join(heads) + " \\\\", " ".join(rules)]
    lines += [" & ".join(_latex_text(t) for t in [*table.key_titles, *(table.titles[j] for j in columns)]) + " \\\\",
              "\\midrule"]
    above = None
    for group, labels, values, bold in zip(table.groups, table.keys, table.values, table.bold):
        if group is not None and group != above:
            lines += ["\\midrule"] * (above is not None)
            lines.append(f"\\multicolumn{{{keys + len(columns)}}}{{l}}{{\\itshape {_latex_text(group)}}} \\\\")
            above = group
        cells = [*map(_latex_text, labels), *(("\\bfseries " if bold[j] else "") + _latex_text(values[j])
                                               for j in columns)]
        lines.append(" & ".join(cells) + " \\\\")
    return "\n".join(lines + ["\\bottomrule", "\\end{tabular}"])


def frame_latex(cells: pd.DataFrame, bold: pd.DataFrame, caption: str, name: str) -> str:
    """Plain cell texts (None: no result) as a LaTeX float for a two-column paper (`table_layout`):
    the caption (`split_caption`) and `\\label{tab:<name>}`, the tabulars (`tabular_latex`), then
    the note in footnote size. Every text is made LaTeX-safe (`_latex_text`); the preamble is
    `LATEX_PREAMBLE`."""
    table = grid(cells, bold)
    layout = table_layout(table)
    text, note = split_caption(caption, layout.width)
    lines = [f"\\begin{{{layout.float}}}", "\\centering", f"\\caption{{{_latex_text(text)}}}", f"\\label{{tab:{name}}}",
             "\n\\par\\medskip\n".join(tabular_latex(table, part) for part in layout.parts)]
    if note:
        lines += ["\\par\\smallskip", f"{{\\footnotesize\\raggedright {_latex_text(note)}\\par}}"]
    return "\n".join(lines + [f"\\end{{{layout.float}}}"]) + "\n"


def frame_markdown(cells: pd.DataFrame, bold: pd.DataFrame, caption: str) -> str:
    """Plain cell texts (None: no result) as a Markdown table, bold cells in `**`, a column per row
    label level (a group's label and each other label only where it changes), an upper header as
    "upper: lower"; the caption above it and the note after it, as paragraphs split as in LaTeX."""
    table = grid(cells, bold)
    text, note = split_caption(caption, table_layout(table).width)
    grouped = any(group is not None for group in table.groups)
    header = [table.group_title] * grouped + table.key_titles + \
        [title if top is None else f"{top}: {title}" for top, title in zip(table.tops, table.titles)]
    lines, above = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)], None
    for group, labels, values, bold_row in zip(table.groups, table.keys, table.values, table.bold):
        first = ["" if group == above else group] * grouped
        above = group
        shown = [f"**{v}**" if b else v for v, b in zip(values, bold_row)]
        lines.append("| " + " | ".join([*first, *labels, *shown]) + " |")
    return f"{text}\n\n" + "\n".join(lines) + "\n" + (f"\n{note}\n" if note else "")


def write_table(name: str, cells: pd.DataFrame, bold: pd.DataFrame, caption: str, out, markdown: bool = False,
                echo: bool = False, label: str | None = None) -> Path:
    """Write `<out>/<name>.tex` (`frame_latex`, labelled `tab:<label or name>`) and with `markdown`
    `<out>/<name>.md` (`frame_markdown`); with `echo` print the Markdown or a preview. Returns the .tex file."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{name}.tex"
    path.write_text(frame_latex(cells, bold, caption, label or name))
    text = frame_markdown(cells, bold, caption)
    if markdown:
        path.with_suffix(".md").write_text(text)
    if echo:
        print(text if markdown else f"[{name}] {caption}\n{cells.fillna(MISSING).to_string()}", end="\n\n")
    return path
