"""Model configs read into geometries: the boundaries of each limit, the error lines, the read path.

test_geometry_models.py checks each family's shapes and test_bad_configs.py that a bad value is one
ConfigError naming its key; this file pins what those leave open, found by a mutation run (issue 18 item 8):

- each documented limit at its edge: the largest value the limit allows loads, one more is refused (the
  limits are in checker/core/sizing/geometry.py: MAX_DIM per dim, MAX_STATE_ELEMENTS per state, 2..1,024 for a
  conv kernel, MAX_CONTEXT_LEN, MAX_EXTRA_PER_SLOT_BYTES, 40 digits, 64 levels of JSON);
- the words of the error lines a user reads to fix a config: which keys a too-large product came from
  (written out from the spec's rule, /work/shared/spec/capacity.md section 11), what kind of value was
  found instead of the one expected, and the way out;
- the properties ranks rely on: the digest of a config ignores key order and whitespace, a preset's does
  not depend on the TP size.

Every call is in-process and takes microseconds to milliseconds: no subprocess, no torch.
"""

from __future__ import annotations

import json
import os
import stat
from functools import cache
from pathlib import Path
from typing import Any

import pytest

from checker.core.errors import ConfigError, FlagError, LayoutError
from checker.core.sizing.geometry import (
    MAX_CONTEXT_LEN,
    MAX_DIM,
    MAX_EXTRA_PER_SLOT_BYTES,
    MAX_LAYERS,
    MAX_STATE_ELEMENTS,
    ModelGeometry,
    canonical_dtype,
    check_shape,
    resolve_dtypes,
    sglang_dtype_name,
)
from checker.core.sizing.models import MAX_CONFIG_BYTES, MAX_CONV_KERNEL, geometry_from_model_spec
from checker.families.geometry import geometry_from_hf_config, load_geometry

FIXTURES = Path(__file__).resolve().parent / "fixtures"
SRC = "cfg.json"
FIX = "fix it in the model config"
SUPPORTED = (
    "(falcon_h1, granitemoehybrid, kimi_k3, kimi_linear, nemotron_h, qwen3_5, qwen3_5_moe, qwen3_next)"
)


@cache
def _text(name: str) -> str:
    return (FIXTURES / f"{name}.json").read_text()


def _cfg(name: str, **changes: Any) -> dict[str, Any]:
    """A fixture with top-level keys changed; a dotted key (``linear_attn_config.num_heads``) goes nested."""
    cfg = json.loads(_text(name))
    for dotted, value in changes.items():
        *parents, last = dotted.split("__")
        node = cfg
        for p in parents:
            node = node[p]
        node[last] = value
    return cfg


def _hf(cfg: dict[str, Any], tp: int = 1) -> ModelGeometry:
    return geometry_from_hf_config(cfg, tp_size=tp, source=SRC)


def _refused(cfg: dict[str, Any], tp: int = 1) -> str:
    with pytest.raises(ConfigError) as info:
        _hf(cfg, tp)
    return str(info.value)


# ---- the conv kernel: 2 .. MAX_CONV_KERNEL in every family, its window is kernel - 1 ----

KERNEL_KEY = {
    "qwen3_next_80b_a3b": "linear_conv_kernel_dim",
    "kimi_linear_48b_a3b": "linear_attn_config__short_conv_kernel_size",
    "nemotron_h_8b": "conv_kernel",
    "falcon_h1_0_5b": "mamba_d_conv",
    "granite_4_0_h_small": "mamba_d_conv",
}


@pytest.mark.parametrize("name", sorted(KERNEL_KEY))
def test_conv_kernel_limits_in_every_family(name: str) -> None:
    """A conv of kernel K keeps K - 1 past tokens (SGLang's conv state window), so K = 1 has no state and
    is refused, K = 2 keeps one token; 1,024 is the documented cap (checker/core/sizing/models.py), 1,025
    refused.
    KDA puts the window axis first, Mamba2 last."""
    key = KERNEL_KEY[name]
    window_axis = 0 if name.startswith("kimi") else 1
    for kernel in (2, MAX_CONV_KERNEL):
        g = _hf(_cfg(name, **{key: kernel}))
        assert g.conv_shapes[0][window_axis] == kernel - 1
    shown = key.replace("__", ".")
    for kernel in (1, MAX_CONV_KERNEL + 1):
        msg = _refused(_cfg(name, **{key: kernel}))
        assert msg == f"{SRC}: {shown}={kernel} must be an integer in [2, 1,024]; {FIX}"


# ---- a size made of several keys: refused past its limit, naming the keys it came from ----

