"""Regenerate tests/fixtures/weights/expected.json: every rank's parameter bytes of each case below, as
SGLang's own model classes hold them, built on the meta device by each release's real code.

    python3 scripts/build_weights_expected.py                     # every release with a CPU environment
    python3 scripts/build_weights_expected.py --release 0.5.23    # one release (merged into the file)
    python3 scripts/build_weights_expected.py --case qwen3_next   # cases whose id starts with this

Each (release, case) runs ``scripts/sglang_weights.py`` in that release's CPU environment (built by
``scripts/sglang_cpu_env.sh``: ``$SGLANG_CPU_HOME/releases/X`` with the venv's Python). The quick suite
(``tests/test_weights.py``) holds the torch-free rules of ``checker/core/weights/weights.py`` to these
figures, so it needs no SGLang; ``pytest -m sglang`` builds the classes again where SGLang imports.

A case a release cannot build (its class asserts one stage, or the release does not register the
architecture) is recorded with the release's own one-line error instead of figures: the rules refuse it
too, or the startup rules do.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "scripts"))

import sglang_envs  # noqa: E402

HOME = Path(os.environ.get("SGLANG_CPU_HOME", Path.home() / ".cache/pp-checker/sglang-cpu"))
PINNED = Path(os.environ.get("SGLANG_WEIGHTS_HOME", Path.home() / ".cache/pp-checker/sglang-cpu-weights"))
"""Where a release's folder with the transformers it pins lives, when the shared one has another (0.5.9
here: its shared folder has transformers 5.19, under which its Qwen3.5 and Granite configs do not load;
0.5.9 pins 4.57.1): ``pip install --no-deps --target PINNED/releases/X sglang==X transformers==... ``."""
OUT = REPO / "tests/fixtures/weights/expected.json"
F = "tests/fixtures"

# id -> (config, layouts, partition env or None, ServerArgs flags)
CASES: dict[str, tuple[str, list[str], str | None, dict[str, object]]] = {
    "qwen3_next/tp": (f"{F}/qwen3_next_80b_a3b.json", ["pp=1,tp=1", "pp=1,tp=4", "pp=1,tp=8"], None, {}),
    "qwen3_next/dp": (f"{F}/qwen3_next_80b_a3b.json", ["pp=1,tp=2,dp=2"], None, {}),
    "qwen3_next/ep": (f"{F}/qwen3_next_80b_a3b.json", ["pp=1,tp=8,ep=8", "pp=1,tp=4,ep=2"], None, {}),
    "qwen3_next/no-fusion": (
        f"{F}/qwen3_next_80b_a3b.json",
        ["pp=1,tp=4,ep=4"],
        None,
        {"disable_shared_experts_fusion": True},
    ),
    "qwen3_next/fp16": (f"{F}/qwen3_next_80b_a3b.json", ["pp=1,tp=2"], None, {"dtype": "float16"}),
    "qwen3_next/pp": (f"{F}/qwen3_next_80b_a3b.json", ["pp=2,tp=1"], None, {}),
    # The NEXTN/MTP draft a last-stage rank loads (--speculative-algorithm EAGLE/NEXTN): the config as the
    # draft's ModelConfig rewrites it (0.5.23 configs/model_config.py:1134-1136), built as one stage
    "qwen3_next/mtp-draft": (
        f"{F}/weights/qwen3_next_mtp_draft.json",
        ["pp=1,tp=1", "pp=1,tp=2", "pp=1,tp=4", "pp=1,tp=8", "pp=1,tp=4,ep=4"],
        None,
        {},
    ),
    # Qwen3.5's MTP draft (Qwen3_5ForCausalLMMTP, models/qwen3_5_mtp.py): the config as the draft's
    # ModelConfig rewrites it (0.5.23 configs/model_config.py:1159-1181), text only, one stage; MoE, dense,
    # and a config tied at the top level only (the draft reads the text config's tie_word_embeddings)
    "qwen3_5/mtp-draft": (
        f"{F}/weights/qwen3_5_mtp_draft.json",
        ["pp=1,tp=1", "pp=1,tp=2", "pp=1,tp=4", "pp=1,tp=8", "pp=1,tp=4,ep=4"],
        None,
        {},
    ),
    "qwen3_5/mtp-draft-dense": (
        f"{F}/weights/qwen3_5_dense_mtp_draft.json",
        ["pp=1,tp=1", "pp=1,tp=4"],
        None,
        {},
    ),
    "qwen3_5/mtp-draft-tied": (f"{F}/weights/qwen3_5_tied_mtp_draft.json", ["pp=1,tp=2"], None, {}),
    # A separate EAGLE3 draft (--speculative-draft-model-path; LlamaForCausalLMEagle3, models/llama_eagle3.py)
    # of the shapes SpecForge writes for a hidden-2048 Qwen3-Next target: its own reduced-vocabulary head
    "eagle3/qwen3-next-draft": (
        f"{F}/weights/eagle3_qwen3_next_draft.json",
        ["pp=1,tp=1", "pp=1,tp=2", "pp=1,tp=4", "pp=1,tp=8"],
        None,
        {},
    ),
    # its options: two layers (0.5.13+; one before), a target hidden size of its own, four aux states
    # (eagle_config), fc_norm (0.5.13+) and norm_before_fc (0.5.17+), the target's vocabulary in its head
    "eagle3/options": (f"{F}/weights/eagle3_options_draft.json", ["pp=1,tp=2"], None, {}),
    # A separate EAGLE-2 draft (--speculative-algorithm EAGLE with --speculative-draft-model-path): the
    # classes of models/llama_eagle.py and models/qwen2_eagle.py as built, before the draft worker swaps in
    # the target's embedding and head (eagle_worker_v2.py init_lm_head; modelled in drafts.eagle2); its
    # options: two layers (layer 0 without its input_layernorm), attention bias, a hot-vocabulary head
    "eagle2/llama3-8b-draft": (
        f"{F}/weights/eagle2_llama3_8b_draft.json",
        ["pp=1,tp=1", "pp=1,tp=2", "pp=1,tp=8"],
        None,
        {},
    ),
    "eagle2/qwen2-7b-draft": (
        f"{F}/weights/eagle2_qwen2_7b_draft.json",
        ["pp=1,tp=1", "pp=1,tp=4"],
        None,
        {},
    ),
    "eagle2/options": (f"{F}/weights/eagle2_options_draft.json", ["pp=1,tp=2"], None, {}),
    "qwen3_5/pp-tp": (
        f"{F}/weights/qwen3_5_397b_a17b.json",
        ["pp=1,tp=8", "pp=2,tp=4", "pp=3,tp=1"],
        None,
        {},
    ),
    "qwen3_5/partition": (f"{F}/weights/qwen3_5_397b_a17b.json", ["pp=4,tp=2"], "14,16,16,14", {}),
    "qwen3_5/dp": (f"{F}/weights/qwen3_5_397b_a17b.json", ["pp=2,tp=1,dp=2"], None, {}),
    "qwen3_5/dp-vision": (f"{F}/weights/qwen3_5_397b_a17b.json", ["pp=2,tp=2,dp=2"], None, {}),
    "qwen3_5/dp-language-only": (f"{F}/weights/qwen3_5_language_only.json", ["pp=2,tp=2,dp=2"], None, {}),
    "qwen3_5/ep": (f"{F}/weights/qwen3_5_397b_a17b.json", ["pp=2,tp=4,ep=4"], None, {}),
    # --language-model-only is refused for Qwen3.5 (0.5.18+ allow-list); the config key is read instead.
    "qwen3_5/language-only": (f"{F}/weights/qwen3_5_language_only.json", ["pp=2,tp=2"], None, {}),
    "qwen3_5/language-only-flag": (
        f"{F}/weights/qwen3_5_397b_a17b.json",
        ["pp=1,tp=2"],
        None,
        {"language_model_only": True},
    ),
    "qwen3_5/tied": (f"{F}/weights/qwen3_5_moe_tied.json", ["pp=1,tp=2", "pp=2,tp=2"], None, {}),
    "qwen3_5/dense": (f"{F}/weights/qwen3_5_dense.json", ["pp=1,tp=4", "pp=2,tp=2"], None, {}),
    "kimi_linear/pp-tp": (
        f"{F}/kimi_linear_48b_a3b.json",
        ["pp=1,tp=2", "pp=2,tp=4", "pp=3,tp=2", "pp=4,tp=1"],
        None,
        {},
    ),
    "kimi_linear/partition": (f"{F}/kimi_linear_48b_a3b.json", ["pp=2,tp=2"], "10,17", {}),
    "kimi_linear/dp": (f"{F}/kimi_linear_48b_a3b.json", ["pp=2,tp=2,dp=2"], None, {}),
    "kimi_linear/ep": (f"{F}/kimi_linear_48b_a3b.json", ["pp=2,tp=4,ep=4"], None, {}),
    "nemotron_h/pp-tp": (
        f"{F}/weights/nemotron_h_8b.json",
        ["pp=1,tp=1", "pp=2,tp=4", "pp=3,tp=2", "pp=4,tp=2", "pp=1,tp=8"],
        None,
        {},
    ),
    "nemotron_h/partition": (f"{F}/weights/nemotron_h_8b.json", ["pp=2,tp=2"], "20,32", {}),
    "nemotron_h/dp": (f"{F}/weights/nemotron_h_8b.json", ["pp=2,tp=2,dp=2"], None, {}),
    "nemotron_h/tied": (f"{F}/weights/nemotron_h_tied.json", ["pp=1,tp=2", "pp=2,tp=2"], None, {}),
    "falcon_h1/tied": (f"{F}/weights/falcon_h1_tied.json", ["pp=1,tp=2"], None, {}),
    "falcon_h1/tp": (
        f"{F}/falcon_h1_0_5b.json",
        ["pp=1,tp=1", "pp=1,tp=2", "pp=1,tp=4", "pp=1,tp=8"],
        None,
        {},
    ),
    "falcon_h1/dp": (f"{F}/falcon_h1_0_5b.json", ["pp=1,tp=2,dp=2"], None, {}),
    "granite_h/tp": (f"{F}/granite_4_0_h_small.json", ["pp=1,tp=1", "pp=1,tp=4", "pp=1,tp=8"], None, {}),
    "granite_h/ep": (f"{F}/granite_4_0_h_small.json", ["pp=1,tp=8,ep=8"], None, {}),
    # FP8 checkpoints (quantization_config as Qwen and NVIDIA publish them: block-wise 128x128 with
    # weight_scale_inv, and per-tensor with static input scales), the quantized classes of the newest
    # release: ``--release 0.5.23 --case qwen3_next/fp8 --case qwen3_5/fp8 --case nemotron_h/fp8``
    "qwen3_next/fp8-block": (
        f"{F}/weights/qwen3_next_fp8_block.json",
        ["pp=1,tp=1", "pp=1,tp=4", "pp=1,tp=2,dp=2"],
        None,
        {},
    ),
    # ep 8: the shared expert, fused into the experts from 0.5.15, stays a tp-8 linear before and its
    # 64-wide partitions are refused (0.5.10, 0.5.13)
    "qwen3_next/fp8-block-ep8": (f"{F}/weights/qwen3_next_fp8_block.json", ["pp=1,tp=8,ep=8"], None, {}),
    # tp 8 splits the 512-wide experts into 64-wide partitions: not whole 128-blocks, refused
    "qwen3_next/fp8-block-tp8": (f"{F}/weights/qwen3_next_fp8_block.json", ["pp=1,tp=8"], None, {}),
    "qwen3_next/fp8-tensor": (
        f"{F}/weights/qwen3_next_fp8_tensor.json",
        ["pp=1,tp=2", "pp=1,tp=4,ep=4"],
        None,
        {},
    ),
    # Qwen3.5 (the family with a vision tower, built unquantized: quant_config=None): MoE and dense
    "qwen3_5/fp8-block": (
        f"{F}/weights/qwen3_5_fp8_block.json",
        ["pp=1,tp=4", "pp=2,tp=2", "pp=3,tp=1", "pp=2,tp=4,ep=4", "pp=2,tp=2,dp=2"],
        None,
        {},
    ),
    "qwen3_5/fp8-dense": (f"{F}/weights/qwen3_5_dense_fp8_block.json", ["pp=1,tp=4", "pp=2,tp=2"], None, {}),
    "nemotron_h/fp8-block": (
        f"{F}/weights/nemotron_h_fp8_block.json",
        ["pp=1,tp=1", "pp=2,tp=2", "pp=4,tp=2"],
        None,
        {},
    ),
    # ModelOpt FP8 (modelopt_fp8, per-tensor weight and input scales): Falcon-H1 declared by a
    # hf_quant_config.json beside config.json (the harness copies <config>.hf_quant_config.json), its head
    # excluded or quantized; Nemotron-H by config.json's flat quantization_config with an FP8 KV cache
    "falcon_h1/modelopt-fp8": (
        f"{F}/weights/falcon_h1_modelopt_fp8.json",
        ["pp=1,tp=1", "pp=1,tp=2", "pp=1,tp=4", "pp=1,tp=2,dp=2"],
        None,
        {},
    ),
    "falcon_h1/modelopt-fp8-head": (f"{F}/weights/falcon_h1_modelopt_fp8_head.json", ["pp=1,tp=2"], None, {}),
    "nemotron_h/modelopt-fp8": (
        f"{F}/weights/nemotron_h_modelopt_fp8.json",
        ["pp=1,tp=1", "pp=2,tp=2", "pp=4,tp=2", "pp=2,tp=2,dp=2"],
        None,
        {},
    ),
    # ModelOpt NVFP4 (modelopt_fp4: uint8 packed e2m1 weights, fp8 16-group scales, fp32 global scales;
    # Marlin on Hopper): Nemotron-H by config.json's flat quantization_config (first/last layers and head
    # excluded; then the head quantized with an FP8 KV cache), Qwen3-Next by a nested hf_quant_config.json
    # (qkv_proj built unquantized, the shared expert fused unless excluded); a nested file without
    # group_size is the release's ValueError (re-raised as "Cannot find 'quant_algo'", modelopt_quant.py:1664)
    "nemotron_h/modelopt-nvfp4": (
        f"{F}/weights/nemotron_h_modelopt_nvfp4.json",
        ["pp=1,tp=1", "pp=2,tp=2", "pp=4,tp=2", "pp=2,tp=2,dp=2"],
        None,
        {},
    ),
    "nemotron_h/modelopt-nvfp4-head": (
        f"{F}/weights/nemotron_h_modelopt_nvfp4_head.json",
        ["pp=1,tp=2"],
        None,
        {},
    ),
    "qwen3_next/modelopt-nvfp4": (
        f"{F}/weights/qwen3_next_modelopt_nvfp4.json",
        ["pp=1,tp=2", "pp=1,tp=4,ep=4", "pp=1,tp=8", "pp=1,tp=2,dp=2"],
        None,
        {},
    ),
    "qwen3_next/modelopt-nvfp4-shared": (
        f"{F}/weights/qwen3_next_modelopt_nvfp4_shared.json",
        ["pp=1,tp=4,ep=4"],
        None,
        {},
    ),
    "qwen3_next/modelopt-nvfp4-nogroup": (
        f"{F}/weights/qwen3_next_modelopt_nvfp4_nogroup.json",
        ["pp=1,tp=2"],
        None,
        {},
    ),
    # compressed-tensors FP8 W8A8 (llm-compressor's presets): per-channel weights with dynamic per-token
    # activations (FP8_DYNAMIC), 128x128 blocks (FP8_BLOCK), per-tensor weights and static input scales
    # with an FP8 KV cache; ignore lists by name, dotted suffix and re: regex, Nemotron-H's by its HF name
    "qwen3_next/ct-fp8-channel": (
        f"{F}/weights/qwen3_next_ct_fp8_channel.json",
        ["pp=1,tp=2", "pp=1,tp=4,ep=4", "pp=1,tp=8", "pp=1,tp=2,dp=2"],
        None,
        {},
    ),
    "qwen3_next/ct-fp8-block": (f"{F}/weights/qwen3_next_ct_fp8_block.json", ["pp=1,tp=4"], None, {}),
    # ep 8: the shared expert, fused into the experts from 0.5.15, stays a tp-8 linear before and its
    # 64-wide partitions are refused (0.5.10, 0.5.13), as fp8-block-ep8
    "qwen3_next/ct-fp8-block-ep8": (
        f"{F}/weights/qwen3_next_ct_fp8_block.json",
        ["pp=1,tp=8,ep=8"],
        None,
        {},
    ),
    # tp 8: 64-wide expert partitions, not whole 128-blocks (compressed_tensors_w8a8_fp8_moe.py:107)
    "qwen3_next/ct-fp8-block-tp8": (f"{F}/weights/qwen3_next_ct_fp8_block.json", ["pp=1,tp=8"], None, {}),
    # per-tensor weights with per-token activations: the MoE method's assertion
    "qwen3_next/ct-fp8-tensor-token": (
        f"{F}/weights/qwen3_next_ct_fp8_tensor_token.json",
        ["pp=1,tp=2"],
        None,
        {},
    ),
    "nemotron_h/ct-fp8-tensor": (
        f"{F}/weights/nemotron_h_ct_fp8_tensor.json",
        ["pp=1,tp=1", "pp=2,tp=2", "pp=4,tp=2", "pp=2,tp=2,dp=2"],
        None,
        {},
    ),
    # compressed-tensors INT weight-only, pack-quantized (CompressedTensorsWNA16 / ...WNA16MoE, Marlin):
    # W4A16 group 128 symmetric, W8A16 group 64 with zero points and actorder "weight" (the experts'
    # whole-intermediate w2 scales), W8A16 per channel, W4A16 group 128 with zero points; Qwen3-Next's
    # linear_attn projections ignored (its class reads their .weight, qwen3_next.py:311)
    "qwen3_next/ct-w4a16": (
        f"{F}/weights/qwen3_next_ct_w4a16.json",
        ["pp=1,tp=1", "pp=1,tp=4", "pp=1,tp=4,ep=4", "pp=1,tp=2,dp=2"],
        None,
        {},
    ),
    # zero points: refused by 0.5.10 (no MoE scheme) and 0.5.13 (an assertion), one layout each
    "qwen3_next/ct-w8a16-zp": (f"{F}/weights/qwen3_next_ct_w8a16_zp.json", ["pp=1,tp=2"], None, {}),
    "qwen3_next/ct-w8a16-zp-ep8": (f"{F}/weights/qwen3_next_ct_w8a16_zp.json", ["pp=1,tp=8,ep=8"], None, {}),
    # quantized linear_attn projections: the class's AttributeError at construction
    "qwen3_next/ct-w4a16-linear-attn": (
        f"{F}/weights/qwen3_next_ct_w4a16_linear_attn.json",
        ["pp=1,tp=2"],
        None,
        {},
    ),
    "nemotron_h/ct-w8a16": (
        f"{F}/weights/nemotron_h_ct_w8a16.json",
        ["pp=1,tp=1", "pp=2,tp=2", "pp=4,tp=2", "pp=2,tp=2,dp=2"],
        None,
        {},
    ),
    "nemotron_h/ct-w4a16-zp": (
        f"{F}/weights/nemotron_h_ct_w4a16_zp.json",
        ["pp=2,tp=2", "pp=3,tp=2", "pp=1,tp=8"],
        None,
        {},
    ),
    # group 256 at tp 8: down_proj's 2688-wide input partition is not whole groups (an assertion,
    # compressed_tensors_wNa16.py:128)
    "nemotron_h/ct-w4a16-g256-tp8": (f"{F}/weights/nemotron_h_ct_w4a16_g256.json", ["pp=1,tp=8"], None, {}),
    # actorder "group" (g_idx, scales repeated on every rank): compressed-tensors 0.20.1 refuses it, 0.5.23
    # pins 0.18.0, which takes it: run these with SGLANG_WEIGHTS_PREPEND=<compressed-tensors 0.18.0 folder>
    "qwen3_next/ct-w4a16-gidx": (f"{F}/weights/qwen3_next_ct_w4a16_gidx.json", ["pp=1,tp=2"], None, {}),
    "nemotron_h/ct-w4a16-gidx": (
        f"{F}/weights/nemotron_h_ct_w4a16_gidx.json",
        ["pp=2,tp=2", "pp=1,tp=4"],
        None,
        {},
    ),
    # GPTQ (quant_method gptq, GPTQModel's layout: qweight/qzeros/scales/g_idx), served on Hopper as
    # gptq_marlin (GPTQMarlinConfig.override_quantization_method, gptq.py:413-437): 4-bit group 128 with and
    # without activation order, 8-bit per channel; dynamic rules (a negative one keeps Qwen3-Next's
    # linear_attn in_proj bf16, as its class needs; a positive one makes layer 3's attention 8-bit)
    "qwen3_next/gptq-int4": (
        f"{F}/weights/qwen3_next_gptq_int4.json",
        ["pp=1,tp=1", "pp=1,tp=4", "pp=1,tp=4,ep=4", "pp=1,tp=2,dp=2"],
        None,
        {},
    ),
    "qwen3_next/gptq-int4-desc-act": (
        f"{F}/weights/qwen3_next_gptq_int4_desc_act.json",
        ["pp=1,tp=2", "pp=1,tp=8,ep=8"],
        None,
        {},
    ),
    "nemotron_h/gptq-int4": (
        f"{F}/weights/nemotron_h_gptq_int4.json",
        ["pp=1,tp=1", "pp=2,tp=2", "pp=4,tp=2", "pp=2,tp=2,dp=2"],
        None,
        {},
    ),
    "nemotron_h/gptq-int4-desc-act": (
        f"{F}/weights/nemotron_h_gptq_int4_desc_act.json",
        ["pp=2,tp=2", "pp=1,tp=4"],
        None,
        {},
    ),
    "nemotron_h/gptq-int8-channel": (
        f"{F}/weights/nemotron_h_gptq_int8_channel.json",
        ["pp=1,tp=1", "pp=2,tp=2", "pp=1,tp=8"],
        None,
        {},
    ),
    # AWQ (quant_method awq, AutoAWQ's GEMM layout: qweight/qzeros/scales), served on Hopper as awq_marlin
    # (AWQMarlinConfig.override_quantization_method, awq/awq.py:332-354; the harness answers is_cuda there):
    # modules_to_not_convert matched as substrings of SGLang's prefix; at tp 4 Nemotron-H's in_proj partition
    # (4640) is not a multiple of 64 (verify_marlin_supports_shape at construction); Qwen3-Next at tp 8 falls
    # back to MoeWNA16 (I_p 64 < 128: uint8 w13_qweight [E, H/16, 2 I_p], built so by 0.5.23 here), which the
    # checker refuses as not modelled: no case
    "qwen3_next/awq-int4": (
        f"{F}/weights/qwen3_next_awq_int4.json",
        ["pp=1,tp=1", "pp=1,tp=4", "pp=1,tp=4,ep=4", "pp=1,tp=2,dp=2"],
        None,
        {},
    ),
    "nemotron_h/awq-int4": (
        f"{F}/weights/nemotron_h_awq_int4.json",
        ["pp=1,tp=1", "pp=2,tp=2", "pp=4,tp=2"],
        None,
        {},
    ),
    # attention DP: before 0.5.14 the mixer splits over the whole TP group (4), its in_proj partition 4640
    "nemotron_h/awq-int4-dp": (f"{F}/weights/nemotron_h_awq_int4.json", ["pp=2,tp=2,dp=2"], None, {}),
    "nemotron_h/awq-int4-tp4": (f"{F}/weights/nemotron_h_awq_int4.json", ["pp=1,tp=4"], None, {}),
    "nemotron_h/awq-int4-fallback": (
        f"{F}/weights/nemotron_h_awq_int4_fallback.json",
        ["pp=1,tp=1", "pp=2,tp=1"],
        None,
        {},
    ),
    "nemotron_h/awq-int4-fallback-tp2": (
        f"{F}/weights/nemotron_h_awq_int4_fallback.json",
        ["pp=1,tp=2"],
        None,
        {},
    ),
    # Qwen3.5 (the family with a vision tower) under AWQ: its vision tower is built with quant_config=None
    # (bf16 whether or not modules_to_not_convert names it); MoE with in_proj_ba kept bf16, dense with every
    # language-model linear quantized; at tp 4 the dense in_proj_ba's 32-row partition is refused
    # (verify_marlin_supports_shape, marlin_utils.py:161-193, at construction)
    "qwen3_5/awq-int4": (
        f"{F}/weights/qwen3_5_awq_int4.json",
        ["pp=2,tp=2", "pp=2,tp=2,ep=2", "pp=3,tp=1"],
        None,
        {},
    ),
    "qwen3_5/awq-int4-dense": (
        f"{F}/weights/qwen3_5_dense_awq_int4.json",
        ["pp=1,tp=1", "pp=2,tp=2", "pp=2,tp=2,dp=2"],
        None,
        {},
    ),
    "qwen3_5/awq-int4-dense-tp4": (f"{F}/weights/qwen3_5_dense_awq_int4.json", ["pp=1,tp=4"], None, {}),
    # Qwen3.5 (the family with a vision tower) under the other methods: its vision tower is built with
    # quant_config=None in every release (0.5.23 qwen3_vl.py:1332-1339), bf16 whether or not the ignore list
    # names it; MoE and dense configs
    "qwen3_5/ct-fp8-channel": (f"{F}/weights/qwen3_5_ct_fp8_channel.json", ["pp=2,tp=4,ep=4"], None, {}),
    "qwen3_5/ct-fp8-dense": (
        f"{F}/weights/qwen3_5_dense_ct_fp8_channel.json",
        ["pp=1,tp=4", "pp=2,tp=2", "pp=2,tp=2,dp=2"],
        None,
        {},
    ),
    "qwen3_5/ct-w4a16": (f"{F}/weights/qwen3_5_ct_w4a16.json", ["pp=2,tp=2", "pp=3,tp=1"], None, {}),
    "qwen3_5/ct-w4a16-dense": (
        f"{F}/weights/qwen3_5_dense_ct_w4a16.json",
        ["pp=1,tp=4", "pp=2,tp=2", "pp=3,tp=1"],
        None,
        {},
    ),
    "qwen3_5/gptq-int4": (f"{F}/weights/qwen3_5_gptq_int4.json", ["pp=2,tp=2,ep=2"], None, {}),
    "qwen3_5/gptq-int4-dense": (
        f"{F}/weights/qwen3_5_dense_gptq_int4.json",
        ["pp=1,tp=4", "pp=2,tp=2", "pp=1,tp=8"],
        None,
        {},
    ),
    "qwen3_5/modelopt-nvfp4": (f"{F}/weights/qwen3_5_modelopt_nvfp4.json", ["pp=2,tp=2"], None, {}),
    "qwen3_5/modelopt-fp8": (f"{F}/weights/qwen3_5_modelopt_fp8.json", ["pp=2,tp=2,ep=2"], None, {}),
    "qwen3_5/modelopt-fp8-dense": (
        f"{F}/weights/qwen3_5_dense_modelopt_fp8.json",
        ["pp=1,tp=4", "pp=2,tp=2"],
        None,
        {},
    ),
    "qwen3_5/modelopt-nvfp4-dense": (
        f"{F}/weights/qwen3_5_dense_modelopt_nvfp4.json",
        ["pp=1,tp=4", "pp=2,tp=2"],
        None,
        {},
    ),
    # in_proj_ba quantized: its 32-row partition at tp 4 is under Marlin's 64-wide tile
    "qwen3_5/ct-w4a16-ba-tp4": (f"{F}/weights/qwen3_5_dense_ct_w4a16_ba.json", ["pp=1,tp=4"], None, {}),
    # Falcon-H1 (dense FFN; its Mamba mixer and RadixAttention built without the quant config, its qkv/o
    # without a prefix) and Granite-4.0-H (MoE; every linear and the experts quantized, the routers not)
    # under compressed-tensors and GPTQ
    "falcon_h1/ct-fp8-channel": (
        f"{F}/weights/falcon_h1_ct_fp8_channel.json",
        ["pp=1,tp=1", "pp=1,tp=2", "pp=1,tp=2,dp=2"],
        None,
        {},
    ),
    "falcon_h1/ct-w4a16": (f"{F}/weights/falcon_h1_ct_w4a16.json", ["pp=1,tp=2", "pp=1,tp=4"], None, {}),
    "falcon_h1/gptq-int4": (f"{F}/weights/falcon_h1_gptq_int4.json", ["pp=1,tp=1", "pp=1,tp=4"], None, {}),
    # Granite's n_groups = 1: a quantized MambaMixer2 asserts the TP size divides it (mamba.py:254-259),
    # so tp 1 (Granite does not run under PP: its load_weights KeyErrors)
    "granite_h/ct-fp8-channel": (f"{F}/weights/granite_h_ct_fp8_channel.json", ["pp=1,tp=1"], None, {}),
    "granite_h/ct-w4a16": (f"{F}/weights/granite_h_ct_w4a16.json", ["pp=1,tp=1"], None, {}),
    "granite_h/gptq-int4": (f"{F}/weights/granite_h_gptq_int4.json", ["pp=1,tp=1"], None, {}),
    "granite_h/tp2-gptq-int4": (f"{F}/weights/granite_h_gptq_int4.json", ["pp=1,tp=2"], None, {}),
    "nemotron_h/fp8-tensor": (
        f"{F}/weights/nemotron_h_fp8_tensor.json",
        ["pp=2,tp=2", "pp=3,tp=2"],
        None,
        {},
    ),
}


def release_env(release: str) -> tuple[str, dict[str, str]] | None:
    python = HOME / "venv/bin/python"
    home = PINNED if (PINNED / "releases" / release).is_dir() else HOME
    if not (home / "releases" / release).is_dir() or not python.exists():
        return None
    env = {k: v for k, v in os.environ.items() if not k.startswith("SGLANG_")}
    env["PYTHONPATH"] = sglang_envs.import_path(release, home)  # the stubs, then the release's folder
    prepend = os.environ.get("SGLANG_WEIGHTS_PREPEND")
    if prepend:  # a package the release pins that the shared venv has at another version
        env["PYTHONPATH"] = f"{prepend}:{env['PYTHONPATH']}"
    return str(python), env


def run_release(release: str, cases: list[str], timeout_s: float) -> dict[str, dict[str, object]]:
    """Every case in one process of the release's environment (the import costs most of the time)."""
    found = release_env(release)
    if found is None:
        raise SystemExit(f"no CPU environment for SGLang {release} under {HOME} (scripts/sglang_cpu_env.sh)")
    python, env = found
    spec = {
        cid: {
            "config": CASES[cid][0],
            "layouts": CASES[cid][1],
            "partition": CASES[cid][2],
            "flags": CASES[cid][3],
        }
        for cid in cases
    }
    with tempfile.NamedTemporaryFile("w", suffix=".json") as f:
        json.dump(spec, f)
        f.flush()
        proc = subprocess.run(
            [python, str(REPO / "scripts/sglang_weights.py"), "--cases", f.name],
            cwd=REPO,
            env=env,
            capture_output=True,
            text=True,
            timeout=timeout_s,
        )
    if proc.returncode != 0:
        raise SystemExit(f"SGLang {release}: the harness failed: {proc.stderr[-2000:]}")
    results = json.loads(proc.stdout)["cases"]
    out: dict[str, dict[str, object]] = {}
    for cid, result in results.items():
        if "error" in result:  # with the layout it stopped at, where the case has several
            out[cid] = {k: result[k] for k in ("error", "layout") if k in result}
            continue
        out[cid] = {
            "layouts": [
                {
                    "layout": entry["layout"],
                    "ranks": [[r["rank"], r["param_bytes"], r["buffer_bytes"]] for r in entry["ranks"]],
                }
                for entry in result["layouts"]
            ]
        }
    return out


