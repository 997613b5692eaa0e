"""The documentation site (mkdocs.yml, docs/) builds with --strict (a broken link, a missing page
or an unresolvable API reference fails), and its Methods page is what the registry generates."""
from __future__ import annotations

import pytest

import importlib.util
import os
import re
import subprocess
import sys

from conftest import REPO
from scripts import methods_page, reproduce


def test_the_methods_page_is_generated_from_the_registry_and_up_to_date():
    text = methods_page.page()
    assert (REPO / "docs" / "methods.md").read_text() == text, "run: .venv/bin/python -m scripts.methods_page"
    from fl_core.algorithms import ALGORITHMS
    assert text.count("\n## ") == len(ALGORITHMS)
    assert "| `pers_rate` | `0.25` |" in text and "| `ditto_lambda` | `1.0` |" in text


@pytest.mark.slow
def test_the_site_builds_strictly(tmp_path):
    assert importlib.util.find_spec("mkdocs") is not None, "mkdocs is a docs dependency: run scripts/setup.sh"
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-d", str(tmp_path / "site")],
                          cwd=REPO, capture_output=True, text=True, timeout=300,
                          env=os.environ | {"NO_MKDOCS_2_WARNING": "1"})
    assert done.returncode == 0, done.stderr[-3000:]
    api = (tmp_path / "site" / "api" / "index.html").read_text()
    assert "masked_average" in api and "DamagedFile" in api   # the references resolved to the code
    assert (tmp_path / "site" / "methods" / "index.html").exists()


# ---------------------------------------------------------------- generated results in the docs


INCLUDE = re.compile(r'^ *--8<-- "([^"]+)"$', re.M)   # indented: inside a collapsed block


def test_the_readme_fits_two_screens_and_shows_the_committed_default_table():
    text = (REPO / "README.md").read_text()
    assert len(text.splitlines()) <= 200
    start, end = reproduce.readme_markers(REPO / "docs" / "results" / "default" / reproduce.README_TABLE)
    block = text.split(start, 1)[1].split(end, 1)[0]
    assert block.strip() == (REPO / "docs" / "results" / "default" / reproduce.README_TABLE).read_text().strip()
    assert "| FedSelect |" in block


def test_every_result_table_of_the_docs_is_an_included_file_with_its_provenance():
    pages = [p for p in (REPO / "docs").rglob("*.md") if "results" not in p.relative_to(REPO / "docs").parts]
    included = {m for p in pages for m in INCLUDE.findall(p.read_text())}
    folders = sorted(p for p in (REPO / "docs" / "results").iterdir() if p.is_dir())
    for folder in folders:
        assert (folder / "provenance.md").exists(), f"{folder} has no provenance.md"
        tables = [f"results/{folder.name}/{t.name}" for t in folder.glob("*.md")]
        assert set(tables) <= included, f"files of {folder} that no page includes: {set(tables) - included}"
    # a study page's results are files: a table row with a mean ± std cell is not typed into a page
    typed = [(p.name, line) for p in pages for line in p.read_text().splitlines()
             if line.startswith("|") and re.search(r"\d ± \d", line) and p.parent.name == "studies"]
    assert not typed, f"result rows typed into study pages: {typed[:3]}"


def test_every_recipe_folder_regenerates_from_named_sweeps():
    for name, recipe in reproduce.RECIPES.items():
        assert name == "claims" or recipe.sweeps, name
        for sweep, study, args in recipe.sweeps:
            assert (REPO / "studies" / f"{study}.toml").exists() and "--name" not in args and sweep
    made = {p.name for p in (REPO / "docs" / "results").iterdir() if p.is_dir()}
    recipes_made = made & set(reproduce.RECIPES)
    assert "default" in recipes_made
    for name in recipes_made:
        provenance = (REPO / "docs" / "results" / name / "provenance.md").read_text()
        assert f"bash scripts/reproduce.sh {name}" in provenance, name    # archived ones too: it reruns them
    reports = {"parity", "kernels", "performance"}  # benchmark reports; the others are archived
    for name in made - set(reproduce.RECIPES) - reports:
        assert "(archived)" in (REPO / "docs" / "results" / name / "provenance.md").read_text(), name


def test_reproduce_refuses_bad_input_with_one_line(capsys):
    assert reproduce.main(["nope"]) == 2
    assert "unknown recipe 'nope'; choose from default," in capsys.readouterr().err
    assert reproduce.main(["default", "--check", "--tables-only"]) == 2
    assert "--check runs the sweeps" in capsys.readouterr().err
    assert reproduce.main(["default", "--ran-at", "abc"]) == 2
    assert "--ran-at names the commit of sweeps run earlier" in capsys.readouterr().err
    assert reproduce.main(["baselines-fmnist", "--data-root", "/nowhere/at/all"]) == 2
    assert "data root '/nowhere/at/all' is not a folder" in capsys.readouterr().err


