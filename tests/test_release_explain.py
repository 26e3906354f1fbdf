"""What changed between two SGLang releases, as the verdict's root cause and ``derive --sglang-version
a,b`` say it (``checker.core.releases.releases.explain_release_difference``).

Expected lines are read off docs/sglang-releases.md's table of release groups: which rule changed, the
first release with the new rule, and the two values.
"""

from __future__ import annotations

from typing import Any

import pytest

from checker.core.releases.releases import explain_release_difference as explain_with
from checker.families import FAMILY_TABLE


def explain_release_difference(a: str, b: str, **kw: Any) -> list[str]:
    """With every family's facts, as the callers pass them."""
    return explain_with(a, b, families=FAMILY_TABLE, **kw)


def test_the_first_release_with_the_new_rule_is_named() -> None:
    """0.5.3.post2 defaults --mamba-full-memory-ratio to 0.2, and 0.5.3.post3 went back to 0.9 (which
    0.5.2 also had): comparing 0.5.3.post2 with 0.5.4 names 0.5.3.post3, the release after the old one
    where the new value starts, not an earlier release that happens to share it."""
    assert explain_release_difference("0.5.3.post2", "0.5.4") == [
        "0.5.3.post2 and 0.5.3.post3 default --mamba-full-memory-ratio differently (0.2 vs 0.9)"
    ]


def test_order_does_not_matter() -> None:
    """The older release is "old" whichever is given first."""
    for a, b in [("0.5.16", "0.5.23"), ("0.5.7", "0.5.8"), ("0.5.3.post2", "0.5.4")]:
        assert explain_release_difference(a, b) == explain_release_difference(b, a)


def test_two_values_are_quoted_where_the_rule_is_a_choice() -> None:
    assert explain_release_difference("0.5.7", "0.5.8") == [
        "0.5.7 and 0.5.8 charge the spec-decoding state differently (auto-fit-raw vs up-front)",
        "0.5.7 and 0.5.8 count slots per request differently (scheduler-v1 vs scheduler-spec)",
        "0.5.7 starts no hybrid model class under pipeline parallelism; 0.5.8 and later do",
    ]


def test_only_the_rules_that_matter_are_explained() -> None:
    """``only`` keeps the rules that matter for the deployment at hand, and nothing else: 0.5.16 to 0.5.23
    changed the charge, the padding slot, the floor and more; asked about the floor alone, one line."""
    assert explain_release_difference("0.5.16", "0.5.23", only={"floor_requests"}) == [
        "0.5.23 floors --max-running-requests // dp at 1 (resolver, no-radix pool, spec reservation); "
        "0.5.16 lets it reach 0 and refuses to start"
    ]
    every = explain_release_difference("0.5.16", "0.5.23")
    assert len(every) > 1 and every[0].startswith(
        "0.5.16 charges each stage for the whole model's state; 0.5.17"
    )


def test_same_rules_in_another_file_is_said_once_and_only_then() -> None:
    """0.5.14 sizes the pool in model_runner_kv_cache_mixin.py, 0.5.16 in kv_cache_configurator.py; with
    only the charge mattering (the same in both) that is all that differs, and it is said. When a rule
    that matters differs, that rule is the line, not the file move."""
    assert explain_release_difference("0.5.14", "0.5.16", only={"charging"}) == [
        "0.5.14 and 0.5.16 size the pool in different files with the same rules"
    ]
    assert explain_release_difference("0.5.14", "0.5.16", only={"charging", "budget_rule"}) == [
        "0.5.14 and 0.5.16 compute the memory handed to sizing differently (slack vs slack+pre-capture); "
        "the same device gives different budgets"
    ]
    # One group (0.5.17 and 0.5.16 differ, but not in a rule asked about, and in the same file): nothing.
    assert explain_release_difference("0.5.16", "0.5.17", only=set()) == []


@pytest.mark.parametrize(("a", "b"), [("0.5.18", "0.5.20"), ("0.5.15", "0.5.15.post1"), ("0.5.23", "0.5.23")])
def test_one_group_has_nothing_to_explain(a: str, b: str) -> None:
    assert explain_release_difference(a, b) == []
