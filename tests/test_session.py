"""The session's history state: what is sent, the reply being written, the breadcrumb."""

from __future__ import annotations

from pathlib import Path

import pytest

from server.history.compaction import TRUNCATED
from server.history.messages import TRIMMED, ChatMessage, Image, left_out_tokens
from server.routing.resolver import Route
from server.sessions.channel import FrameChannel
from server.sessions.events import EventBus
from server.sessions.reply import ReplyWriter
from server.sessions.session import Session
from server.store.backends import open_store

ROUTE = Route("demo", "demo-small", "default")


def session_of(transcript: list[ChatMessage]) -> Session:
    return Session("s", "t", ROUTE, transcript, channel=FrameChannel("s", EventBus()))


def test_session_to_send_leaves_out_the_reply_being_written():
    session = session_of([])
    user = ChatMessage("user", "hi", turn_id="t1")
    session.add(user)
    writer = ReplyWriter("t1", flush_seconds=1.0)
    writer.append("partial")
    session.join_reply(writer)
    session.rebuild()
    assert session.to_send() == [user]
    assert [m.content for m in session.snapshot()] == ["hi", "partial"]
    reply = writer.finish(interrupted=False)
    session.settle_reply(reply)
    assert session.to_send() == [user, reply] and session.transcript == [user, reply]


def test_session_settle_takes_an_empty_streamed_reply_back_out():
    session = session_of([])
    user = ChatMessage("user", "hi", turn_id="t1")
    session.add(user)
    writer = ReplyWriter("t1", flush_seconds=1.0)
    writer.append("")
    session.join_reply(writer)
    session.settle_reply(writer.finish(interrupted=True))
    assert session.transcript == [user] and session.to_send() == [user]


def test_session_settle_lists_a_reply_that_never_streamed():
    session = session_of([ChatMessage("user", "hi", turn_id="t1")])
    writer = ReplyWriter("t1", flush_seconds=1.0)
    message = writer.finish(interrupted=False, tool_calls=[])
    assert message is None  # no text, no tool calls: nothing to keep
    session.settle_reply(message)
    assert len(session.transcript) == 1


def test_breadcrumb_only_for_turns_left_out_to_fit():
    refused = ChatMessage("user", "too long", turn_id="t1", left_out="not sent: over the window")
    kept = ChatMessage("user", "next", turn_id="t2")
    session = session_of([refused, kept])
    assert session.to_send() == [kept]  # a set-aside turn is not "omitted to fit the context window"
    trimmed = ChatMessage("user", "old", turn_id="t0", left_out=TRIMMED)
    session = session_of([trimmed, kept])
    assert [m.breadcrumb for m in session.to_send()] == [True, False]


def test_session_knows_every_message_id_of_its_transcript():
    reply = ChatMessage("assistant", "a", turn_id="t1")
    session = session_of([ChatMessage("user", "q", turn_id="t1", id="u1"), reply])
    assert session.knows("u1") and session.knows(reply.id) and not session.knows("other")


def test_session_knows_the_ids_of_messages_that_joined_after_it_was_asked():
    session = session_of([ChatMessage("user", "q", turn_id="t1", id="u1")])
    assert session.knows("u1") and not session.knows("a1")
    session.add(ChatMessage("assistant", "a", turn_id="t1", id="a1"))
    assert session.knows("a1")
    writer = ReplyWriter("t2", flush_seconds=1.0)
    writer.append("x")
    session.join_reply(writer)  # a streamed reply taken back out: the ids are read again
    streamed = writer.current()
    assert streamed is not None and session.knows(streamed.id)
    session.settle_reply(None)
    session.add(ChatMessage("user", "q2", turn_id="t3", id="u3"))
    assert session.knows("u3")
    session.transcript.insert(0, ChatMessage("user", "summary", summary=True, id="s1"))  # compaction
    session.rebuild()
    assert session.knows("s1") and not session.knows("other")


@pytest.mark.anyio
async def test_session_keeps_its_trimmed_figure_current_through_trims_and_rebuilds(tmp_path: Path) -> None:
    """The meter's "History trimmed" is a running sum (no walk of the transcript per frame): it
    must stay what a recount of the left-out messages gives."""
    store = open_store(tmp_path)
    await store.create_session("s", title="t", route="demo")
    session = Session("s", "t", ROUTE, [], channel=FrameChannel("s", EventBus()), store=store)
    for n in range(6):
        images = [Image("image/png", "aGVsbG8=")] if n % 2 else None
        session.add(ChatMessage("user", f"question {n} " * 20, turn_id=f"t{n}", images=images),
                    ChatMessage("assistant", f"answer {n} " * 30, turn_id=f"t{n}"))

    def recount() -> int:
        return left_out_tokens(m for m in session.transcript if m.left_out in (TRIMMED, TRUNCATED))

    assert session.trimmed_tokens == 0
    await session.trim(session.ledger.trim_turn_count(4), "t5")
    await session.trim(session.ledger.trim_turn_count(2), "t5")
    assert session.trimmed_tokens == recount() > 0
    session.transcript[8].left_out = TRUNCATED  # compaction marks in place, then rebuilds
    session.rebuild()
    assert session.trimmed_tokens == recount()
    assert session_of(list(session.transcript)).trimmed_tokens == recount()  # restored from the store
    await store.close()