def test_reproduce_check_names_every_difference(tmp_path):
    """Each differing cell by file, row and column; a file of another shape as a diff."""
    fresh, committed = tmp_path / "fresh", tmp_path / "committed"
    fresh.mkdir(), committed.mkdir()
    table = "| Method | Dir(0.1) | Dir(0.5) |\n|---|---|---|\n| FedAvg | 29.2 ± 8.9 | 51.5 ± 16.3 |\n\nCaption.\n"
    (fresh / "methods.md").write_text(table)
    (committed / "methods.md").write_text(table)
    (committed / "provenance.md").write_text("made somewhere\n")
    assert reproduce.check(fresh, committed) == []
    (fresh / "methods.md").write_text(table.replace("29.2 ± 8.9", "29.2 ± 9.1").replace("Caption", "Other"))
    (fresh / "grid.md").write_text("new\n")
    (committed / "grid.md").write_text("old\nlines\n")
    (committed / "limit.md").write_text("old\n")
    (fresh / "convergence.md").write_text("x\n")
    problems = reproduce.check(fresh, committed)
    assert problems[0] == f"{committed / 'convergence.md'} is not committed"
    assert "-old" in problems[1] and "+new" in problems[1]   # grid.md: other lines, a diff
    assert problems[2:4] == ["methods.md: row 'FedAvg', column 'Dir(0.1)': committed 29.2 ± 8.9, regenerated "
                             "29.2 ± 9.1",
                             "methods.md: the line 'Caption.'... now reads 'Other.'..."]
    assert problems[4:] == [f"{committed / 'limit.md'} was not regenerated"]


def test_reproduce_copies_the_table_into_the_readme_block(tmp_path):
    table = tmp_path / "methods.md"
    table.write_text("| Method | x |\n|---|---|\n| FedSelect | 1 |\n")
    readme = tmp_path / "README.md"
    start, end = reproduce.readme_markers(table)
    readme.write_text(f"intro\n{start}\nold\n{end}\noutro\n")
    assert reproduce.sync_readme(table, readme) is True
    assert readme.read_text() == f"intro\n{start}\n| Method | x |\n|---|---|\n| FedSelect | 1 |\n{end}\noutro\n"
    assert reproduce.sync_readme(table, readme) is False


def test_reproduce_tabulates_a_sweep_into_the_docs_folder_with_its_provenance(tmp_path, monkeypatch):
    """--tables-only on a finished sweep: the Markdown tables and figures analysis writes land in
    docs/results/NAME (here a temporary one) with provenance.md, the README block follows the
    methods table, and a second tabulation of the same sweep is identical (what --check compares)."""
    import pandas as pd
    from table_helpers import docs_sandbox, write_sweep

    from sweeps import parquet_sink
    from sweeps.parquet_sink import round_sources

    results = tmp_path / "results"
    sweep = write_sweep(results / "fedselect-grid")
    keys = sorted(pd.read_parquet(sweep / "trials.parquet").config_hash)
    for key in [*keys, "fffffffffff0"]:   # the last: a trial no table reports, whose clients are not kept
        parquet_sink.write_clients(sweep, key, [{"config_hash": key, "client": 0, "domain": "clean"}])
    docs, readme = docs_sandbox(tmp_path, monkeypatch)
    assert reproduce.main(["default", "--tables-only", "--results", str(results), "--ran-at", "abc1234"]) == 0
    made = {p.name for p in (docs / "default").iterdir()}
    assert {"methods.md", "provenance.md", "accuracy_vs_round.png"} <= made
    provenance = (docs / "default" / "provenance.md").read_text()
    assert "bash scripts/reproduce.sh default" in provenance and "Sweeps run: abc1234." in provenance
    assert "python -m sweeps.run fedselect_grid --name fedselect-grid" in provenance
    table = (docs / "default" / "methods.md").read_text()
    assert table.split("\n\n")[1].startswith("| Method |") and table.strip() in readme.read_text()  # caption first
    again = reproduce.tabulate("default", reproduce.RECIPES["default"], results, tmp_path / "again")
    assert reproduce.check(tmp_path / "again", docs / "default") == [] and again
    assert reproduce.main(["default", "--results", str(results)]) == 2   # a sweep folder is never overwritten
    kept = docs / "default" / "data" / "fedselect-grid"       # the evidence beside the tables, and only it
    assert {p.name for p in kept.iterdir()} == {"trials.parquet", "rounds", "clients"}   # (no study.toml here)
    assert set(round_sources(kept)) == set(pd.read_parquet(kept / "trials.parquet").config_hash)
    assert sorted(p.stem for p in (kept / "clients").iterdir()) == keys
    assert reproduce.main(["default", "--check", "--from-data"]) == 0   # the tables, from the kept data alone


@pytest.mark.slow
def test_every_table_with_committed_data_recomputes_from_it(capsys):
    """Each docs/results/NAME/data/ (the compacted Parquet of NAME's sweeps) gives NAME's committed
    tables again, without running a sweep: what a fresh clone can check."""
    kept = sorted(p.parent.name for p in (REPO / "docs" / "results").glob(f"*/{reproduce.KEPT}"))
    for name in kept:
        assert reproduce.main([name, "--check", "--from-data"]) == 0, capsys.readouterr().out