# (fixture, changes, the line). The sums and products follow the spec's rules (section 11): Mamba2's
# conv_dim = intermediate + 2 * n_groups * state, temporal = heads * head_dim * state; KDA's conv channels
# 3 * H * d, temporal H * d * d. The numbers are those of the changed keys.
BOUND_CASES = [
    # Qwen: intermediate = 1 value head of 1,048,321; 2 * 1 key head * 128 = 256; sum 1,048,577.
    (
        "qwen3_next_80b_a3b",
        dict(linear_num_value_heads=1, linear_num_key_heads=1, linear_value_head_dim=1_048_321),
        "conv_dim = linear_num_value_heads * linear_value_head_dim + 2 * linear_num_key_heads * "
        "linear_key_head_dim = 1,048,577 is above 1,048,576",
    ),
    # 16,384 value elements x 516,096 key dim = 8,455,716,864 (conv_dim 16,384 + 2 * 516,096 = 1,048,576).
    (
        "qwen3_next_80b_a3b",
        dict(
            linear_num_value_heads=1,
            linear_num_key_heads=1,
            linear_value_head_dim=16_384,
            linear_key_head_dim=516_096,
        ),
        "temporal state elements = linear_num_value_heads * linear_value_head_dim * linear_key_head_dim = "
        "8,455,716,864 is above 4,294,967,296",
    ),
    # Qwen3.5's keys sit in text_config and are named with it.
    (
        "qwen3_5_397b_a17b",
        dict(text_config__linear_num_value_heads=16, text_config__linear_value_head_dim=65_536),
        "conv_dim = text_config.linear_num_value_heads * text_config.linear_value_head_dim + "
        "2 * text_config.linear_num_key_heads * text_config.linear_key_head_dim = 1,052,672 is above",
    ),
    # Nemotron-H: 1 head of 1,048,576 + 2 * 8 groups * 128 = 1,050,624.
    (
        "nemotron_h_8b",
        dict(mamba_num_heads=1, mamba_head_dim=MAX_DIM),
        "conv_dim = mamba_num_heads * mamba_head_dim + 2 * n_groups * ssm_state_size = 1,050,624 is above",
    ),
    # 128 heads x 128 x 262,145 = 4,294,983,680: one state column past 2**32.
    (
        "nemotron_h_8b",
        dict(mamba_num_heads=128, mamba_head_dim=128, n_groups=1, ssm_state_size=262_145),
        "temporal state elements = mamba_num_heads * mamba_head_dim * ssm_state_size = 4,294,983,680 is",
    ),
    # Falcon-H1 with mamba_d_ssm: 1,048,576 + 2 * 1 * 128 = 1,048,832.
    (
        "falcon_h1_0_5b",
        dict(mamba_d_ssm=MAX_DIM),
        "conv_dim = mamba_d_ssm + 2 * mamba_n_groups * mamba_d_state = 1,048,832 is above",
    ),
    # Falcon-H1 without it: int(2 * 524,288) + 256 = 1,048,832.
    (
        "falcon_h1_0_5b",
        dict(mamba_d_ssm=None, hidden_size=524_288),
        "conv_dim = int(mamba_expand * hidden_size) + 2 * mamba_n_groups * mamba_d_state = 1,048,832 is",
    ),
    (
        "falcon_h1_0_5b",
        dict(mamba_n_heads=1024, mamba_d_head=1024, mamba_d_state=4097, mamba_d_ssm=1024),
        "temporal state elements = mamba_n_heads * mamba_d_head * mamba_d_state = 4,296,015,872 is above",
    ),
    (
        "granite_4_0_h_small",
        dict(hidden_size=524_288),
        "conv_dim = int(mamba_expand * hidden_size) + 2 * mamba_n_groups * mamba_d_state = 1,048,832 is",
    ),
    # An expand and hidden size whose product alone is past the cap: named before the sum.
    (
        "granite_4_0_h_small",
        dict(hidden_size=MAX_DIM),
        "mamba_expand * hidden_size = 2 * 1048576 is above 1,048,576",
    ),
    # Kimi-Linear: 3 * 32 heads * 16,384 = 1,572,864 conv channels.
    (
        "kimi_linear_48b_a3b",
        dict(linear_attn_config__head_dim=16_384),
        "conv channels = 3 * linear_attn_config.num_heads * linear_attn_config.head_dim = 1,572,864 is above",
    ),
    # 16 heads x 16,385 x 16,385 = 4,295,491,600.
    (
        "kimi_linear_48b_a3b",
        dict(linear_attn_config__num_heads=16, linear_attn_config__head_dim=16_385),
        "temporal state elements = linear_attn_config.num_heads * linear_attn_config.head_dim * "
        "linear_attn_config.head_dim = 4,295,491,600 is above 4,294,967,296",
    ),
]


@pytest.mark.parametrize(("name", "changes", "line"), BOUND_CASES)
def test_a_size_past_its_limit_names_the_keys_it_is_made_of(
    name: str, changes: dict[str, Any], line: str
) -> None:
    """Each key alone is within its cap, so the line must say which keys the too-large size came from,
    as the user wrote them, and the size itself."""
    msg = _refused(_cfg(name, **changes))
    assert msg.startswith(f"{SRC}: ") and line in msg, msg
    assert msg.endswith("far past any real model; check those keys in the model config"), msg


def test_sizes_exactly_at_their_limit_load() -> None:
    """The caps are inclusive (geometry.py: "at most"): a conv width of exactly MAX_DIM and a temporal
    state of exactly MAX_STATE_ELEMENTS load, with the shapes the spec's rules give."""
    # Qwen: 1 value head x 1,048,320 + 2 * 1 key head * 128 = 1,048,576.
    g = _hf(
        _cfg(
            "qwen3_next_80b_a3b",
            linear_num_value_heads=1,
            linear_num_key_heads=1,
            linear_value_head_dim=MAX_DIM - 256,
        )
    )
    assert g.conv_shapes == ((MAX_DIM, 3),)
    # Nemotron-H: 128 x 128 x 262,144 = 2**32; conv_dim 16,384 + 2 * 262,144 = 540,672.
    g = _hf(_cfg("nemotron_h_8b", mamba_num_heads=128, mamba_head_dim=128, n_groups=1, ssm_state_size=2**18))
    assert g.temporal_shape == (128, 128, 2**18) and g.conv_shapes == ((540_672, 3),)
    # Kimi-Linear: 16 x 16,384 x 16,384 = 2**32; conv channels 3 * 16 * 16,384 = 786,432.
    g = _hf(_cfg("kimi_linear_48b_a3b", linear_attn_config__num_heads=16, linear_attn_config__head_dim=2**14))
    assert g.temporal_shape == (16, 2**14, 2**14) and g.conv_shapes == ((3, 786_432),)
    # Granite: expand 1 x hidden 1,047,552 + 2 * 1 * 512 = 1,048,576.
    g = _hf(_cfg("granite_4_0_h_small", mamba_expand=1, hidden_size=MAX_DIM - 1024, mamba_d_state=512))
    assert g.conv_shapes == ((MAX_DIM, 3),)


