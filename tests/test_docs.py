"""The documents stay true: every frame and field in docs/protocol.md, every setting in
docs/configuration.md, and nothing documented that the code does not have."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

from server.config.load import env_name
from server.config.settings import MCP_SERVER_SCHEMA, PROVIDER_SCHEMA, ROUTE_SCHEMA, RULE_SCHEMA, SCHEMA
from server.protocol import CLIENT_FRAMES, SERVER_FRAMES, field_names

DOCS = Path(__file__).resolve().parent.parent / "docs"


def documented_frames(direction: str) -> dict[str, dict[str, bool]]:
    text = (DOCS / "protocol.md").read_text()
    section = text.split(f"## {direction}\n", 1)[1].split("\n## ", 1)[0]
    frames: dict[str, dict[str, bool]] = {}
    for block in section.split("\n### ")[1:]:
        name = re.match(r"`(\w+)`", block).group(1)
        rows = re.findall(r"^\| `(\w+)` \| (yes|no) \|", block, flags=re.M)
        frames[name] = {field: optional == "yes" for field, optional in rows}
    return frames


def code_frames(registry: dict[str, tuple[str, ...]]) -> dict[str, dict[str, bool]]:
    frames = {}
    for name, spec in registry.items():
        required, optional = field_names(spec)
        frames[name] = {**{f: False for f in required}, **{f: True for f in optional}}
    return frames


def test_docs_protocol_lists_every_client_frame_and_field():
    assert documented_frames("Client to server") == code_frames(CLIENT_FRAMES)


def test_docs_protocol_lists_every_server_frame_and_field():
    assert documented_frames("Server to client") == code_frames(SERVER_FRAMES)


def documented_settings() -> dict[str, set[str]]:
    text = (DOCS / "configuration.md").read_text()
    tables: dict[str, set[str]] = {}
    for block in re.split(r"^## ", text, flags=re.M)[1:]:
        heading = re.match(r"`\[+([\w.]+)\]+`", block)
        if heading:
            tables[heading.group(1)] = set(re.findall(r"^\| `(\w+)` \|", block, flags=re.M))
    return tables


def test_docs_configuration_lists_every_setting():
    tables = documented_settings()
    expected = {section: {s.name for s in settings} for section, settings in SCHEMA.items()}
    expected["providers.ALIAS"] = {s.name for s in PROVIDER_SCHEMA}
    expected["model_routes"] = {s.name for s in ROUTE_SCHEMA}
    expected["classifier.rules"] = {s.name for s in RULE_SCHEMA}
    expected["mcp_servers.NAME"] = {s.name for s in MCP_SERVER_SCHEMA}
    assert tables == expected


def test_docs_configuration_names_every_environment_variable():
    text = (DOCS / "configuration.md").read_text()
    for section, settings in SCHEMA.items():
        for setting in settings:
            assert f"`{env_name(section, setting.name)}`" in text
    assert "METERCHAT_DATA_DIR" in text and "METERCHAT_DEFAULT_ROUTE" in text


def test_docs_examples_are_valid_settings():
    from server.config.load import settings_from_mapping
    from server.routing.resolver import RouteResolver

    readme = (DOCS.parent / "README.md").read_text()
    configuration = (DOCS / "configuration.md").read_text()
    examples = re.findall(r"```toml\n(.*?)```", readme + configuration, flags=re.S)
    assert len(examples) >= 2
    for example in examples:
        settings = settings_from_mapping(tomllib.loads(example), env={})
        RouteResolver(settings, {})  # routes resolve, as at start-up


def test_docs_protocol_names_every_enumerated_value():
    from server.protocol import ENUMS
    from server.routing.resolver import ROUTE_KINDS

    text = (DOCS / "protocol.md").read_text()
    for values in [*ENUMS.values(), ROUTE_KINDS]:
        for value in values:
            assert f"`{value}`" in text, value
