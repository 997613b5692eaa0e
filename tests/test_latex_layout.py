"""Tables that fit a paper (analysis.render's layout): every LaTeX table `analysis` writes compiles in
a two-column article with no box more than 1 pt too wide and a caption of at most 3 lines, the rest
of its text in a note under the table; its rows come by data setting, then method (the methods
table's order), then configuration, each setting's label printed once; its Markdown twin says the
same. pdflatex checks where it is installed (.ci/run installs it); the layout's decisions and the
Markdown are checked without it."""
from __future__ import annotations

import re
import shutil
import subprocess

import pandas as pd
import pytest

from analysis.common import settings_order
from analysis.convergence import convergence, convergence_frame
from analysis.render import (CAPTION_LINES, COLUMN_WIDTH, LATEX_PREAMBLE, TEXT_WIDTH, Caption, frame_latex,
                             frame_markdown, grid, in_order, math_symbols, split_caption, table_layout, text_width)
from analysis.tables import build_tables

from conftest import REPO
from latex_check import TWO_COLUMN, caption_lines, check_latex, compile_log, overfull

NO_TEX = "pdflatex is not installed (.ci/run installs it): the compiled page cannot be measured"
needs_tex = pytest.mark.skipif(shutil.which("pdflatex") is None, reason=NO_TEX)
CELL = "88.8 ± 12.1▲△"


