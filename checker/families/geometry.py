"""What the rest of the checker asks for a model's geometry: a built-in preset, an HF ``config.json`` of
a family in the registry (:mod:`checker.families`), or a JSON model spec, read at a TP size."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

from checker.core.errors import ConfigError, LayoutError, shorten
from checker.core.sizing.geometry import ModelGeometry
from checker.core.sizing.models import (
    FIX,
    Keys,
    attention_geometry,
    context_length,
    digest,
    geometry_from_model_spec,
    looks_hybrid,
    read_json,
    resolve_config_path,
    shown_path,
)
from checker.families import BY_MODEL_TYPE, DEFAULT_MODEL, FAMILY_TABLE, PRESETS, family_for

# Model types SGLang 0.5.23 gives a state pool (srt/configs/hybrid_arch.py mambaish_config) that the checker
# does not read: a config of one of these is a hybrid model to describe with a JSON model spec.
STATE_POOL_FAMILIES = frozenset(
    {
        "bailing_hybrid",
        "falcon_mamba",
        "glm5_next",
        "inkling_mm_model",
        "inkling_model",
        "intern_s2_preview",
        "jet_nemotron",
        "jet_vlm",
        "lfm2",
        "lfm2_moe",
        "lfm2_vl",
        "mamba",
        "mamba2",
        "minicpm_sala",
        "NemotronH_Nano_VL_V2",
        "zaya",
    }
)


def geometry_from_hf_config(cfg: Mapping[str, Any], *, tp_size: int, source: str) -> ModelGeometry:
    model_type = cfg.get("model_type")
    if not isinstance(model_type, str):
        raise ConfigError(
            f"{source}: model_type={shorten(model_type)} must be a string naming the model family "
            f"({', '.join(sorted(BY_MODEL_TYPE))}); {FIX}"
        )
    keys = Keys(cfg, source)
    family = family_for(model_type)
    # A family whose config class nests the language model's keys in text_config (Family.text_config).
    nested = family.text_config if family is not None else None
    if nested == "required" or (nested == "optional" and cfg.get("text_config") is not None):
        text = keys.section("text_config")
        keys = Keys({**text.data, "model_type": model_type}, source, text.prefix)
    if family is None:
        supported = ", ".join(sorted(BY_MODEL_TYPE))
        if model_type in STATE_POOL_FAMILIES or looks_hybrid(keys.data):
            raise ConfigError(
                f"{source}: model_type={shorten(model_type)} is not a hybrid family the checker reads "
                f"({supported}); describe it with a JSON model spec instead (docs/preflight.md)"
            )
        raise ConfigError(
            f"{source}: model_type={shorten(model_type)} has no linear-attention (mamba) layers, so SGLang "
            "gives it no state pool and there is nothing for this check to compare (SGLang sizes only its "
            f"KV cache); the check applies to hybrid models ({supported})"
        )
    fields = family.geometry(keys, tp_size)
    spec = family.attention
    context = context_length(keys, default=spec.context_default)
    attention = attention_geometry(cfg, keys, spec, fields)
    return ModelGeometry(
        name=f"{source} ({model_type})",
        context_len=context,
        family=model_type,
        attention=attention,
        **fields,
    )


def model_architectures(*, model: str | None, model_config: str | None) -> tuple[str, ...]:
    """The architectures SGLang would look up for the model as the user named it: a preset's (the class
    its family's geometry names), an HF config's ``architectures`` list; none for a JSON model spec (it
    names none)."""
    if model_config is not None:
        # start-up: the model registry's tables load only where a class is looked up (bench/startup_bench.py)
        from checker.core.releases.model_support import config_architectures

        return config_architectures(model_config)
    preset = PRESETS.get(model or DEFAULT_MODEL)  # no model named: the default preset, as load_geometry
    attention = None if preset is None else preset(1).attention
    return (attention.architecture,) if attention is not None and attention.architecture else ()


def load_geometry(
    *, model: str | None = None, model_config: str | Path | None = None, tp_size: int = 1
) -> ModelGeometry:
    """Resolve ``--model NAME`` or ``--model-config PATH`` (HF config, model spec, or a model directory
    holding config.json) at ``tp_size``."""
    if isinstance(tp_size, bool) or not isinstance(tp_size, int) or tp_size < 1:
        raise LayoutError(f"--tp-size {shorten(tp_size)} must be a positive integer")
    if model_config is not None:
        path = resolve_config_path(model_config)
        data = read_json(path)
        source = shown_path(path)  # the geometry's name: in every report and log line
        if "linear_layer_ids" in data:
            geometry = geometry_from_model_spec(data, source=source)
        elif "model_type" not in data:
            raise ConfigError(
                f"{source}: neither an HF config (no 'model_type') nor a model spec "
                "(no 'linear_layer_ids'); see docs/preflight.md 'JSON model spec'"
            )
        else:
            geometry = geometry_from_hf_config(data, tp_size=tp_size, source=source)
        # The file's content as JSON reads it: two copies that differ only in whitespace or key order
        # are one model to SGLang too.
        return replace(
            geometry, source_digest=digest(json.dumps(data, sort_keys=True)), families=FAMILY_TABLE
        )
    name = model or DEFAULT_MODEL
    if name not in PRESETS:
        raise ConfigError(
            f"--model {shorten(name)} is not a built-in preset ({', '.join(PRESETS)}); "
            "pass --model-config PATH for anything else"
        )
    own = json.dumps(PRESETS[name](1).describe(), sort_keys=True)  # the preset's definition, before TP
    return replace(PRESETS[name](tp_size), source_digest=digest(own), families=FAMILY_TABLE)
