"""The import rules of docs/architecture.md, read off the source with ``ast``.

Every import counts: module level, inside functions and under ``TYPE_CHECKING`` (a cycle a type
checker needs is still a cycle a reader has to untangle).
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SERVER = ROOT / "server"

# What each part of server/ may import, by package (docs/architecture.md, one line each). The order
# is the layering: nothing imports a package above it, except where a line below says so.
MAY_IMPORT: dict[str, set[str]] = {
    "errors": set(),
    "locks": set(),
    "config": {"errors"},
    "protocol": {"errors"},
    "history": {"config", "errors"},
    "store": {"history", "errors"},
    # Accounts: who is asking, passwords, the user directory and its command line.
    "accounts": {"store", "config", "history", "errors"},
    # The demo provider reads the demo tool's titles (the one reach from providers into tools).
    "providers": {"history", "config", "errors", "tools"},
    "tools": {"providers", "history", "config", "errors", "protocol"},
    "routing": {"providers", "tools", "history", "config", "errors", "protocol", "locks"},
    "sessions": {"routing", "providers", "tools", "store", "history", "config", "errors", "protocol",
                 "locks"},
    "live": {"sessions", "routing", "history", "config", "errors", "protocol"},
    "web": {"accounts", "sessions", "live", "routing", "providers", "tools", "store", "history", "config",
            "errors", "protocol"},
    "cli": {"accounts", "web", "sessions", "live", "routing", "providers", "tools", "store", "history",
            "config", "errors", "protocol"},
    "__main__": {"cli"},
    # DESIGN contract names kept at the top (server.history_trim, server.budget): re-exports only.
    "history_trim": {"history"},
    "budget": {"history"},
}
# The pure history engine: arithmetic over messages, no I/O of any kind.
IO_LIBRARIES = {"anyio", "asyncio", "httpx", "starlette", "uvicorn", "websockets", "sqlite3", "socket",
                "threading", "subprocess", "urllib", "http", "jinja2"}
# The session core, from the bottom up: each part imports only parts below it (channel and reply <
# session < turn < hub < connection); the hub's parts sit at its level and none imports the hub.
S = "server.sessions."
HUB_PARTS = {S + "cache", S + "restore", S + "unsaved"}
HUB = {S + "hub"} | HUB_PARTS
CONNECTION = "server.web.connection"
CORE_MUST_NOT = {
    S + "channel": {S + "session", S + "turn", CONNECTION, "server.store"} | HUB,
    "server.live.channel": {S + "session", S + "turn", CONNECTION, "server.store"} | HUB,
    S + "reply": {S + "session", S + "turn", CONNECTION, S + "channel", "server.store",
                  "server.providers"} | HUB,
    S + "session": {S + "turn", CONNECTION, S + "runtime", "server.providers"} | HUB,
    S + "turn": {CONNECTION, S + "views"} | HUB,
    S + "hub": {CONNECTION},
    **{part: {S + "hub", CONNECTION} for part in HUB_PARTS},
    S + "runtime": {S + "session", S + "turn", CONNECTION} | HUB,
}


def package_of(module: str) -> str:
    """``server.sessions.turn`` -> ``sessions``; a top-level module is its own package."""
    return module.split(".")[1] if module.count(".") >= 1 else ""


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def resolve(module: str, name: str) -> str:
    """``from server.providers import _http`` imports the submodule, not the package."""
    candidate = f"{module}.{name}"
    relative = Path(*candidate.split("."))
    if (ROOT / relative).with_suffix(".py").exists() or (ROOT / relative / "__init__.py").exists():
        return candidate
    return module


def imports_of(path: Path) -> Iterator[str]:
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            assert node.level == 0, f"{path}: relative import; the server spells imports in full"
            if node.module.startswith("server"):
                yield from (resolve(node.module, alias.name) for alias in node.names)
            else:
                yield node.module


def graph(root: Path = SERVER) -> dict[str, set[str]]:
    return {module_name(path): set(imports_of(path)) for path in sorted(root.rglob("*.py"))}


def violations(modules: dict[str, set[str]]) -> list[str]:
    found = []
    for module, imported in modules.items():
        for target in sorted(imported):
            rule = broken_rule(module, target)
            if rule:
                found.append(f"{module} imports {target}: {rule}")
    return found


def within(target: str, names: set[str]) -> bool:
    return any(target == name or target.startswith(name + ".") for name in names)


def broken_rule(module: str, target: str) -> str | None:
    top = target.split(".")[0]
    package = package_of(module)
    if package == "history" and top in IO_LIBRARIES:
        return "the pure history engine does no I/O"
    if top == "server" and target != "server":
        allowed = MAY_IMPORT.get(package)
        if allowed is None:
            return f"{package!r} is not a package docs/architecture.md places"
        if package_of(target) not in allowed | {package}:
            return f"{package} may import only {', '.join(sorted(allowed)) or 'nothing of the server'}"
    if within(target, CORE_MUST_NOT.get(module, set())):
        return "the session core imports only downwards (channel, reply < session < turn < hub < connection)"
    return None


def cycles(modules: dict[str, set[str]]) -> list[list[str]]:
    """Every strongly connected group of more than one server module (Tarjan)."""
    edges = {m: {t for t in deps if t in modules and t != m} for m, deps in modules.items()}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    groups: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in edges[node]:
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            group = []
            while True:
                member = stack.pop()
                group.append(member)
                if member == node:
                    break
            if len(group) > 1:
                groups.append(sorted(group))

    for node in sorted(edges):
        if node not in index:
            visit(node)
    return groups


def test_architecture_import_rules_hold():
    assert violations(graph()) == []


def test_architecture_no_import_cycles_among_server_modules():
    found = cycles(graph())
    assert found == []


def test_architecture_sees_every_server_module():
    modules = graph()
    assert {package_of(m) for m in modules if m != "server"} == MAY_IMPORT.keys()
    assert "server.sessions.session" in modules and "server.providers.base" in modules
    assert "server.sessions.channel" in modules["server.sessions.session"]  # the parser reads imports at all


@pytest.mark.parametrize("module, bad, rule", [
    ("server.history.ledger", "anyio", "pure history engine"),
    ("server.history.messages", "server.store.base", "history may import only config, errors"),
    ("server.history.compaction", "server.sessions.session", "history may import only"),
    ("server.providers.openai", "server.sessions.session", "providers may import only"),
    ("server.providers.base", "server.protocol", "providers may import only"),
    ("server.store.base", "server.sessions.turn", "store may import only"),
    ("server.store.base", "server.config.settings", "store may import only"),
    ("server.sessions.turn", "server.web.app", "sessions may import only"),
    ("server.live.turns", "server.web.connection", "live may import only"),
    ("server.sessions.hub", "server.live.turns", "sessions may import only"),
    ("server.newpart.thing", "server.errors", "is not a package"),
    ("server.sessions.session", "server.sessions.turn", "imports only downwards"),
    ("server.sessions.channel", "server.sessions.session", "imports only downwards"),
    ("server.sessions.cache", "server.sessions.hub", "imports only downwards"),
    ("server.sessions.turn", "server.sessions.unsaved", "imports only downwards"),
])
def test_architecture_rules_catch_a_bad_import(tmp_path, module, bad, rule):
    """The rules fail for real: one bad import added to a copy of the source breaks them."""
    path = tmp_path / Path(*module.split(".")).with_suffix(".py")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"from __future__ import annotations\n\nimport {bad}\n", encoding="utf-8")
    modules = graph()
    modules[module] = modules.get(module, set()) | set(imports_of(path))
    assert any(rule in v for v in violations(modules))


def test_architecture_cycle_check_catches_a_cycle():
    modules = graph()
    modules[S + "channel"] = modules[S + "channel"] | {S + "hub"}
    assert any({S + "channel", S + "hub", S + "session"} <= set(group) for group in cycles(modules))
