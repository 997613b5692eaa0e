"""Run a study the documentation reports and regenerate its result files under docs/results/.

    python -m scripts.reproduce NAME            # run the sweep(s), then write the tables and figures
    python -m scripts.reproduce NAME --tables-only   # tabulate sweeps already in --results
    python -m scripts.reproduce default --check      # run the default sweep in a temporary folder and
                                                     # fail when its tables differ from the committed ones
    python -m scripts.reproduce NAME --check --from-data  # recompute the tables from the committed data
    python -m scripts.reproduce NAME --from-data     # rewrite the committed tables from the committed data
    python -m scripts.reproduce --list

Every result table in the docs is a Markdown file that `analysis` wrote from a named sweep
(`build_tables(..., markdown=True)`); the pages include these files and never type a number.
A recipe is the exact command(s) that made the committed files; `docs/results/NAME/provenance.md`
says which commit ran the sweeps and which wrote the tables. `bash scripts/reproduce.sh NAME`
sets up `.venv` first. For the default sweep the README's table is rewritten too (between its
`generated:` markers; `tests/test_docs.py` checks that it equals the committed file).

The evidence travels with the tables: after a recipe's sweeps ran, `docs/results/NAME/data/<sweep>/`
keeps what analysis reads to recompute them (`keep_data`: trials.parquet, study.toml and the
compacted rows of the trials the tables report, not the search's), so that `--from-data` rebuilds
every table and verdict of a fresh clone without running a sweep (`tests/test_docs.py` does). Without
`--check`, `--from-data` writes what it recomputes: after a change to how `analysis` prints a table,
every Markdown table of NAME that now reads otherwise is rewritten from that data (no sweep, no
figure redrawn) and provenance.md says at which commit (`data_rewrite_note`).
"""

from __future__ import annotations

import argparse
import difflib
import importlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from scripts.recipes import CLAIMS_FROM, RECIPES, Recipe

ROOT = Path(__file__).resolve().parent.parent
DOCS_RESULTS = ROOT / "docs" / "results"
README = ROOT / "README.md"
README_TABLE = "methods.md"   # the default sweep's table shown in the README
DATA = "--data-root"
KEPT = "data"         # docs/results/NAME/data/<sweep>/: the compacted Parquet behind NAME's tables


def git(*args: str) -> str:
    try:
        return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def repo_relative(path: Path) -> Path:
    return path.relative_to(ROOT) if path.is_relative_to(ROOT) else path


def commit_label() -> str:
    """HEAD's short hash, with `+changes` when the work tree differs from it (outside docs/results/,
    which this script writes)."""
    head = git("rev-parse", "--short", "HEAD")
    dirty = git("status", "--porcelain", "--untracked-files=no", "--", ".", ":!docs/results")
    return f"{head}+changes" if dirty and dirty != "unknown" else head


def command_line(recipe: Recipe, sweep: tuple[str, str, tuple[str, ...]], results: Path, data_root: str) -> list[str]:
    name, study, args = sweep
    cmd = [sys.executable, "-m", "sweeps.run", study, *args, "--results", str(results), "--name", name]
    return cmd + [DATA, data_root] if recipe.needs_data else cmd


def shown(cmd: list[str]) -> str:
    """The command as a user types it: repository-relative, without the --results and --data-root
    this script chose."""
    parts, skip = [], False
    for c in cmd:
        if skip:
            skip = False
        elif c in ("--results", DATA):
            skip = True
        else:
            parts.append("python" if c == sys.executable else c.replace(str(ROOT) + "/", ""))
    return " ".join(parts)


