"""A fake Ollama server: ``POST /api/chat`` streaming NDJSON lines (final ``done: true`` with
``prompt_eval_count``/``eval_count``) and ``POST /api/show`` for the models in ``fake.models``:
``{"llama3": {"context_length": 131072, "num_ctx": 8192, "arch": "llama"}}`` (``num_ctx`` optional,
written into the Modelfile ``parameters`` text). Tool calls arrive whole, without ids.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from tests.fakes.base import ENDLESS_WORDS, FakeProvider, Reply, json_text


def _now() -> str:
    return datetime.now(UTC).isoformat()


class FakeOllama(FakeProvider):
    dialect = "ollama"
    media_type = "application/x-ndjson"

    def routes(self) -> list[Any]:
        return [Route("/api/chat", self.chat, methods=["POST"]),
                Route("/api/show", self.show, methods=["POST"])]

    def check(self, request: Request, body: Any) -> Response | None:
        if not isinstance(body, dict) or not body.get("model") or not isinstance(body.get("messages"), list):
            return self.error_json(400, {"error": "model and messages are required"})
        return None

    async def show(self, request: Request) -> Response:
        body = await self.record(request, self.meta_requests)
        if self.meta_flood is not None:
            return self.flood()
        name = (body or {}).get("model", "")
        card = self.models.get(name)
        if card is None:
            return JSONResponse({"error": f"model '{name}' not found"}, status_code=404)
        arch = card.get("arch", "llama")
        parameters = 'stop "<|eot_id|>"'
        if card.get("num_ctx"):
            parameters = f"num_ctx {card['num_ctx']}\n{parameters}"
        return JSONResponse({"modelfile": "FROM fake", "parameters": parameters, "template": "{{ .Prompt }}",
                             "details": {"family": arch, "parameter_size": "8B"},
                             "model_info": {"general.architecture": arch,
                                            f"{arch}.context_length": card.get("context_length", 8192)}})

    def _line(self, model: str, created: str, message: dict[str, Any], **extra: Any) -> bytes:
        data = {"model": model, "created_at": created,
                "message": {"role": "assistant", "content": "", **message}, "done": False, **extra}
        return (json_text(data) + self.newline).encode()

    def render(self, reply: Reply, body: Any) -> tuple[list[bytes], list[bytes]]:
        model, created = reply.model or body["model"], _now()
        head = [self._line(model, created, {"thinking": piece}) for piece in reply.thinking]
        head += [self._line(model, created, {"content": piece}) for piece in reply.text]
        if reply.tool_calls:
            calls = [{"function": {"name": c.name, "arguments": c.arguments}} for c in reply.tool_calls]
            head.append(self._line(model, created, {"tool_calls": calls}))
        final: dict[str, Any] = {"done": True, "done_reason": reply.finish or "stop", "total_duration": 1000}
        usage = self.auto_usage(reply, body)
        if usage is not None:
            final.update(prompt_eval_count=usage[0], eval_count=usage[1])
        return head, [self._line(model, created, {}, **final)]

    def endless_piece(self, kind: str) -> bytes:
        """Ollama streams whole calls, so an endless run of arguments is one call after another."""
        if kind == "arguments":
            call = {"function": {"name": "search", "arguments": {"q": ENDLESS_WORDS}}}
            return self._line("fake-endless", _now(), {"tool_calls": [call]})
        return self._line("fake-endless", _now(), {"thinking" if kind == "thinking" else "content":
                                                   ENDLESS_WORDS})

    def error_body(self, reply: Reply) -> Any:
        return {"error": reply.error}

    def keepalive_bytes(self) -> bytes:
        return self.newline.encode()

    def stream_error_event(self, reply: Reply) -> bytes:
        return (json.dumps({"error": reply.stream_error}) + self.newline).encode()

    def last_user_text(self, body: Any) -> str:
        for message in reversed(body.get("messages") or []):
            if message.get("role") == "user":
                return str(message.get("content") or "")
        return ""

    @staticmethod
    def overflow(message: str = "the input length exceeds the context length") -> Reply:
        return Reply(status=400, error=message)
