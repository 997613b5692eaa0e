"""A table's numbers and how they are printed: LaTeX (pandas Styler, booktabs) and a text preview.

A cell is "mean ± std" over seeds in % (one seed: the mean alone), "(n=k)" where its seed count
differs from the table's usual count, bold where it is the best of its column (or of the table),
"--" where there is no result.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd

MISSING = "--"


@dataclass
class Table:
    """A table's numbers: `mean`, `std` and `n` (seeds) share one index and columns."""
    name: str
    mean: pd.DataFrame
    std: pd.DataFrame
    n: pd.DataFrame
    caption: str = ""
    best: str = "column"  # "column": bold the best of each column; "table": the best cell overall
    row_title: str = ""   # the header of the row labels
    notes: list[str] = field(default_factory=list)

    @property
    def usual_n(self) -> int:
        """The most common number of seeds behind a cell (0 when the table is empty)."""
        counts = self.n.stack()
        counts = counts[counts > 0]
        return int(counts.mode().min()) if len(counts) else 0

    def seeds_uniform(self) -> bool:
        counts = self.n.stack()
        return counts[counts > 0].nunique() <= 1

    def cells(self, pm: str = "±") -> pd.DataFrame:
        """The cell texts ("mean ± std", marked "(n=k)" when k differs from the usual count); None
        where there is no result."""
        usual = self.usual_n
        text = pd.DataFrame(None, index=self.mean.index, columns=self.mean.columns, dtype=object)
        for row in self.mean.index:
            for col in self.mean.columns:
                text.loc[row, col] = format_cell(self.mean.loc[row, col], self.std.loc[row, col],
                                                 int(self.n.loc[row, col]), usual, pm)
        text.index.name, text.columns.name = None, self.row_title
        return text

    def best_mask(self) -> pd.DataFrame:
        """True where a cell holds the best mean (of its column, or of the table) as printed, to
        0.1%: cells that print the same best value are all bold."""
        shown = (100 * self.mean).round(1)
        if self.best == "table":
            return shown.eq(shown.max().max()) & shown.notna()
        return shown.eq(shown.max(axis=0), axis=1) & shown.notna()

    def full_caption(self) -> str:
        seeds = self.usual_n
        if self.seeds_uniform():
            count = f"{seeds} seed{'s' if seeds != 1 else ''} per cell"
        else:
            count = f"{seeds} seed{'s' if seeds != 1 else ''} per cell unless marked (n=k)"
        legend = f"Final personalized accuracy (%), mean ± std over seeds ({count}); best in bold; -- = no result."
        return " ".join(part for part in (self.caption, legend, *self.notes) if part)


def format_cell(mean: float, std: float, n: int, usual_n: int, pm: str = "±") -> str | None:
    if n == 0 or pd.isna(mean):
        return None
    text = f"{100 * mean:.1f}"
    if n > 1 and not pd.isna(std):
        text += f" {pm} {100 * std:.1f}"
    if n != usual_n:
        text += f" (n={n})"
    return text


def to_latex(table: Table) -> str:
    """The table as LaTeX: booktabs rules, the best cells in \\textbf, missing cells "--"."""
    cells = table.cells(pm=r"$\pm$")
    best = table.best_mask()
    cells.columns.name = _latex_text(table.row_title)
    styler = cells.style.format(na_rep=MISSING).format_index(_latex_text, axis=0) \
        .format_index(_latex_text, axis=1)
    styler = styler.apply(lambda _: np.where(best.to_numpy(), "font-weight: bold;", ""), axis=None)
    caption = _latex_text(table.full_caption())
    return styler.to_latex(hrules=True, convert_css=True, caption=caption, label=f"tab:{table.name}",
                           position_float="centering", column_format="l" + "c" * len(cells.columns))


def _latex_text(text: str) -> str:
    """Plain caption text made LaTeX-safe (± and α become math)."""
    text = str(text)
    for char in "%_&#{}$":
        text = text.replace(char, "\\" + char)
    return text.replace("±", r"$\pm$").replace("α", r"$\alpha$")


def preview(table: Table) -> str:
    """A plain-text rendering (best cells starred)."""
    cells = table.cells().fillna(MISSING)
    cells = cells.where(~table.best_mask(), cells + " *")
    return f"[{table.name}] {table.full_caption()}  (* = best)\n{cells.to_string()}"