def tabulate(name: str, recipe: Recipe, results: Path, out: Path) -> list[Path]:
    """Write the recipe's Markdown tables (and figures, reports) from its sweeps in `results` into
    `out`. The tables are built where `python -m analysis.tables` puts them (the first sweep's
    `tables/`, refreshing its summary.parquet) and copied from there."""
    from analysis.plots import build_plots
    from analysis.tables import build_tables

    folders = [results / sweep for sweep, _, _ in recipe.sweeps]
    if name == "claims":
        folders = [results / sweep for other in CLAIMS_FROM for sweep, _, _ in RECIPES[other].sweeps
                   if (results / sweep / "trials.parquet").exists()]
    missing = [str(f) for f in folders if not (f / "trials.parquet").exists()]
    if missing or (not folders and name != "claims"):   # the claims page lists every claim, sweeps or none
        raise SystemExit(f"error: no sweep results in {', '.join(missing) or results}; "
                         "run the recipe without --tables-only")
    if name == "claims":
        fresh, written = [], {"claims.md": claims_table(folders, keep_not_run=True)}
    else:
        # the Markdown twin of every LaTeX table written (a table without one is left out, not an error)
        fresh = [md for tex in build_tables(folders, recipe.table, markdown=True).values()
                 if (md := tex.with_suffix(".md")).is_file()]
        if recipe.figures:
            fresh += [p for p in build_plots(folders) if p.suffix == ".png"]
        # build_tables keeps the statistics of the table it pooled from all the recipe's sweeps in the
        # first sweep's tables/summary.parquet: judge the claims there, once (the other sweeps' own
        # summaries would judge the same cells again, under other corrections), unless each sweep
        # holds data of its own (`claims_per_sweep`: FedL2P's Table 1, one sweep per pretraining)
        verdicts = claims_table(folders if recipe.claims_per_sweep else folders[:1], keep_not_run=False)
        written = {"claims.md": verdicts} if verdicts is not None else {}
    with tempfile.TemporaryDirectory() as tmp:
        for file, text in written.items():
            (Path(tmp) / file).write_text(text)
            fresh.append(Path(tmp) / file)
        for module, report, plot in recipe.reports:
            args = [*map(str, folders), "--markdown", "--out", f"{tmp}/{report}"]
            if plot:
                args += ["--plot", f"{tmp}/{plot}"]
            if importlib.import_module(module).main(args) != 0:
                raise SystemExit(f"error: python -m {module} failed")
            fresh += [Path(tmp) / report] + ([Path(tmp) / plot] if plot else [])
        return replace_files(out, fresh)


def keep_data(results: Path, recipe: Recipe, out: Path) -> list[Path]:
    """Copy into out/data/<sweep>/ what the recipe's tables are computed from: each sweep's
    trials.parquet and study.toml, and the round and client rows of the trials a table reports (no
    search trial: analysis.common.final_rows), as the sweep compacted them. Returns the folders written."""
    import pandas as pd

    from analysis.common import final_rows
    from sweeps.parquet_sink import round_sources

    kept = []
    for sweep, _, _ in recipe.sweeps:
        source, target = results / sweep, out / KEPT / sweep
        if target.exists():
            shutil.rmtree(target)
        (target / "rounds").mkdir(parents=True)
        reported = set(final_rows(pd.read_parquet(source / "trials.parquet"))["config_hash"])
        for key, files in round_sources(source).items():
            for file in files if key in reported else ():
                shutil.copy2(file, target / "rounds" / file.name)
        for key in sorted(reported):  # the clients' realised data (FedL2P's policy table reads their domains)
            if (source / "clients" / f"{key}.parquet").exists():
                (target / "clients").mkdir(exist_ok=True)
                shutil.copy2(source / "clients" / f"{key}.parquet", target / "clients" / f"{key}.parquet")
        for name in ("trials.parquet", "study.toml"):   # study.toml: which study it is (the claims read it)
            if (source / name).exists():
                shutil.copy2(source / name, target / name)
        kept.append(target)
    return kept


def committed_data(names: list[str], into: Path) -> None:
    """The sweeps kept under docs/results/<name>/data/ for each recipe name, copied into `into`."""
    for name in names:
        for sweep in sorted((DOCS_RESULTS / name / KEPT).glob("*/")):
            shutil.copytree(sweep, into / sweep.name)


def claims_table(folders: list[Path], keep_not_run: bool) -> str | None:
    """The papers' claims checked on these sweeps (analysis.claims) as Markdown: every claim (the
    claims page), or only those the sweeps test (a study's folder; None when they test none)."""
    from analysis.claims import NOT_RUN, check_claims
    from analysis.claims import to_markdown as claims_markdown

    table = check_claims(folders)
    if not keep_not_run:
        table = table[table["verdict"] != NOT_RUN]   # claims of other studies, or whose methods these sweeps lack
    return claims_markdown(table) if not table.empty else None


def replace_files(out: Path, fresh: list[Path]) -> list[Path]:
    """Make `out` hold exactly `fresh` (and its provenance.md)."""
    if out.exists():
        for old in out.iterdir():
            if old.is_file() and old.name != "provenance.md":
                old.unlink()
    out.mkdir(parents=True, exist_ok=True)
    return [Path(shutil.copy2(p, out / p.name)) for p in fresh]


