from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from server.config.settings import CompactionSettings
from server.history.compaction import (
    SUMMARIZED,
    TRUNCATED,
    apply_summary,
    build_groups,
    compact,
    compaction_target,
    plan_compaction,
    rollback,
    summary_request,
)
from server.history.messages import ChatMessage, ToolCall, estimate_history_tokens, is_turn_start, visible
from tests.test_history_trim import histories


def novel_turn(n: int) -> list[ChatMessage]:
    """The seed's shape: a question, a tool call, a long tool result, an answer (about 70 tokens)."""
    call = ToolCall(f"c{n}", "get_novel", {"name": f"novel {n}"})
    return [ChatMessage("user", f"find novel {n}"),
            ChatMessage("assistant", "", tool_calls=[call]),
            ChatMessage("tool", "x" * 200, tool_call_id=call.id, name="get_novel"),
            ChatMessage("assistant", "here it is")]


def session(turns: int) -> list[ChatMessage]:
    rows = [ChatMessage("system", "You are a helpful assistant.")]
    for n in range(turns):
        rows += novel_turn(n)
    return rows


def truncation(trigger: int, **fields: object) -> CompactionSettings:
    return CompactionSettings(strategy="truncation", tokens_exceed=trigger, **fields)  # type: ignore[arg-type]


def test_groups_kinds_and_call_id_linking() -> None:
    call = ToolCall("c1", "f", {})
    result = ChatMessage("tool", "r", tool_call_id="c1")
    rows = [ChatMessage("system", "s"), ChatMessage("user", "q"),
            ChatMessage("assistant", "", tool_calls=[call]), ChatMessage("assistant", "thinking aloud"),
            result, ChatMessage("assistant", "done"), ChatMessage("user", "[Summary] x", summary=True)]
    groups = build_groups(rows)
    assert [g.kind for g in groups] == ["system", "user", "tool_call", "assistant_text",
                                        "assistant_text", "summary"]
    assert groups[2].messages == [rows[2], result]  # linked by id across the gap
    assert sum(g.tokens for g in groups) == estimate_history_tokens(rows)


def test_groups_tool_results_text_joins_group_before() -> None:
    rows = [ChatMessage("user", "q"), ChatMessage("assistant", "<call/>"),
            ChatMessage("user", "[Tool results]\nok")]
    assert [g.kind for g in build_groups(rows)] == ["user", "tool_call"]


def test_groups_orphan_result_is_its_own_group() -> None:
    rows = [ChatMessage("tool", "r", tool_call_id="nobody"), ChatMessage("user", "q")]
    assert [g.kind for g in build_groups(rows)] == ["tool_call", "user"]


def test_target_defaults_to_the_trigger_as_seed_004_says() -> None:
    assert compaction_target(truncation(1000)) == 1000
    assert compaction_target(truncation(1000, target_tokens=600)) == 600
    assert compaction_target(truncation(1000, target_tokens=1000)) == 1000
    assert compaction_target(truncation(1000, target_tokens=0)) == 1000
    assert compaction_target(truncation(1000, target_tokens=1500)) == 1000


def test_truncation_without_target_stops_once_count_no_longer_exceeds_trigger() -> None:
    rows = session(8)
    trigger = estimate_history_tokens(rows) - 1
    plan = compact([*rows], truncation(trigger, minimum_preserved_groups=1))
    assert plan.needed and plan.target == trigger and plan.tokens_after <= trigger
    # Minimal: keeping the last excluded group back would leave the count above the trigger.
    assert plan.tokens_after + plan.groups[-1].tokens > trigger or plan.groups[-1].kind != "user"
    hysteresis = compact(session(8), truncation(trigger, target_tokens=trigger // 2,
                                                minimum_preserved_groups=1))
    assert len(hysteresis.groups) > len(plan.groups)


def test_compaction_none_or_under_trigger_changes_nothing() -> None:
    rows = session(5)
    assert not compact(rows, CompactionSettings(strategy="none", tokens_exceed=10)).needed
    assert not compact(rows, truncation(estimate_history_tokens(rows))).needed
    assert not compact(rows, truncation(0)).needed
    assert all(m.left_out is None for m in rows)


