"""meterchat's own command line (``server.cli.main``) with uvicorn options set by the bench: the
event loop, the HTTP parser and the WebSocket implementation, so each can be measured on the real
server before one is chosen in ``server/cli.py``."""

from __future__ import annotations

from typing import Any


def main(overrides: dict[str, Any], argv: list[str]) -> None:
    import uvicorn

    original_run, original_config = uvicorn.run, uvicorn.Config

    def run(*args: Any, **kwargs: Any) -> Any:
        return original_run(*args, **{**kwargs, **overrides})

    def config(*args: Any, **kwargs: Any) -> Any:
        return original_config(*args, **{**kwargs, **overrides})

    # Patched before server.cli is imported, so either spelling in cli.py picks the overrides up.
    uvicorn.run, uvicorn.Config = run, config
    from server.cli import main as serve

    serve(argv)