def write_provenance(name: str, recipe: Recipe, commands: list[str], out: Path, ran: str | None,
                     seconds: float | None, kernels: str, judged: list[str] | None = None) -> None:
    if not recipe.sweeps:   # the claims: no sweep of their own
        lines = [f"**`docs/results/{name}`**: {recipe.about}. Regenerate: `bash scripts/reproduce.sh {name}`, which "
                 "runs no sweep: it judges the sweeps of the claims' studies found in `results/` "
                 "(`scripts/recipes.py` CLAIMS_FROM); `--check --from-data` judges those committed under "
                 "`docs/results/*/data/`.", "",
                 f"Written by `analysis` at commit {commit_label()} ({time.strftime('%Y-%m-%d', time.gmtime())}) "
                 f"from the sweeps {', '.join(judged) if judged else '(none: every row is not rerun yet)'}; "
                 "each study's provenance.md says which commit ran it."]
        (out / "provenance.md").write_text("\n".join(lines) + "\n")
        return
    lines = [f"**`docs/results/{name}`**: {recipe.about}. Regenerate: `bash scripts/reproduce.sh {name}`, "
             "which runs:", ""]
    lines += [f"    {c}" for c in commands]
    lines += ["", f"Tables and figures written by `analysis` at commit {commit_label()} "
                  f"({time.strftime('%Y-%m-%d', time.gmtime())})."]
    if seconds is not None:
        lines.append(f"Sweeps run at commit {ran} in {seconds / 60:.0f} min (this machine).")
    elif ran:
        lines.append(f"Sweeps run: {ran}.")
    lines.append(f"The trials ran {kernels} (fl_core/kernels.py; `not recorded`: before the columns existed).")
    (out / "provenance.md").write_text("\n".join(lines) + "\n")


def sync_readme(table: Path, readme: Path | None = None) -> bool:
    """Replace the README's generated block with `table`; True when it changed."""
    readme = readme or README
    text = readme.read_text()
    start, end = readme_markers(table)
    if start not in text or end not in text:
        raise SystemExit(f"error: {readme} has no block between {start!r} and {end!r}")
    head, rest = text.split(start, 1)
    _, tail = rest.split(end, 1)
    new = f"{head}{start}\n{table.read_text().rstrip()}\n{end}{tail}"
    if new != text:
        readme.write_text(new)
    return new != text


def readme_markers(table: Path) -> tuple[str, str]:
    rel = table.relative_to(ROOT) if table.is_relative_to(ROOT) else table
    return f"<!-- generated: {rel} -->", "<!-- end generated -->"


def check(out_new: Path, committed: Path) -> list[str]:
    """The differences between freshly written tables and the committed ones (Markdown tables only):
    each differing cell by file, row and column where the tables have the same shape, else a diff."""
    problems = []
    for fresh in sorted(out_new.glob("*.md")):
        if fresh.name == "provenance.md":
            continue
        old = committed / fresh.name
        if not old.exists():
            problems.append(f"{old} is not committed")
            continue
        if fresh.read_text() != old.read_text():
            cells = cell_differences(old.read_text(), fresh.read_text())
            if cells is not None:
                problems += [f"{fresh.name}: {cell}" for cell in cells]
            else:
                diff = difflib.unified_diff(old.read_text().splitlines(), fresh.read_text().splitlines(),
                                            str(old), "regenerated", lineterm="")
                problems.append("\n".join(diff))
    for old in sorted(committed.glob("*.md")):
        if old.name != "provenance.md" and not (out_new / old.name).exists():
            problems.append(f"{old} was not regenerated")
    return problems


def cell_differences(old: str, new: str) -> list[str] | None:
    """'row R, column C: committed X, regenerated Y' for each differing cell of two Markdown files
    whose lines differ only inside table rows of the same number of cells (None otherwise; a
    caption that differs is reported as a line)."""
    old_lines, new_lines = old.splitlines(), new.splitlines()
    if len(old_lines) != len(new_lines):
        return None
    found, header = [], []
    for a, b in zip(old_lines, new_lines):
        if a.startswith("|") and a.count("|") == b.count("|"):
            cells_a, cells_b = a.strip("|").split("|"), b.strip("|").split("|")
            header = cells_a if not header else header
            found += [f"row {cells_a[0].strip()!r}, column {header[k].strip()!r}: committed {x.strip()}, "
                      f"regenerated {y.strip()}" for k, (x, y) in enumerate(zip(cells_a, cells_b)) if x != y]
        else:
            header = []
            if a != b:
                found.append(f"the line {a[:80]!r}... now reads {b[:80]!r}...")
    return found


