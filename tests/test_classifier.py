from __future__ import annotations

from server.classifier import Classifier
from server.config import ClassifierRule


def test_classifier_no_rules_gives_none() -> None:
    classifier = Classifier([])
    assert classifier.classify("write a function") is None
    assert not classifier


def test_classifier_no_match_gives_none() -> None:
    classifier = Classifier([ClassifierRule(hint="code", keywords=["function"])])
    assert classifier.classify("tell me a story") is None


def test_classifier_highest_priority_wins() -> None:
    rules = [
        ClassifierRule(hint="low", keywords=["function"], priority=1),
        ClassifierRule(hint="high", keywords=["function"], priority=5),
    ]
    assert Classifier(rules).classify("a function please") == "high"


def test_classifier_equal_priority_keeps_file_order() -> None:
    rules = [
        ClassifierRule(hint="first", keywords=["x"], priority=2),
        ClassifierRule(hint="second", keywords=["x"], priority=2),
        ClassifierRule(hint="third", keywords=["x"], priority=2),
    ]
    assert Classifier(rules).classify("x") == "first"
    assert Classifier(list(reversed(rules))).classify("x") == "third"


def test_classifier_keywords_ignore_case() -> None:
    classifier = Classifier([ClassifierRule(hint="code", keywords=["Function"])])
    assert classifier.classify("write a FUNCTION that adds") == "code"


def test_classifier_patterns_respect_case() -> None:
    classifier = Classifier([ClassifierRule(hint="sql", patterns=["SELECT"])])
    assert classifier.classify("SELECT * FROM t") == "sql"
    assert classifier.classify("select * from t") is None


def test_classifier_keyword_or_pattern_either_matches() -> None:
    classifier = Classifier([ClassifierRule(hint="code", keywords=["python"], patterns=["def "])])
    assert classifier.classify("def f(): pass") == "code"
    assert classifier.classify("PYTHON question") == "code"
    assert classifier.classify("a poem") is None


def test_classifier_rule_without_keywords_matches_on_length_alone() -> None:
    rules = [
        ClassifierRule(hint="code", keywords=["function"], priority=1),
        ClassifierRule(hint="long", min_length=20),
    ]
    classifier = Classifier(rules)
    assert classifier.classify("short") is None
    assert classifier.classify("a rather long message about nothing") == "long"
    assert classifier.classify("a long function question here") == "code"


def test_classifier_length_counts_utf8_bytes() -> None:
    # 4 Japanese characters are 12 UTF-8 bytes.
    text = "こんにちは"[:4]
    assert len(text) == 4 and len(text.encode("utf-8")) == 12
    assert Classifier([ClassifierRule(hint="big", min_length=10)]).classify(text) == "big"
    assert Classifier([ClassifierRule(hint="small", max_length=8)]).classify(text) is None
    assert Classifier([ClassifierRule(hint="small", max_length=12)]).classify(text) == "small"


def test_classifier_length_bounds_are_inclusive() -> None:
    classifier = Classifier([ClassifierRule(hint="mid", min_length=3, max_length=5)])
    assert classifier.classify("ab") is None
    assert classifier.classify("abc") == "mid"
    assert classifier.classify("abcde") == "mid"
    assert classifier.classify("abcdef") is None


def test_classifier_max_length_zero_means_unbounded() -> None:
    classifier = Classifier([ClassifierRule(hint="any", keywords=["x"], max_length=0)])
    assert classifier.classify("x" * 100_000) == "any"


def test_classifier_length_failure_falls_through_to_next_rule() -> None:
    rules = [
        ClassifierRule(hint="short-code", keywords=["code"], max_length=10, priority=3),
        ClassifierRule(hint="code", keywords=["code"], priority=1),
    ]
    classifier = Classifier(rules)
    assert classifier.classify("code") == "short-code"
    assert classifier.classify("please review this code") == "code"
