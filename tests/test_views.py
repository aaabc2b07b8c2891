"""Wire views of messages: what the ``history`` frame shows."""

from __future__ import annotations

from server.history.messages import TRIMMED, ChatMessage, ToolCall
from server.sessions.views import HISTORY_TOOL_CHARS, display_text, message_view


def test_history_view_clips_tool_text_over_the_limit():
    long = ChatMessage("tool", "z" * (HISTORY_TOOL_CHARS + 500), tool_call_id="c1")
    shown = display_text(long)
    assert shown.startswith("z" * HISTORY_TOOL_CHARS) and "500 more characters" in shown
    assert display_text(ChatMessage("assistant", "z" * 20000)) == "z" * 20000


def test_message_view_spells_left_out_as_the_page_reads_it():
    trimmed = message_view(ChatMessage("user", "old", turn_id="t0", left_out=TRIMMED, id="m1"))
    assert trimmed["trimmed"] is True and "excluded" not in trimmed and trimmed["turn_id"] == "t0"
    retried = message_view(ChatMessage("user", "again", left_out="replaced by a retry"))
    assert retried["trimmed"] is False and retried["excluded"] == "replaced by a retry"
    sent = message_view(ChatMessage("assistant", "", tool_calls=[ToolCall("c1", "lookup", {"q": 1})]))
    assert sent["trimmed"] is False and "excluded" not in sent
    assert sent["tool_calls"] == [{"id": "c1", "name": "lookup", "args": {"q": 1}}]