def _dump(doc: dict[str, object]) -> str:
    """The figures one rank per line: a diff shows which ranks of which release moved."""
    text = json.dumps(doc, indent=1, sort_keys=True)
    import re

    # fold [rank, params, buffers] triples onto one line each
    text = re.sub(r"\[\n\s*(\d+),\n\s*(\d+),\n\s*(\d+)\n\s*\]", r"[\1, \2, \3]", text)
    return text + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--release", action="append", help="default: every release with a CPU environment")
    ap.add_argument("--case", action="append", help="only cases whose id starts with this (repeatable)")
    ap.add_argument("--timeout-s", type=float, default=5400)
    args = ap.parse_args()
    releases = args.release or sorted(
        (p.name for p in (HOME / "releases").iterdir() if p.is_dir()),
        key=lambda v: [int(x) if x.isdigit() else x for x in v.replace("post", ".").split(".")],
    )
    doc = json.loads(OUT.read_text()) if OUT.exists() else {"cases": {}, "figures": {}}
    doc["cases"] = {
        k: {"config": c, "layouts": ls, "partition": p, "flags": f} for k, (c, ls, p, f) in CASES.items()
    }
    for release in releases:
        chosen = [c for c in CASES if not args.case or any(c.startswith(p) for p in args.case)]
        t0 = time.monotonic()
        figures = run_release(release, chosen, args.timeout_s)
        doc["figures"].setdefault(release, {}).update(figures)
        for cid in chosen:
            print(f"{release} {cid}: {figures[cid].get('error') or 'ok'}", flush=True)
        print(f"{release}: {len(chosen)} cases in {time.monotonic() - t0:.0f} s", flush=True)
        OUT.write_text(_dump(doc))
    return 0


if __name__ == "__main__":
    sys.exit(main())
