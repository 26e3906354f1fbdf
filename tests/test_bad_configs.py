"""Bad model configs and model specs: refused up front, in bounded time and memory, with one line.

Each family's fixture is mutated the way a hand-edited or machine-generated config goes wrong (a layer
count no model has, NaN or Infinity, -1, "", a list where a dtype name belongs, JSON nested 100,000 deep,
a 50 MB file, a model directory). The invariant: a :class:`ConfigError` (exit 2 in every command) whose one
line names the key as the user wrote it (``text_config.num_hidden_layers`` for a nested one) and stays
short, instead of a traceback, a RecursionError, minutes of work or gigabytes of memory on every rank.

The limits are sized from real models (checker/core/sizing/geometry.py explains each one); the "largest
accepted" tests below show they leave a valid 10,000-layer model deriving in milliseconds.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from checker.core.errors import CheckerInputError, ConfigError, FlagError
from checker.core.sizing.geometry import MAX_DIM, MAX_LAYERS, resolve_dtypes
from checker.core.sizing.models import MAX_CONFIG_BYTES
from checker.core.sizing.sizing import CapacityInputs, derive_all
from checker.families.geometry import load_geometry

NAN, INF = float("nan"), float("inf")
# An error line quotes values shortened; a line this long would mean a value was pasted whole.
MAX_MESSAGE_CHARS = 600
# Qwen3-Next-80B-A3B's per_req at TP 1 (sglang/srt/configs/qwen3_next.py ``mamba2_cache_params``): 36 linear
# layers x (conv (8192, 3) bf16 + temporal (32, 128, 128) fp32) = 77,266,944 bytes.
QWEN_NEXT_BYTES_PER_LAYER = 77_266_944 // 36

TOY_SPEC: dict[str, Any] = {
    "name": "toy",
    "num_hidden_layers": 4,
    "linear_layer_ids": [0, 1, 3],
    "conv_shapes": [[64, 3]],
    "temporal_shape": [4, 16, 16],
    "context_len": 4096,
    "attention": {"full_attention_layer_ids": [2], "num_key_value_heads": 2, "head_dim": 64},
}


def _fixture(fixtures_dir: Path, name: str) -> dict[str, Any]:
    if name == "spec":
        return json.loads(json.dumps(TOY_SPEC))
    return json.loads((fixtures_dir / f"{name}.json").read_text())


def _set(path: str, value: Any) -> Callable[[dict[str, Any]], None]:
    """An edit that sets a dotted key path (``text_config.num_hidden_layers``) to ``value``."""

    def edit(cfg: dict[str, Any]) -> None:
        *parents, last = path.split(".")
        for p in parents:
            cfg = cfg[p]
        cfg[last] = value

    return edit


def _raw(key: str, literal: str) -> Callable[[str], str]:
    """A text edit: the value of top-level ``key`` becomes ``literal`` as written (e.g. ``1e400``)."""

    def edit(text: str) -> str:
        cfg = json.loads(text)
        cfg[key] = "@@"
        return json.dumps(cfg).replace('"@@"', literal)

    return edit


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "config.json"
    path.write_text(text)
    return path


# (case id, fixture, edit of the dict or None, edit of the text or None, what the message must name)
# fmt: off
CASES: list[tuple[str, str, Any, Any, str]] = [
    # ---- Qwen3-Next: top-level keys ----
    ("qwen-layers", "qwen3_next_80b_a3b", _set("num_hidden_layers", MAX_LAYERS + 1), None,
     f"num_hidden_layers={MAX_LAYERS + 1}"),
    ("qwen-nan", "qwen3_next_80b_a3b", _set("linear_key_head_dim", NAN), None, "linear_key_head_dim=NaN"),
    # NaN/Infinity are refused anywhere, also in keys the sizing never reads.
    ("qwen-inf-unread-key", "qwen3_next_80b_a3b", _set("rope_theta", INF), None, "rope_theta=Infinity"),
    ("qwen-context-neg", "qwen3_next_80b_a3b", _set("max_position_embeddings", -1), None,
     "max_position_embeddings=-1"),
    ("qwen-dtype-empty", "qwen3_next_80b_a3b", _set("mamba_ssm_dtype", ""), None, "mamba_ssm_dtype=''"),
    ("qwen-dtype-list", "qwen3_next_80b_a3b", _set("mamba_ssm_dtype", ["bfloat16"]), None,
     "mamba_ssm_dtype=['bfloat16']"),
    ("qwen-bool-int", "qwen3_next_80b_a3b", _set("linear_num_value_heads", True), None,
     "linear_num_value_heads=True"),
    ("qwen-kernel-1", "qwen3_next_80b_a3b", _set("linear_conv_kernel_dim", 1), None,
     "linear_conv_kernel_dim=1"),
    # Each key within its cap, the product past any real conv width: the message names the product's keys.
    ("qwen-product", "qwen3_next_80b_a3b", _set("linear_value_head_dim", MAX_DIM), None,
     "linear_num_value_heads * linear_value_head_dim"),
    ("qwen-model-type-list", "qwen3_next_80b_a3b", _set("model_type", ["qwen3_next"]), None,
     "model_type=['qwen3_next']"),
    # ---- Qwen3.5: keys nested in text_config are named by their path ----
    ("qwen35-layers", "qwen3_5_397b_a17b", _set("text_config.num_hidden_layers", 10**9), None,
     "text_config.num_hidden_layers=1000000000"),
    ("qwen35-dtype-empty", "qwen3_5_397b_a17b", _set("text_config.mamba_ssm_dtype", ""), None,
     "text_config.mamba_ssm_dtype=''"),
    ("qwen35-string-int", "qwen3_5_397b_a17b", _set("text_config.linear_num_key_heads", "16"), None,
     "text_config.linear_num_key_heads='16'"),
    ("qwen35-context-inf", "qwen3_5_397b_a17b", _set("text_config.max_position_embeddings", -INF), None,
     "text_config.max_position_embeddings=-Infinity"),
    ("qwen35-text-config-list", "qwen3_5_397b_a17b", _set("text_config", []), None, "text_config=[]"),
    # ---- Kimi-Linear: keys nested in linear_attn_config ----
    ("kimi-layers", "kimi_linear_48b_a3b", _set("num_hidden_layers", MAX_LAYERS + 1), None,
     "num_hidden_layers=10001"),
    ("kimi-bool", "kimi_linear_48b_a3b", _set("linear_attn_config.num_heads", False), None,
     "linear_attn_config.num_heads=False"),
    ("kimi-nan", "kimi_linear_48b_a3b", _set("linear_attn_config.head_dim", NAN), None,
     "linear_attn_config.head_dim=NaN"),
    ("kimi-kernel-neg", "kimi_linear_48b_a3b", _set("linear_attn_config.short_conv_kernel_size", -1), None,
     "linear_attn_config.short_conv_kernel_size=-1"),
    # 10**5 ids for a 27-layer model: refused by count before any per-id work.
    ("kimi-kda-huge", "kimi_linear_48b_a3b", _set("linear_attn_config.kda_layers", [1] * 10**5), None,
     "linear_attn_config.kda_layers="),
    # ---- Nemotron-H: the pattern string is the layer count ----
    ("nemotron-pattern-huge", "nemotron_h_8b", _set("hybrid_override_pattern", "M" * (MAX_LAYERS + 1)),
     None, "hybrid_override_pattern="),
    ("nemotron-pattern-empty", "nemotron_h_8b", _set("hybrid_override_pattern", ""), None,
     "hybrid_override_pattern=''"),
    ("nemotron-zero", "nemotron_h_8b", _set("mamba_num_heads", 0), None, "mamba_num_heads=0"),
    ("nemotron-1e400", "nemotron_h_8b", None, _raw("ssm_state_size", "1e400"), "ssm_state_size=1e400"),
    ("nemotron-float", "nemotron_h_8b", _set("conv_kernel", 4.5), None, "conv_kernel=4.5"),
    # ---- Falcon-H1 ----
    ("falcon-layers", "falcon_h1_0_5b", _set("num_hidden_layers", MAX_LAYERS + 1), None,
     "num_hidden_layers=10001"),
    ("falcon-expand-nan", "falcon_h1_0_5b", _set("mamba_expand", NAN), None, "mamba_expand=NaN"),
    # A finite expand whose product with hidden_size overflows any real width (and int(inf) at 1.7e308).
    ("falcon-expand-huge", "falcon_h1_0_5b", lambda c: c.update(mamba_d_ssm=None, mamba_expand=1.7e308),
     None, "mamba_expand * hidden_size"),
    ("falcon-string", "falcon_h1_0_5b", _set("mamba_d_ssm", "1536"), None, "mamba_d_ssm='1536'"),
    ("falcon-neg", "falcon_h1_0_5b", _set("mamba_d_head", -1), None, "mamba_d_head=-1"),
    # ---- Granite-4.0-H ----
    ("granite-layers", "granite_4_0_h_small", _set("num_hidden_layers", MAX_LAYERS + 1), None,
     "num_hidden_layers=10001"),
    ("granite-expand-string", "granite_4_0_h_small", _set("mamba_expand", "2"), None, "mamba_expand='2'"),
    ("granite-layer-types-str", "granite_4_0_h_small", _set("layer_types", "mamba"), None, "layer_types"),
    # Past Python's 4,300-digit int() limit, which json does not turn into a JSONDecodeError.
    ("granite-int-5000-digits", "granite_4_0_h_small", None, _raw("vocab_size", "9" * 5000), "vocab_size="),
    # ---- the JSON model spec ----
    ("spec-layers", "spec", _set("num_hidden_layers", MAX_LAYERS + 1), None, "num_hidden_layers=10001"),
    ("spec-dtype-empty", "spec", _set("dtypes", {"conv": ""}), None, "dtypes.conv=''"),
    ("spec-dtype-list", "spec", _set("dtypes", {"temporal": ["float32"]}), None,
     "dtypes.temporal=['float32']"),
    ("spec-dtypes-empty", "spec", _set("dtypes", ""), None, "dtypes=''"),
    ("spec-ids-too-many", "spec", _set("linear_layer_ids", [0] * 1000), None, "linear_layer_ids="),
    ("spec-shape-huge", "spec", _set("temporal_shape", [MAX_DIM, MAX_DIM]), None, "temporal_shape"),
    ("spec-conv-states", "spec", _set("conv_shapes", [[8, 3]] * 17), None, "conv_shapes="),
    ("spec-extra-neg", "spec", _set("extra_per_slot_bytes", -1), None, "extra_per_slot_bytes=-1"),
    ("spec-name-empty", "spec", _set("name", ""), None, "name=''"),
    # SGLang gives each key head num_v_heads // num_k_heads value heads (qwen3_next.py): 33 / 16 cannot load.
    ("qwen-value-heads-not-multiple", "qwen3_next_80b_a3b", _set("linear_num_value_heads", 33), None,
     "linear_num_value_heads=33 must be a multiple of linear_num_key_heads=16"),
    ("qwen35-value-heads-not-multiple", "qwen3_5_397b_a17b", _set("text_config.linear_num_value_heads", 63),
     None, "text_config.linear_num_value_heads=63 must be a multiple of text_config.linear_num_key_heads"),
    # transformers reads config.json with json.loads, which refuses a byte-order mark: SGLang cannot load it.
    ("qwen-bom", "qwen3_next_80b_a3b", None, lambda t: "\ufeff" + t, "starts with a UTF-8 byte-order mark"),
    # Names are printed in every report and log line: no line breaks, NUL or right-to-left overrides.
    ("spec-name-newline", "spec", _set("name", "toy\nchecker: CONSISTENT"), None,
     "name='toy\\nchecker: CONSISTENT' must be printable text"),
    ("spec-name-nul", "spec", _set("name", "toy\x00"), None, "name='toy\\x00' must be printable text"),
    ("spec-name-rlo", "spec", _set("name", "toy\u202etxt.exe"), None, "must be printable text"),
    ("spec-model-type-newline", "spec", _set("model_type", "qwen3_next\n"), None,
     "model_type='qwen3_next\\n' must be printable text"),
    # ---- nesting: within the parser's reach the path is named, past it the rule is ----
    ("nest-65", "qwen3_next_80b_a3b", _set("deep", json.loads("[" * 65 + "]" * 65)), None, "deep[0][0]"),
    ("nest-100000", "qwen3_next_80b_a3b", None,
     lambda t: t[:-1] + ', "deep": ' + "[" * 100_000 + "]" * 100_000 + "}", "nests deeper than 64"),
]
# fmt: on


@pytest.mark.parametrize(
    ("name", "edit", "text_edit", "needle"),
    [pytest.param(*c[1:], id=c[0]) for c in CASES],
)
def test_bad_config_is_one_config_error_naming_the_key(
    fixtures_dir: Path, tmp_path: Path, name: str, edit: Any, text_edit: Any, needle: str
) -> None:
    """A bad value must stop at load with a ConfigError naming it; a traceback, a RecursionError, a NaN in
    the sizing or minutes of work would show as a different exception, a missing key name, or a slow test."""
    cfg = _fixture(fixtures_dir, name)
    if edit is not None:
        edit(cfg)
    text = json.dumps(cfg)  # writes NaN / Infinity for the float edits, as a careless tool would
    if text_edit is not None:
        text = text_edit(text)
    path = _write(tmp_path, text)
    t0 = time.perf_counter()
    with pytest.raises(ConfigError) as info:
        load_geometry(model_config=path, tp_size=1)
    elapsed = time.perf_counter() - t0
    msg = str(info.value)
    assert needle in msg
    assert "\n" not in msg and len(msg) < MAX_MESSAGE_CHARS, msg
    assert elapsed < 2.0, f"refusing took {elapsed:.2f}s"


def test_the_unmutated_fixtures_still_load(fixtures_dir: Path) -> None:
    """The limits must not refuse a real config: each fixture loads as it is."""
    for path in sorted(fixtures_dir.glob("*.json")):
        assert load_geometry(model_config=path).num_linear_layers > 0


def test_a_50mb_file_is_refused_by_size_without_reading_it(tmp_path: Path) -> None:
    """A weights file passed as --model-config: refused after reading MAX_CONFIG_BYTES + 1, not 50 MB."""
    path = tmp_path / "model.safetensors"
    with path.open("wb") as f:
        f.write(b'{"model_type": "qwen3_next", "pad": "')
        f.truncate(50 * 2**20)  # sparse: costs no disk
    t0 = time.perf_counter()
    with pytest.raises(ConfigError, match="larger than 4 MiB") as info:
        load_geometry(model_config=path)
    assert str(path) in str(info.value)
    assert time.perf_counter() - t0 < 2.0
    assert MAX_CONFIG_BYTES == 4 * 2**20


def test_a_model_directory_resolves_to_its_config_json(fixtures_dir: Path, tmp_path: Path) -> None:
    """SGLang users pass the model directory (--model-path habit): DIR means DIR/config.json, so the
    geometry is the file's own (Qwen3-Next-80B-A3B's per_req, 77,266,944 bytes at TP 1)."""
    model_dir = tmp_path / "Qwen3-Next-80B-A3B"
    model_dir.mkdir()
    (model_dir / "config.json").write_text((fixtures_dir / "qwen3_next_80b_a3b.json").read_text())
    for given in (model_dir, str(model_dir), f"{model_dir}/"):
        g = load_geometry(model_config=given)
        assert g.num_linear_layers == 36
        assert g.per_req_bytes == 77_266_944


def test_an_empty_model_config_path_is_not_the_current_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Path("") means "."; an empty --model-config must not quietly read ./config.json."""
    (tmp_path / "config.json").write_text("{}")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError, match="--model-config '' is empty"):
        load_geometry(model_config="")


