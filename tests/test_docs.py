"""The documentation site (mkdocs.yml, docs/) builds with --strict (a broken link, a missing page
or an unresolvable API reference fails), and its Methods page is what the registry generates."""
from __future__ import annotations

import importlib.util
import os
import subprocess
import sys

from conftest import REPO

sys.path.insert(0, str(REPO / "scripts"))
import methods_page  # noqa: E402


def test_the_methods_page_is_generated_from_the_registry_and_up_to_date():
    text = methods_page.page()
    assert (REPO / "docs" / "methods.md").read_text() == text, "run: .venv/bin/python scripts/methods_page.py"
    from fl_core.algorithms import ALGORITHMS
    assert text.count("\n## ") == len(ALGORITHMS)
    assert "| `pers_rate` | `0.25` |" in text and "| `ditto_lambda` | `1.0` |" in text


def test_the_site_builds_strictly(tmp_path):
    assert importlib.util.find_spec("mkdocs") is not None, "mkdocs is a docs dependency: run scripts/setup.sh"
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-d", str(tmp_path / "site")],
                          cwd=REPO, capture_output=True, text=True, timeout=300,
                          env=os.environ | {"NO_MKDOCS_2_WARNING": "1"})
    assert done.returncode == 0, done.stderr[-3000:]
    api = (tmp_path / "site" / "api" / "index.html").read_text()
    assert "masked_average" in api and "DamagedFile" in api   # the references resolved to the code
    assert (tmp_path / "site" / "methods" / "index.html").exists()