@pytest.mark.parametrize(
    ("name", "tp", "what"),
    [
        # 16 key-head groups do not split 3 ways: SGLang counts 3 groups, 4,096 + 2 * 3 * 128 = 4,864.
        ("qwen3_next_80b_a3b", 3, "conv_dim=4864"),
        # 64 groups (replicated): conv_dim 4,096 + 2 * 64 * 128 = 20,480 divides by 64; 32 value heads do not.
        ("qwen3_next_80b_a3b", 64, "linear_num_value_heads=32"),
        # 3 * 32 * 128 = 12,288 channels do not divide by 5.
        ("kimi_linear_48b_a3b", 5, "3 * linear_attn_config.num_heads * linear_attn_config.head_dim=12288"),
        # 12,288 divides by 3, the 32 heads do not.
        ("kimi_linear_48b_a3b", 3, "linear_attn_config.num_heads=32"),
        # 16 groups: 1,536 + 2 * 16 * 128 = 5,632 divides by 16; 24 heads do not.
        ("falcon_h1_0_5b", 16, "mamba_n_heads=24"),
    ],
)
def test_a_tp_size_that_does_not_divide_names_the_count(name: str, tp: int, what: str) -> None:
    """SGLang divides heads and channels by the attention TP size; the line names the count that does not
    divide, as the config spells it."""
    assert _refused(_cfg(name), tp) == (
        f"{SRC}: {what} is not divisible by --tp-size {tp}; choose a TP size that divides it"
    )


def test_expand_times_hidden_is_truncated_as_sglang_does() -> None:
    """SGLang's intermediate size is ``int(mamba_expand * hidden_size)``: 1.5 x 1,365 = 2,047.5 -> 2,047,
    and the conv width is 2,047 + 2 * 1 * 128 = 2,303."""
    g = _hf(_cfg("granite_4_0_h_small", mamba_expand=1.5, hidden_size=1365))
    assert g.conv_shapes == ((2303, 3),)


# ---- what a key holds instead of what it should ----


@pytest.mark.parametrize(
    ("value", "found"),
    [
        ("16", "a string; write it without quotes"),
        ([16], f"a list; {FIX}"),
        ({"n": 16}, f"an object; {FIX}"),
        (16.0, f"a float; {FIX}"),
        (True, f"a boolean; {FIX}"),
    ],
)
def test_a_count_of_the_wrong_kind_says_what_it_found(value: Any, found: str) -> None:
    """A head count must be a JSON integer; the line says what it is instead and, for a quoted number,
    the fix."""
    msg = _refused(_cfg("qwen3_next_80b_a3b", linear_num_key_heads=value))
    assert msg.startswith(f"{SRC}: linear_num_key_heads=") and msg.endswith(
        f"must be an integer, not {found}"
    )


def test_missing_and_misplaced_keys() -> None:
    """A missing key (or null) is named with the two ways out; a section that is not an object says what
    it is; a count outside its range gives the range (layers also why)."""
    cfg = _cfg("qwen3_next_80b_a3b", linear_num_key_heads=None)
    assert _refused(cfg) == f"{SRC}: config key 'linear_num_key_heads' is missing; add it or use a model spec"
    assert _refused(_cfg("qwen3_5_397b_a17b", text_config=[])) == (
        f"{SRC}: text_config=[] must be a JSON object, not a list; {FIX}"
    )
    assert _refused(_cfg("kimi_linear_48b_a3b", linear_attn_config=5)) == (
        f"{SRC}: linear_attn_config=5 must be a JSON object, not an integer; {FIX}"
    )
    assert _refused(_cfg("qwen3_next_80b_a3b", linear_num_key_heads=0)) == (
        f"{SRC}: linear_num_key_heads=0 must be an integer in [1, 1,048,576]; {FIX}"
    )
    assert _refused(_cfg("qwen3_next_80b_a3b", num_hidden_layers=0)) == (
        f"{SRC}: num_hidden_layers=0 must be an integer in [1, 10,000] (the largest real models have a few "
        f"hundred layers); {FIX}"
    )
    # Every key that counts layers has the layer cap: an interval past it is a typo.
    assert "full_attention_interval=10001 must be an integer in [1, 10,000]" in _refused(
        _cfg("qwen3_next_80b_a3b", full_attention_interval=MAX_LAYERS + 1)
    )
    assert _refused(_cfg("qwen3_next_80b_a3b", mamba_ssm_dtype=7)) == (
        f"{SRC}: mamba_ssm_dtype=7 must be one of float32, bfloat16, float16 (or left out for the default); "
        f"{FIX}"
    )


def test_kimi_kda_layers_rules() -> None:
    """kda_layers are 1-based ids, each once: every layer may be one (27 of 27 loads, ids 0..26), one more
    entry than layers is named by count, a non-list or a bool entry is refused."""
    g = _hf(_cfg("kimi_linear_48b_a3b", linear_attn_config__kda_layers=list(range(27, 0, -1))))
    assert g.linear_layer_ids == tuple(range(27))
    assert _refused(_cfg("kimi_linear_48b_a3b", linear_attn_config__kda_layers=[1] * 28)) == (
        f"{SRC}: linear_attn_config.kda_layers=[1, 1, 1, 1, 1, 1, ...] (28 entries) lists 28 layers but "
        "num_hidden_layers=27; list each layer once"
    )
    for bad in ("1,2", [1, True]):
        assert _refused(_cfg("kimi_linear_48b_a3b", linear_attn_config__kda_layers=bad)) == (
            f"{SRC}: linear_attn_config.kda_layers={bad!r} must be a list of 1-based layer ids; {FIX}"
        )


def test_nemotron_pattern_and_granite_layer_types_of_the_wrong_kind() -> None:
    assert _refused(_cfg("nemotron_h_8b", hybrid_override_pattern=["M"])) == (
        f"{SRC}: hybrid_override_pattern=['M'] must be a non-empty string; {FIX}"
    )
    msg = _refused(_cfg("nemotron_h_8b", hybrid_override_pattern="M" * (MAX_LAYERS + 1)))
    assert msg.startswith(f"{SRC}: hybrid_override_pattern='MMM") and msg.endswith(
        "has one character per layer, and 10,001 layers is above 10,000 (the largest real models have a few "
        f"hundred layers); {FIX}"
    )
    assert _refused(_cfg("granite_4_0_h_small", layer_types="mamba")) == (
        f"{SRC}: layer_types must be a list of num_hidden_layers=40 entries, got a string; {FIX}"
    )
    assert "got 39 entries" in _refused(_cfg("granite_4_0_h_small", layer_types=["mamba"] * 39))


