"""The house has no circles: no module of fl_core, sweeps, analysis or benchmarks imports one that
(through others) imports it back, no private name (`_x`) is imported from another module, and
fl_core depends on neither Ray, MLflow, the sweeps nor the analysis. Every import statement counts,
also those inside functions and `if TYPE_CHECKING:` blocks: each shows a coupling."""
from __future__ import annotations

import ast
from pathlib import Path

from conftest import REPO

PACKAGES = ("fl_core", "sweeps", "analysis", "benchmarks")


def modules() -> dict[str, Path]:
    found = {}
    for package in PACKAGES:
        for path in sorted((REPO / package).rglob("*.py")):
            parts = list(path.relative_to(REPO).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join(parts)] = path
    return found


def imports(name: str, path: Path, known: set[str]) -> list[tuple[str, list[str]]]:
    """(imported module, names imported from it) for each import statement of module `name`,
    relative imports resolved; only the repository's own modules."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out += [(alias.name, []) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = package.split(".")
            if node.level:
                base = base[:len(base) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module
            names = [alias.name for alias in node.names]
            submodules = [n for n in names if f"{target}.{n}" in known]
            out += [(f"{target}.{n}", []) for n in submodules]
            rest = [n for n in names if n not in submodules]
            if rest:  # `from package import submodule` depends on the submodule, not on the package's names
                out.append((target, rest))
    return [(target, names) for target, names in out if target in known or target.split(".")[0] in ("ray", "mlflow")]


def graph() -> tuple[dict[str, set[str]], list[str]]:
    found = modules()
    edges, private = {}, []
    for name, path in found.items():
        edges[name] = set()
        for target, names in imports(name, path, set(found)):
            if target in found and target != name:
                edges[name].add(target)
            for imported in names:
                if imported.startswith("_") and not imported.startswith("__") and target in found:
                    private.append(f"{name} imports {imported} from {target}")
            if target.split(".")[0] in ("ray", "mlflow"):
                edges[name].add(target)
    return edges, private


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in edges.get(v, ()):
            if w not in edges:
                continue
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return out


def test_no_module_imports_itself_back():
    assert cycles(graph()[0]) == []


def test_no_private_name_crosses_a_module():
    assert graph()[1] == []


def test_fl_core_depends_on_neither_ray_mlflow_the_sweeps_nor_the_analysis():
    edges, _ = graph()
    outside = [f"{m} -> {t}" for m, targets in edges.items() if m.startswith("fl_core")
               for t in targets if t.split(".")[0] in ("ray", "mlflow", "sweeps", "analysis", "benchmarks")]
    assert outside == []


def test_analysis_reads_files_never_the_sweeps_the_methods_nor_ray_nor_mlflow():
    """analysis reads Parquet (fl_core.result_files) and never imports the sweeps, so the packages
    have one direction: sweeps -> analysis (the tables at a sweep's end), never back; what it needs
    of a method (which model is scored, whether it has a server) is in the rows, so it never imports
    the methods either (fl_core.algorithms)."""
    edges, _ = graph()
    outside = [f"{m} -> {t}" for m, targets in edges.items() if m.startswith("analysis")
               for t in targets if t.split(".")[0] in ("ray", "mlflow", "sweeps", "benchmarks")
               or t == "fl_core.algorithms" or t.startswith("fl_core.algorithms.")]
    assert outside == []


def test_the_checks_see_a_cycle_and_a_private_import_when_there_is_one():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    edges, _ = graph()
    assert "analysis.common" in edges["analysis.tables"] and "fl_core.config" in edges["fl_core.algorithms.base"]
