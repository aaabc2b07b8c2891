"""Fake LLM providers: real HTTP servers on 127.0.0.1 that speak each wire dialect exactly.

Fixtures (``tests/fakes/fixtures.py``; session-scoped servers, reset before each test):
``fake_openai`` (base_url ends in ``/v1``), ``fake_anthropic``, ``fake_ollama``. Each is a
``FakeProvider`` with:

    .base_url                 put it in the ProviderProfile
    .enqueue(*replies)        script the next chat replies, in order (alias: .script)
    .requests                 every chat request received: Recorded(method, path, headers, json)
    .meta_requests            /v1/models and /api/show requests
    .pending                  replies still queued
    .split                    None, or byte sizes (int or sequence, cycled) to cut the stream into;
                              (1, 2, 3, 5, 7) cuts UTF-8 characters and CRLF pairs
    .newline                  "\\n" (default), "\\r\\n" or "\\r" between SSE / NDJSON lines
    .counter                  None | "vllm" | "llamacpp" | "openai" | "anthropic": the count endpoint
                              served (count_requests records them; count_window, count_hold)
    .meta_flood               (head, item, size): the metadata endpoint answers head + item... to size
                              bytes (ENDLESS: never ends) instead of its card
    .models                   metadata: openai {"id": {"max_model_len": N} | {"context_length": N}},
                              ollama {"name": {"context_length": N, "num_ctx": M?, "arch": "llama"}}
    .api_key                  when set, requests without it get the dialect's 401
    .default                  callable(request_json) -> Reply for an empty queue
                              (otherwise: echo "echo: <last user text>" in word pieces, usage "auto")
    .reset()
    .overflow(...)            a Reply with the dialect's context-overflow error:
                              FakeOpenAI.overflow(flavor="openai"|"vllm_old"|"vllm_new"|"llamacpp"|
                              "llamacpp_500", window=8192, requested=9000),
                              FakeAnthropic.overflow(window, requested), FakeOllama.overflow(message)

``Reply(text=[pieces], thinking=[pieces], tool_calls=[Call(name, arguments, id="")],
usage=(input, output) | None | "auto", finish=None, model=None, status=200, error="...",
error_type=None, error_code=None, body=None, headers={}, stream_error=None, ending="complete" |
"drop" | "close", delay=0.0, raw=None, cache=(0, 0), hold=None | threading.Event,
keepalive=0.0, error_size=0 | ENDLESS, error_fill=b" ", endless="" | "text" | "thinking" |
"arguments")``; ``.endless_bytes_sent`` and ``.endless_ended`` follow an endless reply;
see ``tests/fakes/base.py``.

``await drain(provider.stream(request))`` returns ``(events, error_or_None)``; ``joined(events)`` joins
each run of text deltas (a network read's deltas come joined, so their count depends on timing).
"""

from __future__ import annotations

from tests.fakes.anthropic_fake import FakeAnthropic
from tests.fakes.base import (
    AUTO,
    ENDLESS,
    Call,
    FakeProvider,
    Recorded,
    Reply,
    drain,
    joined,
    running,
    serve_in_thread,
)
from tests.fakes.ollama_fake import FakeOllama
from tests.fakes.openai_fake import FakeOpenAI

__all__ = ["AUTO", "ENDLESS", "Call", "FakeAnthropic", "FakeOllama", "FakeOpenAI", "FakeProvider", "Recorded",
           "Reply",
           "drain", "joined", "running", "serve_in_thread"]