@pytest.mark.parametrize(
    ("expand", "rule"),
    [
        (True, "must be a number, not a boolean"),
        ("2", "must be a number, not a string"),
        (0, "must be a positive number"),
        (-2, "must be a positive number"),
    ],
)
def test_mamba_expand_must_be_a_positive_number(expand: Any, rule: str) -> None:
    msg = _refused(_cfg("granite_4_0_h_small", mamba_expand=expand))
    assert msg == f"{SRC}: mamba_expand={expand!r} {rule}; {FIX}"


def test_model_type_lines_list_the_supported_families() -> None:
    """A user whose model_type is wrong or unsupported learns which families the checker reads."""
    assert _refused(_cfg("qwen3_next_80b_a3b", model_type=None)) == (
        f"{SRC}: model_type=None must be a string naming the model family {SUPPORTED}; {FIX}"
    )
    assert _refused({"model_type": "llama"}) == (
        f"{SRC}: model_type='llama' has no linear-attention (mamba) layers, so SGLang gives it no state pool "
        "and there is nothing for this check to compare (SGLang sizes only its KV cache); the check applies "
        f"to hybrid models {SUPPORTED}"
    )
    assert _refused({"model_type": "mamba2"}).endswith(
        f"is not a hybrid family the checker reads {SUPPORTED}; describe it with a JSON model spec instead "
        "(docs/preflight.md)"
    )
    # A key word in any case marks a hybrid (HF configs use lower case, some authors do not).
    assert "JSON model spec" in _refused({"model_type": "newhybrid", "Mamba_D_State": 1})


def test_context_length_is_the_configs_own_up_to_its_cap() -> None:
    """The context length is SGLang's get_context_length (0.5.23 utils/hf_transformers/common.py:668-694):
    the first of max_sequence_length, seq_length, max_seq_len, model_max_length, max_position_embeddings
    (Kimi-Linear's fixture gives model_max_length 1,048,576 and no max_position_embeddings), the config
    class's max_position_embeddings default where none is set (KimiLinearConfig: 4096), times
    rope_scaling's factor; 2**30 loads, one more is refused."""
    assert _hf(_cfg("qwen3_next_80b_a3b")).context_len == 262_144
    assert _hf(_cfg("qwen3_5_397b_a17b")).context_len == 262_144
    assert _hf(_cfg("kimi_linear_48b_a3b")).context_len == 1_048_576
    kimi = _cfg("kimi_linear_48b_a3b")
    del kimi["model_max_length"]
    assert _hf(kimi).context_len == 4096
    assert _hf(_cfg("qwen3_next_80b_a3b", rope_scaling={"factor": 4.0})).context_len == 4 * 262_144
    yarn = {"factor": 4.0, "original_max_position_embeddings": 32768}
    assert _hf(_cfg("qwen3_next_80b_a3b", rope_scaling=yarn)).context_len == 262_144
    assert _hf(_cfg("falcon_h1_0_5b", max_position_embeddings=MAX_CONTEXT_LEN)).context_len == MAX_CONTEXT_LEN
    assert _refused(_cfg("falcon_h1_0_5b", max_position_embeddings=MAX_CONTEXT_LEN + 1)) == (
        f"{SRC}: max_position_embeddings=1073741825 must be an integer in [1, 1,073,741,824] (real models "
        f"reach about 10**7 tokens); {FIX}"
    )


def test_names_and_families_of_hf_configs_and_the_preset() -> None:
    """The geometry's name is the source and its model_type (every report line); family is SGLang's
    model_type (old releases size the pool per family)."""
    g = _hf(_cfg("qwen3_5_397b_a17b"))
    assert (g.name, g.family) == (f"{SRC} (qwen3_5_moe)", "qwen3_5_moe")
    k3 = load_geometry()
    assert (k3.name, k3.family) == ("kimi-k3", "kimi_k3")


def test_only_qwen3_5_reads_its_keys_from_text_config(tmp_path: Path) -> None:
    """Qwen3.5 nests the language model in text_config; another family's text_config (a multimodal
    wrapper's) is not where its keys are. A spec without a name is named by its path."""
    g = _hf(_cfg("nemotron_h_8b", text_config={"num_hidden_layers": 4}))
    assert g.num_hidden_layers == 52
    path = tmp_path / "spec.json"
    path.write_text(json.dumps(SPEC))
    assert load_geometry(model_config=path).name == str(path)


def test_preset_tp_errors_name_the_preset_and_the_count() -> None:
    """The preset's 4,096 conv channels are checked first (3 does not divide them), then its 64 heads
    (128 divides 4,096 but not 64)."""
    with pytest.raises(ConfigError) as info:
        load_geometry(model="kimi-k3", tp_size=3)
    assert str(info.value) == (
        "preset kimi-k3: conv channels=4096 is not divisible by --tp-size 3; choose a TP size that divides it"
    )
    with pytest.raises(
        ConfigError, match=r"^preset kimi-k3: num_heads=64 is not divisible by --tp-size 128;"
    ):
        load_geometry(model="kimi-k3", tp_size=128)
    with pytest.raises(ConfigError) as info:
        load_geometry(model="llama")
    assert str(info.value) == (
        "--model 'llama' is not a built-in preset (kimi-k3); pass --model-config PATH for anything else"
    )


@pytest.mark.parametrize("tp", [0, -1, True, "2", 2.0])
def test_tp_size_must_be_a_positive_integer(tp: Any) -> None:
    with pytest.raises(LayoutError) as info:
        load_geometry(tp_size=tp)
    assert str(info.value) == f"--tp-size {tp!r} must be a positive integer"


