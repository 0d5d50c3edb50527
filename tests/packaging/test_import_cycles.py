"""No two specdec_core modules import each other, however indirectly: the layers read one way.

Static, over the modules' top-level imports (an import inside a function runs when it is called, after both
modules are loaded, and is how an optional extra is reached): parsed with `ast`, nothing is imported.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "specdec_core"


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _statements_run_at_import(body: list[ast.stmt]):
    """The statements that run when the module is loaded: not function or class bodies' functions, not the
    `if TYPE_CHECKING:` blocks; the other blocks (try/except ImportError, if/else) do run."""
    for statement in body:
        if isinstance(statement, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        if isinstance(statement, ast.If) and "TYPE_CHECKING" in ast.unparse(statement.test):
            yield from _statements_run_at_import(statement.orelse)
            continue
        yield statement
        for field in ("body", "orelse", "finalbody", "handlers"):
            inner = getattr(statement, field, None)
            if isinstance(inner, list):
                yield from _statements_run_at_import(inner)


def top_level_imports(path: Path, modules: set[str]) -> set[str]:
    """The specdec_core modules `path` imports when it is loaded.

    A module's own ancestor packages are left out: Python has loaded them before the module, so an import of
    one (`from specdec_core.contract import fields` inside the contract package) cannot close a cycle.
    """
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in _statements_run_at_import(ast.parse(path.read_text(encoding="utf-8")).body):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[: len(parts) - node.level + 1] + ([base] if base else []))
            submodules = {f"{base}.{alias.name}" for alias in node.names} & modules
            found.update(submodules)  # `from package import module` loads the module
            if len(submodules) < len(node.names):  # and a name defined in the package loads the package
                found.add(base)
    ancestors = {".".join(name.split(".")[:i]) for i in range(1, name.count(".") + 1)}
    return {m for m in found if m in modules and m != name and m not in ancestors}


def import_graph() -> dict[str, set[str]]:
    paths = sorted(PACKAGE.rglob("*.py"))
    modules = {module_name(p) for p in paths}
    return {module_name(p): top_level_imports(p, modules) for p in paths}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One cycle per strongly connected component of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph[node]):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_the_cycle_finder_finds_a_cycle_through_three_modules():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert cycles(graph) == [["a", "b", "c"]]


def test_imports_inside_functions_and_type_checking_blocks_do_not_count(tmp_path, monkeypatch):
    package = tmp_path / "specdec_core"
    package.mkdir()
    (package / "m.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import x.y\n"
        "def f():\n    import x.z\ntry:\n    import x.w\nexcept ImportError:\n    pass\n")
    monkeypatch.setattr(__import__(__name__), "PACKAGE", package)
    assert top_level_imports(package / "m.py", {"x.y", "x.z", "x.w"}) == {"x.w"}


def test_no_specdec_core_module_imports_itself_through_others():
    graph = import_graph()
    assert len(graph) > 100 and graph["specdec_core.cli"]  # the walk found the package and its imports
    assert cycles(graph) == []
