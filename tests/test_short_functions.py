"""Functions on the trial path stay short enough to read on one screen (issue 28: about 60 lines at most).
Checked for ursa_ray/tune, the trial (trial.py, prepare.py), ursa_ray/evaluation with its probes, and the grid
package (issue 46); a function's docstring does not count (an update rule or a derivation belongs there)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).parent.parent
PACKAGES = [
    "ursa_ray/tune",
    "ursa_ray/trial.py",
    "ursa_ray/prepare.py",
    "ursa_ray/evaluation",
    "ursa_ray/evaluation/probes",
    "ursa_ray/grid",
]
LIMIT = 60


def long_functions(folder: Path, limit: int = LIMIT) -> list[tuple[str, str, int]]:
    """(file, function, lines) of every function or method in ``folder``'s modules (or the module ``folder``)
    longer than ``limit`` lines (its decorators and its docstring excluded)."""
    found = []
    for path in [folder] if folder.is_file() else sorted(folder.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = node.end_lineno - node.lineno + 1 - _docstring_lines(node)
                if lines > limit:
                    found.append((path.name, node.name, lines))
    return found


def _docstring_lines(node: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    first = node.body[0]
    is_doc = (
        isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str)
    )
    return first.end_lineno - first.lineno + 1 if is_doc else 0


@pytest.mark.parametrize("package", PACKAGES)
def test_no_function_is_longer_than_the_limit(package):
    too_long = long_functions(ROOT / package)
    assert not too_long, f"{package}: functions over {LIMIT} lines (split them by what each part does): {too_long}"


def test_the_check_sees_a_long_method(tmp_path):
    body = "".join(f"        x{i} = {i}\n" for i in range(LIMIT))
    (tmp_path / "m.py").write_text(f"class C:\n    def short(self):\n        pass\n\n    def long(self):\n{body}")
    assert long_functions(tmp_path) == [("m.py", "long", LIMIT + 1)]
    documented = '        """A docstring\n\n        of three lines."""\n' + body
    (tmp_path / "m.py").write_text(f"def documented():\n{documented}")
    assert long_functions(tmp_path) == [("m.py", "documented", LIMIT + 1)]  # the docstring's lines not counted