# ---- the JSON model spec ----

SPEC: dict[str, Any] = {
    "num_hidden_layers": 4,
    "linear_layer_ids": [0, 1, 3],
    "conv_shapes": [[64, 3]],
    "temporal_shape": [4, 16, 16],
}


def _spec_refused(**changes: Any) -> str:
    with pytest.raises(ConfigError) as info:
        _spec(**changes)
    msg = str(info.value)
    assert msg.startswith(f"{SRC}: "), msg
    return msg.removeprefix(f"{SRC}: ")


def _spec(**changes: Any) -> ModelGeometry:
    return geometry_from_model_spec({**SPEC, **changes}, source=SRC)


def test_model_spec_defaults_and_edges() -> None:
    """A spec's defaults are SGLang's (bf16 conv, fp32 temporal, no extra state) and its name is the file;
    every layer may be linear; extra state 0 and 2**40 bytes load; a 200-character name and model_type
    load; the model_type is the family."""
    g = _spec()
    assert (g.conv_dtype, g.temporal_dtype, g.extra_per_slot_bytes) == ("bfloat16", "float32", 0)
    assert g.name == SRC and g.family is None
    g = _spec(linear_layer_ids=[3, 2, 1, 0], extra_per_slot_bytes=0, dtypes=None)
    assert g.linear_layer_ids == (0, 1, 2, 3) and g.extra_per_slot_bytes == 0
    g = _spec(extra_per_slot_bytes=MAX_EXTRA_PER_SLOT_BYTES, name="n" * 200, model_type="m" * 200)
    assert (g.extra_per_slot_bytes, g.name, g.family) == (2**40, "n" * 200, "m" * 200)
    g = _spec(dtypes={"temporal": "torch.bfloat16"})
    assert (g.conv_dtype, g.temporal_dtype) == ("bfloat16", "bfloat16")


@pytest.mark.parametrize(
    ("changes", "start", "rule"),
    [
        (dict(linear_layer_ids="0,1"), "linear_layer_ids='0,1' ", "must be a list of 0-based integers"),
        (
            dict(linear_layer_ids=[0, True]),
            "linear_layer_ids=[0, True] ",
            "must be a list of 0-based integers",
        ),
        (
            dict(linear_layer_ids=[0, 1, 2, 3, 0]),
            "linear_layer_ids=[0, 1, 2, 3, 0] ",
            "lists 5 layers but num_hidden_layers=4; list each once",
        ),
        (dict(conv_shapes=[]), "conv_shapes=[] ", "must be a non-empty list of shapes"),
        (
            dict(conv_shapes=[[8, 3]] * 17),
            "conv_shapes=[[8, 3], ",
            "lists 17 conv states; at most 16 (real: 1)",
        ),
        (dict(temporal_shape=5), "temporal_shape=5 ", "must be a list of positive integers"),
        (dict(conv_shapes=["8"]), "conv_shapes[0]='8' ", "must be a list of positive integers"),
        (
            dict(dtypes=["bf16"]),
            "dtypes=['bf16'] ",
            'must be an object like {"conv": "bfloat16", "temporal": "float32"}',
        ),
        (
            dict(dtypes={"conv": "int8"}),
            "dtypes.conv='int8' ",
            "is not a state dtype; use one of float32, bfloat16, float16",
        ),
        (
            dict(extra_per_slot_bytes=2**40 + 1),
            "extra_per_slot_bytes=1099511627777 ",
            f"must be an integer in [0, 1,099,511,627,776]; {FIX}",
        ),
        (
            dict(model_type=" "),
            "model_type=' ' ",
            "must be a family name like qwen3_next (at most 200 chars)",
        ),
        (dict(model_type=5), "model_type=5 ", "must be a family name like qwen3_next (at most 200 chars)"),
        (
            dict(model_type="m" * 201),
            "model_type='mmm",
            "must be a family name like qwen3_next (at most 200 chars)",
        ),
        (dict(name=" "), "name=' ' ", "must be a non-empty string of at most 200 characters"),
        (dict(name=5), "name=5 ", "must be a non-empty string of at most 200 characters"),
        (dict(name="n" * 201), "name='nnn", "must be a non-empty string of at most 200 characters"),
        (
            dict(name="a\tb"),
            "name='a\\tb' ",
            "must be printable text: no control or format characters (a newline, NUL, a right-to-left "
            "override); rename it in the model spec",
        ),
    ],
)
def test_bad_model_spec_lines(changes: dict[str, Any], start: str, rule: str) -> None:
    """The line names the key and the value as the user wrote them, then the rule."""
    msg = _spec_refused(**changes)
    assert msg.startswith(start) and msg.endswith(f" {rule}"), msg


# ---- reading the file ----


def _write(tmp_path: Path, data: bytes | str) -> Path:
    path = tmp_path / "config.json"
    path.write_bytes(data if isinstance(data, bytes) else data.encode())
    return path


def _load_refused(path: Path | str) -> str:
    with pytest.raises(ConfigError) as info:
        load_geometry(model_config=path)
    return str(info.value)


def test_files_that_are_not_a_json_object(tmp_path: Path) -> None:
    """Each line says what the file holds instead: no object, not UTF-8 (at which byte), not JSON (where),
    neither kind of config."""
    label = f"--model-config {tmp_path / 'config.json'}"
    for text, found in (("null", "null"), ("[1]", "a list"), ("5", "an integer"), ('"x"', "a string")):
        assert _load_refused(_write(tmp_path, text)) == f"{label}: expected a JSON object, got {found}"
    # b'{"a": "' is 7 bytes: the bad byte is at offset 7.
    assert _load_refused(_write(tmp_path, b'{"a": "\xff"}')) == (
        f"{label}: not UTF-8 text (byte 7); pass the model's config.json"
    )
    assert _load_refused(_write(tmp_path, '{"a": }')) == (
        f"{label}: not valid JSON (line 1, column 7: Expecting value)"
    )
    assert _load_refused(_write(tmp_path, "{}")) == (
        f"{tmp_path / 'config.json'}: neither an HF config (no 'model_type') nor a model spec "
        "(no 'linear_layer_ids'); see docs/preflight.md 'JSON model spec'"
    )