def frame(rows, columns, cell=CELL, names=None) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Cells (every one `cell`) for row labels `rows` (tuples: a MultiIndex) and `columns`, none bold."""
    index = pd.MultiIndex.from_tuples(rows, names=names) if isinstance(rows[0], tuple) else pd.Index(rows, name=names)
    cols = pd.MultiIndex.from_tuples(columns) if isinstance(columns[0], tuple) else pd.Index(columns)
    cells = pd.DataFrame(cell, index=index, columns=cols, dtype=object)
    return cells, pd.DataFrame(False, index=index, columns=cols)


def settings(n: int) -> list[str]:
    return [f"fmnist, Dir({a})" for a in (0.05, 0.1, 0.3, 0.5, 1.0, 10.0, 100.0, 1000.0)[:n]]


# ---------------------------------------------------------------- widths and captions, without TeX

def test_widths_are_computer_modern_at_ten_points():
    assert text_width("0123456789") == pytest.approx(50.0)             # cmr10: every digit 5 pt
    assert text_width("88.8 ± 1.2") == pytest.approx(5 * 5 + 4 * 2.78 + 7.78)    # 2 points, 2 spaces, ±
    assert text_width("88.8", bold=True) > text_width("88.8")


def test_a_caption_keeps_its_title_and_then_what_fits():
    short = Caption(["Methods by data setting.", "Final accuracy (%)."])
    assert split_caption(short, COLUMN_WIDTH) == ("Methods by data setting. Final accuracy (%).", "")
    long = "A sentence that runs on for a while. " * 6
    parts = ["Title.", "Legend, short.", long, "A last word."]
    caption, note = split_caption(Caption(parts), COLUMN_WIDTH)
    # the long sentence does not fit, so it and everything after it go to the note, in order
    assert (caption, note) == ("Title. Legend, short.", f"{long.strip()} A last word.")
    assert split_caption(Caption(parts), 4 * TEXT_WIDTH) == (Caption(parts), "")   # a page wide enough: all of it
    assert split_caption(Caption([long * 3]), COLUMN_WIDTH) == (Caption([long * 3]), "")   # the title always stays
    assert Caption(parts) == " ".join(part.strip() for part in parts) and Caption(parts).parts[0] == "Title."


# ---------------------------------------------------------------- the layout

def test_a_table_takes_the_column_both_columns_or_stacked_parts():
    narrow = grid(*frame(["FedSelect", "FedAvg"], settings(2)))
    assert table_layout(narrow).float == "table" and table_layout(narrow).width == COLUMN_WIDTH
    wide = grid(*frame(["FedSelect", "FedAvg"], settings(4)))
    assert table_layout(wide).float == "table*" and table_layout(wide).parts == [[0, 1, 2, 3]]
    wider = table_layout(grid(*frame(["FedSelect", "FedAvg"], settings(8))))
    assert wider.float == "table*" and len(wider.parts) == 2
    assert sorted(j for part in wider.parts for j in part) == list(range(8))
    assert [len(part) for part in wider.parts] == [4, 4]                 # as even as the columns allow


def test_a_span_of_a_two_level_header_is_never_split():
    spans = [(s, part) for s in settings(4) for part in ("Acc. (%)", "Busiest node (MB)")]
    layout = table_layout(grid(*frame(["DisPFL", "D-PSGD"], spans)))
    assert layout.float == "table*" and len(layout.parts) > 1
    assert all(len(part) % 2 == 0 and part[0] % 2 == 0 for part in layout.parts)   # both columns of a span together


def test_a_group_label_is_printed_once_and_other_labels_where_they_change():
    rows = [(s, method, e) for s in settings(2) for method in ("FT (BN C)", "FedL2P") for e in (1, 5)]
    cells, bold = frame(rows, ["Global Acc", "FedL2P"], names=["Data setting", "Method", "e"])
    latex = frame_latex(cells, bold, Caption(["Title."]), "t")
    for setting in settings(2):
        assert latex.count(setting) == 1 and f"\\multicolumn{{4}}{{l}}{{\\itshape {setting}}} \\\\" in latex
    body = latex.split("\\midrule", 1)[1].split("\\bottomrule")[0]
    assert [line.split(" & ")[:2] for line in body.splitlines() if " & " in line] == \
        [["FT (BN C)", "1"], ["", "5"], ["FedL2P", "1"], ["", "5"]] * 2
    markdown = frame_markdown(cells, bold, Caption(["Title."])).splitlines()[2:]   # after the caption
    assert markdown[0] == "| Data setting | Method | e | Global Acc | FedL2P |"
    assert [line.split(" | ")[0] for line in markdown[2:10]] == \
        [f"| {settings(2)[0]}", "| ", "| ", "| ", f"| {settings(2)[1]}", "| ", "| ", "| "]


def test_in_order_sorts_by_each_list_then_by_text():
    rows = pd.DataFrame({"setting": ["b", "a", "b", "a", "z"], "method": ["L", "F", "F", "L", "F"], "n": range(5)})
    ordered = in_order(rows, {"setting": ["b", "a"], "method": ["F", "L"]})
    assert ordered["n"].tolist() == [2, 0, 1, 3, 4]    # z is in no list: last


def rows_of(trial: str, curve: dict[int, float]) -> list[dict]:
    return [dict(config_hash=trial, round=r, client=c, acc=a + 0.01 * c, acc_local=a, acc_global=a, n_test=50,
                 loss=0.5, bytes_up=10, bytes_down=10, personal_fraction=0.0) for r, a in curve.items() for c in (0, 1)]


def test_convergence_rows_come_by_setting_method_and_configuration():
    """Trials given in a scrambled order: the rows follow `settings_order` (shards before Dirichlet),
    `methods_order` (the registry: FedSelect, FedAvg, Local) and the grid's order of each knob."""
    rounds, trials = [], []
    plan = [("dirichlet", "local", 0.5), ("shards", "fedavg", 0.5), ("dirichlet", "fedselect", 0.8),
            ("shards", "local", 0.5), ("dirichlet", "fedselect", 0.25), ("shards", "fedselect", 0.8)]
    for k, (partition, algorithm, p) in enumerate(plan):
        setting = "digits, 2 shards" if partition == "shards" else "digits, Dir(0.3)"
        for seed in (0, 1):
            name = f"t{k}s{seed}"
            rounds += rows_of(name, {r: 0.5 + 0.01 * r + 0.01 * seed for r in (2, 4, 6, 8, 10)})
            trials.append(dict(config_hash=name, algorithm=algorithm, method={"fedselect": "FedSelect", "fedavg":
                                                                                "FedAvg", "local": "Local"}[algorithm],
                               seed=seed, dataset="digits", partition=partition, shards_per_client=2.0,
                               dir_alpha=0.3, setting=setting, pers_rate=p, rounds=10, acc_mean=0.6))
    trials = pd.DataFrame(trials)
    table = convergence(pd.DataFrame(rounds), trials)
    assert settings_order(trials) == ["digits, 2 shards", "digits, Dir(0.3)"]
    assert list(zip(table["setting"], table["method"], table["config"])) == [
        ("digits, 2 shards", "FedSelect", ""), ("digits, 2 shards", "FedAvg", ""), ("digits, 2 shards", "Local", ""),
        ("digits, Dir(0.3)", "FedSelect", "p=0.25"), ("digits, Dir(0.3)", "FedSelect", "p=0.8"),
        ("digits, Dir(0.3)", "Local", "")]
    cells, caption = convergence_frame(table)
    assert list(cells.columns) == ["Tail", "Last", "Δ", "Std", "Conv."]   # the same rounds and seeds everywhere
    assert "Every row: rounds 8 → 10 (R_tail → R), 2 seeds." in caption
    markdown = frame_markdown(cells, cells.isna(), caption).split("\n\n")[1]   # the table, after its caption
    assert [line.split(" | ")[:2] for line in markdown.splitlines()[2:8]] == [
        ["| digits, 2 shards", "FedSelect"], ["| ", "FedAvg"], ["| ", "Local"],
        ["| digits, Dir(0.3)", "FedSelect [p=0.25]"], ["| ", "FedSelect [p=0.8]"], ["| ", "Local"]]


