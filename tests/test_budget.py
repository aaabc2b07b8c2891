from __future__ import annotations

from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st

from server.config.settings import HistoryPruning, RuntimeSettings
from server.history.budget import FALLBACK_WINDOW, effective_context_budget


def budget(capacity: int | None = None, **fields: object) -> int:
    return effective_context_budget(RuntimeSettings(**fields), capacity)  # type: ignore[arg-type]


def test_budget_unset_uses_fallback() -> None:
    assert FALLBACK_WINDOW == 32_000
    assert budget() == 32_000


def test_budget_unset_capped_by_smaller_capacity() -> None:
    assert budget(8_000) == 8_000


def test_budget_unset_not_raised_by_larger_capacity() -> None:
    assert budget(200_000) == 32_000


def test_budget_explicit_zero_disables_trimming() -> None:
    assert budget(8_000, max_context_tokens=0) == 0
    assert budget(None, max_context_tokens=0, context_compact_ratio=0.5) == 0
    pruning = HistoryPruning(enabled=True, max_tokens=100)
    assert budget(None, max_context_tokens=0, history_pruning=pruning) == 0


def test_budget_explicit_max_is_absolute_without_capacity() -> None:
    # An unknown window must not pull an explicit budget down to the 32,000 stub.
    assert budget(None, max_context_tokens=131_072) == 131_072


def test_budget_explicit_max_capped_by_capacity() -> None:
    assert budget(100_000, max_context_tokens=131_072) == 100_000
    assert budget(200_000, max_context_tokens=131_072) == 131_072


def test_budget_ratio_of_known_capacity() -> None:
    assert budget(128_000, context_compact_ratio=0.8) == 102_400


def test_budget_ratio_floors() -> None:
    assert budget(1_001, context_compact_ratio=0.5) == 500


def test_budget_ratio_at_least_one() -> None:
    assert budget(3, context_compact_ratio=0.1) == 1


def test_budget_ratio_of_fallback_window_when_capacity_unknown() -> None:
    assert budget(None, context_compact_ratio=0.5) == 16_000
    assert budget(0, context_compact_ratio=0.5) == 16_000


def test_budget_ratio_applies_to_explicit_max_when_capacity_unknown() -> None:
    assert budget(None, max_context_tokens=100_000, context_compact_ratio=0.5) == 50_000


def test_budget_explicit_max_caps_ratio_budget() -> None:
    assert budget(128_000, max_context_tokens=20_000, context_compact_ratio=0.8) == 20_000
    assert budget(128_000, max_context_tokens=200_000, context_compact_ratio=0.5) == 64_000


def test_budget_ratio_outside_range_counts_as_unset() -> None:
    for ratio in (0.0, -0.5, 1.5, float("nan"), float("inf")):
        assert budget(128_000, context_compact_ratio=ratio) == 32_000
        assert budget(None, max_context_tokens=50_000, context_compact_ratio=ratio) == 50_000


def test_budget_ratio_one_is_whole_window() -> None:
    assert budget(128_000, context_compact_ratio=1.0) == 128_000


def test_budget_pruning_lowers() -> None:
    pruning = HistoryPruning(enabled=True, max_tokens=8_192)
    assert budget(None, history_pruning=pruning) == 8_192
    assert budget(128_000, context_compact_ratio=0.8, history_pruning=pruning) == 8_192


def test_budget_pruning_never_raises() -> None:
    pruning = HistoryPruning(enabled=True, max_tokens=100_000)
    assert budget(None, max_context_tokens=10_000, history_pruning=pruning) == 10_000


def test_budget_pruning_ignored_when_disabled_or_zero() -> None:
    assert budget(None, history_pruning=HistoryPruning(enabled=False, max_tokens=100)) == 32_000
    assert budget(None, history_pruning=HistoryPruning(enabled=True, max_tokens=0)) == 32_000


def test_budget_capacity_caps_pruning_budget() -> None:
    pruning = HistoryPruning(enabled=True, max_tokens=8_192)
    assert budget(4_096, history_pruning=pruning) == 4_096


def test_budget_negative_explicit_counts_as_unset() -> None:
    assert budget(None, max_context_tokens=-5) == 32_000


ratios = st.none() | st.floats(-1.0, 2.0) | st.just(float("nan"))
unpruned = st.builds(
    RuntimeSettings,
    max_context_tokens=st.none() | st.integers(-10, 300_000),
    context_compact_ratio=ratios,
)
capacities = st.none() | st.integers(-10, 1_000_000)


@settings(max_examples=200, deadline=None)
@given(runtime=unpruned, capacity=capacities, cap=st.integers(1, 300_000))
def test_budget_adding_pruning_cap_never_raises(runtime: RuntimeSettings, capacity: int | None,
                                                cap: int) -> None:
    pruned = replace(runtime, history_pruning=HistoryPruning(enabled=True, max_tokens=cap))
    assert effective_context_budget(pruned, capacity) <= effective_context_budget(runtime, capacity)


@settings(max_examples=200, deadline=None)
@given(runtime=unpruned, capacity=st.integers(1, 1_000_000), cap=st.integers(1, 300_000))
def test_budget_adding_explicit_cap_to_ratio_never_raises(runtime: RuntimeSettings, capacity: int,
                                                          cap: int) -> None:
    ratio_only = replace(runtime, max_context_tokens=None)
    capped = replace(runtime, max_context_tokens=cap)
    if ratio_only.context_compact_ratio is not None and 0 < ratio_only.context_compact_ratio <= 1:
        assert effective_context_budget(capped, capacity) <= effective_context_budget(ratio_only, capacity)


@settings(max_examples=200, deadline=None)
@given(runtime=unpruned, capacity=capacities, low=st.integers(1, 300_000), extra=st.integers(0, 300_000))
def test_budget_lower_explicit_max_never_raises(runtime: RuntimeSettings, capacity: int | None,
                                                low: int, extra: int) -> None:
    lower = effective_context_budget(replace(runtime, max_context_tokens=low), capacity)
    higher = effective_context_budget(replace(runtime, max_context_tokens=low + extra), capacity)
    assert lower <= higher


@settings(max_examples=200, deadline=None)
@given(runtime=unpruned, capacity=capacities)
def test_budget_known_capacity_caps_every_positive_budget(runtime: RuntimeSettings,
                                                          capacity: int | None) -> None:
    result = effective_context_budget(runtime, capacity)
    if runtime.max_context_tokens == 0:
        assert result == 0
        return
    assert result >= 1
    if capacity is not None and capacity > 0:
        assert result <= capacity
