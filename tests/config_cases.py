# ruff: noqa: E501  (a table: one line per case)
"""Configs SGLang's config classes refuse (or read otherwise), one change each to a real family's
config.json, for tests/test_config_rules.py (importable: pyproject sets pythonpath=["tests"]).

Each case names the releases that refuse it, as read from their code (configs/<family>.py and, for a
layer type the class lets through, models/<family>.py), and the rule of checker/core/releases/config_rules.py
that refuses it there. The same cases are loaded by the installed release's own config class in the
``sglang`` group: it must refuse exactly these.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

FIXTURES = Path(__file__).resolve().parent / "fixtures"
NEMOTRON_PATTERN = json.loads((FIXTURES / "nemotron_h_8b.json").read_text())["hybrid_override_pattern"]


@dataclass(frozen=True)
class Case:
    name: str
    fixture: str
    change: Callable[[dict[str, Any]], None]
    refused: tuple[tuple[str, str, str], ...]
    """(first, last, rule): the releases from first to last refuse it, by that rule."""
    key: str
    """The field the one line names, as written in the config."""
    sglang_accepts: bool = False
    """SGLang loads it; the checker refuses it all the same, as it would read it otherwise (two layer
    layouts that disagree): not part of the comparison with SGLang's own class."""

    def config(self) -> dict[str, Any]:
        data = json.loads((FIXTURES / f"{self.fixture}.json").read_text())
        data = copy.deepcopy(data)
        self.change(data)
        return data

    def rule_of(self, release: str, order: tuple[str, ...]) -> str | None:
        i = order.index(release)
        for first, last, rule in self.refused:
            if order.index(first) <= i <= order.index(last):
                return rule
        return None


def _pattern(text: str) -> Callable[[dict[str, Any]], None]:
    def change(d: dict[str, Any]) -> None:
        d["hybrid_override_pattern"] = text
        d["num_hidden_layers"] = len(text)

    return change


def _set(path: str, value: object) -> Callable[[dict[str, Any]], None]:
    def change(d: dict[str, Any]) -> None:
        *parents, last = path.split(".")
        for p in parents:
            d = d[p]
        d[last] = value

    return change


def _drop(path: str) -> Callable[[dict[str, Any]], None]:
    def change(d: dict[str, Any]) -> None:
        *parents, last = path.split(".")
        for p in parents:
            d = d[p]
        del d[last]

    return change


def _flatten_text_config(d: dict[str, Any]) -> None:
    text = d.pop("text_config")
    d.update({k: v for k, v in text.items() if k not in d})


P = NEMOTRON_PATTERN
NEMOTRON_ALL = ("0.5.3.post1", "0.5.23")
CHARS_10 = ("0.5.10", "0.5.23", "nemotron_h.pattern_chars")
RANGE = ("0.5.3.post1", "0.5.5.post3", "nemotron_h.pattern_range")
REGEX = ("0.5.6", "0.5.9", "nemotron_h.pattern_regex")
BUILD_OLD = ("0.5.3.post1", "0.5.9", "nemotron_h.layer_class")

