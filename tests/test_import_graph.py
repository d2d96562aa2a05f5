"""The import graph of ``ursa_ray`` has no cycle (issue 20, item 6): every module's imports, read with ``ast``
(imports inside functions included, since a deferred import still ties two modules together), form a DAG.

Imports inside a module-level ``__getattr__`` (PEP 562) are left out: ``ursa_ray/__init__.py`` imports
``ursa_ray.api`` there only when ``ursa_ray.run`` or ``ursa_ray.load`` is first accessed, never while any
module is being imported, so it cannot take part in a circular import; counting it would make every module
of the package (each imports ``ursa_ray.<sub>``, whose parent package is ``ursa_ray``) look circular.
Importing ``ursa_ray.x.y`` counts as importing the packages ``ursa_ray`` and ``ursa_ray.x`` too (Python runs
their ``__init__`` first), so a package ``__init__`` that re-exports from its submodules is part of the graph.
"""

from __future__ import annotations

import ast
from pathlib import Path

import ursa_ray

PACKAGE = Path(ursa_ray.__file__).parent


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def _lazy_getattr_nodes(tree: ast.Module) -> set[int]:
    """ids of the nodes inside a module-level ``def __getattr__``."""
    skipped: set[int] = set()
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and node.name == "__getattr__":
            skipped |= {id(n) for n in ast.walk(node)}
    return skipped