def _with(literal: str) -> str:
    """Qwen3-Next's config with ``"extra": <literal>`` added as written (a key SGLang does not read)."""
    return json.dumps(json.loads(_text("qwen3_next_80b_a3b")))[:-1] + f', "extra": {literal}}}'


def test_values_json_should_not_hold_are_named_where_they_sit(tmp_path: Path) -> None:
    """NaN, an overflowing float and an over-long integer are named by key path, as written, with the rule;
    a top-level key reads as ``label: key=value``."""
    label = f"--model-config {tmp_path / 'config.json'}"
    assert _load_refused(_write(tmp_path, _with("NaN"))) == (
        f"{label}: extra=NaN is not a number JSON allows (NaN and Infinity are refused); {FIX}"
    )
    assert _load_refused(_write(tmp_path, _with("[1, 1e999]"))) == (
        f"{label}: extra[1]=1e999 overflows a float (it reads as infinity); {FIX}"
    )
    assert _load_refused(_write(tmp_path, _with('{"k": -' + "9" * 41 + "}"))).startswith(
        f"{label}: extra.k=-{'9' * 41} has more than 40 digits, far past any real config value;"
    )
    # 40 digits, signed or not, are within the cap (HF's "very large" 1e30 has 31).
    for digits in ("9" * 40, "-" + "9" * 40):
        assert load_geometry(model_config=_write(tmp_path, _with(digits))).family == "qwen3_next"


def test_long_key_paths_are_cut_in_the_middle(tmp_path: Path) -> None:
    """A key of up to 60 characters is shown whole; a longer one shortened with its length; a key path past
    80 characters keeps its start and end and says its length."""
    msg = _load_refused(_write(tmp_path, _with('{"' + "k" * 60 + '": NaN}')))
    assert f": extra.{'k' * 60}=NaN is not a number" in msg
    msg = _load_refused(_write(tmp_path, _with('{"' + "k" * 61 + '": NaN}')))
    assert "(61 chars)" in msg and "k" * 61 not in msg
    path80 = '{"' + "a" * 40 + '": {"' + "b" * 33 + '": NaN}}'  # extra. + 40 + . + 33 = 80
    assert f": extra.{'a' * 40}.{'b' * 33}=NaN" in _load_refused(_write(tmp_path, _with(path80)))
    path81 = '{"' + "a" * 40 + '": {"' + "b" * 34 + '": NaN}}'
    msg = _load_refused(_write(tmp_path, _with(path81)))
    assert f": extra.{'a' * 34}...{'b' * 20} (81 chars)=NaN" in msg, msg


def test_nesting_is_refused_past_64_levels_naming_the_path(tmp_path: Path) -> None:
    """The config object is level 1, the lists under its key "extra" levels 2, 3, ...: 64 nested lists
    (the innermost empty) reach level 64 and load; 65 reach level 65, named by its path, "extra" followed
    by 63 indexings (194 characters, cut)."""
    assert load_geometry(model_config=_write(tmp_path, _with("[" * 64 + "]" * 64))).family == "qwen3_next"
    # Far past the limit, Python's parser gives up first (RecursionError): the same kind of line.
    assert _load_refused(_write(tmp_path, "[" * 100_000 + "]" * 100_000)) == (
        f"--model-config {tmp_path / 'config.json'}: nests deeper than 64 levels (the JSON parser gave up); "
        "a model config nests a few; pass the model's config.json"
    )
    msg = _load_refused(_write(tmp_path, _with("[" * 65 + "]" * 65)))
    assert (
        "(194 chars) nests deeper than 64 levels; a model config nests a few (pass the model's config.json)"
        in msg
    )


def test_paths_that_are_not_a_file(tmp_path: Path) -> None:
    """A NUL byte and a block device: one line each, no OSError."""
    assert _load_refused("a\x00b") == "--model-config a\\x00b: a path cannot hold a NUL byte"
    dev = tmp_path / "blk"
    try:
        os.mknod(dev, stat.S_IFBLK | 0o600, os.makedev(7, 0))
    except OSError:
        return  # no CAP_MKNOD here: the rest is checked
    assert (
        _load_refused(dev)
        == f"--model-config {dev} is a block device; pass the model's config.json or its directory"
    )


def test_a_device_that_never_ends_is_read_up_to_the_cap() -> None:
    """/dev/zero is a character device with no end: read as a stream, MAX_CONFIG_BYTES + 1 bytes at most,
    then refused by size (memory stays bounded; the read does not loop for ever)."""
    assert _load_refused("/dev/zero") == (
        "--model-config /dev/zero: larger than 4 MiB, and a model config.json is a few KiB; pass the "
        "model's config.json (not a weights, index or tokenizer file)"
    )


def test_a_file_of_exactly_the_cap_loads_and_a_read_error_is_one_line(tmp_path: Path) -> None:
    """The 4 MiB cap is inclusive (a config padded to exactly MAX_CONFIG_BYTES loads); a file the system
    fails to read (/proc/self/mem: EIO at offset 0) is one line with the system's reason."""
    text = _text("qwen3_next_80b_a3b").strip()
    pad = MAX_CONFIG_BYTES - len(text.encode()) - len(', "pad": ""')
    path = _write(tmp_path, text[:-1] + ', "pad": "' + "p" * pad + '"}')
    assert path.stat().st_size == MAX_CONFIG_BYTES
    assert load_geometry(model_config=path).family == "qwen3_next"
    assert (
        _load_refused("/proc/self/mem")
        == "--model-config /proc/self/mem: cannot read it (Input/output error)"
    )


def test_a_long_path_is_shown_whole_up_to_200_characters(tmp_path: Path) -> None:
    """Paths in messages are cut at 200 characters, not at the 80 of a key path."""
    path = tmp_path / ("d" * (190 - len(str(tmp_path)) - 1))
    assert len(str(path)) == 190
    assert (
        _load_refused(path)
        == f"--model-config {path}: no such file; pass the path to config.json or the model directory"
    )


