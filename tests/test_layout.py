"""The package's layering, checked from its source: imports point one way
(no cycle, counting imports inside functions and under TYPE_CHECKING), no
module imports another's private names, and a module over 500 lines says at
its top why it is long. `python -m pytest tests/test_layout.py -v` prints
the findings.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "rqueue"
MAX_LINES = 500
LONG_REASON = "Long because"  # how a module over MAX_LINES starts its reason

# Layers, bottom first: a module may import only from its own layer's
# modules and the layers below. Within a layer the graph must still be
# acyclic.
LAYERS = [
    {
        "rqueue.constants",
        "rqueue.errors",
        "rqueue.timelimits",
        "rqueue.events",
        "rqueue.clock",
        "rqueue.randomness",
        "rqueue.ids",
        "rqueue.names",
        "rqueue.results",
        "rqueue.validate",
        "rqueue.delivery",
        "rqueue.ticks",
        "rqueue.tracing",
    },
    {"rqueue.connection"},
    {"rqueue.engine"},
    {
        "rqueue.settings",
        "rqueue.stored_results",
        "rqueue.statewatch",
        "rqueue.protocols",
        "rqueue.deadletters",
        "rqueue.consumer_core",
        "rqueue.consumer",
        "rqueue.retention",
        "rqueue.publishing",
        "rqueue.waiting",
        "rqueue.queue",
        "rqueue.partitioned_consumer",
        "rqueue.partition_routing",
        "rqueue.partitions",
        "rqueue.placement",
        "rqueue.schedules",
        "rqueue.client",
        "rqueue.overview",
        "rqueue.doctor",
        "rqueue.migration",
    },
    {"rqueue", "rqueue.worker", "rqueue.embedded", "rqueue.spark", "rqueue.dashboard"},
    {"rqueue.aio"},
    {"rqueue.cli"},
]


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def imports_of(name: str, path: Path, known: set[str]) -> list[tuple[str, list[str]]]:
    """(imported module, names imported from it) for every import anywhere
    in the module, relative ones resolved; only rqueue's own modules."""
    tree = ast.parse(path.read_text())
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out: list[tuple[str, list[str]]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(a.name, []) for a in node.names if a.name.split(".")[0] == "rqueue"]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target.split(".")[0] != "rqueue":
                continue
            names = [a.name for a in node.names]
            # "from . import x" imports the module x when there is one
            submodules = [f"{target}.{n}" for n in names if f"{target}.{n}" in known]
            out += [(m, []) for m in submodules]
            rest = [n for n in names if f"{target}.{n}" not in known]
            if rest or not submodules:
                out.append((target, rest))
    return out


def graph() -> dict[str, set[str]]:
    found = modules()
    known = set(found)
    edges: dict[str, set[str]] = {m: set() for m in found}
    for name, path in found.items():
        for target, _ in imports_of(name, path, known):
            # importing a.b.c runs a/__init__ and a/b/__init__ too
            parts = target.split(".")
            for i in range(1, len(parts) + 1):
                prefix = ".".join(parts[:i])
                if prefix in known and prefix != name and not name.startswith(prefix + "."):
                    edges[name].add(prefix)
    return edges


def layer_of(name: str) -> int:
    best = -1, -1  # (layer, length of the matching entry)
    for i, layer in enumerate(LAYERS):
        for entry in layer:
            if (name == entry or name.startswith(entry + ".")) and len(entry) > best[1]:
                best = i, len(entry)
    assert best[0] >= 0, f"{name} is in no layer of tests/test_layout.py: add it"
    return best[0]


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    found: list[list[str]] = []
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(edges[node]):
            if state.get(nxt) == 1:
                found.append(stack[stack.index(nxt) :] + [nxt])
            elif nxt not in state:
                visit(nxt)
        stack.pop()
        state[node] = 2

    for node in sorted(edges):
        if node not in state:
            visit(node)
    return found


def test_no_import_cycle() -> None:
    # given every import of the package, wherever it stands
    # then none of them closes a cycle
    assert cycles(graph()) == []


def test_imports_point_down_the_layers() -> None:
    # given every import between two modules of the package
    wrong = [
        f"{source} (layer {layer_of(source)}) imports {target} (layer {layer_of(target)})"
        for source, targets in graph().items()
        for target in sorted(targets)
        if layer_of(target) > layer_of(source)
    ]
    # then none goes up a layer
    assert wrong == []


def test_no_private_name_crosses_modules() -> None:
    # given every "from rqueue... import name" in the package and the tests
    found = modules()
    known = set(found)
    sources = dict(found)
    sources.update({f"tests.{p.stem}": p for p in (ROOT / "tests").rglob("*.py")})
    crossing = [
        f"{name} imports {target}.{n}"
        for name, path in sources.items()
        for target, names in imports_of(name, path, known)
        for n in names
        if n.startswith("_") and not n.startswith("__")
    ]
    # then none of them is private
    assert crossing == []


@pytest.mark.parametrize("name", sorted(modules()))
def test_a_long_module_says_why(name: str) -> None:
    path = modules()[name]
    lines = path.read_text().count("\n")
    if lines <= MAX_LINES:
        return
    docstring = ast.get_docstring(ast.parse(path.read_text())) or ""
    assert LONG_REASON in docstring, f"{path.relative_to(ROOT)} has {lines} lines and no '{LONG_REASON} ...' at its top"


def test_every_module_is_in_a_layer() -> None:
    for name in modules():
        layer_of(name)