def test_a_directory_without_config_json_is_one_clear_error(tmp_path: Path) -> None:
    (tmp_path / "model.safetensors").write_bytes(b"")
    with pytest.raises(ConfigError) as info:
        load_geometry(model_config=tmp_path)
    msg = str(info.value)
    assert f"--model-config {tmp_path}" in msg and "without config.json" in msg


@pytest.mark.parametrize(
    ("flag", "env", "cls", "needle"),
    [
        ("", {}, FlagError, "--mamba-ssm-dtype=''"),  # empty is not unset
        ("   ", {}, FlagError, "--mamba-ssm-dtype='   '"),
        (None, {"SGLANG_MAMBA_SSM_DTYPE": "bf16"}, FlagError, "SGLANG_MAMBA_SSM_DTYPE='bf16'"),
    ],
)
def test_empty_or_misspelt_dtype_names_its_source(
    flag: str | None, env: dict[str, str], cls: type[CheckerInputError], needle: str
) -> None:
    """An empty --mamba-ssm-dtype used to fall through to the env and config: a silent fp32 default."""
    with pytest.raises(cls) as info:
        resolve_dtypes(load_geometry(model="kimi-k3"), env=env, mamba_ssm_dtype=flag)
    assert needle in str(info.value)


def test_a_misspelt_config_dtype_is_a_config_error(fixtures_dir: Path, tmp_path: Path) -> None:
    """The config's own mamba_ssm_dtype is a config problem (ConfigError), named with its file."""
    cfg = _fixture(fixtures_dir, "qwen3_next_80b_a3b")
    cfg["mamba_ssm_dtype"] = "bf16"
    g = load_geometry(model_config=_write(tmp_path, json.dumps(cfg)))
    with pytest.raises(ConfigError, match="mamba_ssm_dtype='bf16'"):
        resolve_dtypes(g, env={})


