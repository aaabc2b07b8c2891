from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from server.history.ledger import HistoryLedger
from server.history.messages import (
    BREADCRUMB_TEXT,
    ChatMessage,
    Image,
    ToolCall,
    estimate_history_tokens,
    is_turn_start,
)
from server.history.trim import (
    REASON_OVERFLOW,
    REASON_TURN_LIMIT,
    cap_tool_result,
    recovery_budget,
    sweep_orphans,
    trim_for_overflow,
    trim_preview,
    trim_to_recent_turn_count,
    trim_to_recent_turns,
)

PNG = Image("image/png", "aGVsbG8=")


def turn(n: int, *, tool: bool = False) -> list[ChatMessage]:
    """One turn: a 4-byte question (5 tokens), optionally a tool pair, and a 4-byte answer."""
    rows = [ChatMessage("user", f"q{n:03d}")]
    if tool:
        call = ToolCall(f"call{n}", "f", {})
        rows += [ChatMessage("assistant", "", tool_calls=[call]),
                 ChatMessage("tool", "rrrr", tool_call_id=call.id, name="f")]
    return [*rows, ChatMessage("assistant", f"a{n:03d}")]


def history(turns: int, *, system: bool = True, tool: bool = False) -> list[ChatMessage]:
    rows = [ChatMessage("system", "ssss")] if system else []
    for n in range(turns):
        rows += turn(n, tool=tool)
    return rows


def test_trim_budget_zero_is_noop() -> None:
    rows = history(20)
    result = trim_to_recent_turns(rows, 0)
    assert result.messages == rows and not result.trimmed


def test_trim_not_needed_keeps_same_messages_in_order() -> None:
    rows = history(3, tool=True)
    result = trim_to_recent_turns(rows, 10_000)
    assert result.messages == rows
    assert all(a is b for a, b in zip(result.messages, rows, strict=True))
    assert (result.dropped, result.dropped_messages, result.trimmed) == ([], 0, False)
    assert result.tokens_before == result.tokens_after == estimate_history_tokens(rows)


def test_trim_drops_fewest_oldest_whole_turns() -> None:
    rows = history(5)  # system 5 tokens, each turn 10 tokens: 55 in all
    crumb = ChatMessage("user", BREADCRUMB_TEXT, breadcrumb=True).text_tokens  # 17
    result = trim_to_recent_turns(rows, 5 + crumb + 30)
    assert result.dropped_turns == 2 and result.kept_turns == 3
    assert result.dropped == rows[1:5]
    assert result.dropped_messages == 4
    assert result.tokens_before == 55 and result.tokens_after == 5 + crumb + 30
    assert result.messages[0] is rows[0] and result.messages[1].breadcrumb
    assert result.messages[2:] == rows[5:]


def test_trim_newest_turn_stays_over_budget() -> None:
    rows = history(3)
    result = trim_to_recent_turns(rows, 1)
    assert result.kept_turns == 1 and result.messages[2:] == rows[-2:]


def test_trim_single_turn_is_untouched() -> None:
    rows = [ChatMessage("user", "x" * 400), ChatMessage("assistant", "y" * 400)]
    result = trim_to_recent_turns(rows, 10)
    assert result.messages == rows and not result.trimmed


def test_trim_tool_results_user_text_belongs_to_turn_before() -> None:
    rows = [ChatMessage("user", "q000"), ChatMessage("assistant", "<call/>"),
            ChatMessage("user", "[Tool results]\nlong output " * 20), ChatMessage("assistant", "a000"),
            *turn(1)]
    result = trim_to_recent_turns(rows, 40)
    assert result.dropped == rows[:4]
    assert result.dropped_turns == 1 and result.kept_turns == 1


def test_trim_tool_pairs_never_split() -> None:
    rows = history(4, tool=True)
    result = trim_to_recent_turns(rows, 60)
    assert result.trimmed
    kept_ids = {m.tool_call_id for m in result.messages if m.role == "tool"}
    call_ids = {c.id for m in result.messages for c in m.tool_calls or ()}
    assert kept_ids == call_ids


