"""What may leave the provider layer (``providers/redact.py``, ``providers/text.py``), as plain functions."""

from __future__ import annotations

import threading

import pytest

from server.providers.base import Finish, ReplyLimits, TextDelta, ThinkingDelta, ToolCallEvent
from server.providers.budget import ReplyBudget
from server.providers.redact import clip, redact, short_message
from server.providers.text import TextGuard, valid_text
from server.providers.translate import translate_error


@pytest.mark.parametrize(("text", "secret"), [
    ("cannot reach http://admin:s3cret-pw@10.0.0.7:8000/v1", "s3cret-pw"),
    ("Incorrect API key provided: sk-proj-Ab12Cd34Ef56Gh78", "Ab12Cd34Ef56Gh78"),
    ("header Authorization: Bearer eyJhbGciOiJIUzI1NiJ9.payload", "eyJhbGciOiJIUzI1NiJ9"),
    ('{"api_key": "plain-words-key"}', "plain-words-key"),
    ("x-api-key: ant-key-1", "ant-key-1"),
    ("token=abcdefghijklmnop", "abcdefghijklmnop"),
    ("trace id 0123456789abcdef0123456789abcdef leaked", "0123456789abcdef0123456789abcdef"),
    ("opaque Zm9vYmFyQmF6cXV4MTIzNDU2Nzg5MEFCQ0RFRg== here", "Zm9vYmFyQmF6cXV4MTIzNDU2Nzg5MEFCQ0RFRg"),
])
def test_redact_hides_what_looks_like_a_secret(text: str, secret: str) -> None:
    assert secret not in redact(text) and "***" in redact(text)


def test_redact_hides_the_known_secrets_and_keeps_plain_words() -> None:
    text = "The model `meta-llama/llama-3.1-70b-instruct-turbo-with-a-long-name` does not exist; key k-42-x"
    assert redact(text, ["k-42-x"]) == text.replace("k-42-x", "***")


def test_short_message_is_one_line_of_at_most_300_characters() -> None:
    message = short_message("first line\n\n  second line " + "word " * 200)
    assert message.startswith("first line second line word") and len(message) == 300
    assert message.endswith("…")


def test_valid_text_joins_escaped_pairs_and_replaces_lone_halves() -> None:
    assert valid_text("a\ud83d\ude00b\udc00c\ud800") == "a😀b\ufffdc\ufffd"
    plain = "nothing to do ✓"
    assert valid_text(plain) is plain


def test_text_guard_joins_a_pair_split_across_deltas_per_channel() -> None:
    guard = TextGuard(ReplyBudget("p", ReplyLimits()))
    got = [out for event in (TextDelta("x\ud83d"), ThinkingDelta("t\ud83e"), TextDelta("\ude00y"),
                             ThinkingDelta("\udd14"), TextDelta("end\ud83d"), Finish("stop", "m\udc00"))
           for out in guard.events(event)]
    assert got == [TextDelta("x"), ThinkingDelta("t"), TextDelta("😀y"), ThinkingDelta("🤔"),
                   TextDelta("end"), TextDelta("\ufffd"), Finish("stop", "m\ufffd")]


def test_text_guard_makes_tool_arguments_valid() -> None:
    call = ToolCallEvent("c\ud800", "look\udc00", {"q": ["a\ud83d\ude00", {"k\udc00": "v"}], "n": 1})
    (out,) = TextGuard(ReplyBudget("p", ReplyLimits())).events(call)
    assert out == ToolCallEvent("c\ufffd", "look\ufffd", {"q": ["a😀", {"k\ufffd": "v"}], "n": 1})


ADVERSARIAL = ["x", "0", "a:", "a://", "sk-", "1a", "Ab1", "-", "token ", " ", "x "]


@pytest.mark.parametrize("run", ADVERSARIAL)
def test_redact_and_short_message_take_linear_time_on_long_runs(run: str) -> None:
    # 1 MiB of one run: a quadratic pattern takes hours over it (the scheme pattern took 3.5 s over
    # 16 KiB before its lookbehind); linear ones take milliseconds. Waited on with a generous deadline.
    text = run * ((1 << 20) // len(run))
    done = threading.Event()

    def work() -> None:
        redact(text, ["secret-key"])
        short_message("context length " + text)
        translate_error("p", 400, {"error": {"message": "maximum context length " + text}})
        done.set()

    threading.Thread(target=work, daemon=True).start()
    assert done.wait(30), f"redacting 1 MiB of {run!r} did not finish"


def test_clip_never_ends_in_half_a_word() -> None:
    assert clip("keep sk-secretsecret", 12) == "keep"
    assert clip("short", 12) == "short"
    assert clip("x" * 20, 12) == ""


def test_redact_still_hides_url_credentials_after_any_prefix() -> None:
    for text in ("1http://u:pw-secret@h/x", "(https://u:pw-secret@h", "see git+ssh://u:pw-secret@h"):
        assert "pw-secret" not in redact(text)
