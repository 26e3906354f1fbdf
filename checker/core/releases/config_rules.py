"""What each SGLang release refuses in a ``config.json`` of the families the checker reads (torch-free).

SGLang loads a model's config through its own config class (``configs/<family>.py``, registered over
transformers' by ``hf_transformers_utils.get_config``), then builds the model class from it. Each class
checks some fields in its constructor and reads others later; a config it refuses stops the server at
start-up, so a ``consistent`` verdict for it would promise a deployment that never runs. The checks
differ between releases (Nemotron-H's layer pattern is a regular expression up to 0.5.9 and a set of
characters from 0.5.10, where ``layers_block_type`` also became the field read first), so each rule
here is applied on the releases whose code has it, with the ``file:line`` that release has it at
(:mod:`checker.core.releases.config_lines`, generated from every release's code by
``scripts/build_config_rules.py``). A refusal is one line naming the release, the field as written, why
the release refuses it and where.

Applied where the release derived as is modelled (``release.modelled == release.derived_as``); the
geometry reader (:mod:`checker.core.sizing.models`) refuses what no release loads, whatever the release.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from checker.core.errors import ConfigError, json_kind, shorten
from checker.core.releases.config_lines import WHERE
from checker.core.releases.releases import MODELLED_RELEASES
from checker.core.sizing.models import read_json, resolve_config_path, shown_path

SRT = "sglang/srt/"
FIX = "fix it in the model config"

NEMOTRON_LAYERS = {"M": "mamba", "E": "moe", "*": "attention", "-": "mlp"}
"""``hybrid_override_pattern``'s characters and the ``layers_block_type`` each stands for (0.5.10+
``configs/nemotron_h.py`` ``_pattern_to_list``)."""
NEMOTRON_REGEX = {
    "nemotron_h.pattern_range": r"^[*-M]+$",
    "nemotron_h.pattern_regex": r"^[*\-ME]+$",
}
"""The regular expression each release's NemotronHConfig asserts, as written (``[*-M]`` is the range
from ``*`` to ``M``, digits and capitals included); ``re.match`` with ``$``, which also matches before
a final newline, as SGLang calls it."""
NEMOTRON_DEFAULT_LAYERS = 52
"""``num_hidden_layers`` where a config leaves it out, up to 0.5.9 (NemotronHConfig's default)."""
GRANITE_LAYERS = ("mamba", "attention")
GRANITE_ALIASES = {"linear_attention": "mamba", "full_attention": "attention"}
"""transformers 5.15's names for granite's layer types, which 0.5.19+ maps back
(``_to_sglang_layer_types``)."""


def where(rule: str, release: str) -> str | None:
    """``file:line`` of ``rule`` in ``release``'s code, None where the release has no such check."""
    if release not in MODELLED_RELEASES:
        return None
    i = MODELLED_RELEASES.index(release)
    for first, last, at in WHERE.get(rule, ()):
        if MODELLED_RELEASES.index(first) <= i <= MODELLED_RELEASES.index(last):
            return at
    return None


class _Release:
    """One release's rules applied to one config: ``has(rule)``, and ``refuse`` naming where."""

    def __init__(self, release: str, source: str, prefix: str = "") -> None:
        self.release, self.source, self.prefix = release, source, prefix

    def has(self, rule: str) -> bool:
        return where(rule, self.release) is not None

    def refuse(
        self,
        rule: str,
        key: str,
        value: object,
        why: str,
        error: str = "ValueError at load",
        *,
        raised: str | None = None,
    ) -> ConfigError:
        """``key``'s value, why the release refuses it, and how and where it fails: at ``rule``'s line,
        or at ``raised``'s where the check of ``rule`` leads to another that raises (its traceback's
        line), with ``rule``'s line after it."""
        at = f"{SRT}{where(rule, self.release)}"
        if raised is not None:
            at = f"{SRT}{where(raised, self.release)}, from {at}"
        return ConfigError(
            f"SGLang {self.release} cannot load {self.source}: {self.prefix}{key}={shorten(value)} {why} "
            f"({error}, {at}); {FIX}"
        )


def check_model_config(release: str, model_config: str) -> None:
    """:func:`check_config` of ``--model-config`` (a config.json or the model directory holding it)."""
    path = resolve_config_path(model_config)
    check_config(release, read_json(path), source=shown_path(path))


def check_config(release: str, data: Mapping[str, Any], *, source: str) -> None:
    """ConfigError (one line) when SGLang ``release`` refuses the HF config ``data`` at load (its config
    class) or while building the model from its layer types; nothing for a family or release the rules
    do not cover, or a JSON model spec."""
    if "linear_layer_ids" in data:
        return
    model_type = data.get("model_type")
    check = _FAMILIES.get(model_type) if isinstance(model_type, str) else None
    if check is not None:
        check(_Release(release, source), data)


# -- Nemotron-H ----------------------------------------------------------------------------------------------


def _nemotron_h(r: _Release, data: Mapping[str, Any]) -> None:
    pattern = data.get("hybrid_override_pattern")
    blocks = data.get("layers_block_type")
    if r.has("nemotron_h.pattern_chars"):  # 0.5.10+: layers_block_type first, the pattern its fallback
        if blocks is not None:
            _block_types(r, "layers_block_type", blocks, "nemotron_h.layers_block_type")
            if isinstance(pattern, str) and pattern != "".join(_PATTERN_OF.get(b, "?") for b in blocks):
                raise r.refuse(
                    "nemotron_h.layers_block_type",
                    "hybrid_override_pattern",
                    pattern,
                    "says another layer layout than layers_block_type, which the release reads instead (the "
                    "pattern is only its fallback); keep one of them, or make them agree",
                    "the layers of layers_block_type built",
                )
        elif isinstance(pattern, str):
            _pattern_chars(r, "hybrid_override_pattern", pattern, "nemotron_h.pattern_chars")
        _nemotron_mtp(r, data)
        return
    if not isinstance(pattern, str):
        if blocks is not None and pattern is None:
            raise r.refuse(
                "nemotron_h.pattern_length",
                "layers_block_type",
                blocks,
                "is not read by this release (layers_block_type arrived in 0.5.10): it builds its default "
                f"{NEMOTRON_DEFAULT_LAYERS}-layer hybrid_override_pattern instead; give "
                "hybrid_override_pattern",
                "the default layers built",
            )
        return  # the geometry reader refuses a pattern that is not a string
    layers = data.get("num_hidden_layers", NEMOTRON_DEFAULT_LAYERS)
    if r.has("nemotron_h.pattern_length") and len(pattern) != layers:
        given = "" if "num_hidden_layers" in data else " (its default: the config leaves it out)"
        raise r.refuse(
            "nemotron_h.pattern_length",
            "hybrid_override_pattern",
            pattern,
            f"has {len(pattern):,} characters but num_hidden_layers={shorten(layers)}{given}; its config "
            "class asserts they are equal",
            "AssertionError at load",
        )
    for rule, regex in NEMOTRON_REGEX.items():
        if r.has(rule) and not re.match(regex, pattern):
            at = next((i for i, c in enumerate(pattern) if not re.fullmatch(regex, c)), None)
            what = "is empty" if at is None else f"has {pattern[at]!r} at layer {at}"
            raise r.refuse(
                rule,
                "hybrid_override_pattern",
                pattern,
                f"{what}; its config class asserts re.match(r{regex!r}, ...)",
                "AssertionError at load",
            )
    builds = {"M", "*", "-"} | ({"E"} if r.has("nemotron_h.moe_layer") else set())
    bad = next((i for i, c in enumerate(pattern) if c not in builds), None)
    if bad is not None and r.has("nemotron_h.layer_class"):
        raise r.refuse(
            "nemotron_h.layer_class",
            "hybrid_override_pattern",
            pattern,
            f"has {pattern[bad]!r} at layer {bad}: the config class lets it through, and the model builds "
            f"no layer for it ({''.join(sorted(builds))!r} only): the stage holding layer {bad} fails",
            "KeyError building the model",
        )


_PATTERN_OF = {v: k for k, v in NEMOTRON_LAYERS.items()}


def _pattern_chars(r: _Release, key: str, pattern: str, rule: str) -> None:
    bad = next((i for i, c in enumerate(pattern) if c not in NEMOTRON_LAYERS), None)
    if bad is not None:
        chars = "nemotron_h.pattern_chars"  # _pattern_to_list: where every pattern's characters are read
        raise r.refuse(
            rule,
            key,
            pattern,
            f"has {pattern[bad]!r} at layer {bad}; its config class takes only 'M', '*', '-' or 'E'",
            raised=None if rule == chars else chars,
        )


def _block_types(r: _Release, key: str, blocks: object, rule: str) -> None:
    if not isinstance(blocks, list):
        raise r.refuse(
            "nemotron_h.block_type_list",
            key,
            blocks,
            f"must be a list of strings, not {json_kind(blocks)}",
        )
    bad = next((i for i, b in enumerate(blocks) if not isinstance(b, str) or b not in _PATTERN_OF), None)
    if bad is not None:
        raise r.refuse(
            rule,
            key,
            blocks,
            f"has {shorten(blocks[bad])} at layer {bad}; its config class takes only 'mamba', 'attention', "
            "'mlp' or 'moe'",
        )


def _nemotron_mtp(r: _Release, data: Mapping[str, Any]) -> None:
    """The MTP layers' layout, checked as 0.5.10+ checks it (a pattern is converted, and the list checked,
    only where the class would)."""
    default = ["attention", "moe"]
    mtp = data.get("mtp_layers_block_type", default)
    if "mtp_hybrid_override_pattern" in data and (mtp is None or mtp == default):
        pattern = data["mtp_hybrid_override_pattern"]
        if isinstance(pattern, str):
            _pattern_chars(r, "mtp_hybrid_override_pattern", pattern, "nemotron_h.mtp_pattern")
            mtp = [NEMOTRON_LAYERS[c] for c in pattern]
    layers = data.get("num_nextn_predict_layers", 0)
    if isinstance(layers, int) and not isinstance(layers, bool) and layers > 0:
        if mtp is None:
            raise r.refuse(
                "nemotron_h.mtp_block_types",
                "mtp_layers_block_type",
                mtp,
                f"is required with num_nextn_predict_layers={layers}",
            )
        _block_types(r, "mtp_layers_block_type", mtp, "nemotron_h.mtp_block_types")


# -- Qwen3-Next and Qwen3.5 ----------------------------------------------------------------------------------


def _qwen3_next(r: _Release, data: Mapping[str, Any]) -> None:
    model_type = data.get("model_type")
    keys: Mapping[str, Any] = data
    if isinstance(model_type, str) and model_type.startswith("qwen3_5"):
        text = data.get("text_config")
        if text is None:
            if r.has("qwen3_5.text_config"):
                raise r.refuse(
                    "qwen3_5.text_config",
                    "text_config",
                    text,
                    "is missing: Qwen3_5Config then builds its default text config, which has no "
                    "full_attention_interval, and reads none of the top-level keys; nest the language "
                    "model's keys in text_config",
                    "AttributeError building the model",
                    raised="qwen3_next.full_attention_interval",
                )
            return
        if not isinstance(text, Mapping):
            return  # the geometry reader refuses a text_config that is no object
        keys, r = text, _Release(r.release, r.source, "text_config.")
    rule = "qwen3_next.full_attention_interval"
    if not r.has(rule):
        return
    interval = keys.get("full_attention_interval")
    if interval is None:
        raise r.refuse(
            rule,
            "full_attention_interval",
            interval,
            "is missing, and the config class reads it for every layer's type: it has no default",
            "AttributeError building the model",
        )
    if isinstance(interval, (int, float)) and not isinstance(interval, bool) and interval == 0:
        raise r.refuse(
            rule,
            "full_attention_interval",
            interval,
            "divides the layer index",
            "ZeroDivisionError building the model",
        )
    if not isinstance(interval, (int, float)):
        raise r.refuse(
            rule,
            "full_attention_interval",
            interval,
            "divides the layer index",
            "TypeError building the model",
        )


# -- Kimi-Linear ---------------------------------------------------------------------------------------------


def _kimi_linear(r: _Release, data: Mapping[str, Any]) -> None:
    rule = "kimi_linear.router_activation"
    act = data.get("moe_router_activation_func", "sigmoid")
    if r.has(rule) and act not in ("softmax", "sigmoid"):
        raise r.refuse(
            rule,
            "moe_router_activation_func",
            act,
            "is neither 'softmax' nor 'sigmoid', which the config class asserts",
            "AssertionError at load",
        )
    lac = data.get("linear_attn_config")
    if not isinstance(lac, Mapping):
        return  # None: not a linear-attention model; another type: the geometry reader refuses it
    r = _Release(r.release, r.source, f"{r.prefix}linear_attn_config.")
    for key, rule in (
        ("kda_layers", "kimi_linear.kda_layers"),
        ("full_attn_layers", "kimi_linear.full_attn_layers"),
    ):
        if r.has(rule) and lac.get(key) is None:
            kind = "linear" if key == "kda_layers" else "full"
            raise r.refuse(
                rule,
                key,
                lac.get(key),
                f"is {'missing' if key not in lac else 'null'}, and the config class asserts it is given; "
                f"list the {kind} attention layers (1-based)",
                f"{'KeyError' if key not in lac else 'AssertionError'} at load",
            )


# -- Kimi-K3 ----------------------------------------------------------------------------------------------


def _kimi_k3(r: _Release, data: Mapping[str, Any]) -> None:
    """A release without KimiK3Config (configs/kimi_k3.py) has no config class registered for the
    model_type (transformers has none either): it cannot load the file at all. From there the text_config
    is a KimiLinearConfig (``KimiLinearConfig(**text_config)``), checked as Kimi-Linear's."""
    if not r.has("kimi_k3.config_class"):
        first = next(v for v in MODELLED_RELEASES if where("kimi_k3.config_class", v) is not None)
        raise ConfigError(
            f"SGLang {r.release} cannot load {r.source}: model_type='kimi_k3' has no config class in this "
            f"release (KimiK3Config, {SRT}configs/kimi_k3.py, arrived in SGLang {first}; transformers' "
            f"AutoConfig refuses the type: ValueError at load); derive for {first} or later"
        )
    text = data.get("text_config")
    if isinstance(text, Mapping):
        _kimi_linear(_Release(r.release, r.source, "text_config."), text)


# -- Falcon-H1 and Granite-4.0-H: the Mamba2 block's sizes --------------------------------------------------


def _number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _mamba_heads(
    r: _Release,
    *,
    family: str,
    intermediate: object,
    intermediate_name: str,
    heads: object,
    head_dim: object,
    auto: bool = False,
) -> None:
    """``intermediate`` must split into ``heads`` heads of ``head_dim`` (``auto``: the class takes "auto"
    as whatever divides)."""
    if not (_number(intermediate) and isinstance(heads, int) and not isinstance(heads, bool) and heads > 0):
        return  # a size that is not one: the geometry reader names it
    if r.has(f"{family}.heads_divide") and intermediate % heads:  # type: ignore[operator]
        raise r.refuse(
            f"{family}.heads_divide",
            "mamba_n_heads",
            heads,
            f"does not divide {intermediate_name} = {shorten(intermediate)}",
        )
    if (auto and head_dim == "auto") or not r.has(f"{family}.head_dim"):
        return
    if not (_number(head_dim) or isinstance(head_dim, str)):
        return  # a list or an object: the geometry reader names it
    if head_dim * heads != intermediate:  # type: ignore[operator]  # a string repeats: SGLang's ValueError too
        raise r.refuse(
            f"{family}.head_dim",
            "mamba_d_head",
            head_dim,
            f"* mamba_n_heads={heads} is not {intermediate_name} = {shorten(intermediate)}",
        )


def _falcon_h1(r: _Release, data: Mapping[str, Any]) -> None:
    # mamba_d_ssm left out is the class's default, 1024; null means mamba_expand * hidden_size.
    d_ssm = data.get("mamba_d_ssm", 1024) if r.has("falcon_h1.d_ssm_default") else data.get("mamba_d_ssm")
    if d_ssm is None and r.has("falcon_h1.d_ssm_null_state"):
        # 0.5.3 sizes the state from mamba_d_ssm itself (hybrid_gdn_params), not from the intermediate
        # size its constructor worked out: a null one is None + int when the pool is sized.
        raise r.refuse(
            "falcon_h1.d_ssm_null_state",
            "mamba_d_ssm",
            None,
            "is added to 2 * n_groups * mamba_d_state when the state pool is sized (this release does not "
            "fall back to mamba_expand * hidden_size there); give it as an integer",
            "TypeError at start-up",
        )
    if d_ssm is None:
        expand, hidden = data.get("mamba_expand", 2), data.get("hidden_size", 4096)
        if not (_number(expand) and _number(hidden)):
            return
        intermediate, name = expand * hidden, "mamba_expand * hidden_size"
    else:
        intermediate, name = d_ssm, "mamba_d_ssm" if "mamba_d_ssm" in data else "mamba_d_ssm (its default)"
    _mamba_heads(
        r,
        family="falcon_h1",
        intermediate=intermediate,
        intermediate_name=name,
        heads=data.get("mamba_n_heads", 128),
        head_dim=data.get("mamba_d_head", "auto"),
        auto=True,
    )


def _granite(r: _Release, data: Mapping[str, Any]) -> None:
    layers = data.get("num_hidden_layers", 40)
    types = data.get("layer_types")
    if isinstance(types, list):
        if r.has("granitemoehybrid.layer_types_aliases"):
            types = [GRANITE_ALIASES.get(t, t) if isinstance(t, str) else t for t in types]
        if r.has("granitemoehybrid.layer_types_length") and len(types) != layers:
            raise r.refuse(
                "granitemoehybrid.layer_types_length",
                "layer_types",
                data["layer_types"],
                f"has {len(types):,} entries but num_hidden_layers={shorten(layers)}",
            )
        bad = next((i for i, t in enumerate(types) if t not in GRANITE_LAYERS), None)
        if bad is not None and r.has("granitemoehybrid.layer_types_values"):
            taken = "'mamba' or 'attention'"
            if r.has("granitemoehybrid.layer_types_aliases"):
                taken += " (or 'linear_attention', 'full_attention')"
            raise r.refuse(
                "granitemoehybrid.layer_types_values",
                "layer_types",
                data["layer_types"],
                f"has {shorten(data['layer_types'][bad])} at layer {bad}; its config class takes only "
                f"{taken}",
            )
    expand, hidden = data.get("mamba_expand", 2), data.get("hidden_size", 2048)
    if not (_number(expand) and _number(hidden)):
        return
    _mamba_heads(
        r,
        family="granitemoehybrid",
        intermediate=expand * hidden,
        intermediate_name="mamba_expand * hidden_size",
        heads=data.get("mamba_n_heads", 64),
        head_dim=data.get("mamba_d_head", 64),
    )


_FAMILIES = {
    "nemotron_h": _nemotron_h,
    "qwen3_next": _qwen3_next,
    "qwen3_5": _qwen3_next,
    "qwen3_5_moe": _qwen3_next,
    "kimi_linear": _kimi_linear,
    "kimi_k3": _kimi_k3,
    "falcon_h1": _falcon_h1,
    "granitemoehybrid": _granite,
}
