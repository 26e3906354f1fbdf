"""Model geometry: linear layer ids, per-rank state shapes, dtypes, per_req (SGLang: each family's
``mamba2_cache_params`` in sglang/srt/configs/<family>.py; ``mamba_cache_per_req`` in
sglang/srt/configs/mamba_utils.py).

Every expected shape below is written out from the public config numbers with SGLang's Mamba2 rule
(sglang/srt/configs/mamba_utils.py ``Mamba2StateShape.create``: ``if n_groups % tp: n_groups = tp``;
conv_dim = intermediate + 2 * n_groups * state), not read back from the code under test. A wrong rule
shows as a per_req off by a factor, and every pool size with it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from checker.core.errors import CheckerInputError, ConfigError, FlagError
from checker.core.sizing.geometry import resolve_dtypes
from checker.families.geometry import load_geometry

BF16, FP32, FP16 = 2, 4, 2


def _qwen_ids(L: int, interval: int) -> tuple[int, ...]:
    return tuple(i for i in range(L) if (i + 1) % interval != 0)


KIMI_KDA_1BASED = [1, 2, 3, 5, 6, 7, 9, 10, 11, 13, 14, 15, 17, 18, 19, 21, 22, 23, 25, 26]
KIMI_IDS = tuple(i - 1 for i in KIMI_KDA_1BASED)
NEMOTRON_PATTERN = "M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M-"

# (fixture, tp, L, linear ids, conv shapes, temporal shape), per-rank at that TP.
FAMILY_CASES: list[tuple[str, int, int, tuple[int, ...], list[tuple[int, ...]], tuple[int, ...]]] = [
    # Qwen3-Next-80B-A3B: value heads 32 x 128, key heads 16, key dim 128, kernel 4.
    ("qwen3_next_80b_a3b", 1, 48, _qwen_ids(48, 4), [(32 * 128 + 2 * 16 * 128, 3)], (32, 128, 128)),
    ("qwen3_next_80b_a3b", 2, 48, _qwen_ids(48, 4), [((32 * 128 + 2 * 16 * 128) // 2, 3)], (16, 128, 128)),
    # tp 32 does not divide the 16 key-head groups: groups become 32 (replicated), heads 32/32 = 1.
    ("qwen3_next_80b_a3b", 32, 48, _qwen_ids(48, 4), [((32 * 128 + 2 * 32 * 128) // 32, 3)], (1, 128, 128)),
    # Qwen3.5-397B-A17B, keys nested in text_config: value heads 64 x 128, key heads 16.
    ("qwen3_5_397b_a17b", 1, 60, _qwen_ids(60, 4), [(64 * 128 + 2 * 16 * 128, 3)], (64, 128, 128)),
    ("qwen3_5_397b_a17b", 4, 60, _qwen_ids(60, 4), [((64 * 128 + 2 * 16 * 128) // 4, 3)], (16, 128, 128)),
    # Kimi-Linear-48B-A3B: kda_layers are 1-based; H=32, d=128, kernel 4; window axis first.
    ("kimi_linear_48b_a3b", 1, 27, KIMI_IDS, [(3, 3 * 32 * 128)], (32, 128, 128)),
    ("kimi_linear_48b_a3b", 8, 27, KIMI_IDS, [(3, 3 * 32 * 128 // 8)], (4, 128, 128)),
    # Nemotron-H-8B: 'M' positions of the pattern; 128 heads x 64, 8 groups, state 128, kernel 4.
    (
        "nemotron_h_8b",
        1,
        52,
        tuple(i for i, c in enumerate(NEMOTRON_PATTERN) if c == "M"),
        [(128 * 64 + 2 * 8 * 128, 3)],
        (128, 64, 128),
    ),
    (
        "nemotron_h_8b",
        4,
        52,
        tuple(i for i, c in enumerate(NEMOTRON_PATTERN) if c == "M"),
        [((128 * 64 + 2 * 8 * 128) // 4, 3)],
        (32, 64, 128),
    ),
    # Falcon-H1-0.5B: every layer holds state; d_ssm 1536, 24 heads x 64, 1 group, state 128.
    ("falcon_h1_0_5b", 1, 36, tuple(range(36)), [(1536 + 2 * 1 * 128, 3)], (24, 64, 128)),
    # tp 2: the single group cannot split, so SGLang counts 2 groups.
    ("falcon_h1_0_5b", 2, 36, tuple(range(36)), [((1536 + 2 * 2 * 128) // 2, 3)], (12, 64, 128)),
    # Granite-4.0-H-Small: 'mamba' layer_types (attention at 5, 15, 25, 35); expand 2 x hidden 4096.
    (
        "granite_4_0_h_small",
        1,
        40,
        tuple(i for i in range(40) if i not in (5, 15, 25, 35)),
        [(2 * 4096 + 2 * 1 * 128, 3)],
        (128, 64, 128),
    ),
    (
        "granite_4_0_h_small",
        4,
        40,
        tuple(i for i in range(40) if i not in (5, 15, 25, 35)),
        [((2 * 4096 + 2 * 4 * 128) // 4, 3)],
        (32, 64, 128),
    ),
]


@pytest.mark.parametrize(("name", "tp", "L", "ids", "conv", "temporal"), FAMILY_CASES)
def test_hf_family_geometry(
    fixtures_dir: Path,
    name: str,
    tp: int,
    L: int,
    ids: tuple[int, ...],
    conv: list[tuple[int, ...]],
    temporal: tuple[int, ...],
) -> None:
    """Each family's ids and per-rank shapes follow its SGLang config class (sglang/srt/configs/<family>.py
    ``linear_layer_ids`` / ``mamba2_cache_params``); per_req is ``mamba_cache_per_req``: the bytes of one
    layer's states times the number of linear layers."""
    g = load_geometry(model_config=fixtures_dir / f"{name}.json", tp_size=tp)
    assert g.num_hidden_layers == L
    assert g.linear_layer_ids == ids
    assert [tuple(s) for s in g.conv_shapes] == conv
    assert tuple(g.temporal_shape) == temporal
    assert (g.conv_dtype, g.temporal_dtype) == ("bfloat16", "float32")
    per_layer = sum(a * b for a, b in conv) * BF16 + temporal[0] * temporal[1] * temporal[2] * FP32
    assert g.per_req_bytes == per_layer * len(ids)


