"""Functions on the trial path stay short enough to read on one screen (issue 28: about 60 lines at most).
Checked for ursa_ray/tune; add a package to PACKAGES once its functions are short too."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).parent.parent
PACKAGES = ["ursa_ray/tune"]
LIMIT = 60


def long_functions(folder: Path, limit: int = LIMIT) -> list[tuple[str, str, int]]:
    """(file, function, lines) of every function or method in ``folder``'s modules longer than ``limit`` lines
    (its decorators excluded, its docstring included)."""
    found = []
    for path in sorted(folder.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = node.end_lineno - node.lineno + 1
                if lines > limit:
                    found.append((path.name, node.name, lines))
    return found


@pytest.mark.parametrize("package", PACKAGES)
def test_no_function_is_longer_than_the_limit(package):
    too_long = long_functions(ROOT / package)
    assert not too_long, f"{package}: functions over {LIMIT} lines (split them by what each part does): {too_long}"


def test_the_check_sees_a_long_method(tmp_path):
    body = "".join(f"        x{i} = {i}\n" for i in range(LIMIT))
    (tmp_path / "m.py").write_text(f"class C:\n    def short(self):\n        pass\n\n    def long(self):\n{body}")
    assert long_functions(tmp_path) == [("m.py", "long", LIMIT + 1)]
