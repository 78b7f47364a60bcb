"""The source tree keeps the shape docs/layout.md draws: two wings under backends/, the CLI as a package,
no module over 600 lines, and no import circle (a ``TYPE_CHECKING`` import for a type only excepted)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# Where each part of the ``bertknn_search`` namespace lives in the repository (pyproject's package-dir).
PARTS = {
    "bertknn_search": ROOT / "bertknn_search",
    "bertknn_search.ingest": ROOT / "ingest",
    "bertknn_search.eval": ROOT / "eval",
    "bertknn_search.nodes": ROOT / "nodes",
}
MAX_LINES = 600


def modules() -> dict[str, Path]:
    found = {}
    for prefix, folder in PARTS.items():
        for path in folder.rglob("*.py"):
            relative = path.relative_to(folder).with_suffix("")
            parts = [p for p in relative.parts if p != "__init__"]
            name = ".".join([prefix, *parts])
            if prefix == "bertknn_search" and parts and parts[0] in {"ingest", "eval", "nodes"}:
                continue  # not part of the package (no such folders there)
            found[name] = path
    return found


def _type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def imports_of(name: str, path: Path, known: set[str]) -> set[str]:
    """The package's modules ``name`` imports anywhere (functions included), except under TYPE_CHECKING."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out: set[str] = set()

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and _type_checking(node):
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names if a.name in known)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: the package, or one of its parents
                parts = package.split(".")
                base = ".".join([*parts[: len(parts) - node.level + 1], base])
            for alias in node.names:
                full = f"{base}.{alias.name}"
                out.add(full if full in known else base)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    return {m for m in out if m in known and m != name}


def test_backends_has_two_wings_and_at_most_eight_modules_of_its_own() -> None:
    backends = ROOT / "bertknn_search" / "backends"
    assert (backends / "embedded" / "__init__.py").is_file()
    assert (backends / "engines" / "__init__.py").is_file()
    top = sorted(p.name for p in backends.glob("*.py"))
    assert len(top) <= 8, top


def test_the_cli_is_a_package_with_main_as_its_entry_point() -> None:
    assert not list((ROOT / "bertknn_search").glob("cli*.py"))
    from bertknn_search.cli import main

    assert {"query", "ingest", "add", "serve", "stats", "titles", "eval", "engine"} <= set(main.commands)


def test_no_module_is_over_600_lines() -> None:
    long = {
        name: n
        for name, path in modules().items()
        if (n := len(path.read_text(encoding="utf-8").splitlines())) > MAX_LINES
    }
    assert not long, long


def test_no_import_circle() -> None:
    found = modules()
    known = set(found)
    graph = {name: imports_of(name, path, known) for name, path in found.items()}
    # A package's __init__ is imported before any module in it: a module importing its own package's
    # __init__ is no circle unless that __init__ imports it back, which the search below finds.
    state: dict[str, int] = {}
    stack: list[str] = []
    circles: list[list[str]] = []

    def walk(node: str) -> None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                circles.append([*stack[stack.index(nxt) :], nxt])
            elif nxt not in state:
                walk(nxt)
        stack.pop()
        state[node] = 2

    for name in sorted(graph):
        if name not in state:
            walk(name)
    assert not circles, circles[:5]
