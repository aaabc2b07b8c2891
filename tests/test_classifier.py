from __future__ import annotations

from server.config.settings import ClassifierRule
from server.routing.classifier import Classifier


def test_classifier_no_rules_gives_none() -> None:
    classifier = Classifier([])
    assert classifier.hint_for("write a function") is None


def test_classifier_no_match_gives_none() -> None:
    classifier = Classifier([ClassifierRule(hint="code", keywords=["function"])])
    assert classifier.hint_for("tell me a story") is None


def test_classifier_highest_priority_wins() -> None:
    rules = [
        ClassifierRule(hint="low", keywords=["function"], priority=1),
        ClassifierRule(hint="high", keywords=["function"], priority=5),
    ]
    assert Classifier(rules).hint_for("a function please") == "high"


def test_classifier_equal_priority_keeps_file_order() -> None:
    rules = [
        ClassifierRule(hint="first", keywords=["x"], priority=2),
        ClassifierRule(hint="second", keywords=["x"], priority=2),
        ClassifierRule(hint="third", keywords=["x"], priority=2),
    ]
    assert Classifier(rules).hint_for("x") == "first"
    assert Classifier(list(reversed(rules))).hint_for("x") == "third"


def test_classifier_keywords_ignore_case() -> None:
    classifier = Classifier([ClassifierRule(hint="code", keywords=["Function"])])
    assert classifier.hint_for("write a FUNCTION that adds") == "code"


def test_classifier_patterns_respect_case() -> None:
    classifier = Classifier([ClassifierRule(hint="sql", patterns=["SELECT"])])
    assert classifier.hint_for("SELECT * FROM t") == "sql"
    assert classifier.hint_for("select * from t") is None


def test_classifier_keyword_or_pattern_either_matches() -> None:
    classifier = Classifier([ClassifierRule(hint="code", keywords=["python"], patterns=["def "])])
    assert classifier.hint_for("def f(): pass") == "code"
    assert classifier.hint_for("PYTHON question") == "code"
    assert classifier.hint_for("a poem") is None


def test_classifier_rule_without_keywords_matches_on_length_alone() -> None:
    rules = [
        ClassifierRule(hint="code", keywords=["function"], priority=1),
        ClassifierRule(hint="long", min_length=20),
    ]
    classifier = Classifier(rules)
    assert classifier.hint_for("short") is None
    assert classifier.hint_for("a rather long message about nothing") == "long"
    assert classifier.hint_for("a long function question here") == "code"


def test_classifier_length_counts_utf8_bytes() -> None:
    # 4 Japanese characters are 12 UTF-8 bytes.
    text = "こんにちは"[:4]
    assert len(text) == 4 and len(text.encode("utf-8")) == 12
    assert Classifier([ClassifierRule(hint="big", min_length=10)]).hint_for(text) == "big"
    assert Classifier([ClassifierRule(hint="small", max_length=8)]).hint_for(text) is None
    assert Classifier([ClassifierRule(hint="small", max_length=12)]).hint_for(text) == "small"


def test_classifier_length_bounds_are_inclusive() -> None:
    classifier = Classifier([ClassifierRule(hint="mid", min_length=3, max_length=5)])
    assert classifier.hint_for("ab") is None
    assert classifier.hint_for("abc") == "mid"
    assert classifier.hint_for("abcde") == "mid"
    assert classifier.hint_for("abcdef") is None


def test_classifier_max_length_zero_means_unbounded() -> None:
    classifier = Classifier([ClassifierRule(hint="any", keywords=["x"], max_length=0)])
    assert classifier.hint_for("x" * 100_000) == "any"


def test_classifier_length_failure_falls_through_to_next_rule() -> None:
    rules = [
        ClassifierRule(hint="short-code", keywords=["code"], max_length=10, priority=3),
        ClassifierRule(hint="code", keywords=["code"], priority=1),
    ]
    classifier = Classifier(rules)
    assert classifier.hint_for("code") == "short-code"
    assert classifier.hint_for("please review this code") == "code"
