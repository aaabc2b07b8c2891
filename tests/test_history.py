from __future__ import annotations

from server.history.messages import (
    BREADCRUMB_TEXT,
    TRIMMED,
    ChatMessage,
    Image,
    ToolCall,
    estimate_history_tokens,
    is_turn_start,
    left_out_from,
    stored_marks,
    visible,
)

PNG = Image("image/png", "aGVsbG8=")


def test_estimate_ceil_bytes_over_four_plus_four() -> None:
    assert estimate_history_tokens([ChatMessage("user", "abcd")]) == 1 + 4
    assert estimate_history_tokens([ChatMessage("user", "abcde")]) == 2 + 4
    assert estimate_history_tokens([ChatMessage("user", "")]) == 4


def test_estimate_counts_utf8_bytes_not_characters() -> None:
    # Three kana are nine UTF-8 bytes: ceil(9 / 4) = 3.
    assert estimate_history_tokens([ChatMessage("user", "あいう")]) == 3 + 4


def test_estimate_sums_messages() -> None:
    history = [ChatMessage("system", "x" * 8), ChatMessage("user", "y" * 4)]
    assert estimate_history_tokens(history) == (2 + 4) + (1 + 4)


def test_estimate_counts_tool_call_name_and_arguments() -> None:
    call = ToolCall("c1", "abcd", {"k": 1})  # name 4 bytes + '{"k": 1}' 8 bytes
    assert estimate_history_tokens([ChatMessage("assistant", "", tool_calls=[call])]) == 3 + 4


def test_estimate_user_images_always_count() -> None:
    history = [ChatMessage("user", "abcd", images=[PNG, PNG]), ChatMessage("assistant", "abcd"),
               ChatMessage("user", "abcd")]
    assert estimate_history_tokens(history, image_token_cost=100) == 3 * 5 + 200


def test_estimate_tool_images_count_only_in_current_turn() -> None:
    old = [ChatMessage("user", "abcd"), ChatMessage("tool", "abcd", tool_call_id="c", images=[PNG])]
    assert estimate_history_tokens(old, image_token_cost=100) == 10 + 100
    later = [*old, ChatMessage("user", "abcd")]
    assert estimate_history_tokens(later, image_token_cost=100) == 15


def test_estimate_tool_results_user_text_images_follow_tool_rule() -> None:
    output = ChatMessage("user", "[Tool results]\nok", images=[PNG])
    history = [ChatMessage("user", "abcd"), output]
    assert estimate_history_tokens(history, image_token_cost=100) == 5 + 9 + 100
    assert estimate_history_tokens([*history, ChatMessage("user", "abcd")], image_token_cost=100) == 19


def test_estimate_assistant_images_never_count() -> None:
    history = [ChatMessage("user", "abcd"), ChatMessage("assistant", "abcd", images=[PNG])]
    assert estimate_history_tokens(history, image_token_cost=100) == 10


def test_estimate_measures_text_once() -> None:
    message = ChatMessage("user", "abcd")
    assert message.text_tokens == 5
    message.content = "a much longer text than before"  # not via set_content: cache must hold
    assert message.text_tokens == 5
    message.set_content("abcdefgh")
    assert message.text_tokens == 6


def test_turn_start_is_a_real_user_message() -> None:
    assert is_turn_start(ChatMessage("user", "hello"))
    assert not is_turn_start(ChatMessage("user", "[Tool results]\n42"))
    assert not is_turn_start(ChatMessage("user", BREADCRUMB_TEXT, breadcrumb=True))
    assert not is_turn_start(ChatMessage("user", "[Summary] x", summary=True))
    assert not is_turn_start(ChatMessage("assistant", "hello"))
    assert not is_turn_start(ChatMessage("tool", "hello", tool_call_id="c"))


def test_breadcrumb_recognised_by_flag_not_text() -> None:
    assert is_turn_start(ChatMessage("user", BREADCRUMB_TEXT))


def test_visible_hides_trimmed_and_excluded() -> None:
    kept = ChatMessage("user", "a")
    history = [ChatMessage("user", "b", left_out="trimmed"), ChatMessage("user", "c", left_out="x"), kept]
    assert visible(history) == [kept]


def test_left_out_is_stored_and_sent_as_trimmed_or_excluded() -> None:
    retry = "replaced by a retry"
    cases = [(None, (False, None)), (TRIMMED, (True, None)), (retry, (False, retry))]
    for left_out, marks in cases:
        message = ChatMessage("user", "x", left_out=left_out)
        assert stored_marks(message) == marks and left_out_from(*marks) == left_out
