"""Every LaTeX table `analysis` writes works in a paper: it compiles inside the preamble the docs
give (pdflatex, where installed; .ci/run installs it), its rows match its declared columns, it
holds no character pdflatex rejects, and its label is unique per table and sweep. The tables of
the committed default and tuned-digits sweeps cover methods, grid, limit, convergence, cost and
search_best; test_traffic_analysis and test_fedl2p_analysis check traffic and fedl2p the same way."""
from __future__ import annotations

import re
import shutil

import pytest

from analysis.render import LATEX_PREAMBLE
from analysis.tables import build_tables

from conftest import REPO
from latex_check import check_latex, structure_problems

COMMITTED = {"default": "fedselect-grid", "tuned-digits": "tuned-digits"}


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    """name -> .tex of every table built from the committed sweeps' data (copied aside)."""
    out = {}
    for folder, sweep in COMMITTED.items():
        data = tmp_path_factory.mktemp(folder) / sweep
        shutil.copytree(REPO / "docs" / "results" / folder / "data" / sweep, data)
        for name, path in build_tables([data], out=data / "tables").items():
            out[f"{folder}/{name}"] = path
    return out


def test_the_committed_sweeps_give_every_kind_of_table(written):
    kinds = {name.split("/")[1].split("_dir")[0] for name in written}
    assert {"methods", "grid_digits", "limit", "convergence", "cost", "search_best"} <= kinds


def test_every_table_compiles_in_the_documented_preamble(written, tmp_path):
    for name, path in written.items():
        check_latex(path, tmp_path / name.replace("/", "-"))


def test_labels_are_unique_per_table_and_sweep(written):
    labels = [re.search(r"\\label\{([^}]*)\}", path.read_text()).group(1) for path in written.values()]
    assert len(set(labels)) == len(labels)
    assert "tab:fedselect-grid:methods" in labels and "tab:tuned-digits:methods" in labels


def test_captions_keep_their_symbols_as_latex(written):
    convergence = written["default/convergence"].read_text()
    assert r"$\Delta$" in convergence and r"$\to$" in convergence and "Δ" not in convergence
    methods = written["tuned-digits/methods"].read_text()
    assert "p $<$ 0.05" in methods and "p < 0.05" not in methods  # OT1 prints a bare < as ¡


def test_the_docs_give_the_whole_preamble():
    page = (REPO / "docs" / "analysis.md").read_text()
    block = re.search(r"```latex\n(.*?)```", page, re.S).group(1)
    assert [line.strip() for line in block.strip().splitlines()] == LATEX_PREAMBLE.strip().splitlines()


@pytest.mark.parametrize("latex, needle", [
    ("\\begin{tabular}{lcc}\n\\toprule\na & b & c & d \\\\\n\\end{tabular}", "4 cells where the tabular declares 3"),
    ("\\begin{tabular}{lc}\n\\toprule\nΔ & b \\\\\n\\end{tabular}", "U+0394"),
    ("\\begin{tabular}{lc}\n\\multirow{2}{*}{a} & b \\\\\n\\end{tabular}", "multirow"),
])
def test_the_structural_check_names_what_would_not_compile(latex, needle):
    assert any(needle in problem for problem in structure_problems(latex))


def test_multicolumn_headers_count_their_span():
    latex = "\\begin{tabular}{llcc}\n & & \\multicolumn{2}{c}{c = 1} \\\\\na & b & 1 \\& 2 & 3 \\\\\n\\end{tabular}"
    assert structure_problems(latex) == []
