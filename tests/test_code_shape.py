"""Functions a newcomer can read on one screen: none in fl_core, sweeps or analysis is longer than
60 lines (docstring included), unless a comment in it or on the line above its `def` starts with
`# long:` and says why. Complexity has its own check: ruff's C901 at 15 (pyproject.toml, run by CI)."""
from __future__ import annotations

import ast

from conftest import REPO

LIMIT = 60
MARK = "# long:"


def long_functions(source: str, limit: int = LIMIT) -> list[tuple[str, int, int]]:
    """(name, first line, length) of each function over `limit` lines without a `# long:` comment."""
    lines = source.splitlines()
    found = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        start = min([node.lineno, *(d.lineno for d in node.decorator_list)])
        length = node.end_lineno - node.lineno + 1
        said_why = any(line.strip().startswith(MARK) for line in lines[max(start - 2, 0):node.end_lineno])
        if length > limit and not said_why:
            found.append((node.name, node.lineno, length))
    return found


def test_no_function_is_longer_than_a_screen_unless_it_says_why():
    over = [f"{path.relative_to(REPO)}:{line} {name} ({length} lines)"
            for package in ("fl_core", "sweeps", "analysis") for path in sorted((REPO / package).rglob("*.py"))
            for name, line, length in long_functions(path.read_text())]
    assert over == []


def test_the_check_sees_a_long_function_and_accepts_one_that_says_why():
    body = "\n".join(f"    x{i} = {i}" for i in range(LIMIT))
    assert long_functions(f"def f():\n{body}\n") == [("f", 1, LIMIT + 1)]
    assert long_functions(f"{MARK} a flat list of flags\ndef f():\n{body}\n") == []
    assert long_functions(f"def f():\n    {MARK} one table, row by row\n{body}\n") == []
    assert long_functions(f"def f():\n{body}\n", limit=LIMIT + 1) == []
