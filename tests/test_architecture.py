"""The tree keeps the shape docs/architecture.md draws: no import cycle, one switch for PostgreSQL,
and the private packages used only by what they serve.

``python -m tests.test_architecture`` prints the import graph's arrows and its cycles.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "scheduler_app"
# Modules that may ask which database they run on: the switch itself.
# The statements' switch, and the one index only PostgreSQL gets partial (indexes.py says why).
SWITCH = {"scheduler_app.statements", "scheduler_app.statements.orm", "scheduler_app.indexes"}


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, Path]:
    return {
        module_name(path): path for path in sorted(PACKAGE.rglob("*.py")) if "migrations" not in path.parts
    }


def imports(path: Path, known: set[str]) -> set[str]:
    """The app's modules ``path`` imports, inside functions too (an import put off until a call
    still ties the two modules together); those under TYPE_CHECKING are for the type checker only."""
    tree = ast.parse(path.read_text())
    found: set[str] = set()

    def visit(nodes: list[ast.stmt]) -> None:
        for node in nodes:
            if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
                continue
            if isinstance(node, ast.Import):
                found.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                submodules = {f"{node.module}.{alias.name}" for alias in node.names} & known
                found.update(submodules)
                if len(submodules) < len(node.names):
                    found.add(node.module)
            else:
                for field in ("body", "orelse", "finalbody"):
                    visit([child for child in getattr(node, field, []) if isinstance(child, ast.stmt)])
                for handler in getattr(node, "handlers", []):
                    visit(handler.body)

    visit(tree.body)
    # A package is loaded before its modules: an arrow to an enclosing package adds nothing.
    own = module_name(path)
    return {name for name in found if name in known and not own.startswith(f"{name}.")}


def graph() -> dict[str, set[str]]:
    found = modules()
    known = set(found)
    return {name: imports(path, known) - {name} for name, path in found.items()}


def cycles(arrows: dict[str, set[str]]) -> list[list[str]]:
    """Every strongly connected group of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[list[str]] = []

    def connect(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in sorted(arrows.get(node, ())):
            if target not in index:
                connect(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            group = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                group.append(member)
                if member == node:
                    break
            if len(group) > 1:
                groups.append(sorted(group))

    for node in sorted(arrows):
        if node not in index:
            connect(node)
    return groups


def test_the_import_graph_of_the_app_has_no_cycle():
    assert cycles(graph()) == []


def test_the_cycle_finder_finds_a_cycle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_only_the_switch_asks_which_database_it_runs_on():
    asking = {
        name
        for name, path in modules().items()
        if ".vendor" in path.read_text() or "is_psycopg3" in path.read_text()
    }
    assert asking == SWITCH


def test_the_private_packages_are_used_only_by_what_they_serve():
    """runner/ serves run_scheduler; postgres/ is reached through the switch (and runner types only)."""
    arrows = graph()
    for name, targets in arrows.items():
        if not name.startswith(("scheduler_app.runner", "scheduler_app.management")):
            assert not {t for t in targets if t.startswith("scheduler_app.runner")}, name
        if not name.startswith(("scheduler_app.postgres", "scheduler_app.statements")):
            assert not {t for t in targets if t.startswith("scheduler_app.postgres")}, name


if __name__ == "__main__":
    arrows = graph()
    for name in sorted(arrows):
        for target in sorted(arrows[name]):
            print(f"{name} -> {target}")
    found = cycles(arrows)
    print(f"{sum(map(len, arrows.values()))} arrows between {len(arrows)} modules; cycles: {found or 'none'}")
    sys.exit(1 if found else 0)
