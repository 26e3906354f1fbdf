"""A Kimi-K3 config.json is read as SGLang reads it, not refused as a model without linear attention.

SGLang 0.5.23's ``KimiK3Config`` (``configs/kimi_k3.py:80-118``) builds its ``text_config`` as a
``KimiLinearConfig`` (``configs/kimi_linear.py``): the KDA layers (``linear_attn_config.kda_layers``,
1-based), the full-attention layers (the others, ``full_attention_layer_ids`` :169), the KDA state
(``mamba2_cache_params`` :172-182) and the MLA attention. ``configs/hybrid_arch.py`` ``kimi_linear_config``
returns that text config for the state pool; ``ModelConfig`` takes the MLA branch for
KimiK3ForConditionalGeneration (``configs/model_config.py:1463-1474``: head_dim 72, ``kv_lora_rank``,
``qk_rope_head_dim`` of the text config), so a stage's KV cell is ``(kv_lora_rank + qk_rope_head_dim) x
its full-attention layers x 2`` bytes in bf16. The class exists from 0.5.17 (``configs/kimi_k3.py`` and
the registry's KimiK3ForConditionalGeneration); older releases cannot load the file.

tests/fixtures/kimi_k3_config.json is written from those classes' fields with the built-in ``kimi-k3``
preset's geometry (93 layers, 69 KDA, MLA 512 + 64, 64 KDA heads of 128). Where the two describe the same
model they derive the same; the preset's conv state is the upstream unit test's ``(4096, 3)`` per layer,
not KDA's ``(K - 1, 3 * H * d)``, so the state per request is the one thing that differs.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from checker.core.errors import ConfigError
from checker.core.releases.releases import MODELLED_RELEASES
from checker.core.sizing.sizing import CapacityInputs, derive_all
from checker.families.geometry import load_geometry
from checker.families.rules import check_config

FIXTURE = Path(__file__).resolve().parent / "fixtures" / "kimi_k3_config.json"
FIRST = "0.5.17"


@pytest.mark.parametrize("tp", [1, 2, 4, 8])
def test_the_config_reads_as_the_presets_model(tp: int) -> None:
    config = load_geometry(model_config=FIXTURE, tp_size=tp)
    preset = load_geometry(model="kimi-k3", tp_size=tp)
    assert config.family == preset.family == "kimi_k3"
    assert config.num_hidden_layers == preset.num_hidden_layers == 93
    assert config.linear_layer_ids == preset.linear_layer_ids and len(config.linear_layer_ids) == 69
    assert config.temporal_shape == preset.temporal_shape == (64 // tp, 128, 128)
    assert config.attention == preset.attention  # MLA 512 + 64, the 24 full-attention layers, bf16
    assert config.attention is not None and config.attention.kv_lora_rank == 512
    assert config.context_len == preset.context_len == 4096  # KimiLinearConfig's max_position_embeddings
    # KDA's conv state (configs/mamba_utils.py KimiLinearStateShape): window first, q, k, v channels.
    assert config.conv_shapes == ((3, 3 * 64 * 128 // tp),)
    assert preset.conv_shapes == ((4096 // tp, 3),)


def test_it_derives_what_the_preset_derives_where_they_describe_the_same_model() -> None:
    """0.5.23, pp 8, 40 GiB, --max-mamba-cache-size 64, --max-total-tokens 100,000: the pool (branch A:
    64 slots), the KV cell of each stage's own full-attention layers ((512 + 64) x n x 2 B; stage 0
    [0, 11) holds layers 3 and 7, stage 7 [81, 93) 83, 87, 91 and 92), the capacity after the MIN
    (100,000), the request cap (min(clamp(int(100,000 / 4,096 x 512), 2048, 4096), 100,000 // 2, 64 //
    ratio)) and the micro-batch are the same; only the state per request differs (KDA conv 3 x 24,576 bf16
    per layer against the preset's 4,096 x 3)."""
    kw = dict(budget_gib=40.0, pp_size=8, max_mamba_cache_size=64, max_total_tokens=100_000)
    config = derive_all(CapacityInputs(geometry=load_geometry(model_config=FIXTURE), **kw))  # type: ignore[arg-type]
    preset = derive_all(CapacityInputs(geometry=load_geometry(model="kimi-k3"), **kw))  # type: ignore[arg-type]
    same = (
        "start_layer",
        "end_layer",
        "stage_linear_layers",
        "max_mamba_cache_size",
        "max_running_requests",
        "pp_max_micro_batch_size",
        "context_len",
        "kv_attention_layers",
        "kv_cell_bytes",
        "max_total_num_tokens",
    )
    for c, p in zip(config, preset, strict=True):
        assert {n: getattr(c, n) for n in same} == {n: getattr(p, n) for n in same}
    assert [s.kv_cell_bytes for s in config] == [(512 + 64) * s.kv_attention_layers * 2 for s in config]
    assert (config[0].kv_attention_layers, config[-1].kv_attention_layers) == (2, 4)
    assert {s.max_total_num_tokens for s in config} == {100_000}
    assert config[0].per_req_bytes == 69 * (3 * 3 * 64 * 128 * 2 + 64 * 128 * 128 * 4) == 299_581_440
    assert preset[0].per_req_bytes == 69 * (4096 * 3 * 2 + 64 * 128 * 128 * 4) == 291_102_720


def test_a_kimi_k3_config_is_not_called_a_model_without_linear_attention(cli) -> None:
    out = cli(["derive", "--budget-gib", "8", "--model-config", str(FIXTURE), "--format", "json"])
    assert out.rc == 0, out.err
    assert "no linear-attention" not in out.err
    ranks = json.loads(out.out)["ranks"]
    assert ranks and all(r["max_mamba_cache_size"] > 0 for r in ranks)


@pytest.mark.parametrize("release", ["0.5.2", "0.5.13", "0.5.16"])
def test_a_release_before_kimi_k3_refuses_it_naming_the_release(cli, release: str) -> None:
    out = cli(["derive", "--budget-gib", "8", "--sglang-version", release, "--model-config", str(FIXTURE)])
    assert out.rc == 2, out.out
    (line,) = out.err.strip().splitlines()
    assert f"SGLang {release} cannot load" in line and FIRST in line and "Traceback" not in line


def test_only_the_releases_with_its_config_class_load_it_whatever_the_architecture() -> None:
    """Read per release (scripts/build_config_rules.py, ``kimi_k3.config_class``): 0.5.17-0.5.23 have
    configs/kimi_k3.py; before, no config class reads the model_type, even with no architectures named."""
    data = json.loads(FIXTURE.read_text())
    del data["architectures"]
    for release in MODELLED_RELEASES:
        if MODELLED_RELEASES.index(release) >= MODELLED_RELEASES.index(FIRST):
            check_config(release, data, source="c.json")
            continue
        with pytest.raises(ConfigError, match=f"SGLang {release} cannot load c.json: model_type='kimi_k3'"):
            check_config(release, data, source="c.json")


def test_its_text_config_is_held_to_kimi_linears_checks() -> None:
    """KimiLinearConfig asserts ``linear_attn_config["full_attn_layers"] is not None`` (0.5.23
    configs/kimi_linear.py:121): a Kimi-K3 text_config without it stops SGLang at load."""
    data = json.loads(FIXTURE.read_text())
    data["text_config"]["linear_attn_config"]["full_attn_layers"] = None
    with pytest.raises(ConfigError) as exc:
        check_config("0.5.23", data, source="c.json")
    line = str(exc.value)
    assert "text_config.linear_attn_config.full_attn_layers=None" in line
    assert "sglang/srt/configs/kimi_linear.py:121" in line