def test_truncation_excludes_oldest_groups_to_target() -> None:
    rows = session(5)
    before = estimate_history_tokens(rows)
    plan = compact(rows, truncation(before - 1, minimum_preserved_groups=3))
    assert plan.needed and plan.tokens_after <= plan.target
    sent = visible(rows)
    assert len(rows) == 21  # nothing deleted
    assert estimate_history_tokens(sent) == plan.tokens_after
    assert sent[0].role == "system" and is_turn_start(sent[1])
    assert {m.left_out for m in rows if m.left_out} == {TRUNCATED}


def test_truncation_explicit_lower_target_does_not_refire() -> None:
    rows = session(6)
    trigger = estimate_history_tokens(rows) - 1
    settings_ = truncation(trigger, target_tokens=trigger * 3 // 4, minimum_preserved_groups=2)
    compact(rows, settings_)
    rows += novel_turn(99)
    assert estimate_history_tokens(visible(rows)) <= settings_.tokens_exceed
    assert not compact(rows, settings_).needed


def test_truncation_keeps_minimum_preserved_groups_over_target() -> None:
    rows = session(3)
    plan = compact(rows, truncation(10, minimum_preserved_groups=6))
    sent = visible(rows)
    assert plan.tokens_after > plan.target
    assert len([g for g in build_groups(sent) if g.kind != "system"]) >= 6


def test_truncation_extends_to_user_boundary() -> None:
    rows = session(4)
    # minimum_preserved_groups=2 would keep only [tool_call, assistant_text]: the cut moves back to
    # the user group of the newest turn instead of leaving an assistant message first.
    compact(rows, truncation(10, minimum_preserved_groups=2))
    sent = visible(rows)
    assert sent[1] is rows[-4] and is_turn_start(sent[1])


def test_truncation_never_excludes_current_turn() -> None:
    rows = session(2)
    compact(rows, truncation(1, minimum_preserved_groups=0))
    assert visible(rows)[1:] == rows[-4:]


def test_truncation_is_idempotent_and_rolls_back() -> None:
    rows = session(5)
    settings_ = truncation(100, minimum_preserved_groups=1)
    plan = compact(rows, settings_)
    marks = [m.left_out for m in rows]
    assert not compact(rows, settings_).needed
    assert [m.left_out for m in rows] == marks
    rollback(plan)
    assert all(m.left_out is None for m in rows)


def test_summarization_plans_without_changing_anything() -> None:
    rows = session(4)
    plan = compact(rows, CompactionSettings(strategy="summarization", tokens_exceed=100,
                                            minimum_preserved_groups=1))
    assert plan.needed and all(m.left_out is None for m in rows)
    text = summary_request(plan)[0].content
    assert "find novel 0" in text and "get_novel" in text and "find novel 3" not in text


def test_summarization_apply_inserts_summary_and_rollback_restores() -> None:
    rows = session(4)
    original = list(rows)
    plan = plan_compaction(rows, CompactionSettings(strategy="summarization", tokens_exceed=100,
                                                    minimum_preserved_groups=1))
    summary = apply_summary(rows, plan, "The user looks for novels.")
    assert summary.summary and summary.content.startswith("[Summary]")
    sent = visible(rows)
    assert sent[0].role == "system" and sent[1] is summary and is_turn_start(sent[2])
    assert {m.left_out for m in plan.excluded_messages} == {SUMMARIZED}
    rollback(plan)
    assert rows == original and all(m.left_out is None for m in rows)


FAST = settings(max_examples=200, deadline=None)


@FAST
@given(rows=histories(), trigger=st.integers(1, 3000), preserved=st.integers(0, 6))
def test_property_truncation_invariants(rows: list[ChatMessage], trigger: int, preserved: int) -> None:
    plan = compact(rows, truncation(trigger, minimum_preserved_groups=preserved), image_token_cost=100)
    sent = visible(rows)
    calls = {c.id for m in sent for c in m.tool_calls or ()}
    assert calls == {m.tool_call_id for m in sent if m.role == "tool"}
    systems = [m for m in rows if m.role == "system"]
    assert sent[: len(systems)] == systems
    turn_starts = [i for i, m in enumerate(rows) if is_turn_start(m)]
    if turn_starts:
        assert all(m.left_out is None for m in rows[turn_starts[-1]:])
    if plan.needed:
        assert is_turn_start(sent[len(systems)])
        non_system = [g for g in build_groups(sent) if g.kind != "system"]
        assert len(non_system) >= preserved
    assert estimate_history_tokens(sent, 100) == plan.tokens_after
    again = compact(rows, truncation(trigger, minimum_preserved_groups=preserved), image_token_cost=100)
    assert not again.needed
