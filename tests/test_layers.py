"""The package's layers: no module imports one above its own (docs: "Architecture of the code")."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "src" / "mtt"

#: from the bottom up; a module may import its own layer and those below it
LAYERS = [
    (
        "leaves",
        {
            "__init__",
            "errors",
            "schema",
            "outputs",
            "checkpoint",
            "allocator",
        },
    ),
    ("launch and data", {"distributed", "data"}),
    ("models", {"architectures"}),
    ("training", {"training"}),
    ("models out of mtt", {"export", "inference"}),
    ("options", {"config"}),
    ("how a run begins", {"starts"}),
    ("active learning", {"learning"}),
    ("commands", {"commands", "testing", "__main__"}),
]


def _layer_of(parts: tuple[str, ...]) -> int:
    top = parts[0] if parts else "__init__"
    for number, (_, names) in enumerate(LAYERS):
        if top in names:
            return number
    raise AssertionError(f"mtt.{'.'.join(parts)} belongs to no layer: add it to LAYERS and to the docs")


def _imported(path: Path) -> list[tuple[tuple[str, ...], int]]:
    """The mtt modules that ``path`` imports (at the top or inside functions), with line numbers."""
    package = path.relative_to(PACKAGE).with_suffix("").parts[:-1]
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - node.level + 1]
                target = base + tuple((node.module or "").split(".")) if node.module else base
                if not node.module:  # `from . import name`: a module, or a name of the package
                    for alias in node.names:
                        name = base + (alias.name,)
                        is_module = (
                            PACKAGE.joinpath(*name).is_dir() or PACKAGE.joinpath(*name).with_suffix(".py").is_file()
                        )
                        found.append((name if is_module else base, node.lineno))
                    continue
            elif node.module and node.module.split(".")[0] == "mtt":
                target = tuple(node.module.split(".")[1:])
            else:
                continue
            found.append((tuple(p for p in target if p), node.lineno))
        elif isinstance(node, ast.Import):
            found += [(tuple(a.name.split(".")[1:]), node.lineno) for a in node.names if a.name.split(".")[0] == "mtt"]
    return found


def test_no_module_imports_a_layer_above_its_own():
    upward = []
    for path in sorted(PACKAGE.rglob("*.py")):
        own_parts = path.relative_to(PACKAGE).with_suffix("").parts
        own = _layer_of(own_parts)
        for target, line in _imported(path):
            if _layer_of(target) > own:
                upward.append(
                    f"{path.relative_to(PACKAGE)}:{line} ({LAYERS[own][0]}) imports mtt.{'.'.join(target)} "
                    f"({LAYERS[_layer_of(target)][0]})"
                )
    assert not upward, "imports of a higher layer:\n" + "\n".join(upward)


def _module_of(target: tuple[str, ...]) -> tuple[str, ...] | None:
    """The module file an import names: ``mtt.a.b`` is a.b.py, or a/b/__init__.py; a name
    imported from a module belongs to that module."""
    while target:
        if PACKAGE.joinpath(*target).with_suffix(".py").is_file():
            return target
        if PACKAGE.joinpath(*target, "__init__.py").is_file():
            return (*target, "__init__")
        target = target[:-1]
    return ("__init__",)


def test_no_two_modules_import_each_other():
    """No circle of imports, however long: each module can be read before those that use it."""
    graph: dict[tuple[str, ...], set[tuple[str, ...]]] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        own = path.relative_to(PACKAGE).with_suffix("").parts
        graph[own] = {_module_of(target) for target, _ in _imported(path)} - {own}
    circles, done, path = [], set(), []

    def visit(module):
        if module in path:
            circles.append(" -> ".join(".".join(m) for m in path[path.index(module) :] + [module]))
            return
        if module in done:
            return
        path.append(module)
        for target in sorted(graph.get(module, ())):
            visit(target)
        path.pop()
        done.add(module)

    for module in sorted(graph):
        visit(module)
    assert not circles, "modules that import each other:\n" + "\n".join(circles)