def test_the_digest_is_the_configs_content_not_its_layout(tmp_path: Path) -> None:
    """Ranks compare the digest as the ``model`` input: two copies of one config that differ in key order
    or whitespace are one model; a changed value is another; the preset's digest is the same at every TP
    size (the TP size is compared as its own input)."""
    cfg = json.loads(_text("qwen3_next_80b_a3b"))
    a = tmp_path / "a.json"
    b = tmp_path / "b.json"
    a.write_text(json.dumps(cfg))
    b.write_text(json.dumps(dict(reversed(list(cfg.items()))), indent=4))
    da = load_geometry(model_config=a).source_digest
    # Short enough to read in every row's ``model`` input ("<name> #<digest>").
    assert da == load_geometry(model_config=b).source_digest and len(da) <= 16
    b.write_text(json.dumps({**cfg, "rope_theta": 1.0}))
    assert load_geometry(model_config=b).source_digest != da
    assert load_geometry(tp_size=1).source_digest == load_geometry(tp_size=4).source_digest


# ---- geometry.py: dtypes, shapes and the geometry's own checks ----


def test_canonical_dtype_spellings() -> None:
    """The flag takes SGLang's names and the short ones people type, in any case, with or without
    ``torch.`` and surrounding spaces."""
    for spelt, canonical in (
        (" BF16 ", "bfloat16"),
        ("torch.float16", "float16"),
        ("Half", "float16"),
        ("fp32", "float32"),
    ):
        assert canonical_dtype(spelt, source="--x") == canonical
    with pytest.raises(FlagError) as info:
        canonical_dtype(["bf16"], source="--x")
    assert (
        str(info.value) == "--x=['bf16'] is a list, not a dtype name; use one of float32, bfloat16, float16"
    )
    with pytest.raises(FlagError) as info:
        canonical_dtype("", source="--x")
    assert (
        str(info.value)
        == "--x='' is empty; use one of float32, bfloat16, float16, or leave it out for the default"
    )
    with pytest.raises(ConfigError) as info:
        canonical_dtype("int8", source="s", error=ConfigError)
    assert str(info.value) == "s='int8' is not a state dtype; use one of float32, bfloat16, float16"


def test_sglang_dtype_names_are_exact() -> None:
    assert sglang_dtype_name("float16", source="E", ignored_as="x") == "float16"
    for bad in ("bf16", "Float16", None):
        with pytest.raises(FlagError) as info:
            sglang_dtype_name(bad, source="E", ignored_as="bfloat16")  # type: ignore[arg-type]
        assert str(info.value) == (
            f"E={bad!r} is not a dtype name SGLang accepts (exactly float32, bfloat16 or float16); SGLang "
            "ignores it and uses bfloat16: spell it exactly"
        )


def test_an_empty_env_var_is_unset_and_the_line_names_the_fallback(tmp_path: Path) -> None:
    """SGLang keeps its fallback for an env var set to "": the config's mamba_ssm_dtype then applies."""
    cfg = _cfg("qwen3_next_80b_a3b", mamba_ssm_dtype="float16")
    g = resolve_dtypes(_hf(cfg), env={"SGLANG_MAMBA_CONV_DTYPE": "", "SGLANG_MAMBA_SSM_DTYPE": ""})
    assert (g.conv_dtype, g.temporal_dtype) == ("bfloat16", "float16")
    for env, fallback in (
        ({"SGLANG_MAMBA_CONV_DTYPE": "bf16"}, "bfloat16"),
        ({"SGLANG_MAMBA_SSM_DTYPE": "bf16"}, "the config's or float32"),
    ):
        with pytest.raises(FlagError, match=f"SGLang ignores it and uses {fallback}: spell it exactly"):
            resolve_dtypes(_hf(cfg), env=env)
    with pytest.raises(ConfigError) as info:
        resolve_dtypes(_hf(_cfg("qwen3_next_80b_a3b", mamba_ssm_dtype="fp16")), env={})
    assert str(info.value).startswith(f"{SRC} (qwen3_next): mamba_ssm_dtype='fp16' is not a dtype name")
    assert str(info.value).endswith("SGLang ignores it and uses float32: spell it exactly")


def _geometry(**changes: Any) -> ModelGeometry:
    fields: dict[str, Any] = dict(
        name="g",
        num_hidden_layers=4,
        linear_layer_ids=(0, 1, 3),
        conv_shapes=((8, 3),),
        temporal_shape=(2, 4),
    )
    return ModelGeometry(**{**fields, **changes})


def _geometry_refused(**changes: Any) -> str:
    with pytest.raises(ConfigError) as info:
        _geometry(**changes)
    return str(info.value)


def test_geometry_edges_load() -> None:
    """Each of the geometry's caps is inclusive: MAX_LAYERS layers, 16 conv states, a 1 TiB extra state, a
    2**30 context, a 200-character family, a dim of MAX_DIM and a state of MAX_STATE_ELEMENTS."""
    g = _geometry(
        num_hidden_layers=MAX_LAYERS,
        conv_shapes=((MAX_DIM, 1),) * 16,
        temporal_shape=(2**12, 2**20),
        extra_per_slot_bytes=MAX_EXTRA_PER_SLOT_BYTES,
        context_len=MAX_CONTEXT_LEN,
        family="f" * 200,
        linear_layer_ids=(MAX_LAYERS - 1,),
    )
    assert g.per_req_bytes == (16 * MAX_DIM * 2 + MAX_STATE_ELEMENTS * 4) * 1
    assert g.linear_layers_in(0, MAX_LAYERS) == 1
    # And the low ends: one dim, one token of context.
    assert _geometry(temporal_shape=(7,), context_len=1).bytes_per_layer == 8 * 3 * 2 + 7 * 4
    g = _geometry()  # linear layers 0, 1, 3 of 4
    assert [g.linear_layers_in(a, b) for a, b in ((0, 4), (1, 4), (2, 3), (1, 1), (3, 1))] == [3, 2, 0, 0, 0]


