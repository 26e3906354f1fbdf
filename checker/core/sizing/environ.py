"""The environment variables SGLang's sizing reads, named once.

Each one changes what a rank derives, so each one joins the preflight's inputs (compared by digest
across ranks): the layer partition (``sglang/srt/distributed/utils.py`` ``get_pp_indices``), the state
dtypes (``sglang/srt/configs/mamba_utils.py``) and the decode-lock switch (``sglang/srt/environ.py``).
``SGLANG_ENABLE_PP_SPEC`` (:data:`PP_SPEC_ENV`) is read too, but only decides whether speculative
decoding under PP starts, which each rank refuses on its own (:mod:`checker.core.releases.startup`): it sizes
nothing, so it is not a compared input.
"""

from __future__ import annotations

from checker.core.sizing.partition import PARTITION_ENV

MAMBA_CONV_DTYPE_ENV = "SGLANG_MAMBA_CONV_DTYPE"
MAMBA_SSM_DTYPE_ENV = "SGLANG_MAMBA_SSM_DTYPE"
SKIP_DECODE_LOCK_ENV = "SGLANG_OPT_MAMBA_SKIP_DECODE_LOCK"
PP_SPEC_ENV = "SGLANG_ENABLE_PP_SPEC"
"""0.5.21+: speculative decoding (EAGLE) under pipeline parallelism starts only with it set
(``arg_groups/validation_hook.py`` ``check_pipeline_parallel_compat``), outside a prefill node."""

LONGER_CONTEXT_ENV = "SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN"
"""Lets --context-length exceed the model's own (``ModelConfig._derive_context_length``: otherwise a
ValueError at start-up, every modelled release); the context length sizes the request estimate."""

SGLANG_ENV_VARS = (
    PARTITION_ENV,
    MAMBA_CONV_DTYPE_ENV,
    MAMBA_SSM_DTYPE_ENV,
    SKIP_DECODE_LOCK_ENV,
    LONGER_CONTEXT_ENV,
)
