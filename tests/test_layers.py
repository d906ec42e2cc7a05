"""The house's rules, checked on the sources (docs/architecture.md): each layer imports only
the layers below it, no import circles (``TYPE_CHECKING`` imports included), no module over
900 lines and no class over 600, and no reach-ins across rooms."""

from __future__ import annotations

import ast
import socket
from pathlib import Path

SRC = Path(__file__).resolve().parent.parent / "src"
PACKAGE = SRC / "smcr"

LAYERS: list[set[str]] = [
    {"smcr._mypyc", "smcr.native", "smcr.ueid", "smcr.pnet", "smcr.peers", "smcr.settings",
     "smcr.plainsock", "smcr.exits", "smcr.osthreads", "smcr.locks", "smcr.bound"},
    {"smcr.wire"},
    {"smcr.rdma"},
    {"smcr.core"},
    {"smcr.stack", "smcr.discovery"},
    {"smcr.diag"},
    {"smcr.socket"},
    {"smcr.run"},
    {"smcr", "smcr.__main__", "smcr.cli", "smcr.tools", "smcr.sample", "smcr.pcap",
     "smcr.nativebuild"},
]
"""Bottom up.  A module belongs to the longest entry that is it or a package above it.  The
bottom layer (modules of no package) and the top one (the package's front and its tools)
are one room each."""
MAX_MODULE_LINES = 900
MAX_CLASS_LINES = 600


def _modules() -> dict[str, Path]:
    out = {}
    for path in PACKAGE.rglob("*.py"):
        if "_native" in path.parts:
            continue
        parts = path.relative_to(SRC).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        out[name] = path
    return out


MODULES = _modules()


def _imports(name: str) -> set[str]:
    """The smcr modules ``name`` imports anywhere in its text (functions and TYPE_CHECKING
    blocks included)."""
    path = MODULES[name]
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(up + ([base] if base else []))
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in MODULES else base
                       for a in node.names]
        for target in targets:
            module = target
            while module and module not in MODULES:
                module = module.rpartition(".")[0]
            if module and module != name:
                found.add(module)
    return found


GRAPH = {name: _imports(name) for name in MODULES}


def _layer(name: str) -> tuple[int, str]:
    """(layer index, the entry of :data:`LAYERS` the module belongs to)."""
    best: tuple[int, str] | None = None
    for i, entries in enumerate(LAYERS):
        for entry in entries:
            if (name == entry or name.startswith(entry + ".")) and (
                    best is None or len(entry) > len(best[1])):  # fmt: skip
                best = (i, entry)
    assert best is not None, f"{name} is in no layer: add it to LAYERS"
    return best


def test_every_module_has_a_layer() -> None:
    for name in MODULES:
        _layer(name)


def test_imports_run_down_the_layers() -> None:
    """A module imports its own room (package) or the layers below; a layer's rooms do not
    import each other (stack and discovery, say)."""
    wrong = []
    for name, deps in GRAPH.items():
        layer, room = _layer(name)
        for dep in deps:
            dep_layer, dep_room = _layer(dep)
            if dep_layer > layer or (dep_layer == layer and dep_room != room
                                     and layer not in (0, len(LAYERS) - 1)):  # fmt: skip
                wrong.append(f"{name} -> {dep}")
    assert wrong == []


def test_no_import_circles() -> None:
    """Tarjan's strongly connected components over every import, TYPE_CHECKING ones too."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    circles: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(GRAPH[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                circles.append(sorted(component))

    for name in sorted(GRAPH):
        if name not in index:
            visit(name)
    assert circles == []


def test_modules_and_classes_stay_small() -> None:
    big = []
    for name, path in MODULES.items():
        text = path.read_text()
        if (n := len(text.splitlines())) > MAX_MODULE_LINES:
            big.append(f"module {name}: {n} lines")
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.ClassDef):
                assert node.end_lineno is not None
                if (n := node.end_lineno - node.lineno + 1) > MAX_CLASS_LINES:
                    big.append(f"class {name}.{node.name}: {n} lines")
    assert big == []


def _attribute_chains(tree: ast.AST) -> list[tuple[str, str, int]]:
    """(object's name or attribute, attribute, line) of every ``x.y`` in ``tree``."""
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute):
            value = node.value
            owner = (value.id if isinstance(value, ast.Name)
                     else value.attr if isinstance(value, ast.Attribute) else "")  # fmt: skip
            out.append((owner, node.attr, node.lineno))
    return out


def _socket_private_names() -> set[str]:
    """The private attributes an SMC socket holds (SocketBase, SMCSocket)."""
    names = set()
    for module in ("smcr.socket.base", "smcr.socket.api"):
        tree = ast.parse(MODULES[module].read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef) and node.name in ("SocketBase", "SMCSocket"):
                for item in ast.walk(node):
                    if isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
                        names.add(item.target.id)
                    elif isinstance(item, ast.Attribute) and isinstance(item.value, ast.Name) \
                            and item.value.id == "self":  # fmt: skip
                        names.add(item.attr)
    stdlib = set(dir(socket.socket))  # (its own privates, _real_close say, are not ours)
    return {n for n in names if n.startswith("_") and not n.startswith("__")} - stdlib


def test_no_reach_ins() -> None:
    """Outside core and stack nothing reads the engine's connections, the CQ or a
    handshake's reader; outside the socket package nothing touches a socket's privates."""
    engine_rooms = ("smcr.core", "smcr.stack")
    private = _socket_private_names()
    wrong = []
    for name, path in MODULES.items():
        chains = _attribute_chains(ast.parse(path.read_text()))
        if not name.startswith(engine_rooms):
            wrong += [f"{name}:{line} {owner}.{attr}" for owner, attr, line in chains
                      if (owner, attr) in {("engine", "conns"), ("cq", "poll"),
                                           ("handshake", "reader")}]  # fmt: skip
        if not name.startswith("smcr.socket"):
            wrong += [f"{name}:{line} {owner}.{attr}" for owner, attr, line in chains
                      if attr in private and owner not in ("self", "cls")]
    assert wrong == []
