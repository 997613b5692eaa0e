"""Does a table `analysis` wrote work in a paper? `check_latex` always checks its structure (every
row of every tabular has as many cells as the tabular declares columns; no character pdflatex
rejects: the file is ASCII) and, where pdflatex is installed, compiles it inside
`analysis.render.LATEX_PREAMBLE` in its two-column form (`TWO_COLUMN`: a paper's column is
229.9 pt, its text 469.8 pt), and asserts no overfull box wider than `OVERFULL_PT` and no caption
of more than `analysis.render.CAPTION_LINES` lines (TeX counts them: `CAPTION_PROBE`). Without
pdflatex it warns that only the structure was checked (.ci/run installs it)."""
from __future__ import annotations

import re
import shutil
import subprocess
import warnings
from pathlib import Path

from analysis.render import CAPTION_LINES, LATEX_PREAMBLE

TWO_COLUMN = LATEX_PREAMBLE.replace("\\documentclass{article}", "\\documentclass[twocolumn]{article}")
OVERFULL_PT = 1.0
# Before a float prints its caption, set the same text in a box of the float's width (the caption's
# own paragraph settings) and log how many lines TeX broke it into (\prevgraf).
CAPTION_PROBE = r"""\makeatletter
\let\tablecaption\@makecaption
\long\def\@makecaption#1#2{\setbox0\vbox{\noindent #1: #2\par\xdef\captionlines{\the\prevgraf}}%
  \typeout{CAPTION LINES: \captionlines}\tablecaption{#1}{#2}}
\makeatother
"""


def structure_problems(latex: str) -> list[str]:
    """What keeps `latex` from compiling as a table, found without TeX: rows whose cell count
    differs from their tabular's columns, characters outside ASCII, packages beyond the preamble's."""
    problems = [f"character {c!r} (U+{ord(c):04X}) outside ASCII" for c in sorted(set(latex)) if ord(c) > 127]
    if "\\multirow" in latex:
        problems.append("\\multirow needs the multirow package, not in the preamble")
    tabulars = list(re.finditer(r"\\begin\{tabular\}\{([^}]*)\}(.*?)\\end\{tabular\}", latex, re.S))
    if not tabulars:
        return problems + ["no tabular"]
    for tabular in tabulars:
        columns = len(re.findall(r"[lcrp]", tabular.group(1)))
        for line in tabular.group(2).splitlines():
            line = line.strip()
            if not line.endswith("\\\\"):
                continue
            cells = re.split(r"(?<!\\)&", line.removesuffix("\\\\"))
            width = sum(int(m.group(1)) if (m := re.match(r"\s*\\multicolumn\{(\d+)\}", c)) else 1 for c in cells)
            if width != columns:
                problems.append(f"{width} cells where the tabular declares {columns}: {line[:80]}")
    return problems


def compile_log(latex: str, folder: Path) -> tuple[str | None, str]:
    """(pdflatex's first error on `latex` inside `TWO_COLUMN` and `CAPTION_PROBE`, None when it
    compiles; the log)."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "table.tex").write_text(latex)
    (folder / "doc.tex").write_text(TWO_COLUMN + CAPTION_PROBE + "\\begin{document}\n\\input{table}\n\\end{document}\n")
    done = subprocess.run(["pdflatex", "-interaction=nonstopmode", "-halt-on-error", "doc.tex"], cwd=folder,
                          capture_output=True, text=True, timeout=120)
    log = (folder / "doc.log").read_text(errors="replace") if (folder / "doc.log").exists() else done.stdout
    if done.returncode == 0 and (folder / "doc.pdf").exists():
        return None, log
    errors = [line for line in done.stdout.splitlines() if line.startswith("!")]
    return " / ".join(errors[:3]) or f"pdflatex exit {done.returncode}", log


def compile_problem(latex: str, folder: Path) -> str | None:
    """pdflatex's first error on `latex` inside the two-column preamble, None when it compiles."""
    return compile_log(latex, folder)[0]


def overfull(log: str) -> list[float]:
    """How far (pt) each overfull box of a pdflatex log sticks out."""
    return [float(pt) for pt in re.findall(r"^Overfull \\[hv]box \(([\d.]+)pt too (?:wide|high)\)", log, re.M)]


def caption_lines(log: str) -> list[int]:
    """The line count of each caption the compiled document set (`CAPTION_PROBE`)."""
    return [int(n) for n in re.findall(r"^CAPTION LINES: (\d+)", log, re.M)]


def check_latex(latex: str | Path, folder: Path) -> None:
    """Assert the table's structure, and where pdflatex is installed that it compiles in a
    two-column paper with no box more than `OVERFULL_PT` too wide and a caption of at most
    `CAPTION_LINES` lines (`folder`: a scratch folder for the run)."""
    text = Path(latex).read_text() if isinstance(latex, Path) else latex
    assert structure_problems(text) == []
    if shutil.which("pdflatex") is None:
        warnings.warn("pdflatex is not installed: the LaTeX tables were checked for structure only", stacklevel=2)
        return
    error, log = compile_log(text, folder)
    assert error is None
    assert [pt for pt in overfull(log) if pt > OVERFULL_PT] == []
    lines = caption_lines(log)
    assert lines and max(lines) <= CAPTION_LINES, lines
