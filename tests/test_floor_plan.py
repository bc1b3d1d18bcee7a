"""The floor plan holds: packages are layers, every import points down, no circle, no module over 600 lines, no
function over cyclomatic complexity 25 (radon's measure). docs/design.md draws the same picture."""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src" / "distprof"

# What each layer may import, besides itself (docs/design.md, "The layers"). The top (cli, cli_support, demo,
# the package's face) may import anything.
MAY_IMPORT = {
    "util": set(),
    "rundir": {"util"},
    "config": {"util", "rundir"},
    "capture": {"util", "rundir", "config"},
    "trace": {"util", "rundir", "config"},
    "analysis": {"util", "rundir", "config", "trace"},
    "report": {"util", "rundir", "config", "trace", "analysis"},
    "integrations": {"util", "rundir", "config", "capture"},
}
TOP = {"cli", "cli_support", "cli_watch", "cli_open", "cli_wrap", "cli_hang", "demo", "__init__", "__main__"}
# The one import allowed against the layers, and why: the analysis handle's ``report()`` hands its one read to the
# report layer, imported when called (``import distprof.analysis`` stays free of plotly). Nothing below imports it.
ALLOWED_UP = {("distprof.analysis.handle", "distprof.report")}
MAX_LINES = 600
MAX_COMPLEXITY = 25


def _modules() -> dict[str, Path]:
    out = {}
    for p in sorted(SRC.rglob("*.py")):
        parts = list(p.relative_to(SRC.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = p
    return out


MODULES = _modules()


def _imports(name: str, path: Path) -> set[str]:
    """The distprof modules ``name`` imports, anywhere in it (function-local and TYPE_CHECKING imports too)."""
    is_pkg = path.name == "__init__.py"
    pkg = name if is_pkg else name.rsplit(".", 1)[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = pkg.split(".")[: len(pkg.split(".")) - (node.level - 1)]
                base = ".".join(up + ([node.module] if node.module else []))
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in MODULES else base for a in node.names]
        else:
            continue
        for t in targets:
            while t and t not in MODULES:
                t = t.rpartition(".")[0]
            if t.startswith("distprof") and t != name:
                found.add(t)
    return found


GRAPH = {name: _imports(name, path) for name, path in MODULES.items()}


def _layer(name: str) -> str:
    parts = name.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def test_every_import_points_down_a_layer():
    wrong = []
    for name, targets in GRAPH.items():
        layer = _layer(name)
        if layer in TOP:
            continue
        assert layer in MAY_IMPORT, f"{name}: package {layer!r} is not in the floor plan (MAY_IMPORT)"
        for t in sorted(targets):
            if _layer(t) != layer and _layer(t) not in MAY_IMPORT[layer] and (name, t) not in ALLOWED_UP:
                wrong.append(f"{name} -> {t}")
    assert not wrong, "imports that point up or across the layers:\n" + "\n".join(wrong)


def test_no_circle_of_imports():
    # Tarjan's strongly connected components over module imports.
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    circles = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in GRAPH[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            # a package's __init__ that re-exports its own modules is not a circle of meaning
            real = [c for c in comp if not any(o.startswith(c + ".") for o in comp)]
            if len(real) > 1:
                circles.append(sorted(comp))

    for v in GRAPH:
        if v not in index:
            visit(v)
    assert not circles, "modules that import each other in a loop:\n" + "\n".join(map(str, circles))


def test_no_module_over_600_lines():
    big = {n: len(p.read_text().splitlines()) for n, p in MODULES.items()}
    over = {n: k for n, k in big.items() if k > MAX_LINES}
    assert not over, f"modules over {MAX_LINES} lines (split them by concern): {over}"


def test_no_function_over_complexity_25():
    from radon.complexity import cc_visit  # a dev dependency

    over = []
    for name, path in MODULES.items():
        for block in cc_visit(path.read_text()):
            if block.complexity > MAX_COMPLEXITY:
                over.append(f"{name}:{block.lineno} {block.fullname} ({block.complexity})")
    assert not over, f"functions over cyclomatic complexity {MAX_COMPLEXITY} (radon):\n" + "\n".join(over)
