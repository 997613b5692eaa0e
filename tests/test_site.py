"""The built site as a reader sees it at 1400 px in headless Chromium (tests/site_check.py): no table
of any page is wider than the page's content area, and the claims page opens on its verdict table
(near the top, short rows, every verdict and Holm p-value in view, a caption above each table).
Without Chromium (.ci/run installs it) the tests check the claims table's column order instead
and say so."""
from __future__ import annotations

import os
import subprocess
import sys
import warnings

import pytest

from analysis.claims import HEADER
from conftest import REPO
from site_check import chromium, hidden_columns, layouts, too_wide

WIDTH = 1400           # a laptop's window
VERDICT_TOP = 400      # px from the top of the page where the claims page's first table may start at the latest
ROW_MAX = 100          # px: the tallest row the verdict table may have (three lines of its text)
WANTED = ("Verdict", "Holm p")


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    out = tmp_path_factory.mktemp("site")
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-d", str(out)], cwd=REPO,
                          capture_output=True, text=True, timeout=300, env=os.environ | {"NO_MKDOCS_2_WARNING": "1"})
    assert done.returncode == 0, done.stderr[-3000:]
    return out


@pytest.fixture(scope="module")
def measured(site):
    """Every built page that has a table, measured at WIDTH px in one browser start (None without Chromium)."""
    if chromium() is None:
        warnings.warn("no Chromium on PATH: the site's layout was not measured, only the claims table's column order")
        return None
    pages = sorted(p for p in site.rglob("index.html") if "<table" in p.read_text())
    assert site / "claims" / "index.html" in pages and len(pages) > 10
    return {p.relative_to(site).parent.as_posix(): tables for p, tables in layouts(site, pages, WIDTH).items()}


@pytest.mark.slow
def test_the_claims_page_opens_on_its_verdict_table(measured):
    assert HEADER[:5] == ("#", "Claim", "Sweep", "Setting", "Verdict") and HEADER[-2:] == ("Holm p", "Seeds")
    if measured is None:
        return
    tables = measured["claims"]
    first = tables[0]
    assert tuple(first["headers"]) == HEADER, "the claims page's first table is not the verdict table"
    assert first["top"] <= VERDICT_TOP, f"the verdict table starts {first['top']} px down (at most {VERDICT_TOP})"
    assert len(first["rows"]) >= 30 and max(first["rows"]) <= ROW_MAX, sorted(first["rows"])[-5:]
    assert hidden_columns([first], WANTED) == [] and all(first["visible"])
    assert all(t["caption_above"] for t in tables), [t["headers"][:3] for t in tables if not t["caption_above"]]


@pytest.mark.slow
def test_no_table_is_wider_than_the_content_area_at_a_laptops_width(measured):
    if measured is None:
        return
    assert {"claims", "studies/fedselect-grid", "studies/fedl2p", "studies/perfedmask"} <= set(measured)
    wide = {page: [(t["headers"][:3], f"{t['width']} px in {t['area']}") for t in too_wide(tables)]
            for page, tables in measured.items() if too_wide(tables)}
    assert wide == {}


def test_hidden_columns_and_too_wide_name_what_lies_beyond_the_box():
    tables = [{"headers": ["Claim", "Verdict", "Holm p"], "visible": [True, True, False], "width": 900, "area": 868,
               "overflow": 32},
              {"headers": ["Method", "acc"], "visible": [True, True], "width": 868, "area": 868, "overflow": 0}]
    assert hidden_columns(tables, WANTED) == ["Holm p"]
    assert too_wide(tables) == [tables[0]]
