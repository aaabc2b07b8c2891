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

# The pure history engine: arithmetic over messages, no I/O of any kind.
PURE = {"server.history", "server.history_trim", "server.ledger", "server.budget", "server.compaction"}
PURE_MAY_IMPORT = PURE | {"server.config", "server.errors"}
IO_LIBRARIES = {"anyio", "asyncio", "httpx", "starlette", "uvicorn", "websockets", "sqlite3", "socket",
                "threading", "subprocess", "urllib", "http", "jinja2"}
# Providers speak one wire dialect each: they know nothing of sessions, turns or the client protocol.
PROVIDERS_MUST_NOT = {"server.session", "server.turn", "server.hub", "server.channel", "server.protocol",
                      "server.connection", "server.views", "server.reply", "server.runtime",
                      "server.compaction_runner", "server.events", "server.store", "server.store_sqlite",
                      "server.api", "server.app"}
# The store keeps sessions and messages; turns, the wire and the live side are not its business.
STORE = {"server.store", "server.store_sqlite"}
STORE_MUST_NOT = {"server.turn", "server.session", "server.hub", "server.channel", "server.reply",
                  "server.connection", "server.views", "server.runtime", "server.compaction_runner",
                  "server.protocol", "server.providers"}
# The hub's parts sit at its level: above the turn, below the connection, and none imports the hub.
HUB_PARTS = {"server.session_cache", "server.restore", "server.unsaved"}
HUB = {"server.hub"} | HUB_PARTS
# The session core, from the bottom up: each part imports only parts below it.
CORE_MUST_NOT = {
    "server.channel": {"server.session", "server.turn", "server.connection", "server.store"} | HUB,
    "server.live_channel": {"server.session", "server.turn", "server.connection", "server.store"} | HUB,
    "server.reply": {"server.session", "server.turn", "server.connection", "server.channel",
                     "server.store", "server.providers"} | HUB,
    "server.session": {"server.turn", "server.connection", "server.runtime", "server.providers"} | HUB,
    "server.turn": {"server.connection", "server.views"} | HUB,
    "server.hub": {"server.connection"},
    **{part: {"server.hub", "server.connection"} for part in HUB_PARTS},
    "server.runtime": {"server.session", "server.turn", "server.connection"} | HUB,
}


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
    if module in PURE and (top in IO_LIBRARIES or (top == "server" and target not in PURE_MAY_IMPORT)):
        return "the pure history engine does no I/O and knows no server part beyond the engine"
    if module.startswith("server.providers") and within(target, PROVIDERS_MUST_NOT):
        return "providers know nothing of sessions or the wire"
    if module in STORE and within(target, STORE_MUST_NOT):
        return "the store knows nothing of turns, sessions or the wire"
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
    assert PURE <= modules.keys() and "server.session" in modules and "server.providers.base" in modules
    assert "server.channel" in modules["server.session"]  # the parser reads imports at all


@pytest.mark.parametrize("module, bad, rule", [
    ("server.ledger", "anyio", "pure history engine"),
    ("server.history", "server.store", "pure history engine"),
    ("server.compaction", "server.session", "pure history engine"),
    ("server.providers.openai", "server.session", "providers know nothing"),
    ("server.providers.base", "server.protocol", "providers know nothing"),
    ("server.store", "server.turn", "the store knows nothing"),
    ("server.session", "server.turn", "imports only downwards"),
    ("server.channel", "server.session", "imports only downwards"),
    ("server.session_cache", "server.hub", "imports only downwards"),
    ("server.turn", "server.unsaved", "imports only downwards"),
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
    modules["server.channel"] = modules["server.channel"] | {"server.hub"}
    assert any({"server.channel", "server.hub", "server.session"} <= set(group) for group in cycles(modules))
