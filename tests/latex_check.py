"""Does a table `analysis` wrote work in a paper? `check_latex` always checks its structure (every
row has as many cells as the tabular declares columns; no character pdflatex rejects: the file is
ASCII) and, where pdflatex is installed, compiles it inside `analysis.render.LATEX_PREAMBLE`.
Without pdflatex it warns that only the structure was checked (.ci/run installs it)."""
from __future__ import annotations

import re
import shutil
import subprocess
import warnings
from pathlib import Path

from analysis.render import LATEX_PREAMBLE


def structure_problems(latex: str) -> list[str]:
    """What keeps `latex` from compiling as a table, found without TeX: rows whose cell count
    differs from the tabular's columns, characters outside ASCII, packages beyond the preamble's."""
    problems = [f"character {c!r} (U+{ord(c):04X}) outside ASCII" for c in sorted(set(latex)) if ord(c) > 127]
    if "\\multirow" in latex:
        problems.append("\\multirow needs the multirow package, not in the preamble")
    spec = re.search(r"\\begin\{tabular\}\{([^}]*)\}", latex)
    if spec is None:
        return problems + ["no tabular"]
    columns = len(re.findall(r"[lcrp]", spec.group(1)))
    body = latex[spec.end():latex.index("\\end{tabular}")]
    for line in body.splitlines():
        line = line.strip()
        if not line.endswith("\\\\"):
            continue
        cells = re.split(r"(?<!\\)&", line.removesuffix("\\\\"))
        width = sum(int(m.group(1)) if (m := re.match(r"\s*\\multicolumn\{(\d+)\}", c)) else 1 for c in cells)
        if width != columns:
            problems.append(f"{width} cells where the tabular declares {columns}: {line[:80]}")
    return problems


def compile_problem(latex: str, folder: Path) -> str | None:
    """pdflatex's first error on `latex` inside the preamble, None when it compiles."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "table.tex").write_text(latex)
    (folder / "doc.tex").write_text(LATEX_PREAMBLE + "\\begin{document}\n\\input{table}\n\\end{document}\n")
    done = subprocess.run(["pdflatex", "-interaction=nonstopmode", "-halt-on-error", "doc.tex"], cwd=folder,
                          capture_output=True, text=True, timeout=120)
    if done.returncode == 0 and (folder / "doc.pdf").exists():
        return None
    errors = [line for line in done.stdout.splitlines() if line.startswith("!")]
    return " / ".join(errors[:3]) or f"pdflatex exit {done.returncode}"


def check_latex(latex: str | Path, folder: Path) -> None:
    """Assert the table's structure, and that it compiles where pdflatex is installed (`folder`:
    a scratch folder for the run)."""
    text = Path(latex).read_text() if isinstance(latex, Path) else latex
    assert structure_problems(text) == []
    if shutil.which("pdflatex") is None:
        warnings.warn("pdflatex is not installed: the LaTeX tables were checked for structure only", stacklevel=2)
        return
    assert compile_problem(text, folder) is None
