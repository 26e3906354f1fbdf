"""What the rest of the checker asks of a family's release rules, through the registry: the config
checks of each release (:func:`check_config`), the weights each rank holds (:func:`model_weights`) and the
checkpoint names each release's ``load_weights`` takes (:func:`check_shapes`, :func:`check_loadable`).

Loaded on first use: a rank imports it only for a model config or a checkpoint.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from checker.core.errors import ConfigError, shorten
from checker.core.releases.config_rules import Release, where
from checker.core.sizing.models import read_json, resolve_config_path, shown_path
from checker.core.weights.checkpoint import Checkpoint
from checker.core.weights.checkpoint_names import Shape
from checker.core.weights.quant import read_scheme
from checker.core.weights.weights import (
    ConfigSection,
    FamilyWeights,
    ModelWeights,
    Param,
    Place,
    WeightsLayout,
    draft_params,
    model_weights_of,
    places,
    rank_params_of,
    text_section,
)
from checker.families import FAMILIES, family_for
from checker.families.drafts import read_draft_config, with_separate_draft

_EXPERT = re.compile(r"\.experts\.\d+\.")


def family_of(config: Mapping[str, Any], source: str) -> tuple[FamilyWeights, ConfigSection, ConfigSection]:
    cfg = ConfigSection(config, source)
    mt = cfg.string("model_type")
    family = family_for(mt or "")
    fam = family.rules().weights if family is not None else None
    if fam is None:
        known = ", ".join(f.name for f in FAMILIES if f.rules().weights is not None)
        raise ConfigError(
            f"{source}: model_type={shorten(mt)} is not a family whose weights the checker models ({known}); "
            "give the weights per GPU with --weights-gib"
        )
    return fam, cfg, text_section(fam, cfg)


def rank_params(
    config: Mapping[str, Any], layout: WeightsLayout, *, release: str, source: str = "config.json"
) -> list[tuple[Place, list[Param]]]:
    """Every rank's parameters, buffers and kept copies (name, per-rank shape, held dtype), in
    world-rank order and in the order the class builds them."""
    fam, _, _ = family_of(config, source)
    return rank_params_of(fam, config, layout, release=release, source=source)


def draft_rank_params(
    config: Mapping[str, Any], layout: WeightsLayout, *, release: str, source: str = "config.json"
) -> list[tuple[Place, list[Param]]]:
    """The NEXTN/MTP draft's parameters and buffers on every rank that loads it (the last stage's), in
    world-rank order (checker.core.weights.weights.draft_params)."""
    fam, cfg, text = family_of(config, source)
    if layout.draft is None:
        layout = dataclasses.replace(layout, draft="nextn")
    out = []
    for place in places(layout, fam.num_layers(text), release):
        params = draft_params(fam, cfg, text, layout, place, release)
        if params is not None:
            out.append((place, params))
    return out


def model_weights(
    config: Mapping[str, Any], layout: WeightsLayout, *, release: str, source: str = "config.json"
) -> ModelWeights:
    """Every rank's weights for ``layout`` as SGLang ``release``'s class holds them; a separate draft
    (``--speculative-draft-model-path``) read from its own config.json (checker.families.drafts)."""
    fam, _, _ = family_of(config, source)
    if layout.draft == "separate" and layout.draft_path is not None:
        draft_config = read_draft_config(layout.draft_path)
        target = model_weights_of(
            fam, config, dataclasses.replace(layout, draft=None), release=release, source=source
        )
        draft_source = shown_path(Path(layout.draft_path) / "config.json")
        return with_separate_draft(target, draft_config, layout, release=release, source=draft_source)
    return model_weights_of(fam, config, layout, release=release, source=source)


def expected_shapes(config: Mapping[str, Any], source: str = "config.json") -> dict[str, Shape]:
    """Tensor name -> shape of the family's checkpoint; a per-expert name has ``experts.E.`` in place
    of the expert index (every expert has the same shape)."""
    fam, cfg, text = family_of(config, source)
    return dict(fam.tensors(cfg, text))


def expected_tensors(config: Mapping[str, Any], source: str = "config.json") -> Iterator[tuple[str, Shape]]:
    """Every tensor of the family's checkpoint (per-expert names expanded), for building test shards."""
    fam, cfg, text = family_of(config, source)
    for name, shape in fam.tensors(cfg, text):
        if ".experts.E." in name:
            layer_cfg = text
            count = layer_cfg.integer("num_experts", 0, minimum=0) or layer_cfg.integer(
                "n_routed_experts", 0, minimum=0
            )
            for e in range(count):
                yield name.replace(".experts.E.", f".experts.{e}."), shape
        else:
            yield name, shape