# ---------------------------------------------------------------- compiled

def measured(texts: list[str], folder) -> list[float]:
    """The width in pt pdflatex gives each text in an \\hbox."""
    folder.mkdir(parents=True, exist_ok=True)
    boxes = "\n".join(f"\\setbox0\\hbox{{{text}}}\\typeout{{WIDTH \\the\\wd0}}" for text in texts)
    (folder / "w.tex").write_text(f"{LATEX_PREAMBLE}\\begin{{document}}\n{boxes}\n\\end{{document}}\n")
    log = subprocess.run(["pdflatex", "-interaction=nonstopmode", "w.tex"], cwd=folder, capture_output=True,
                         text=True, timeout=120).stdout
    return [float(w) for w in re.findall(r"WIDTH ([\d.]+)pt", log)]


@needs_tex
def test_the_width_estimate_is_within_three_percent_of_tex(tmp_path):
    texts = ["FedSelect [epochs=2, p=0.5, α=0.8]", CELL, "fmnist_c (clean), Dir(0.1) per domain, 6 unseen clients",
             "Busiest node (MB)", "FT (BN C, authors')", "93.7 ± 1.5"]
    latex = [math_symbols(t.replace("_", "\\_")) for t in texts]
    for text, width in zip(texts, measured(latex, tmp_path)):
        assert text_width(text) == pytest.approx(width, rel=0.03), text


def wide_tables() -> dict[str, tuple[pd.DataFrame, pd.DataFrame, Caption]]:
    """One table of each layout: the column, both columns, stacked parts, groups under a two-level
    header, a group label longer than the table, a caption that needs its note."""
    legend = ("Final personalized accuracy (%), mean ± std over seeds (5 seeds per cell); -- = no result. "
              "▲/▼: significantly better/worse than FedAvg, △/▽: than Local, in the same column (p < 0.05 after "
              "Benjamini–Hochberg over the table's 19 distinct paired comparisons).")
    methods = ["FedSelect", "FedAvg", "Local", "FedAvg+FT (weak ×0.5)"]
    grouped = [(s, m) for s in settings(3) for m in methods]
    spans = [(f"c = {c}", part) for c in (1, 0.1) for part in ("Before FT", "After FT")] + \
        [("Cost", h) for h in ("Params (K)", "Fwd MFLOPs", "Bwd MFLOPs")]
    long = [("fmnist_c (clean), Dir(0.1) per domain, 6 unseen clients, c = 0.5", m) for m in methods[:2]]
    return {"column": (*frame(methods[:3], settings(2), names="Method"), Caption(["Methods by data setting.", legend])),
            "both": (*frame(methods, settings(4), names="Method"), Caption(["Methods by data setting.", legend])),
            "parts": (*frame(methods, settings(8), names="Method"), Caption(["Methods by data setting.", legend * 3])),
            "grouped": (*frame(grouped, spans, names=["Data setting", "Method"]), Caption(["Cost.", legend])),
            "long group": (*frame(long, ["Tail", "Last"], cell="93.7", names=["Setting", "Method"]),
                           Caption(["Convergence.", legend]))}


