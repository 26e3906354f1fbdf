"""No weights figure from a checkpoint SGLang would read otherwise, or not load at all.

The weights figure is the bf16/fp16/fp32 parameters the release's class holds
(checker/core/weights/weights.py).
A quantized checkpoint holds other bytes, so it is refused in one line where SGLang would read a
quantization: config.json's ``quantization_config`` (as before), its ``compression_config``
(compressed-tensors) and a ``hf_quant_config.json`` beside it (ModelOpt; 0.5.23
``configs/model_config.py`` ``_parse_quant_hf_config``), and float8 tensors in the shards under a
config that declares nothing. And Falcon-H1's ``load_weights`` (``models/falcon_h1.py``, every release)
has no filter for a tensor its class has no parameter for: ``params_dict[name]`` raises KeyError (a
36-layer checkpoint under a 32-layer config, ``*.weight_scale_inv`` without a quantization config), so
the checker names that tensor and its shard instead of a figure. What a user relies on: each of these
ends ``derive --gpu-free-gib`` (and every command that reads the checkpoint) in one line, exit 2, and
the same checkpoint without it derives.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from checker.core.releases.releases import MODELLED_RELEASES
from tests.checkpoints import model_dir, model_tensors, write_checkpoint

FIXTURES = Path(__file__).parent / "fixtures"
FALCON = FIXTURES / "falcon_h1_0_5b.json"
NEMOTRON = FIXTURES / "nemotron_h_8b.json"
DERIVE = ["derive", "--gpu-free-gib", "79", "--mem-fraction-static", "0.85", "--pp-size", "1"]


def _derive(cli: Callable[..., Any], directory: Path) -> Any:
    return cli([*DERIVE, "--model-config", str(directory)])


def _one_line(res: Any) -> str:
    assert res.rc == 2 and res.out == "", res
    (line,) = res.err.strip().splitlines()
    assert "Traceback" not in line
    return line


# -- a quantization declared where SGLang reads it ---------------------------------------------------------


@pytest.mark.parametrize(
    ("where", "content", "says"),
    [
        (  # ModelOpt FP8 and NVFP4 are modelled (tests/test_quant_weights.py, test_modelopt_fp4.py):
            # NVFP4_AWQ is refused by name
            "hf_quant_config.json",
            {"producer": {"name": "modelopt"}, "quantization": {"quant_algo": "NVFP4_AWQ", "group_size": 16}},
            "quantized (modelopt NVFP4_AWQ, hf_quant_config.json; SGLang's modelopt_fp4",
        ),
        (
            "hf_quant_config.json",
            {"quantization": {"quant_algo": "MIXED_PRECISION"}},
            "quantized (modelopt MIXED_PRECISION, hf_quant_config.json)",
        ),
        (  # compressed-tensors FP8 W8A8 and INT W4A16 are modelled for Falcon-H1 too
            # (test_quant_families.py): an INT8 W8A8 compression_config is refused naming the scheme
            "compression_config",
            {
                "format": "int-quantized",
                "quant_method": "compressed-tensors",
                "config_groups": {
                    "group_0": {
                        "targets": ["Linear"],
                        "weights": {"num_bits": 8, "type": "int", "strategy": "channel", "symmetric": True},
                        "input_activations": {
                            "num_bits": 8,
                            "type": "int",
                            "strategy": "token",
                            "dynamic": True,
                        },
                    }
                },
            },
            "quantized (compressed-tensors INT8 W8A8 (CompressedTensorsW8A8Int8)); the checker models",
        ),
        (
            "quantization_config",
            {"quant_method": "awq", "bits": 4, "group_size": 128, "zero_point": True},
            "quantized (awq as awq_marlin, INT4 group 128 with zero points); the checker models that method",
        ),
    ],
    ids=["modelopt-nvfp4-awq", "modelopt-mixed", "compressed-tensors", "quantization_config"],
)
def test_a_quantization_declared_where_sglang_reads_it_is_refused(cli, tmp_path, where, content, says):
    """A quantization the checker does not model, declared where SGLang reads it: refused naming it, never
    sized as bf16 (Falcon-H1 under a ModelOpt hf_quant_config.json was "weights 1.09 GiB", the
    unquantized figure; its FP8 is now derived, tests/test_quant_weights.py)."""
    d = model_dir(tmp_path / "m", FALCON, shards=1)
    assert _derive(cli, d).rc == 0  # the unquantized checkpoint derives
    if where.endswith(".json"):
        (d / where).write_text(json.dumps(content))
    else:
        cfg = json.loads((d / "config.json").read_text())
        cfg[where] = content
        (d / "config.json").write_text(json.dumps(cfg))
    line = _one_line(_derive(cli, d))
    assert says in line and "--weights-gib" in line, line


def test_an_unreadable_hf_quant_config_is_refused_as_sglang_fails_on_it(cli, tmp_path):
    d = model_dir(tmp_path / "m", FALCON, shards=1)
    (d / "hf_quant_config.json").write_text("{not json")
    line = _one_line(_derive(cli, d))
    assert "hf_quant_config.json" in line and "not JSON" in line, line


def test_float8_tensors_under_a_config_that_declares_nothing_are_refused(cli, tmp_path):
    """A checkpoint of F8_E4M3 weights whose config.json declares no quantization: read as bf16 it would
    be half the figure; SGLang casts the values without their scales. Refused naming a tensor and shard."""
    cfg = json.loads(NEMOTRON.read_text())
    d = tmp_path / "m"
    d.mkdir()
    (d / "config.json").write_text(json.dumps(cfg))
    write_checkpoint(d, model_tensors(cfg, dtype="F8_E4M3"), shards=2)
    line = _one_line(_derive(cli, d))
    assert "F8_E4M3" in line and "in shard 'model-0000" in line and "declares no quantization" in line, line


# -- Falcon-H1: a tensor its class has no parameter for ----------------------------------------------------


def test_a_checkpoint_with_more_layers_than_the_config_is_refused_naming_tensor_and_shard(cli, tmp_path):
    """config.json of 32 layers beside the 36-layer checkpoint: 0.5.23's load_weights raises KeyError on
    the first tensor of layer 32 it has no parameter for (models/falcon_h1.py:552); the checker derived a
    32-layer figure."""
    d = model_dir(tmp_path / "m", FALCON, shards=3)
    cfg = json.loads((d / "config.json").read_text())
    cfg["num_hidden_layers"] = 32
    (d / "config.json").write_text(json.dumps(cfg))
    line = _one_line(_derive(cli, d))
    assert "tensor 'model.layers.3" in line and "in shard 'model-0000" in line, line
    assert "KeyError" in line and "models/falcon_h1.py:552" in line, line


SKIPPED_BY_LOAD = ("model.layers.0.mamba.out_proj.bias", "model.layers.0.self_attn.rotary_emb.inv_freq")
"""Names Falcon-H1's load_weights leaves to no parameter without a word: a bias the class has none of,
the rotary cache."""
UNKNOWN = (
    "model.layers.0.mamba.in_proj.weight_scale_inv",
    "model.layers.0.self_attn.q_proj.weight_scale_inv",
    "model.layers.40.self_attn.q_proj.weight",
    "model.layers.40.input_layernorm.weight",
)
"""Names it indexes params_dict with and has no parameter for (a stacked projection's too): KeyError."""


@pytest.mark.parametrize("name", UNKNOWN)
def test_scale_tensors_and_extra_layers_are_refused(cli, tmp_path, name):
    """``*.weight_scale_inv`` beside bf16 weights with no quantization config, or a layer the config does
    not have: no parameter takes them, and load_weights raises."""
    d = model_dir(tmp_path / "m", FALCON, shards=2, extra=[(name, (1, 1), "F32")])
    line = _one_line(_derive(cli, d))
    assert f"tensor {name!r}" in line, line


def test_the_names_load_weights_skips_are_no_refusal(cli, tmp_path):
    cfg = json.loads(FALCON.read_text())
    skipped = [(SKIPPED_BY_LOAD[0], (cfg["hidden_size"],), "BF16"), (SKIPPED_BY_LOAD[1], (32,), "F32")]
    ok = model_dir(tmp_path / "ok", FALCON, shards=2, extra=skipped)
    assert _derive(cli, ok).rc == 0


_PROBE = """
import os, sys, importlib
from pathlib import Path
sys.path.insert(0, sys.argv[1])
import pp_meta_build as pm
sys.meta_path.insert(0, pm._ImportOnly())
os.environ.setdefault("SGLANG_ROPE_CACHE_FP32", "1")
import torch
class _NoStream:
    def __init__(self, *a, **k): pass
torch.cuda.Stream = _NoStream
copy = torch.Tensor.copy_
def meta_copy(self, src, *a, **k):
    if getattr(src, "is_meta", False) or self.is_meta: return self
    return copy(self, src, *a, **k)
torch.Tensor.copy_ = meta_copy
from sglang.srt.configs.load_config import LoadConfig
from sglang.srt.model_loader.loader import _initialize_model
from sglang.srt.server_args import ServerArgs
rc = pm._optional("sglang.srt.runtime_context")
with pm._extra_buffer_on_cpu():
    sa = ServerArgs(model_path=sys.argv[2], device="cpu", tp_size=1, pp_size=1, skip_tokenizer_init=True,
                    disable_radix_cache=True)
    if hasattr(sa, "resolve_once"):
        sa.resolve_once()
importlib.import_module("sglang.srt.models.registry").ModelRegistry.get_supported_archs()
mc = pm._stage(rc, True, sa, 0, 1)
torch.set_default_dtype(mc.dtype)
with torch.device("meta"):
    model = _initialize_model(mc, LoadConfig())
for n in sys.argv[3:]:
    try:
        model.load_weights(iter([(n, torch.empty((1,), device="meta"))]))
        print("LOADS", n)
    except KeyError as e:
        print("KEYERROR", n, pm._sglang_frame(e))
"""


@pytest.mark.sglang
def test_the_installed_falcon_h1_class_raises_on_exactly_these_names(sglang_engine, tmp_path):
    """Falcon-H1 built on the meta device from the installed release's own code (0.5.22+, as
    scripts/pp_meta_build.py builds it), each name streamed through its own load_weights: the names the
    checker refuses raise KeyError at the line it names, the names it lets through load."""
    import subprocess
    import sys

    from checker.core.releases.config_rules import where

    release = sglang_engine.version
    if MODELLED_RELEASES.index(release) < MODELLED_RELEASES.index("0.5.22"):
        pytest.skip("scripts/pp_meta_build.py builds classes of 0.5.22+ only")
    d = tmp_path / "falcon"
    d.mkdir()
    (d / "config.json").write_text(FALCON.read_text())
    (tmp_path / "probe.py").write_text(_PROBE)
    scripts = str(Path(__file__).resolve().parent.parent / "scripts")
    proc = subprocess.run(
        [sys.executable, str(tmp_path / "probe.py"), scripts, str(d), *UNKNOWN, *SKIPPED_BY_LOAD],
        capture_output=True,
        text=True,
        timeout=240,
    )
    said: dict[str, tuple[str, ...]] = {}
    for line in proc.stdout.splitlines():
        status, *rest = line.split()
        if status in ("LOADS", "KEYERROR") and rest:
            said[rest[0]] = (status, *rest[1:])
    at = where("falcon_h1.load_unknown", release)
    shown = (proc.stdout[-1500:], proc.stderr[-1500:])
    for name in UNKNOWN:
        assert said.get(name) == ("KEYERROR", at), (name, said.get(name), shown)
    for name in SKIPPED_BY_LOAD:
        assert said.get(name) == ("LOADS",), (name, said.get(name), shown)
