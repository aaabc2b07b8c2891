"""The bare relay: the least a Starlette server can do to relay a provider stream to a WebSocket
(websocket in, httpx stream out, no meterchat code). It answers the subset of protocol v1 the load
clients use (``hello`` -> ``session``; ``message`` -> ``chunk``... ``done``), so the same clients
measure it and meterchat.
"""

from __future__ import annotations

import json
from typing import Any

import httpx
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse
from starlette.routing import Route, WebSocketRoute
from starlette.websockets import WebSocket


def relay_app(base_url: str) -> Starlette:
    # The same pool wall lifted as in meterchat's bench config, so the relay measures the stack.
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
    http = httpx.AsyncClient(base_url=base_url, limits=limits, timeout=120)

    async def stream_reply(ws: WebSocket, content: str) -> None:
        body = {"model": "m", "stream": True, "messages": [{"role": "user", "content": content}]}
        reply: list[str] = []
        async with http.stream("POST", "/chat/completions", json=body) as response:
            async for line in response.aiter_lines():
                if not line.startswith("data: {"):
                    continue
                choices = json.loads(line[6:]).get("choices") or [{}]
                piece = choices[0].get("delta", {}).get("content")
                if piece:
                    reply.append(piece)
                    await ws.send_text(json.dumps({"type": "chunk", "turn_id": "t", "content": piece}))
        await ws.send_text(json.dumps({"type": "done", "turn_id": "t", "full_response": "".join(reply)}))

    async def endpoint(ws: WebSocket) -> None:
        await ws.accept(subprotocol="meterchat.v1")
        seq = 0
        async for text in ws.iter_text():
            frame: dict[str, Any] = json.loads(text)
            seq += 1
            if frame.get("type") == "hello":
                await ws.send_text(json.dumps({"type": "session", "seq": seq, "session_id": "s"}))
            elif frame.get("type") == "message":
                await stream_reply(ws, frame["content"])

    async def healthz(request: Request) -> PlainTextResponse:
        return PlainTextResponse("ok")

    return Starlette(routes=[WebSocketRoute("/ws", endpoint), Route("/healthz", healthz)])


def serve(port: int, base_url: str, options: dict[str, Any]) -> None:
    uvicorn.run(relay_app(base_url), host="127.0.0.1", port=port, log_level="warning",
                ws_max_size=16 * 1024 * 1024, ws_per_message_deflate=False, **options)