# ---- the largest accepted configs derive fast ----


def _largest(fixtures_dir: Path, name: str) -> tuple[dict[str, Any], int]:
    """The fixture scaled to MAX_LAYERS layers; returns it and its number of linear layers."""
    cfg = _fixture(fixtures_dir, name)
    L = MAX_LAYERS
    if name == "qwen3_next_80b_a3b":
        cfg["num_hidden_layers"] = L
        return cfg, L - L // 4  # every 4th layer is full attention
    if name == "kimi_linear_48b_a3b":
        cfg["num_hidden_layers"] = L
        cfg["linear_attn_config"]["kda_layers"] = [i for i in range(1, L + 1) if i % 4]
        return cfg, L - L // 4
    if name == "nemotron_h_8b":
        cfg["hybrid_override_pattern"] = "M-" * (L // 2)
        return cfg, L // 2
    if name == "falcon_h1_0_5b":
        cfg["num_hidden_layers"] = L
        return cfg, L  # every layer holds state
    if name == "granite_4_0_h_small":
        cfg["num_hidden_layers"] = L
        cfg["layer_types"] = ["mamba", "attention"] * (L // 2)
        return cfg, L // 2
    spec = {
        **cfg,
        "num_hidden_layers": L,
        "linear_layer_ids": list(range(L)),
        "conv_shapes": [[MAX_DIM // 2, 3]] * 16,
        "temporal_shape": [64, 128, 128],
        "attention": {"full_attention_layer_ids": list(range(L)), "num_key_value_heads": 8, "head_dim": 128},
    }
    return spec, L


@pytest.mark.parametrize(
    "name",
    [
        "qwen3_next_80b_a3b",
        "kimi_linear_48b_a3b",
        "nemotron_h_8b",
        "falcon_h1_0_5b",
        "granite_4_0_h_small",
        "spec",
    ],
)
def test_largest_accepted_config_derives_in_bounded_time(
    fixtures_dir: Path, tmp_path: Path, name: str
) -> None:
    """MAX_LAYERS layers load and derive at pp 1, 8 and 64 in well under a second (measured: tens of ms);
    before the limits, 10**9 layers derived for minutes at 6.7 GB per rank. One more layer is refused."""
    cfg, num_linear = _largest(fixtures_dir, name)
    path = _write(tmp_path, json.dumps(cfg))
    t0 = time.perf_counter()
    g = load_geometry(model_config=path)
    for pp in (1, 8, 64):
        stages = derive_all(CapacityInputs(geometry=g, budget_gib=10_000.0, pp_size=pp, page_size=1))
        assert sum(s.stage_linear_layers for s in stages) == num_linear
    elapsed = time.perf_counter() - t0
    assert g.num_hidden_layers == MAX_LAYERS and g.num_linear_layers == num_linear
    if name == "qwen3_next_80b_a3b":
        assert g.per_req_bytes == QWEN_NEXT_BYTES_PER_LAYER * num_linear
    assert elapsed < 2.0, f"{name}: load + 3 derivations took {elapsed:.2f}s"


# ---- end to end: exit 2, one stderr line, no traceback, bounded by a timeout ----


def _qwen_next(fixtures_dir: Path) -> dict[str, Any]:
    return _fixture(fixtures_dir, "qwen3_next_80b_a3b")


@pytest.mark.parametrize(
    ("case", "needle"),
    [
        # 10**9 layers: minutes and 6.7 GB before the limit; the subprocess timeout bounds a regression.
        ("layers", "num_hidden_layers=1000000000"),
        ("nan", "mamba_expand=NaN"),
        ("deep", "nests deeper than 64"),
        ("empty-dir", "without config.json"),
    ],
)
def test_derive_cli_exits_2_with_one_line(
    fixtures_dir: Path, tmp_path: Path, run_checker: Callable[..., Any], case: str, needle: str
) -> None:
    """What a user sees: `python -m checker derive --model-config BAD` ends with exit code 2 and one line
    on stderr naming the key, never a traceback."""
    if case == "layers":
        target: Path = _write(tmp_path, json.dumps({**_qwen_next(fixtures_dir), "num_hidden_layers": 10**9}))
    elif case == "nan":
        cfg = _fixture(fixtures_dir, "falcon_h1_0_5b")
        target = _write(tmp_path, json.dumps({**cfg, "mamba_d_ssm": None, "mamba_expand": NAN}))
    elif case == "deep":
        target = _write(tmp_path, "[" * 100_000 + "]" * 100_000)
    else:
        target = tmp_path / "empty-model-dir"
        target.mkdir()
    res = run_checker(["derive", "--model-config", str(target)])
    assert res.returncode == 2, res.stderr
    lines = res.stderr.splitlines()
    assert len(lines) == 1, res.stderr
    assert "Traceback" not in res.stderr
    assert needle in lines[0]
    assert res.stdout == ""


# ---- models the check does not apply to, and paths and files that are not a config ----------------------

# Meta-Llama-3.1-8B-Instruct's config.json (abridged to the keys that tell a model's kind).
LLAMA = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "num_attention_heads": 32,
    "num_hidden_layers": 32,
    "num_key_value_heads": 8,
    "max_position_embeddings": 131072,
    "torch_dtype": "bfloat16",
}


def test_a_model_without_a_state_pool_is_told_the_check_does_not_apply(tmp_path: Path) -> None:
    """A Llama has no state pool: "describe it with a JSON model spec" would send the user to describe
    layers that do not exist. A hybrid family the checker does not read still gets that advice."""
    with pytest.raises(ConfigError) as info:
        load_geometry(model_config=_write(tmp_path, json.dumps(LLAMA)))
    msg = str(info.value)
    assert "model_type='llama' has no linear-attention (mamba) layers" in msg
    assert "nothing for this check to compare" in msg and "model spec" not in msg
    for hybrid in (
        {**LLAMA, "model_type": "lfm2"},
        {**LLAMA, "model_type": "newhybrid", "mamba_d_state": 128},
    ):
        with pytest.raises(ConfigError, match="describe it with a JSON model spec"):
            load_geometry(model_config=_write(tmp_path, json.dumps(hybrid)))


def test_a_model_spec_may_carry_a_byte_order_mark(tmp_path: Path) -> None:
    """The spec is the checker's own file (SGLang never reads it): a BOM there is harmless."""
    path = _write(tmp_path, "\ufeff" + json.dumps(TOY_SPEC))
    assert load_geometry(model_config=path).name == "toy"


@pytest.mark.parametrize("flag", ["--model-config", "--model-path"])
def test_a_path_longer_than_the_system_allows_is_one_line(cli, flag: str) -> None:
    """Path.is_dir() raised OSError "File name too long" (under torchrun: no report at all)."""
    path = "/tmp/" + "m" * 5000
    argv = (
        ["derive", "--model-config", path]
        if flag == "--model-config"
        else ["derive", "--", "python", "-m", "sglang.launch_server", "--model-path", path]
    )
    res = cli(argv)
    (line,) = res.err.splitlines()
    assert res.rc == 2 and f"{flag} /tmp/mmm" in line and "File name too long" in line, res
    assert "(5,005 chars)" in line and len(line) < MAX_MESSAGE_CHARS


def test_a_fifo_nobody_writes_is_bounded_and_one_that_is_written_is_read(
    cli, fixtures_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`derive --model-config FIFO` hung for ever; `--model-config <(cat config.json)` (a pipe someone
    writes) is a real way to pass a config, so it still works."""
    import threading

    from checker.core.sizing import models

    monkeypatch.setattr(models, "READ_S", 0.5)
    fifo = tmp_path / "config.json"
    os.mkfifo(fifo)
    t0 = time.monotonic()
    res = cli(["derive", "--model-config", str(fifo)])
    (line,) = res.err.splitlines()
    assert res.rc == 2 and "nothing to read within 0.5 s" in line, res
    assert time.monotonic() - t0 < 3

    def write() -> None:
        with open(fifo, "w") as f:
            f.write((fixtures_dir / "qwen3_next_80b_a3b.json").read_text())

    writer = threading.Thread(target=write, daemon=True)
    writer.start()
    assert load_geometry(model_config=fifo).family == "qwen3_next"
    writer.join(5)


def test_a_socket_given_as_the_model_config_is_refused(tmp_path: Path) -> None:
    import socket

    path = tmp_path / "s"
    if len(str(path)) > 100:
        pytest.skip("tmp_path too long for a unix socket name")
    with socket.socket(socket.AF_UNIX) as s:
        s.bind(str(path))
        with pytest.raises(ConfigError, match=r"is a socket; pass the model's config.json"):
            load_geometry(model_config=path)


def test_a_config_path_with_control_characters_is_shown_escaped(fixtures_dir: Path, tmp_path: Path) -> None:
    """The geometry's name (every report line) and every message show a path's newline as \\n."""
    d = tmp_path / "bad\nname"
    d.mkdir()
    (d / "config.json").write_text((fixtures_dir / "qwen3_next_80b_a3b.json").read_text())
    name = load_geometry(model_config=d).name
    assert "\n" not in name and "bad\\nname" in name
    with pytest.raises(ConfigError) as info:
        load_geometry(model_config=tmp_path / "gone\u202e")
    assert "\u202e" not in str(info.value) and "gone\\u202e" in str(info.value)
