"""A fake OpenAI-compatible server: ``POST /v1/chat/completions`` (SSE chunks, ``data: [DONE]``)
and ``GET /v1/models`` (cards from ``fake.models``, e.g. ``{"m": {"max_model_len": 8192}}``).

Tool-call arguments are sent in several fragments; the usage chunk (``choices: []``) comes only
when the request asked for ``stream_options.include_usage``, as OpenAI does. ``reasoning_field``
names the delta key for thinking pieces (``reasoning_content`` as vLLM, ``reasoning`` as OpenRouter).
"""

from __future__ import annotations

import json
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from tests.fakes.base import ENDLESS_WORDS, FakeProvider, Reply, json_pieces


def _not_found() -> Response:
    return JSONResponse({"detail": "Not Found"}, status_code=404)  # FastAPI's (vLLM) answer

_TYPES = {401: "invalid_request_error", 403: "permission_error", 429: "rate_limit_exceeded",
          500: "server_error", 503: "server_error"}


class FakeOpenAI(FakeProvider):
    dialect = "openai"

    def __init__(self) -> None:
        super().__init__()
        self.reasoning_field = "reasoning_content"

    def reset(self) -> None:
        super().reset()
        self.reasoning_field = "reasoning_content"

    def routes(self) -> list[Any]:
        return [Route("/v1/chat/completions", self.chat, methods=["POST"]),
                Route("/v1/models", self.list_models, methods=["GET"]),
                Route("/tokenize", self.tokenize, methods=["POST"]),
                Route("/apply-template", self.apply_template, methods=["POST"]),
                Route("/props", self.props, methods=["GET"]),
                Route("/v1/responses/input_tokens", self.input_tokens, methods=["POST"])]

    # --- count endpoints (``counter``: "vllm", "llamacpp" or "openai"; None: all 404) -------------

    async def tokenize(self, request: Request) -> Response:
        """vLLM: {messages, tools, ...} -> {count, max_model_len, tokens, token_strs}. llama.cpp:
        {content} -> {tokens}; given messages (no content) it answers {tokens: []}."""
        body = await self.record(request, self.count_requests)
        await self.count_wait()
        if self.counter == "vllm":
            count = self.count_of({"messages": body["messages"], "tools": body.get("tools")})
            return JSONResponse({"count": count, "max_model_len": self.count_window,
                                 "tokens": list(range(count)), "token_strs": None})
        if self.counter == "llamacpp":
            content = body.get("content")
            return JSONResponse({"tokens": list(range(self.count_of(content))) if content else []})
        return _not_found()

    async def apply_template(self, request: Request) -> Response:
        body = await self.record(request, self.count_requests)
        await self.count_wait()
        if self.counter != "llamacpp":
            return _not_found()
        prompt = "".join(f"<|im_start|>{m['role']}\n{json.dumps(m, ensure_ascii=False)}<|im_end|>\n"
                         for m in body["messages"]) + json.dumps(body.get("tools") or [])
        return JSONResponse({"prompt": prompt + "<|im_start|>assistant\n"})

    async def props(self, request: Request) -> Response:
        await self.record(request, self.count_requests)
        if self.counter != "llamacpp":
            return _not_found()
        return JSONResponse({"default_generation_settings": {"n_ctx": self.count_window, "n_predict": -1},
                             "total_slots": 1, "model_path": "fake.gguf", "build_info": "fake"})

    async def input_tokens(self, request: Request) -> Response:
        """OpenAI: {model, input, tools} -> {object: "response.input_tokens", input_tokens}."""
        body = await self.record(request, self.count_requests)
        await self.count_wait()
        if self.counter != "openai":
            return JSONResponse({"error": {"message": "Invalid URL (POST /v1/responses/input_tokens)",
                                           "type": "invalid_request_error", "param": None, "code": None}},
                                status_code=404)
        count = self.count_of({"input": body["input"], "tools": body.get("tools")})
        return JSONResponse({"object": "response.input_tokens", "input_tokens": count})

    def check(self, request: Request, body: Any) -> Response | None:
        if self.api_key is not None and request.headers.get("authorization") != f"Bearer {self.api_key}":
            error = {"message": "Incorrect API key provided", "type": "invalid_request_error",
                     "code": "invalid_api_key"}
            return self.error_json(401, {"error": error})
        if not isinstance(body, dict) or not isinstance(body.get("messages"), list) or not body.get("model"):
            return self.error_json(400, {"error": {"message": "model and messages are required",
                                                   "type": "invalid_request_error"}})
        return None

    async def list_models(self, request: Request) -> Response:
        await self.record(request, self.meta_requests)
        if self.meta_flood is not None:
            return self.flood()
        cards = [{"id": name, "object": "model", "created": 0, "owned_by": "fake", **extra}
                 for name, extra in self.models.items()]
        return JSONResponse({"object": "list", "data": cards})

    def render(self, reply: Reply, body: Any) -> tuple[list[bytes], list[bytes]]:
        model = reply.model or body["model"]
        wants_usage = bool((body.get("stream_options") or {}).get("include_usage"))

        def chunk(choices: list[Any] | None, usage: Any = None) -> bytes:
            data: dict[str, Any] = {"id": "chatcmpl-fake", "object": "chat.completion.chunk",
                                    "created": 0, "model": model, "choices": choices}
            if wants_usage:
                data["usage"] = usage
            return self.sse(data)

        def delta(value: dict[str, Any], finish: str | None = None) -> bytes:
            return chunk([{"index": 0, "delta": value, "finish_reason": finish}])

        head = [delta({"role": "assistant", "content": ""})]
        head += [delta({self.reasoning_field: piece}) for piece in reply.thinking]
        head += [delta({"content": piece}) for piece in reply.text]
        for index, call in enumerate(reply.tool_calls):
            opening = {"index": index, "id": call.id or f"call_fake_{index}", "type": "function",
                       "function": {"name": call.name, "arguments": ""}}
            head.append(delta({"tool_calls": [opening]}))
            head += [delta({"tool_calls": [{"index": index, "function": {"arguments": piece}}]})
                     for piece in json_pieces(call.arguments)]
        finish = reply.finish or ("tool_calls" if reply.tool_calls else "stop")
        tail = [delta({}, finish)]
        usage = self.auto_usage(reply, body)
        if wants_usage and usage is not None:
            tail.append(chunk([], {"prompt_tokens": usage[0], "completion_tokens": usage[1],
                                   "total_tokens": usage[0] + usage[1]}))
        tail.append(self.sse("[DONE]"))
        return head, tail

    def _delta(self, value: dict[str, Any]) -> bytes:
        return self.sse({"id": "chatcmpl-fake", "object": "chat.completion.chunk", "created": 0,
                         "model": "fake-endless", "choices": [{"index": 0, "delta": value,
                                                                "finish_reason": None}]})

    def endless_start(self, kind: str) -> bytes:
        if kind != "arguments":
            return b""
        opening = {"index": 0, "id": "call_endless", "type": "function",
                   "function": {"name": "search", "arguments": '{"q": "'}}
        return self._delta({"tool_calls": [opening]})

    def endless_piece(self, kind: str) -> bytes:
        if kind == "arguments":
            return self._delta({"tool_calls": [{"index": 0, "function": {"arguments": ENDLESS_WORDS}}]})
        return self._delta({self.reasoning_field if kind == "thinking" else "content": ENDLESS_WORDS})

    def error_body(self, reply: Reply) -> Any:
        kind = reply.error_type or _TYPES.get(reply.status, "invalid_request_error")
        return {"error": {"message": reply.error, "type": kind, "param": None, "code": reply.error_code}}

    def stream_error_event(self, reply: Reply) -> bytes:
        return self.sse({"error": {"message": reply.stream_error, "type": reply.error_type or "server_error",
                                   "param": None, "code": reply.error_code}})

    def last_user_text(self, body: Any) -> str:
        for message in reversed(body.get("messages") or []):
            if message.get("role") == "user":
                content = message.get("content")
                if isinstance(content, list):
                    return " ".join(p.get("text", "") for p in content if p.get("type") == "text")
                return str(content or "")
        return ""

    @staticmethod
    def overflow(flavor: str = "openai", window: int = 8192, requested: int = 9000,
                 max_tokens: int = 256) -> Reply:
        """The context-overflow error of ``openai``, ``vllm_old``, ``vllm_new``, ``vllm_max_tokens``,
        ``vllm_minus_max_tokens`` (a window less ``max_tokens``, as vLLM 0.15 rc said), ``llamacpp``
        (``llamacpp_500`` for the older status, ``llamacpp_text`` without the count fields)."""
        if flavor == "openai":
            message = (f"This model's maximum context length is {window} tokens. However, your messages "
                       f"resulted in {requested} tokens. Please reduce the length of the messages.")
            return Reply(status=400, body={"error": {"message": message, "type": "invalid_request_error",
                                                     "param": "messages", "code": "context_length_exceeded"}})
        if flavor in ("vllm_old", "vllm_new"):
            message = (f"This model's maximum context length is {window} tokens. However, you requested "
                       f"{requested} tokens ({requested - 256} in the messages, 256 in the completion). "
                       "Please reduce the length of the messages or completion.")
            error = {"message": message, "type": "BadRequestError", "param": None, "code": 400}
            body = {"object": "error", **error} if flavor == "vllm_old" else {"error": error}
            return Reply(status=400, body=body)
        if flavor == "vllm_max_tokens":  # the prompt fits, prompt + max_tokens does not
            message = (f"'max_tokens' or 'max_completion_tokens' is too large: {max_tokens}. This model's "
                       f"maximum context length is {window} tokens and your request has {requested} input "
                       f"tokens ({max_tokens} > {window} - {requested}). None")
            return Reply(status=400, body={"error": {"message": message, "type": "BadRequestError",
                                                     "param": None, "code": 400}})
        if flavor == "vllm_minus_max_tokens":  # vLLM 0.15 rc (#33418): it named the window less max_tokens
            message = (f"This model's maximum context length is {window - max_tokens} tokens. However, you "
                       f"requested {requested} tokens ({requested - max_tokens} in the messages, "
                       f"{max_tokens} in the completion). Please reduce the length of the messages or "
                       "completion.")
            return Reply(status=400, body={"error": {"message": message, "type": "BadRequestError",
                                                     "param": None, "code": 400}})
        if flavor in ("llamacpp", "llamacpp_500", "llamacpp_text"):
            # tools/server/server-task.cpp's wording; a build without the fields keeps only the text
            error = {"code": 400, "message": f"request ({requested} tokens) exceeds the available context "
                     f"size ({window} tokens), try increasing it", "type": "exceed_context_size_error"}
            if flavor != "llamacpp_text":
                error |= {"n_prompt_tokens": requested, "n_ctx": window}
            return Reply(status=500 if flavor == "llamacpp_500" else 400, body={"error": error})
        raise ValueError(f"unknown overflow flavor {flavor!r}")