def kernels_used(results: Path, recipe: Recipe) -> str:
    """The kernels the recipe's trials ran and the instruction sets of the CPUs they ran on (the
    trials' columns kernels and cpu_isa)."""
    import pandas as pd

    seen = set()
    for sweep, _, _ in recipe.sweeps:
        path = results / sweep / "trials.parquet"
        if path.exists():
            trials = pd.read_parquet(path)
            if {"kernels", "cpu_isa"} <= set(trials.columns):
                seen |= set(zip(trials.kernels.fillna("not recorded"), trials.cpu_isa.fillna("not recorded")))
    return "; ".join(f"kernels {k} on a CPU with {isa}" for k, isa in sorted(seen)) or "not recorded"


def flags_error(args: argparse.Namespace) -> str | None:
    """What is wrong with the recipe's name or a combination of flags (None: nothing)."""
    if args.name not in RECIPES:
        return f"unknown recipe {args.name!r}; choose from {', '.join(RECIPES)}"
    if args.check and args.tables_only:
        return ("--check runs the sweeps; it cannot be combined with --tables-only (--check --from-data "
                "recomputes the tables from the committed data)")
    if args.from_data and args.tables_only:
        return ("--from-data reads the Parquet committed under docs/results/NAME/data/; --tables-only reads "
                "--results: choose one")
    if args.ran_at is not None and not args.tables_only:
        return "--ran-at names the commit of sweeps run earlier; it goes with --tables-only"
    return None


def data_root_error(args: argparse.Namespace, data: str) -> str | None:
    """What is wrong with the data root of a recipe whose sweeps run and need data (None: nothing)."""
    if RECIPES[args.name].needs_data and not args.tables_only and not args.from_data and not Path(data).is_dir():
        return (f"data root {data!r} is not a folder; give --data-root DIR holding FashionMNIST/raw "
                "(or set FL_DATA_ROOT)")
    return None


def report_check(name: str, recipe: Recipe, results: Path, out: Path, committed: Path) -> int:
    """--check: print how the regenerated tables `out` differ from the committed ones; 1 if they do, else 0."""
    problems = check(out, committed)
    print(f"[reproduce] the trials ran {kernels_used(results, recipe)}", flush=True)
    if problems:
        print("\n".join(problems))
        print(f"error: {len(problems)} differences between the regenerated tables of {name!r} and "
              f"docs/results/{name}; the committed ones were made with the kernels their provenance.md "
              f"names (commit the new ones with: bash scripts/reproduce.sh {name})", file=sys.stderr)
        return 1
    count = len(list(out.glob("*.md")))
    print(f"[reproduce] {count} tables regenerated, identical to docs/results/{name}")
    return 0


TABLES_WRITTEN = re.compile(r"^Tables (?:and figures )?written by `analysis` at commit (\S+) \(([^)]*)\)"
                            r"(?:, from the Parquet under `data/`; figures at commit (\S+) \(([^)]*)\))?\.$", re.M)


def data_rewrite_note(provenance: str) -> str:
    """provenance.md once its tables were rewritten from data/ at this commit: the line that says
    which commit wrote the tables names this one, and keeps the one that drew the figures."""
    found = TABLES_WRITTEN.search(provenance)
    line = (f"Tables written by `analysis` at commit {commit_label()} ({time.strftime('%Y-%m-%d', time.gmtime())}), "
            "from the Parquet under `data/`")
    if found is None:
        return provenance.rstrip("\n") + f"\n{line}.\n"
    figures, day = (found.group(3), found.group(4)) if found.group(3) else (found.group(1), found.group(2))
    return provenance[:found.start()] + f"{line}; figures at commit {figures} ({day})." + provenance[found.end():]


