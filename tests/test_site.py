"""The built site as a reader sees it at 1400 px in headless Chromium (tests/site_check.py): on the
claims page every verdict and Holm p-value is visible without scrolling sideways. Without Chromium
(.ci/run installs it) the test checks the page's column order instead and says so."""
from __future__ import annotations

import os
import subprocess
import sys
import warnings

import pytest

from analysis.claims import HEADER
from conftest import REPO
from site_check import chromium, hidden_columns, layout

WANTED = ("Verdict", "Holm p")


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    out = tmp_path_factory.mktemp("site")
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-d", str(out)], cwd=REPO,
                          capture_output=True, text=True, timeout=300, env=os.environ | {"NO_MKDOCS_2_WARNING": "1"})
    assert done.returncode == 0, done.stderr[-3000:]
    return out


@pytest.mark.slow
def test_the_claims_page_shows_every_verdict_and_p_value_without_scrolling_sideways(site):
    assert HEADER[:2] == ("Claim", "Verdict") and HEADER.index("Holm p") < 6   # the verdict before the details
    if chromium() is None:
        warnings.warn("no Chromium on PATH: the claims page's layout was not measured, only its column order")
        return
    tables = layout(site / "claims" / "index.html", width=1400)
    claims = [t for t in tables if "Verdict" in t["headers"]]
    assert claims, "the claims page has no table with a Verdict column"
    assert hidden_columns(claims, WANTED) == []


def test_hidden_columns_names_what_lies_beyond_the_box():
    tables = [{"headers": ["Claim", "Verdict", "Holm p"], "visible": [True, True, False]}]
    assert hidden_columns(tables, WANTED) == ["Holm p"]