def test_qwen3_next_worked_example(fixtures_dir: Path) -> None:
    """Qwen3-Next-80B-A3B (48 layers, full_attention_interval 4, key heads 16, value heads 32, dims 128,
    kernel 4) through sglang/srt/configs/qwen3_next.py ``mamba2_cache_params``: 36 linear layers, conv
    (8192, 3), temporal (32, 128, 128), per_req 77,266,944 bytes at TP 1."""
    g = load_geometry(model_config=fixtures_dir / "qwen3_next_80b_a3b.json", tp_size=1)
    assert g.num_linear_layers == 36
    assert g.conv_shapes == ((8192, 3),)
    assert g.temporal_shape == (32, 128, 128)
    assert g.per_req_bytes == 77_266_944


def test_preset_kimi_k3_seed_fixture() -> None:
    """The upstream unit test's fixture (docs/how-it-computes.md, "The upstream claim, measured": Model):
    4,218,880 bytes per layer and per_req 291,102,720; TP divides heads and channels."""
    g = load_geometry(model="kimi-k3")
    assert g.bytes_per_layer == 4096 * 3 * BF16 + 64 * 128 * 128 * FP32 == 4_218_880
    assert g.per_req_bytes == 291_102_720
    for tp in (2, 4, 8):
        gt = load_geometry(model="kimi-k3", tp_size=tp)
        assert gt.conv_shapes == ((4096 // tp, 3),) and gt.temporal_shape == (64 // tp, 128, 128)
        assert gt.per_req_bytes * tp == 291_102_720


def _write(tmp_path: Path, cfg: dict[str, Any], name: str = "config.json") -> Path:
    path = tmp_path / name
    path.write_text(json.dumps(cfg))
    return path


def _load(fixtures_dir: Path, name: str) -> dict[str, Any]:
    return json.loads((fixtures_dir / f"{name}.json").read_text())


def test_qwen_ignores_layer_types(fixtures_dir: Path, tmp_path: Path) -> None:
    """SGLang derives Qwen's linear layers from full_attention_interval alone; reading layer_types would
    change the ids when the two disagree."""
    cfg = _load(fixtures_dir, "qwen3_5_397b_a17b")
    cfg["text_config"]["layer_types"] = ["linear_attention"] * 60
    g = load_geometry(model_config=_write(tmp_path, cfg))
    assert g.linear_layer_ids == _qwen_ids(60, 4) and g.num_linear_layers == 45


# ---- dtype precedence: --mamba-ssm-dtype > SGLANG_MAMBA_SSM_DTYPE > config (Qwen only) > default ----


@pytest.mark.parametrize(
    ("flag", "env", "expected"),
    [
        (None, {}, "bfloat16"),  # config mamba_ssm_dtype (set to bf16 below) beats the fp32 default
        (None, {"SGLANG_MAMBA_SSM_DTYPE": "float16"}, "float16"),  # env beats config
        ("float32", {"SGLANG_MAMBA_SSM_DTYPE": "float16"}, "float32"),  # flag beats env
        ("bf16", {}, "bfloat16"),  # short spelling
    ],
)
@pytest.mark.parametrize(("name", "nested"), [("qwen3_next_80b_a3b", False), ("qwen3_5_397b_a17b", True)])
def test_ssm_dtype_precedence_for_qwen(
    fixtures_dir: Path,
    tmp_path: Path,
    name: str,
    nested: bool,
    flag: str | None,
    env: dict[str, str],
    expected: str,
) -> None:
    """The temporal dtype doubles or halves most of per_req; the wrong precedence shows as a wrong dtype."""
    cfg = _load(fixtures_dir, name)
    (cfg["text_config"] if nested else cfg)["mamba_ssm_dtype"] = "bfloat16"
    g = resolve_dtypes(load_geometry(model_config=_write(tmp_path, cfg)), env=env, mamba_ssm_dtype=flag)
    assert g.temporal_dtype == expected
    assert g.conv_dtype == "bfloat16"


@pytest.mark.parametrize("name", ["kimi_linear_48b_a3b", "granite_4_0_h_small"])
def test_config_ssm_dtype_is_ignored_outside_qwen(fixtures_dir: Path, tmp_path: Path, name: str) -> None:
    """Kimi-Linear and Granite SGLang code ignores the config dtype key: the default fp32 stays."""
    cfg = _load(fixtures_dir, name)
    cfg["mamba_ssm_dtype"] = "bfloat16"
    g = resolve_dtypes(load_geometry(model_config=_write(tmp_path, cfg)), env={})
    assert g.temporal_dtype == "float32"


def test_conv_dtype_env_and_per_req_bytes(fixtures_dir: Path) -> None:
    """SGLANG_MAMBA_CONV_DTYPE sets the conv dtype; per_req moves by exactly the conv bytes."""
    base = load_geometry(model_config=fixtures_dir / "qwen3_next_80b_a3b.json")
    g = resolve_dtypes(base, env={"SGLANG_MAMBA_CONV_DTYPE": "float32", "SGLANG_MAMBA_SSM_DTYPE": "bfloat16"})
    assert (g.conv_dtype, g.temporal_dtype) == ("float32", "bfloat16")
    assert g.per_req_bytes == (8192 * 3 * FP32 + 32 * 128 * 128 * BF16) * 36


@pytest.mark.parametrize(
    ("env", "flag", "needle"),
    [
        ({"SGLANG_MAMBA_CONV_DTYPE": "int8"}, None, "SGLANG_MAMBA_CONV_DTYPE='int8'"),
        ({"SGLANG_MAMBA_SSM_DTYPE": "fp8"}, None, "SGLANG_MAMBA_SSM_DTYPE='fp8'"),
        ({}, "double", "--mamba-ssm-dtype='double'"),
    ],
)
def test_unknown_dtype_is_a_flag_error(env: dict[str, str], flag: str | None, needle: str) -> None:
    with pytest.raises(FlagError) as info:
        resolve_dtypes(load_geometry(model="kimi-k3"), env=env, mamba_ssm_dtype=flag)
    assert needle in str(info.value)


# ---- the JSON model spec ----


def test_model_spec_geometry(tmp_path: Path) -> None:
    """A model spec's shapes are per-rank and its dtypes are honoured (tp_size does not divide them)."""
    spec = {
        "name": "toy",
        "num_hidden_layers": 6,
        "linear_layer_ids": [4, 0, 1, 3],
        "conv_shapes": [[64, 3], [32, 3]],
        "temporal_shape": [4, 16, 16],
        "dtypes": {"conv": "float16", "temporal": "bfloat16"},
        "extra_per_slot_bytes": 1000,
    }
    g = load_geometry(model_config=_write(tmp_path, spec), tp_size=2)
    assert g.name == "toy"
    assert g.linear_layer_ids == (0, 1, 3, 4)
    assert g.conv_shapes == ((64, 3), (32, 3)) and g.temporal_shape == (4, 16, 16)
    assert g.per_req_bytes == ((64 * 3 + 32 * 3) * FP16 + 4 * 16 * 16 * BF16) * 4
    assert g.extra_per_slot_bytes == 1000


# ---- config errors the core raises (the CLI's exit-2 path is in test_derive_cli.py) ----


def _mutate(fixtures_dir: Path, tmp_path: Path, name: str, edit: Any) -> Path:
    cfg = _load(fixtures_dir, name)
    edit(cfg)
    return _write(tmp_path, cfg)


def _kda(cfg: dict[str, Any]) -> list[int]:
    return cfg["linear_attn_config"]["kda_layers"]


@pytest.mark.parametrize(
    ("name", "edit", "tp", "needle"),
    [
        ("qwen3_next_80b_a3b", lambda c: c.pop("linear_num_key_heads"), 1, "'linear_num_key_heads'"),
        # Nested keys are named by their path, as the user would search the file for them.
        (
            "qwen3_5_397b_a17b",
            lambda c: c["text_config"].pop("full_attention_interval"),
            1,
            "'text_config.full_attention_interval'",
        ),
        ("nemotron_h_8b", lambda c: c.pop("hybrid_override_pattern"), 1, "'hybrid_override_pattern'"),
        ("falcon_h1_0_5b", lambda c: c.update(mamba_d_ssm=None, hidden_size=None), 1, "'hidden_size'"),
        ("granite_4_0_h_small", lambda c: c["layer_types"].pop(), 1, "layer_types"),
        (
            "kimi_linear_48b_a3b",
            lambda c: c["linear_attn_config"].pop("short_conv_kernel_size"),
            1,
            "'linear_attn_config.short_conv_kernel_size'",
        ),
        ("kimi_linear_48b_a3b", lambda c: _kda(c).append(28), 1, "kda_layers [28]"),
        ("kimi_linear_48b_a3b", lambda c: _kda(c).append(0), 1, "kda_layers [0]"),
        ("kimi_linear_48b_a3b", lambda c: _kda(c).append(26), 1, "kda_layers repeats [26]"),
        ("qwen3_next_80b_a3b", lambda c: c.update(model_type="llama"), 1, "'llama'"),
        ("qwen3_next_80b_a3b", lambda c: c.update(num_hidden_layers="48"), 1, "'48'"),
        # tp 3: groups -> 3, conv_dim 32*128 + 2*3*128 = 4864 does not divide by 3.
        ("qwen3_next_80b_a3b", lambda c: None, 3, "--tp-size 3"),
        ("nemotron_h_8b", lambda c: None, 256, "mamba_num_heads=128"),
        ("kimi_linear_48b_a3b", lambda c: None, 3, "--tp-size 3"),
    ],
)
def test_bad_configs_raise_config_errors(
    fixtures_dir: Path, tmp_path: Path, name: str, edit: Any, tp: int, needle: str
) -> None:
    """A config SGLang cannot load must fail here with one line naming the key or value."""
    path = _mutate(fixtures_dir, tmp_path, name, edit)
    with pytest.raises(CheckerInputError) as info:
        load_geometry(model_config=path, tp_size=tp)
    assert needle in str(info.value)
    assert "\n" not in str(info.value)


SHAPES = {"conv_shapes": [[8, 3]], "temporal_shape": [2, 4]}


@pytest.mark.parametrize(
    ("spec", "needle"),
    [
        ({"num_hidden_layers": 4, "linear_layer_ids": [0, 4], **SHAPES}, "[4]"),
        ({"num_hidden_layers": 4, "linear_layer_ids": [1, 1], **SHAPES}, "[1]"),
        ({"num_hidden_layers": 4, "linear_layer_ids": [-1], **SHAPES}, "[-1]"),
        (
            {"num_hidden_layers": 4, "linear_layer_ids": [0], "conv_shapes": [[8, 0]], "temporal_shape": [2]},
            "[8, 0]",
        ),
        ({"num_hidden_layers": 4, "linear_layer_ids": [0], "conv_shapes": [[8, 3]]}, "'temporal_shape'"),
        ({"num_hidden_layers": 4, "linear_layer_ids": [], **SHAPES}, "no linear-attention layers"),
    ],
)
def test_bad_model_spec(tmp_path: Path, spec: dict[str, Any], needle: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_geometry(model_config=_write(tmp_path, spec))
    assert needle in str(info.value)