@needs_tex
@pytest.mark.parametrize("kind", list(wide_tables()))
def test_every_layout_compiles_with_no_overfull_box(kind, tmp_path):
    cells, bold, caption = wide_tables()[kind]
    latex = frame_latex(cells, bold, caption, kind.replace(" ", "-"))
    check_latex(latex, tmp_path)
    assert ("\\begin{table*}" in latex) == (kind != "column")
    assert (latex.count("\\begin{tabular}") > 1) == (kind in ("parts", "grouped"))   # stacked: too wide for a page


@needs_tex
def test_the_check_sees_an_overfull_table_and_a_long_caption(tmp_path):
    """What the check measures could fail: a tabular wider than the column, a caption of many lines."""
    words = " ".join(f"word{i}" for i in range(120))
    latex = (f"\\begin{{table}}\n\\centering\n\\caption{{{words}}}\n\\begin{{tabular}}{{ll}}\n"
             f"{'x' * 80} & {'y' * 40} \\\\\n\\end{{tabular}}\n\\end{{table}}\n")
    error, log = compile_log(latex, tmp_path)
    assert error is None and max(overfull(log)) > 100 and max(caption_lines(log)) > CAPTION_LINES
    assert "twocolumn" in TWO_COLUMN


# ---------------------------------------------------------------- every kind the code writes, from real results

KINDS = ("methods", "limit", "ablation", "grid", "traffic", "cost", "fedl2p", "fedl2p_policy", "convergence",
         "search_best")


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    """kind -> [.tex] of every table built (as `--table auto` does) from the data committed under
    docs/results for five studies, copied aside."""
    out: dict[str, list] = {}
    for study in ("default", "dispfl-fmnist", "fedl2p-fmnist", "perfedmask-fmnist", "ablation-fmnist"):
        folder = tmp_path_factory.mktemp(study)
        shutil.copytree(REPO / "docs" / "results" / study / "data", folder / "data")
        sweeps = sorted(p for p in (folder / "data").iterdir() if p.is_dir())
        for name, path in build_tables(sweeps, out=folder / "tables", markdown=True).items():
            out.setdefault(re.sub(r"_[a-z0-9_]*_e\d+$", "", name), []).append(path)
    return out


@pytest.mark.slow
def test_every_kind_of_table_fits_a_two_column_paper(written, tmp_path):
    assert set(KINDS) <= set(written)
    for kind, paths in written.items():
        for n, path in enumerate(paths):
            check_latex(path, tmp_path / f"{kind}-{n}")


@pytest.mark.slow
def test_grouped_tables_print_each_setting_once_in_the_tables_order(written):
    """The convergence (the issue's 32 unsorted rows), cost, fedl2p and search tables of real studies:
    a setting's label once, the settings in `settings_order`, the methods of each in `methods_order`."""
    default = written["convergence"][0].with_suffix(".md").read_text()
    lines = [line.split(" | ") for line in default.splitlines() if line.startswith("| ")][1:]
    labels = [cells[0].removeprefix("| ") for cells in lines if cells[0] != "| "]
    assert labels == ["digits, Dir(0.1)", "digits, Dir(0.5)"] and len(lines) == 32
    methods = [cells[1].split(" [")[0] for cells in lines]
    assert methods[:16] == ["FedSelect"] * 12 + ["FedAvg"] * 2 + ["Local"] * 2 == methods[16:]
    for kind in ("convergence", "cost", "fedl2p", "search_best"):
        for path in written[kind]:
            latex = path.read_text()
            groups = re.findall(r"\\multicolumn\{\d+\}\{l\}\{\\itshape (.*?)\} \\\\", latex)
            parts = latex.count("\\begin{tabular}")
            assert len(groups) == len(set(groups)) * parts, path      # once per group in each stacked part