def test_trim_reuses_existing_breadcrumb() -> None:
    first = trim_to_recent_turns(history(6), 60)
    crumb = first.messages[1]
    second = trim_to_recent_turns([*first.messages, *turn(7), *turn(8)], 60)
    assert second.trimmed
    assert [m for m in second.messages if m.breadcrumb] == [crumb]
    assert second.messages[1] is crumb


def test_trim_breadcrumb_never_counted_as_turn() -> None:
    rows = history(3)
    first = trim_to_recent_turn_count(rows, 2)
    assert first.kept_turns == 2
    again = trim_to_recent_turn_count(first.messages, 2)
    assert not again.trimmed and again.kept_turns == 2


def test_trim_orphans_before_first_turn_drop_with_it() -> None:
    orphan = ChatMessage("tool", "stale", tool_call_id="gone")
    rows = [ChatMessage("system", "ssss"), orphan, *history(3, system=False)]
    result = trim_to_recent_turns(rows, 30)
    assert orphan in result.dropped and orphan not in result.messages


def test_trim_images_counted_only_where_sent() -> None:
    old = [ChatMessage("user", "q000"), ChatMessage("tool", "rrrr", tool_call_id="c", images=[PNG])]
    rows = [*old, *turn(1)]
    # the old tool image no longer counts: 20 tokens fit a budget of 25
    assert not trim_to_recent_turns(rows, 25, image_token_cost=1000).trimmed
    with_user_image = [ChatMessage("user", "q000", images=[PNG]), *rows[1:]]
    assert trim_to_recent_turns(with_user_image, 25, image_token_cost=1000).dropped_turns == 1


def test_turn_count_keeps_newest_turns() -> None:
    rows = history(5, tool=True)
    result = trim_to_recent_turn_count(rows, 2)
    assert result.dropped_turns == 3 and result.kept_turns == 2
    assert result.messages[2:] == rows[-8:]
    assert result.reason == REASON_TURN_LIMIT
    assert "tokens_before" not in result.frame_fields()


def test_turn_count_zero_keeps_newest_turn() -> None:
    rows = history(4)
    result = trim_to_recent_turn_count(rows, 0)
    assert result.kept_turns == 1 and result.messages[2:] == rows[-2:]


def test_turn_count_within_limit_is_untouched() -> None:
    rows = history(3)
    assert trim_to_recent_turn_count(rows, 3).messages == rows


def test_recovery_budget_is_two_thirds() -> None:
    assert recovery_budget(300) == 200
    assert recovery_budget(100) == 66


def test_trim_for_overflow_targets_two_thirds() -> None:
    rows = history(6)  # 65 tokens -> budget 43
    result = trim_for_overflow(rows)
    assert result.reason == REASON_OVERFLOW and result.token_budget == 43
    assert result.tokens_after <= 43
    assert result.frame_fields()["reason"] == "overflow_recovery"


def test_trim_for_overflow_single_turn_cannot_trim() -> None:
    assert not trim_for_overflow(history(1)).trimmed


def test_trim_preview_matches_trim_and_changes_nothing() -> None:
    rows = history(5)
    snapshot = list(rows)
    turns, tokens = trim_preview(rows, 40)
    result = trim_to_recent_turns(rows, 40)
    assert (turns, tokens) == (result.dropped_turns, result.tokens_before - result.tokens_after)
    assert rows == snapshot and not any(m.left_out for m in rows)


def test_cap_tool_result_keeps_head_and_tail() -> None:
    text = "a" * 100 + "b" * 100
    capped = cap_tool_result(text, 30)
    assert capped == "a" * 20 + "\n\n[... 170 characters truncated ...]\n\n" + "b" * 10


def test_cap_tool_result_zero_or_short_is_unchanged() -> None:
    assert cap_tool_result("x" * 100, 0) == "x" * 100
    assert cap_tool_result("x" * 10, 10) == "x" * 10


