"""The harness's modules import in one direction: no circle, and the leaves stay leaves.

Reads every `harness/` module with `ast` (no import runs) and builds the graph of which harness module imports which,
counting imports inside functions too: a function-local import hides a circle from Python, not from a reader (the
report and its page once imported each other that way). Then: the graph has no cycle; `config.py`, which every loop
module reads, reaches no loop module even through a function; the report's page reaches neither the lifecycle nor the
stage (it reads the run's config through `harness.config`).
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LOOP = ("harness.graph", "harness.engineer", "harness.backtest", "harness.vet", "harness.lifecycle", "harness.experiment")


def _modules(root: Path) -> dict[str, Path]:
    out = {}
    for p in sorted((root / "harness").rglob("*.py")):
        parts = p.relative_to(root).with_suffix("").parts
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = p
    return out


def _type_checking(node: ast.AST) -> bool:
    return isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)


def _imports(tree: ast.Module, everywhere: bool) -> list[ast.Import | ast.ImportFrom]:
    """Import statements at module level (`everywhere=False`) or anywhere (functions too); never under TYPE_CHECKING."""
    found, todo = [], list(tree.body)
    while todo:
        node = todo.pop()
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            found.append(node)
        elif _type_checking(node):
            continue
        elif everywhere or isinstance(node, (ast.If, ast.Try, ast.ExceptHandler, ast.With)):  # these run at import
            todo.extend(ast.iter_child_nodes(node))
    return found


def import_graph(root: Path, everywhere: bool = True) -> dict[str, set[str]]:
    """harness module -> the harness modules it imports (`from harness.tasks import mapf` counts as harness.tasks.mapf)."""
    mods = _modules(root)
    graph: dict[str, set[str]] = {}
    for name, path in mods.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        edges = set()
        for node in _imports(ast.parse(path.read_text()), everywhere):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            else:
                base = node.module or ""
                if node.level:
                    up = package.split(".")[:len(package.split(".")) - node.level + 1]
                    base = ".".join(up + ([node.module] if node.module else []))
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in mods else base for a in node.names]
            for t in targets:
                while t not in mods and "." in t:
                    t = t.rpartition(".")[0]
                if t in mods and t != name:
                    edges.add(t)
        graph[name] = edges
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import circle as a path (a -> b -> a), or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(v: str) -> list[str] | None:
        state[v] = 1
        path.append(v)
        for w in sorted(graph[v]):
            if state.get(w) == 1:
                return path[path.index(w):] + [w]
            if w not in state and (c := visit(w)):
                return c
        state[v] = 2
        path.pop()
        return None

    for v in sorted(graph):
        if v not in state and (c := visit(v)):
            return c
    return None


def reach(graph: dict[str, set[str]], start: str) -> set[str]:
    seen, todo = set(), [start]
    while todo:
        for w in graph[todo.pop()] - seen:
            seen.add(w)
            todo.append(w)
    return seen


def _loop(mods: set[str], loop: tuple[str, ...] = LOOP) -> list[str]:
    return sorted(m for m in mods if any(m == x or m.startswith(x + ".") for x in loop))


def test_no_import_circle_among_harness_modules():
    cycle = find_cycle(import_graph(ROOT))
    assert cycle is None, ("import circle (function-local imports included): " + " -> ".join(cycle)
                           + "; move what both need into a module that imports neither, or invert one import")


def test_the_checker_sees_a_circle_hidden_in_a_function(tmp_path):
    """What the test above would miss if it read module-level imports only: a circle through a function's import."""
    (tmp_path / "harness").mkdir()
    (tmp_path / "harness" / "__init__.py").write_text("")
    (tmp_path / "harness" / "a.py").write_text("from harness.b import f\n")
    (tmp_path / "harness" / "b.py").write_text("def f():\n    from harness import a\n    return a\n")
    assert find_cycle(import_graph(tmp_path, everywhere=False)) is None
    assert find_cycle(import_graph(tmp_path)) in (["harness.a", "harness.b", "harness.a"],
                                                  ["harness.b", "harness.a", "harness.b"])


def test_config_reaches_no_loop_module():
    """Every loop module reads the config, so the config importing one (even inside a validator) is a circle waiting:
    a config type a loop module defines belongs in config.py."""
    graph = import_graph(ROOT)
    assert not _loop(reach(graph, "harness.config")), _loop(reach(graph, "harness.config"))


def test_the_report_page_reaches_neither_the_lifecycle_nor_the_stage():
    """The page reads the report's data and the run's config; loading the lifecycle (and so the whole loop, torch
    included) to read one config field was the old way."""
    top, everywhere = import_graph(ROOT, everywhere=False), import_graph(ROOT)
    assert not _loop(reach(top, "harness.report_page")), _loop(reach(top, "harness.report_page"))
    stage = ("harness.graph", "harness.lifecycle", "harness.engineer", "harness.vet", "harness.experiment")
    assert not _loop(reach(everywhere, "harness.report_page"), stage), _loop(reach(everywhere, "harness.report_page"))
    assert "harness.report_page" not in reach(everywhere, "harness.report"), "the report's data imports its page"
