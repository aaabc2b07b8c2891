"""A fake Anthropic Messages server: ``POST /v1/messages`` streaming ``event:``/``data:`` pairs
(message_start, ping, content blocks, message_delta, message_stop).

It rejects what the real API rejects: no ``anthropic-version`` header, no ``max_tokens``, a role
other than user/assistant, a wrong ``x-api-key`` when ``fake.api_key`` is set. ``Reply.cache``
adds cache_creation/cache_read input tokens to message_start's usage.
"""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from tests.fakes.base import ENDLESS_WORDS, FakeProvider, Reply, json_pieces

_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
          404: "not_found_error", 413: "request_too_large", 429: "rate_limit_error", 500: "api_error",
          529: "overloaded_error"}


class FakeAnthropic(FakeProvider):
    dialect = "anthropic"

    def routes(self) -> list[Any]:
        return [Route("/v1/messages", self.chat, methods=["POST"]),
                Route("/v1/messages/count_tokens", self.count_tokens, methods=["POST"])]

    async def count_tokens(self, request: Request) -> Response:
        """{model, messages, system, tools} -> {input_tokens} (``counter == "anthropic"``)."""
        body = await self.record(request, self.count_requests)
        await self.count_wait()
        if self.counter != "anthropic":
            error = {"type": "not_found_error", "message": "Not found"}
            return JSONResponse({"type": "error", "error": error}, status_code=404)
        if "max_tokens" in body or "stream" in body:  # not fields of the count request
            return self._invalid(400, "max_tokens: Extra inputs are not permitted")
        prompt = {key: body.get(key) for key in ("system", "messages", "tools")}
        return JSONResponse({"input_tokens": self.count_of(prompt)})

    def _invalid(self, status: int, message: str) -> Response:
        error = {"type": _TYPES[status], "message": message}
        return self.error_json(status, {"type": "error", "error": error, "request_id": "req_fake"})

    def check(self, request: Request, body: Any) -> Response | None:
        if self.api_key is not None and request.headers.get("x-api-key") != self.api_key:
            return self._invalid(401, "invalid x-api-key")
        if not request.headers.get("anthropic-version"):
            return self._invalid(400, "anthropic-version: header is required")
        if not isinstance(body, dict) or not isinstance(body.get("max_tokens"), int):
            return self._invalid(400, "max_tokens: Field required")
        roles = {message.get("role") for message in body.get("messages") or []}
        if not roles or roles - {"user", "assistant"}:
            return self._invalid(400, f"messages: roles must be user or assistant, got "
                                      f"{sorted(map(str, roles))}")
        return None

    def _event(self, data: dict[str, Any]) -> bytes:
        return self.sse(data, event=data["type"])

    def _block(self, index: int, start: dict[str, Any], deltas: list[dict[str, Any]]) -> list[bytes]:
        events = [self._event({"type": "content_block_start", "index": index, "content_block": start})]
        events += [self._event({"type": "content_block_delta", "index": index, "delta": d}) for d in deltas]
        events.append(self._event({"type": "content_block_stop", "index": index}))
        return events

    def render(self, reply: Reply, body: Any) -> tuple[list[bytes], list[bytes]]:
        usage = self.auto_usage(reply, body)
        message: dict[str, Any] = {"id": "msg_fake", "type": "message", "role": "assistant", "content": [],
                                   "model": reply.model or body.get("model"), "stop_reason": None,
                                   "stop_sequence": None}
        if usage is not None:
            message["usage"] = {"input_tokens": usage[0], "output_tokens": 1,
                                "cache_creation_input_tokens": reply.cache[0],
                                "cache_read_input_tokens": reply.cache[1]}
        head = [self._event({"type": "message_start", "message": message}), self._event({"type": "ping"})]
        index = 0
        if reply.thinking:
            deltas = [{"type": "thinking_delta", "thinking": p} for p in reply.thinking]
            deltas.append({"type": "signature_delta", "signature": "c2lnbmF0dXJl"})
            head += self._block(index, {"type": "thinking", "thinking": ""}, deltas)
            index += 1
        if reply.text:
            deltas = [{"type": "text_delta", "text": p} for p in reply.text]
            head += self._block(index, {"type": "text", "text": ""}, deltas)
            index += 1
        for call in reply.tool_calls:
            call_id = call.id or f"toolu_fake_{index}"
            start = {"type": "tool_use", "id": call_id, "name": call.name, "input": {}}
            deltas = [{"type": "input_json_delta", "partial_json": p} for p in json_pieces(call.arguments)]
            head += self._block(index, start, deltas)
            index += 1
        reason = reply.finish or ("tool_use" if reply.tool_calls else "end_turn")
        stop = {"stop_reason": reason, "stop_sequence": None}
        delta: dict[str, Any] = {"type": "message_delta", "delta": stop}
        if usage is not None:
            delta["usage"] = {"output_tokens": usage[1]}
        return head, [self._event(delta), self._event({"type": "message_stop"})]

    def endless_start(self, kind: str) -> bytes:
        block = {"arguments": {"type": "tool_use", "id": "toolu_endless", "name": "search", "input": {}},
                 "thinking": {"type": "thinking", "thinking": ""}}.get(kind, {"type": "text", "text": ""})
        return self._event({"type": "content_block_start", "index": 0, "content_block": block})

    def endless_piece(self, kind: str) -> bytes:
        delta = {"arguments": {"type": "input_json_delta", "partial_json": ENDLESS_WORDS},
                 "thinking": {"type": "thinking_delta", "thinking": ENDLESS_WORDS}
                 }.get(kind, {"type": "text_delta", "text": ENDLESS_WORDS})
        return self._event({"type": "content_block_delta", "index": 0, "delta": delta})

    def error_body(self, reply: Reply) -> Any:
        kind = reply.error_type or _TYPES.get(reply.status, "api_error")
        return {"type": "error", "error": {"type": kind, "message": reply.error}, "request_id": "req_fake"}

    def stream_error_event(self, reply: Reply) -> bytes:
        error = {"type": reply.error_type or "overloaded_error", "message": reply.stream_error}
        return self._event({"type": "error", "error": error})

    def last_user_text(self, body: Any) -> str:
        for message in reversed(body.get("messages") or []):
            content = message.get("content")
            if message.get("role") != "user":
                continue
            if isinstance(content, str):
                return content
            texts = [b.get("text", "") for b in content if b.get("type") == "text"]
            if texts:
                return " ".join(texts)
        return ""

    @staticmethod
    def overflow(window: int = 200000, requested: int = 208656) -> Reply:
        return Reply(status=400, error_type="invalid_request_error",
                     error=f"prompt is too long: {requested} tokens > {window} maximum")