def test_cap_tool_result_never_splits_image_marker() -> None:
    marker = "[IMAGE:/tmp/cat.png]"
    capped = cap_tool_result("x" * 15 + marker + "y" * 100, 30)
    assert capped.startswith("x" * 15 + "\n\n[...")
    tail_marker = "z" * 100 + marker + "w" * 3
    assert cap_tool_result(tail_marker, 30).endswith("...]\n\n" + "w" * 3)


def test_sweep_drops_result_without_call() -> None:
    orphan = ChatMessage("tool", "x", tool_call_id="nobody")
    rows = [ChatMessage("user", "q"), orphan, ChatMessage("assistant", "a")]
    assert sweep_orphans(rows) == [rows[0], rows[2]]


def test_sweep_drops_result_before_its_call() -> None:
    call = ToolCall("c1", "f", {})
    early = ChatMessage("tool", "x", tool_call_id="c1")
    rows = [early, ChatMessage("assistant", "", tool_calls=[call])]
    assert sweep_orphans(rows) == []


def test_sweep_drops_unanswered_textless_call_and_strips_texted_one() -> None:
    lone = ChatMessage("assistant", "", tool_calls=[ToolCall("c1", "f", {})])
    texted = ChatMessage("assistant", "let me look", tool_calls=[ToolCall("c2", "f", {}),
                                                               ToolCall("c3", "g", {})])
    result = ChatMessage("tool", "ok", tool_call_id="c3")
    swept = sweep_orphans([ChatMessage("user", "q"), lone, texted, result])
    assert lone not in swept and swept[-1] is result
    assert swept[1].id == texted.id and [c.id for c in swept[1].tool_calls or ()] == ["c3"]
    assert len(texted.tool_calls or ()) == 2  # the input is not mutated


def test_sweep_keeps_paired_history_as_is() -> None:
    rows = history(3, tool=True)
    assert sweep_orphans(rows) == rows


def test_ledger_running_session_matches_pure_trim() -> None:
    rows = history(0)
    ledger = HistoryLedger(rows)
    for n in range(700):  # enough dropped rows to exercise the ledger's storage compaction
        new = turn(n, tool=n % 2 == 0)
        ledger.extend(new)
        rows += new
        expected = trim_to_recent_turns(rows, 300)
        report = ledger.trim(300)
        assert report.dropped == expected.dropped and report.tokens_after == expected.tokens_after
        assert ledger.text_tokens == sum(m.text_tokens for m in ledger.messages())
        rows = expected.messages
    def real(messages: list[ChatMessage]) -> list[ChatMessage]:
        return [m for m in messages if not m.breadcrumb]

    assert real(ledger.messages()) == real(rows) and ledger.estimate == estimate_history_tokens(rows)


def test_ledger_turn_count_and_overflow() -> None:
    ledger = HistoryLedger(history(5))
    assert ledger.trim_turn_count(0).dropped_turns == 4 and ledger.turns == 1
    assert not ledger.trim_for_overflow().trimmed


# --- properties over generated histories -------------------------------------------------------

texts = st.text(alphabet="abc xyzあ", max_size=40)


@st.composite
def turns_strategy(draw: st.DrawFn, index: int) -> list[ChatMessage]:
    images = [PNG] * draw(st.integers(0, 2))
    rows = [ChatMessage("user", f"u{index} " + draw(texts), images=images or None)]
    for call_no in range(draw(st.integers(0, 2))):
        call = ToolCall(f"t{index}-{call_no}", "tool", {"q": draw(texts)})
        rows.append(ChatMessage("assistant", "", tool_calls=[call]))
        tool_images = [PNG] if draw(st.booleans()) else None
        rows.append(ChatMessage("tool", draw(texts), tool_call_id=call.id, images=tool_images))
    if draw(st.booleans()):
        rows.append(ChatMessage("user", "[Tool results]\n" + draw(texts)))
    if draw(st.booleans()):
        rows.append(ChatMessage("assistant", draw(texts)))
    return rows