def imported(name: str, path: Path, known: set[str]) -> set[str]:
    """The ursa_ray modules ``name`` imports (anywhere in the file, parent packages included)."""
    tree = ast.parse(path.read_text(), str(path))
    skipped = _lazy_getattr_nodes(tree)
    is_package = path.name == "__init__.py"
    targets: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.Import):
            targets |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: resolve against this module's package
                base = name.split(".") if is_package else name.split(".")[:-1]
                base = base[: len(base) - (node.level - 1)]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            targets.add(module)
            targets |= {f"{module}.{alias.name}" for alias in node.names}  # `from pkg import submodule`
    edges: set[str] = set()
    for target in targets:
        parts = target.split(".")
        for i in range(1, len(parts) + 1):  # the target and every package above it
            candidate = ".".join(parts[:i])
            if candidate in known and candidate != name and not name.startswith(candidate + "."):
                edges.add(candidate)
    return edges


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}  # 1: on the stack, 2: done
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt) :] + [nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def import_graph() -> dict[str, set[str]]:
    found = modules()
    return {name: imported(name, path, set(found)) for name, path in found.items()}


# Open (issue 20): the plug-in checks of ursa_ray.plugins import the protocol classes inside functions
# (``from ursa_ray.data.base import DatasetSpec``), which runs the package __init__ (ursa_ray.data), which
# imports ursa_ray.registry, which imports ursa_ray.plugins.  Harmless at run time (the imports are deferred
# until a plug-in is checked) but a cycle by this test's rule; breaking it means handing the checks their
# protocol classes from the packages.  These edges, and only these, are left out until then.
KNOWN_CYCLE_EDGES = {
    ("ursa_ray.plugins", target)
    for target in (
        "ursa_ray.data",
        "ursa_ray.data.base",
        "ursa_ray.models",
        "ursa_ray.models.base",
        "ursa_ray.methods",
        "ursa_ray.methods.base",
    )
}


def test_the_ursa_ray_import_graph_is_acyclic():
    graph = import_graph()
    assert "ursa_ray.tune.runner" in graph and "ursa_ray.tune.trials" in graph
    assert find_cycle(graph) is not None or not KNOWN_CYCLE_EDGES, "the plug-in cycle is gone: empty KNOWN_CYCLE_EDGES"
    graph = {name: {t for t in edges if (name, t) not in KNOWN_CYCLE_EDGES} for name, edges in graph.items()}
    cycle = find_cycle(graph)
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_the_driver_depends_one_way():
    graph = import_graph()
    assert "ursa_ray.tune.search" in graph["ursa_ray.tune.runner"]
    assert "ursa_ray.tune.trials" in graph["ursa_ray.tune.search"]
    assert "ursa_ray.tune.runner" not in graph["ursa_ray.tune.search"]
    assert not {"ursa_ray.tune.runner", "ursa_ray.tune.search"} & graph["ursa_ray.tune.trials"]


def test_the_checker_sees_a_cycle_made_by_an_import_inside_a_function(tmp_path):
    """The checker itself can fail: a deferred import back into a module is an edge, and a cycle is found."""
    graph = import_graph()
    fake = tmp_path / "search.py"
    fake.write_text("import json\n\n\ndef f():\n    from ursa_ray.tune.runner import run_grid\n    return run_grid\n")
    edges = imported("ursa_ray.tune.search", fake, set(graph))
    assert edges == {"ursa_ray.tune.runner"}  # its own parent packages are not edges: Python ran them first
    graph["ursa_ray.tune.search"] = graph["ursa_ray.tune.search"] | edges
    assert find_cycle(graph) is not None
    lazy = tmp_path / "lazy.py"
    lazy.write_text("def __getattr__(name):\n    from ursa_ray import api\n    return getattr(api, name)\n")
    assert imported("ursa_ray.lazy", lazy, set(graph)) == set()


# The layers, lowest first (issue 28): a module imports only from its own layer or those below it.  A name is
# a module or package under ``ursa_ray``; a module belongs to the longest name that contains it.  ``ursa_ray``
# itself is the package __init__, whose lazy ``__getattr__`` is left out (see the module docstring).
LAYERS: tuple[tuple[str, ...], ...] = (
    ("spec",),  # the trial spec: the grid builds it, everything else reads it; it imports nothing of ursa_ray
    ("eval_sets", "results"),  # evaluation-set names, the results tables (what analysis/ may read)
    # the building blocks and their registries (the plug-in cycle above lies within this layer); no Ray
    ("registry", "plugins", "search_space", "data", "models", "methods", "evaluation", "regression", "reference"),
    ("prepare", "evaluation.probes"),  # a trial's data, streams and evaluation sets; the probes scoring them
    ("trial",),  # one trial: prepare, sample, probes, rows
    ("grid",),  # a grid file -> checked specs (ursa_ray.spec.TrialSpec)
    ("lease", "guard", "tune"),  # Ray and the results directory's owner
    ("api", "cli"),  # entry points
)
# Only these may import Ray: a method, model, dataset or evaluation knows nothing of it.
RAY_LAYERS = {"tune"}


def layer_of(module: str) -> int | None:
    inner = module.removeprefix("ursa_ray.")
    placed = [
        (len(name), rank)
        for rank, names in enumerate(LAYERS)
        for name in names
        if inner == name or inner.startswith(name + ".")
    ]
    return max(placed)[1] if placed else None


def test_every_module_of_ursa_ray_has_a_layer():
    unplaced = sorted(name for name in import_graph() if name != "ursa_ray" and layer_of(name) is None)
    assert not unplaced, f"place these in LAYERS: {unplaced}"


def test_no_module_imports_from_a_layer_above_it():
    upward = [
        f"{name} (layer {layer_of(name)}) imports {target} (layer {layer_of(target)})"
        for name, edges in sorted(import_graph().items())
        for target in sorted(edges)
        if name != "ursa_ray" and target != "ursa_ray" and layer_of(target) > layer_of(name)
    ]
    assert not upward, "\n".join(upward)


def test_only_the_tune_layer_imports_ray():
    offenders = []
    for name, path in modules().items():
        top = name.split(".")[1] if "." in name else None
        tree = ast.parse(path.read_text(), str(path))
        for node in ast.walk(tree):
            names = (
                [alias.name for alias in node.names]
                if isinstance(node, ast.Import)
                else [node.module or ""]
                if isinstance(node, ast.ImportFrom) and not node.level
                else []
            )
            if top not in RAY_LAYERS and any(n == "ray" or n.startswith("ray.") for n in names):
                offenders.append(name)
    assert not offenders, f"modules outside {sorted(RAY_LAYERS)} import Ray: {sorted(set(offenders))}"


def test_the_layer_check_sees_an_upward_import(tmp_path):
    """The checker itself can fail: a method importing the trial runner is an upward edge."""
    graph = import_graph()
    fake = tmp_path / "sgd.py"
    fake.write_text("def f():\n    from ursa_ray.trial import run_trial\n    return run_trial\n")
    edges = imported("ursa_ray.methods.sgd", fake, set(graph))
    assert any(layer_of(t) > layer_of("ursa_ray.methods.sgd") for t in edges)


def test_the_spec_imports_nothing_of_ursa_ray():
    """The lowest layer: the Tune driver and every worker unpickle specs without importing anything else."""
    assert layer_of("ursa_ray.spec") == 0 and LAYERS[0] == ("spec",)
    assert import_graph()["ursa_ray.spec"] == set()