def rewrite_from_data(name: str, recipe: Recipe, committed: Path) -> int:
    """--from-data without --check: recompute NAME's tables from its committed data and write each
    Markdown file that reads otherwise into `committed` (the default's also into the README);
    provenance.md follows (`data_rewrite_note`). Figures are left as they are."""
    if not (committed / KEPT).is_dir() and name != "claims":
        print(f"error: docs/results/{name} keeps no data/ to recompute its tables from", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="reproduce-") as tmp:
        results, fresh = Path(tmp) / "results", Path(tmp) / "fresh"
        committed_data(list(CLAIMS_FROM) if name == "claims" else [name], results)
        tabulate(name, recipe, results, fresh)
        changed = [shutil.copy2(new, committed / new.name) for new in sorted(fresh.glob("*.md"))
                   if not (committed / new.name).is_file() or (committed / new.name).read_text() != new.read_text()]
        gone = sorted({p.name for p in committed.glob("*.md")} - {p.name for p in fresh.glob("*.md")}
                      - {"provenance.md"})
    for path in changed:
        print(f"[reproduce] rewrote {repo_relative(Path(path))} from the committed data")
    for file in gone:
        print(f"[reproduce] {file}: not written from the data any more; left as it is")
    if changed:
        provenance = committed / "provenance.md"
        provenance.write_text(data_rewrite_note(provenance.read_text() if provenance.exists() else ""))
    if name == "default" and (committed / README_TABLE).exists() and sync_readme(committed / README_TABLE):
        print(f"[reproduce] README table updated from {committed / README_TABLE}")
    print(f"[reproduce] {len(changed)} tables of {name!r} rewritten from its data")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="scripts/reproduce.sh", description=__doc__.split("\n")[0])
    parser.add_argument("name", nargs="?", help="the recipe (--list shows them)")
    parser.add_argument("--list", action="store_true", help="print the recipes and exit")
    parser.add_argument("--tables-only", action="store_true", help="tabulate sweeps already in --results")
    parser.add_argument("--check", action="store_true",
                        help="run in a temporary folder and compare the tables with docs/results/NAME")
    parser.add_argument("--from-data", action="store_true",
                        help="no sweep runs; the tables are recomputed from the Parquet committed under "
                             "docs/results/NAME/data/ (the claims: that of the studies they read) and compared with "
                             "the committed ones (with --check) or written over those that read otherwise")
    parser.add_argument("--results", type=Path, default=ROOT / "results", help="results folder (default results/)")
    parser.add_argument("--data-root", default=None, help="data folder (default $FL_DATA_ROOT or ../shared/data)")
    parser.add_argument("--ran-at", default=None,
                        help="with --tables-only: the commit that ran the sweeps, for provenance.md")
    args = parser.parse_args(argv)
    if args.list or not args.name:
        for name, recipe in RECIPES.items():
            print(f"{name:32s} {recipe.about}")
        return 0 if args.list else 2
    data = args.data_root or os.environ.get("FL_DATA_ROOT", str(ROOT.parent / "shared" / "data"))
    error = flags_error(args) or data_root_error(args, data)
    if error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    recipe = RECIPES[args.name]
    committed = DOCS_RESULTS / args.name
    if args.from_data and not args.check:
        return rewrite_from_data(args.name, recipe, committed)
    with tempfile.TemporaryDirectory(prefix="reproduce-") as tmp:
        results = Path(tmp) / "results" if args.check else args.results
        commands = [command_line(recipe, s, results, data) for s in recipe.sweeps]
        seconds = None
        if args.from_data:
            committed_data(list(CLAIMS_FROM) if args.name == "claims" else [args.name], results)
        elif not args.tables_only:
            taken = [str(results / s[0]) for s in recipe.sweeps if (results / s[0]).exists()]
            if taken:
                print(f"error: {', '.join(taken)} exists; remove it or tabulate it with --tables-only",
                      file=sys.stderr)
                return 2
            start = time.monotonic()
            for cmd in commands:
                print(f"[reproduce] {shown(cmd)}", flush=True)
                done = subprocess.run(cmd, cwd=ROOT)
                if done.returncode != 0:
                    print(f"error: the sweep exited {done.returncode}; nothing under docs/ was changed",
                          file=sys.stderr)
                    return done.returncode
            seconds = time.monotonic() - start
        out = Path(tmp) / "fresh" if args.check else committed
        written = tabulate(args.name, recipe, results, out)
        if args.check:
            return report_check(args.name, recipe, results, out, committed)
    if recipe.sweeps:
        for folder in keep_data(results, recipe, committed):
            print(f"[reproduce] kept the Parquet behind the tables in {repo_relative(folder)}")
    shown_commands = [shown(cmd) for cmd in commands]
    ran = (args.ran_at or "not recorded") if args.tables_only else commit_label()
    judged = sorted(s for other in CLAIMS_FROM for s, _, _ in RECIPES[other].sweeps if (results / s).is_dir())
    write_provenance(args.name, recipe, shown_commands, committed, ran, seconds, kernels_used(results, recipe),
                     judged if args.name == "claims" else None)
    for path in written:
        print(f"[reproduce] wrote {repo_relative(path)}")
    if args.name == "default" and (committed / README_TABLE).exists() and sync_readme(committed / README_TABLE):
        print(f"[reproduce] README table updated from {committed / README_TABLE}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