@st.composite
def histories(draw: st.DrawFn) -> list[ChatMessage]:
    rows = [ChatMessage("system", draw(texts)) for _ in range(draw(st.integers(0, 2)))]
    if draw(st.booleans()):
        rows.append(ChatMessage("user", BREADCRUMB_TEXT, breadcrumb=True))
    for index in range(draw(st.integers(0, 12))):
        rows += draw(turns_strategy(index))
    return rows


budgets = st.integers(0, 3000)
FAST = settings(max_examples=200, deadline=None)


def _pairs_whole(messages: list[ChatMessage]) -> bool:
    calls = {c.id for m in messages for c in m.tool_calls or ()}
    results = {m.tool_call_id for m in messages if m.role == "tool"}
    return calls == results


def _turn_rows(messages: list[ChatMessage]) -> list[list[ChatMessage]]:
    starts = [i for i, m in enumerate(messages) if is_turn_start(m)] + [len(messages)]
    return [messages[a:b] for a, b in zip(starts, starts[1:], strict=False)]


@FAST
@given(rows=histories(), budget=budgets)
def test_property_trim_invariants(rows: list[ChatMessage], budget: int) -> None:
    result = trim_to_recent_turns(rows, budget, image_token_cost=100)
    kept = result.messages
    assert _pairs_whole(kept)
    systems = [m for m in rows if m.role == "system"]  # generated only at the front
    assert kept[: len(systems)] == systems
    if _turn_rows(rows):
        assert _turn_rows(kept)[-1] == _turn_rows(rows)[-1]
    order = {id(m): i for i, m in enumerate(rows)}
    positions = [order[id(m)] for m in kept if id(m) in order]
    assert positions == sorted(positions)
    assert sum(1 for m in kept if m.breadcrumb) <= 1
    assert len(kept) + result.dropped_messages == len(rows) + (result.trimmed and not
                                                                any(m.breadcrumb for m in rows))


@FAST
@given(rows=histories(), budget=budgets)
def test_property_second_trim_changes_nothing(rows: list[ChatMessage], budget: int) -> None:
    first = trim_to_recent_turns(rows, budget, image_token_cost=100)
    second = trim_to_recent_turns(first.messages, budget, image_token_cost=100)
    assert not second.trimmed and second.messages == first.messages


@FAST
@given(rows=histories(), budget=budgets)
def test_property_fits_or_keeps_one_turn(rows: list[ChatMessage], budget: int) -> None:
    result = trim_to_recent_turns(rows, budget, image_token_cost=100)
    assert result.tokens_after == estimate_history_tokens(result.messages, 100)
    if result.trimmed:
        assert result.tokens_after <= budget or result.kept_turns == 1


@FAST
@given(rows=histories(), limit=st.integers(0, 15))
def test_property_turn_count_keeps_newest(rows: list[ChatMessage], limit: int) -> None:
    result = trim_to_recent_turn_count(rows, limit)
    total = len(_turn_rows(rows))
    assert result.kept_turns == min(max(limit, 1), total) or total == 0
    assert _turn_rows(result.messages) == _turn_rows(rows)[total - result.kept_turns:]
    assert _pairs_whole(result.messages)


@FAST
@given(rows=histories(), budget=budgets)
def test_property_ledger_agrees_with_pure_trim(rows: list[ChatMessage], budget: int) -> None:
    ledger = HistoryLedger(rows, image_token_cost=100)
    assert ledger.estimate == estimate_history_tokens(rows, 100)
    preview = ledger.preview(budget)
    expected = trim_to_recent_turns(rows, budget, image_token_cost=100)
    report = ledger.trim(budget)
    assert preview == trim_preview(rows, budget, image_token_cost=100)
    assert report.dropped == expected.dropped and report.kept_turns == expected.kept_turns
    assert report.tokens_after == expected.tokens_after == ledger.estimate
    assert ledger.text_tokens == sum(m.text_tokens for m in ledger.messages())
    assert ledger.system_tokens == sum(m.text_tokens for m in ledger.messages() if m.role == "system")
    assert [m.id for m in ledger.messages() if not m.breadcrumb] == \
        [m.id for m in expected.messages if not m.breadcrumb]