def test_a_recipe_of_several_sweeps_judges_its_claims_once_on_the_pooled_table(tmp_path, monkeypatch):
    """build_tables keeps the statistics of the table it pooled from all of a recipe's sweeps in
    the first sweep's summary; judging every sweep would count the same cells twice."""
    import pandas as pd
    from table_helpers import write_sweep

    import analysis.claims

    results = tmp_path / "results"
    recipe = reproduce.RECIPES["baselines-pfl"]
    for sweep, _, _ in recipe.sweeps:
        write_sweep(results / sweep)
    judged = []

    def check_claims(folders):
        judged.append(list(folders))
        return pd.DataFrame({"paper": ["P"], "source": ["P"], "claim": ["c"], "paper_number": [""], "study": ["s"],
                             "setting": [""], "ours": [""], "verdict": ["holds"], "test": [""]})

    monkeypatch.setattr(analysis.claims, "check_claims", check_claims)
    reproduce.tabulate("baselines-pfl", recipe, results, tmp_path / "out")
    assert judged == [[results / recipe.sweeps[0][0]]]
    assert (tmp_path / "out" / "claims.md").read_text().count("| P |") == 1


def test_every_list_in_the_docs_starts_after_a_blank_line():
    """Markdown renders a list glued to the paragraph before it as that paragraph, with literal
    " - " in it (as it did in 11 places): every list item that follows a paragraph line needs a
    blank line between them."""
    item = re.compile(r"^\s*([-*]|\d+\.) ")
    glued = []
    for page in sorted((REPO / "docs").rglob("*.md")):
        lines, fenced = page.read_text().splitlines(), False
        start = lines.index("---", 1) + 1 if lines[:1] == ["---"] else 0   # after the page's front matter
        for i, line in enumerate(lines[start:], start):
            fenced ^= line.strip().startswith("```")
            before = lines[i - 1] if i else ""
            if not fenced and item.match(line) and before.strip() and not item.match(before) \
                    and not before.startswith(("  ", "|", "#", "```")):
                glued.append(f"{page.relative_to(REPO)}:{i + 1}")
    assert glued == []


def test_the_docs_link_nowhere_outside_the_repository():
    """A user's clone has no ../shared/: no page links there or names a file outside the project."""
    outside = [f"{page.relative_to(REPO)}: {hit}" for page in sorted((REPO / "docs").rglob("*.md"))
               for hit in re.findall(r"\]\((?:\.\./)+shared/[^)]*\)|\.\./shared/\S+", page.read_text())]
    assert outside == []


def test_the_docs_speak_of_the_project_not_of_how_it_was_built():
    """Pages describe the project as it is: no issue numbers, no sessions."""
    words = re.compile(r"\bissue \d+|\bissue's\b|\b(?:this|an earlier|a later|in a) session\b", re.I)
    found = [f"{page.relative_to(REPO)}: {m.group(0)}" for page in sorted((REPO / "docs").rglob("*.md"))
             if "results" not in page.parts for m in words.finditer(page.read_text())]
    found += [f"README.md: {m.group(0)}" for m in words.finditer((REPO / "README.md").read_text())]
    assert found == []


def test_every_committed_figure_is_shown_on_a_page():
    """A figure under docs/results that no page includes is evidence nobody sees: every one is."""
    pages = "\n".join(p.read_text() for p in (REPO / "docs").rglob("*.md") if "results" not in p.parts)
    unseen = [str(f.relative_to(REPO / "docs")) for f in sorted((REPO / "docs" / "results").glob("*/*.png"))
              if str(f.relative_to(REPO / "docs")) not in pages]
    assert unseen == []
    # and zoomable: every figure on a page is a link to its own file (a click opens it full size)
    bare = re.findall(r"^ *!\[[^\]]*\]\([^)]+\)", pages, re.M)
    assert bare == []


def test_every_module_a_page_names_is_on_the_api_page():
    """A page that sends readers to `analysis.stats.compare` needs `analysis.stats` in the API
    reference: every module the pages name (the longest importable prefix of a dotted name)."""
    api = set(re.findall(r"^::: (\S+)$", (REPO / "docs" / "api.md").read_text(), re.M))
    named = set()
    for page in (REPO / "docs").rglob("*.md"):
        if "results" in page.parts:
            continue
        for dotted in re.findall(r"\b((?:fl_core|sweeps|analysis)(?:\.[a-z_0-9]+)+)", page.read_text()):
            parts, module = dotted.split("."), None
            for i in range(2, len(parts) + 1):   # the longest prefix that is a module
                try:
                    found = importlib.util.find_spec(".".join(parts[:i])) is not None
                except ModuleNotFoundError:      # a prefix that is a module, not a package
                    found = False
                if not found:
                    break
                module = ".".join(parts[:i])
            if module:          # not a file name such as analysis.md
                named.add(module)
    assert sorted(named - api) == []
