"""The shape of the package: no import circles (lazy imports included), the layers of
docs/architecture.md as an import-linter contract, and no module too long to read."""

import subprocess
import sys
from pathlib import Path

import grimp

PACKAGE = Path(__file__).resolve().parents[1] / "ess_explorer"
MAX_LINES = 550


def _cycle(graph, modules):
    """One import cycle among ``modules`` as a list of names, or None (iterative DFS)."""
    colour = {m: 0 for m in modules}  # 0 new, 1 on the stack, 2 done
    for root in sorted(modules):
        if colour[root]:
            continue
        stack = [(root, iter(sorted(graph.find_modules_directly_imported_by(root) & modules)))]
        colour[root] = 1
        path = [root]
        while stack:
            node, children = stack[-1]
            child = next(children, None)
            if child is None:
                colour[node] = 2
                stack.pop()
                path.pop()
            elif colour[child] == 1:
                return path[path.index(child) :] + [child]
            elif colour[child] == 0:
                colour[child] = 1
                path.append(child)
                stack.append((child, iter(sorted(graph.find_modules_directly_imported_by(child) & modules))))
    return None


def test_no_import_circles():
    graph = grimp.build_graph("ess_explorer")  # function-level (lazy) imports count too
    # The root package only re-exports the public API; every other module is checked.
    modules = {m for m in graph.modules if m != "ess_explorer"}
    cycle = _cycle(graph, modules)
    assert cycle is None, "import circle: " + " -> ".join(cycle)


def test_the_cycle_finder_finds_a_cycle():
    class Graph:
        edges = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}

        def find_modules_directly_imported_by(self, module):
            return self.edges[module]

    assert _cycle(Graph(), {"a", "b", "c", "d"}) == ["a", "b", "c", "a"]
    Graph.edges["c"] = set()
    assert _cycle(Graph(), {"a", "b", "c", "d"}) is None


def test_import_contracts_hold():
    lint = Path(sys.executable).with_name("lint-imports")
    done = subprocess.run([str(lint)], cwd=PACKAGE.parent, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]


def test_no_module_is_too_long_to_read():
    long = {
        str(p.relative_to(PACKAGE)): n
        for p in PACKAGE.rglob("*.py")
        if (n := len(p.read_text().splitlines())) > MAX_LINES
    }
    assert not long, f"modules over {MAX_LINES} lines: {long}"


def test_the_widget_class_stays_a_thin_view():
    """The explorer's widget class is traitlets in, chart out (its worker, chart, controls and
    fitting live in their own modules): under 200 lines."""
    import ast

    tree = ast.parse((PACKAGE / "app" / "widget.py").read_text())
    (widget,) = [node for node in tree.body if isinstance(node, ast.ClassDef) and node.name == "ESSExplorer"]
    assert widget.end_lineno - widget.lineno + 1 < 200