@pytest.mark.parametrize(
    ("changes", "line"),
    [
        (dict(num_hidden_layers=0), "g: num_hidden_layers=0 must be an integer in [1, 10,000]"),
        (dict(num_hidden_layers=True), "g: num_hidden_layers=True must be an integer"),
        (dict(num_hidden_layers=MAX_LAYERS + 1), "g: num_hidden_layers=10001 must be"),
        (dict(linear_layer_ids=()), "g: the model has no linear-attention layers, so there is no state pool"),
        (dict(linear_layer_ids=(0, 1.0)), "g: linear_layer_ids=(0, 1.0) must all be integers"),
        (dict(linear_layer_ids=(0, 4)), "g: linear_layer_ids [4] out of range [0, 4); ids are 0-based"),
        (dict(linear_layer_ids=(-1, 0)), "g: linear_layer_ids [-1] out of range [0, 4)"),
        (dict(linear_layer_ids=(1, 1)), "g: linear_layer_ids repeats [1]; list each layer once"),
        (dict(conv_shapes=((8, 3),) * 17), "g: 17 conv states per layer, above 16 (real models have one)"),
        (dict(conv_dtype="int8"), "g: state dtype 'int8' is not one of float32, bfloat16, float16"),
        (dict(temporal_dtype=None), "g: state dtype None is not one of"),
        (
            dict(extra_per_slot_bytes=-1),
            "g: extra_per_slot_bytes=-1 must be an integer in [0, 1,099,511,627,776]",
        ),
        (dict(extra_per_slot_bytes=True), "g: extra_per_slot_bytes=True must be"),
        (dict(extra_per_slot_bytes=2**40 + 1), "g: extra_per_slot_bytes=1099511627777 must be"),
        (dict(family=""), "g: model_type='' must be a non-empty string"),
        (dict(family=" "), "g: model_type=' ' must be"),
        (dict(family=7), "g: model_type=7 must be"),
        (dict(family="f" * 201), "must be a non-empty string"),
        (dict(context_len=0), "g: max_position_embeddings=0 must be an integer in [1, 1,073,741,824]"),
        (dict(context_len=True), "g: max_position_embeddings=True must be"),
        (dict(context_len=MAX_CONTEXT_LEN + 1), "g: max_position_embeddings=1073741825 must be"),
    ],
)
def test_geometry_refuses_with_one_line(changes: dict[str, Any], line: str) -> None:
    msg = _geometry_refused(**changes)
    assert msg.startswith("g: ") and line in msg, msg


def test_geometry_lines_say_the_way_out() -> None:
    """The whole line for each kind of bad geometry: what was seen, the rule, why, what to check."""
    assert _geometry_refused(num_hidden_layers=0) == (
        "g: num_hidden_layers=0 must be an integer in [1, 10,000] (the largest real models have a few "
        "hundred layers); check the model config"
    )
    assert _geometry_refused(linear_layer_ids=()) == (
        "g: the model has no linear-attention layers, so there is no state pool to check; this tool is for "
        "hybrid models (Qwen3-Next, Kimi-Linear, Nemotron-H, ...)"
    )
    assert _geometry_refused(linear_layer_ids=(4,)) == (
        "g: linear_layer_ids [4] out of range [0, 4); ids are 0-based and must be below num_hidden_layers"
    )
    assert _geometry_refused(conv_shapes=((8, 3),) * 17) == (
        "g: 17 conv states per layer, above 16 (real models have one); check the model spec's conv_shapes"
    )
    assert _geometry_refused(temporal_shape=(MAX_DIM + 1,)) == (
        "g: state shape [1048577] holds 1,048,577 elements per layer; the limit is 1,048,576 per dim and "
        "4,294,967,296 in all (real models hold about 10**6); check the model spec or config"
    )


@pytest.mark.parametrize(
    ("shape", "line"),
    [
        ((), "s: state shape () must be 1-8 positive integer dims"),
        ((1,) * 9, "s: state shape (1, 1, 1, 1, 1, 1, ...) (9 entries) must be 1-8"),
        ([2, 0], "s: state shape [2, 0] must be 1-8 positive integer dims; check the model spec or config"),
        ([2, True], "s: state shape [2, True] must be"),
        ("22", "s: state shape '22' must be"),
        (
            (MAX_DIM + 1,),
            "s: state shape [1048577] holds 1,048,577 elements per layer; the limit is 1,048,576 per dim",
        ),
        ((2**12, 2**20, 2), "s: state shape [4096, 1048576, 2] holds 8,589,934,592 elements per layer"),
    ],
)
def test_check_shape_refuses(shape: Any, line: str) -> None:
    with pytest.raises(ConfigError) as info:
        check_shape(shape, what="state shape", source="s")
    assert str(info.value).startswith(line), str(info.value)
    check_shape((1,) * 8, what="state shape", source="s")  # 8 dims are allowed


def test_describe_is_the_geometrys_json() -> None:
    """``describe()`` is the ``geometry`` object of every JSON report: its keys are the report schema's."""
    g = _geometry(conv_shapes=((8, 3), (4, 3)), extra_per_slot_bytes=5, conv_dtype="float32")
    assert g.describe() == {
        "name": "g",
        "num_hidden_layers": 4,
        "num_linear_layers": 3,
        "linear_layer_ids": [0, 1, 3],
        "conv_shapes": [[8, 3], [4, 3]],
        "temporal_shape": [2, 4],
        "conv_dtype": "float32",
        "temporal_dtype": "float32",
        "extra_per_slot_bytes": 5,
        "bytes_per_layer": (8 * 3 + 4 * 3) * 4 + 2 * 4 * 4,
        "per_req_bytes": ((8 * 3 + 4 * 3) * 4 + 2 * 4 * 4) * 3,
        "context_len": None,
        "attention": None,
    }