CASES: tuple[Case, ...] = (
    # Nemotron-H's layer pattern (the four): a lower-case m, a space, a trailing newline, escapes.
    Case("nemotron-lower-m", "nemotron_h_8b", _pattern(P[:5] + "m" + P[6:]), (RANGE, REGEX, CHARS_10), "hybrid_override_pattern"),
    Case("nemotron-space", "nemotron_h_8b", _pattern(P[:5] + " " + P[6:]), (RANGE, REGEX, CHARS_10), "hybrid_override_pattern"),
    Case("nemotron-newline", "nemotron_h_8b", _pattern(P + "\n"), (BUILD_OLD, CHARS_10), "hybrid_override_pattern"),
    Case("nemotron-escapes", "nemotron_h_8b", _pattern(P[:3] + "\x1b[2J" + P[7:]), (RANGE, REGEX, CHARS_10), "hybrid_override_pattern"),
    # 'E' (MoE) passes 0.5.3.post1-0.5.5.post3's range [*-M], but their model builds no MoE layer.
    Case("nemotron-moe-early", "nemotron_h_8b", _pattern(P[:5] + "E" + P[6:]), (("0.5.3.post1", "0.5.5.post3", "nemotron_h.layer_class"),), "hybrid_override_pattern"),
    # Up to 0.5.9 the pattern's length must be num_hidden_layers; from 0.5.10 the pattern is the count.
    Case("nemotron-length", "nemotron_h_8b", _set("num_hidden_layers", 50), (("0.5.3.post1", "0.5.9", "nemotron_h.pattern_length"),), "hybrid_override_pattern"),
    Case("nemotron-block-type", "nemotron_h_8b", _set("layers_block_type", ["mamba", "ssm"] * 26), (("0.5.10", "0.5.23", "nemotron_h.layers_block_type"),), "layers_block_type"),
    Case("nemotron-mtp-pattern", "nemotron_h_8b", _set("mtp_hybrid_override_pattern", "*x"), (("0.5.10", "0.5.23", "nemotron_h.mtp_pattern"),), "mtp_hybrid_override_pattern"),
    Case(
        "nemotron-two-layouts",
        "nemotron_h_8b",
        _set("layers_block_type", ["mamba"] * 52),
        (("0.5.10", "0.5.23", "nemotron_h.layers_block_type"),),
        "hybrid_override_pattern",
        sglang_accepts=True,
    ),
    # Falcon-H1's Mamba2 heads.
    Case("falcon-heads", "falcon_h1_0_5b", _set("mamba_n_heads", 25), (("0.5.3", "0.5.23", "falcon_h1.heads_divide"),), "mamba_n_heads"),
    Case("falcon-head-dim", "falcon_h1_0_5b", _set("mamba_d_head", 32), (("0.5.3", "0.5.23", "falcon_h1.head_dim"),), "mamba_d_head"),
    # A null mamba_d_ssm (expand * hidden_size = 2048 = 16 heads of 128): 0.5.3 adds None to an int sizing the state.
    Case("falcon-d-ssm-null", "falcon_h1_0_5b", lambda d: d.update(mamba_d_ssm=None, mamba_n_heads=16, mamba_d_head=128), (("0.5.3", "0.5.3", "falcon_h1.d_ssm_null_state"),), "mamba_d_ssm"),
    # Granite-4.0-H's layer types and heads.
    Case("granite-length", "granite_4_0_h_small", _set("num_hidden_layers", 39), (("0.5.9", "0.5.23", "granitemoehybrid.layer_types_length"),), "layer_types"),
    Case("granite-value", "granite_4_0_h_small", lambda d: d["layer_types"].__setitem__(3, "linear"), (("0.5.9", "0.5.23", "granitemoehybrid.layer_types_values"),), "layer_types"),
    Case(
        "granite-new-names",
        "granite_4_0_h_small",
        lambda d: d.__setitem__(
            "layer_types", ["linear_attention" if t == "mamba" else "full_attention" for t in d["layer_types"]]
        ),
        (("0.5.9", "0.5.18", "granitemoehybrid.layer_types_values"),),
        "layer_types",
    ),
    Case("granite-head-dim", "granite_4_0_h_small", _set("mamba_d_head", 32), (("0.5.9", "0.5.23", "granitemoehybrid.head_dim"),), "mamba_d_head"),
    # Kimi-Linear's asserts.
    Case("kimi-router", "kimi_linear_48b_a3b", _set("moe_router_activation_func", "relu"), (("0.5.4.post2", "0.5.23", "kimi_linear.router_activation"),), "moe_router_activation_func"),
    Case("kimi-full-attn", "kimi_linear_48b_a3b", _drop("linear_attn_config.full_attn_layers"), (("0.5.4.post2", "0.5.23", "kimi_linear.full_attn_layers"),), "linear_attn_config.full_attn_layers"),
    # Qwen3-Next and Qwen3.5: the interval every layer's type is read from.
    Case("qwen3-next-interval", "qwen3_next_80b_a3b", _drop("full_attention_interval"), (("0.5.2", "0.5.23", "qwen3_next.full_attention_interval"),), "full_attention_interval"),
    Case("qwen3-next-interval-0", "qwen3_next_80b_a3b", _set("full_attention_interval", 0), (("0.5.2", "0.5.23", "qwen3_next.full_attention_interval"),), "full_attention_interval"),
    Case("qwen3.5-no-text-config", "qwen3_5_397b_a17b", _flatten_text_config, (("0.5.9", "0.5.23", "qwen3_5.text_config"),), "text_config"),
    Case("qwen3.5-interval", "qwen3_5_397b_a17b", _drop("text_config.full_attention_interval"), (("0.5.9", "0.5.23", "qwen3_next.full_attention_interval"),), "text_config.full_attention_interval"),
)  # fmt: skip
