"""Qwen3.5 (``model_type`` qwen3_5, qwen3_5_moe): Qwen3-Next's layers under ``text_config``, with a vision
tower (SGLang ``configs/qwen3_5.py``): the geometry and config rules are Qwen3-Next's, the weights and
checkpoint names its own."""

from __future__ import annotations

from checker.core.releases.family_facts import GDN, FamilyFacts
from checker.families import qwen3_next
from checker.families.family import FamilyRules, HybridFamily


def _rules() -> FamilyRules:
    # start-up: the release rules (config checks, weights, checkpoint names) load only for a model config
    # or a checkpoint; a rank that sizes a preset or a model spec never imports them
    from checker.families.qwen3_5.rules import RULES

    return RULES


FAMILY = HybridFamily(
    name="Qwen3.5",
    facts=FamilyFacts(
        model_types=("qwen3_5", "qwen3_5_moe"),
        kind=GDN,
        # configs/hybrid_arch.py ``hybrid_gdn_config``: Qwen3_5Config, Qwen3_5MoeConfig.
    ),
    read=qwen3_next.geometry,
    attention=qwen3_next.QWEN_ATTENTION,
    load_rules=_rules,
    text_config="optional",
    example_configs=("tests/fixtures/qwen3_5_397b_a17b.json", "tests/fixtures/qwen3_5_gdn_small.json"),
)