def check_shapes(ckpt: Checkpoint, config: Mapping[str, Any], source: str = "config.json") -> int:
    """Refuse a checkpoint whose tensor contradicts config.json (one ConfigError line naming the tensor,
    both shapes and the shard); returns how many tensors were checked."""
    expected = expected_shapes(config, source)
    checked = 0
    for name, tensor in ckpt.tensors.items():
        key = _EXPERT.sub(".experts.E.", name) if ".experts." in name else name
        want = expected.get(key)
        if want is None:
            continue
        checked += 1
        if tensor.shape != want:
            raise ConfigError(
                f"tensor {shorten(name)} in shard {shorten(tensor.shard)} has shape {list(tensor.shape)} but "
                f"{source} gives {list(want)}; the checkpoint and config.json are of different models (point "
                "--model-path at the directory that holds both)"
            )
    return checked


def check_complete(ckpt: Checkpoint, config: Mapping[str, Any], source: str = "config.json") -> None:
    """Refuse a checkpoint that lacks a tensor the family's class needs (one ConfigError line naming the
    tensor and the shards): every release's ``load_weights`` fills only the parameters the checkpoint
    names, and a class whose ``load_weights`` skips a name it has no parameter for (Nemotron-H and
    Qwen3.5 log a warning, 0.5.23 ``models/nemotron_h.py:1354``, ``models/qwen3_5.py:2368``) starts on
    uninitialized memory, e.g. Llama's tensor names under a Nemotron-H config.json."""
    have = ckpt.tensors
    for name, _ in expected_tensors(config, source):
        if name not in have and f"{name}_packed" not in have:  # compressed-tensors pack-quantized
            shards = sorted({t.shard for t in have.values()})
            held = f"{len(shards)} shard{'s' if len(shards) != 1 else ''}" if len(shards) != 1 else shards[0]
            example = next(iter(have), None)
            raise ConfigError(
                f"tensor {shorten(name)} is in no shard of the checkpoint ({held}"
                f"{', which hold e.g. ' + shorten(example) if example else ''}), and the class config.json "
                "names loads it: the checkpoint and config.json are of different models, or the download is "
                "incomplete (point --model-path at the directory that holds both, whole)"
            )


def check_loadable(ckpt: Checkpoint, config: Mapping[str, Any], *, release: str, source: str) -> None:
    """Refuse (one ConfigError line naming the tensor and its shard) a checkpoint tensor the release's
    class has no parameter for, where its ``load_weights`` raises on one (FamilyWeights.unknown_tensor_rule:
    Falcon-H1's). The other families'
    classes skip a name they have no parameter for (``if name not in params_dict: continue``) on the
    paths a checkpoint of theirs takes, or refuse it by stage (:mod:`checker.core.releases.pp_support`)."""
    fam, _, _ = family_of(config, source)
    at = where(fam.unknown_tensor_rule, release) if fam.unknown_tensor_rule else None
    if at is None:
        return
    expected = expected_shapes(config, source)
    held: set[str] | None = None
    for name, tensor in ckpt.tensors.items():
        if name in expected or "rotary_emb.inv_freq" in name or name.endswith(".bias"):
            continue
        if fam.load_name is not None and _quantized(config, source):
            # a quantized checkpoint's scales: loaded where the class holds that parameter (its
            # quantized linears), skipped where its load_weights skips a miss, else its KeyError
            if held is None:
                one = WeightsLayout(pp_size=1, tp_size=1)
                ((_, params),) = rank_params(config, one, release=release, source=source)
                held = {p.name for p in params}
            mapped, skipped = fam.load_name(name)
            if mapped in held or skipped:
                continue
            raise ConfigError(
                f"tensor {shorten(name)} in shard {shorten(tensor.shard)} has no parameter in SGLang "
                f"{release}'s {fam.name} class under {source}'s quantization ({mapped} is not built: the "
                "class holds that module unquantized), and its load_weights indexes every such name "
                f"(KeyError, sglang/srt/{at}): SGLang cannot load this checkpoint"
            )
        raise ConfigError(
            f"tensor {shorten(name)} in shard {shorten(tensor.shard)} is no parameter of SGLang {release}'s "
            f"{fam.name} class under {source}, and its load_weights indexes every such name (KeyError, "
            f"sglang/srt/{at}): the checkpoint holds more than config.json describes (another model's "
            "layers, or quantization scales without a quantization config); point --model-path at the "
            "directory whose config.json matches its shards"
        )


def _quantized(config: Mapping[str, Any], source: str) -> bool:
    return read_scheme(config, source=source) is not None


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
    family = family_for(data.get("model_type"))
    if family is not None:
        family.rules().check_config(Release(release, source), data)
