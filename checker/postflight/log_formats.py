# ruff: noqa: E501  (generated: one line per form)
"""How each modelled SGLang release writes the lines the post-flight reads (GENERATED; do not edit).

Built by ``scripts/build_log_formats.py`` from each release's wheel, with ``ast``: the line format of
``configure_logger`` (``srt/utils.py``, later ``srt/utils/common.py``), the rank prefix the scheduler
process builds (``managers/scheduler.py``), and every logger message that starts with one of the
anchors below, as segments: a literal, or a field ``(name, format spec as written, optional)``. Each
form lists the runs of consecutive modelled releases (first, last) that write it, and where the newest
of them writes it. :mod:`checker.postflight.formats` reads this table.
"""

from __future__ import annotations

# fmt: off

RELEASES: tuple[str, ...] = ('0.5.2', '0.5.3', '0.5.3.post1', '0.5.3.post2', '0.5.3.post3', '0.5.4', '0.5.4.post1', '0.5.4.post2', '0.5.4.post3', '0.5.5', '0.5.5.post1', '0.5.5.post2', '0.5.5.post3', '0.5.6', '0.5.6.post1', '0.5.6.post2', '0.5.7', '0.5.8', '0.5.8.post1', '0.5.9', '0.5.10', '0.5.10.post1', '0.5.11', '0.5.12', '0.5.12.post1', '0.5.13', '0.5.13.post1', '0.5.14', '0.5.15', '0.5.15.post1', '0.5.16', '0.5.17', '0.5.18', '0.5.19', '0.5.20', '0.5.21', '0.5.22', '0.5.23')
"""The releases read, oldest first."""

ANCHORS: dict[str, str] = {'weights': 'Load weight end.', 'weights_begin': 'Load weight begin.', 'mamba': 'Mamba Cache is allocated.', 'summary': 'max_total_num_tokens=', 'post_capture': 'Post-capture KV sizing: max_running_requests'}
"""Message kind -> the text its message starts with."""

Spans = tuple[tuple[str, str], ...]
LINE_FORMATS: tuple[tuple[tuple[str, str | None, str | None, str | None], Spans, str], ...] = (
    # ((line format, datefmt, env var adding .%(msecs)03d, env var replacing the config), releases,
    # where)
    (('[%(asctime)s{prefix}] %(message)s', '%Y-%m-%d %H:%M:%S', None, 'SGLANG_LOGGING_CONFIG_PATH'), (('0.5.2', '0.5.5.post3'),), 'utils/common.py'),
    (('[%(asctime)s{maybe_ms}{prefix}] %(message)s', '%Y-%m-%d %H:%M:%S', 'SGLANG_LOG_MS', 'SGLANG_LOGGING_CONFIG_PATH'), (('0.5.6', '0.5.23'),), 'utils/common.py'),
)

PREFIXES: tuple[tuple[tuple[tuple[str, str, str], ...], Spans, str], ...] = (
    # ((token, the size or rank its condition tests, the condition), ...) in the order written
    ((('DP', 'dp_rank', 'is not None'), ('TP', 'tp_size', '> 1'), ('EP', 'ep_size', '> 1'), ('PP', 'pp_size', '> 1')), (('0.5.2', '0.5.5'),), 'managers/scheduler.py:2748 run_scheduler_process'),
    ((('DP', 'dp_rank', 'is not None'), ('PP', 'pp_size', '> 1'), ('TP', 'tp_size', '> 1'), ('EP', 'ep_size', '> 1')), (('0.5.5.post1', '0.5.8.post1'),), 'managers/scheduler.py:2881 run_scheduler_process'),
    ((('DP', 'dp_rank', 'is not None'), ('PP', 'pp_size', '> 1'), ('ATTN_CP', 'attn_cp_size', '> 1'), ('MOE_DP', 'moe_dp_size', '> 1'), ('TP', 'tp_size', '> 1'), ('EP', 'ep_size', '> 1')), (('0.5.9', '0.5.23'),), 'managers/scheduler.py:6257 configure_scheduler_process'),
)

MESSAGES: dict[str, tuple[tuple[tuple[object, ...], Spans, str], ...]] = {
    'weights': (
        (('Load weight end. type=', ('type', '', False), ', dtype=', ('dtype', '', False), ', avail mem=', ('avail_mem', '.2f', False), ' GB, mem usage=', ('mem_usage', '.2f', False), ' GB.'), (('0.5.2', '0.5.8.post1'),), 'model_executor/model_runner.py:949'),
        (('Load weight end. elapsed=', ('elapsed', '.2f', False), ' s, type=', ('type', '', False), ', dtype=', ('dtype', '', False), ', avail mem=', ('avail_mem', '.2f', False), ' GB, mem usage=', ('mem_usage', '.2f', False), ' GB.'), (('0.5.9', '0.5.9'),), 'model_executor/model_runner.py:1040'),
        (('Load weight end. elapsed=', ('elapsed', '.2f', False), ' s, type=', ('type', '', False), ', ', ('quant_str', '', True), 'avail mem=', ('avail_mem', '.2f', False), ' GB, mem usage=', ('mem_usage', '.2f', False), ' GB.'), (('0.5.10', '0.5.23'),), 'model_executor/model_runner.py:1372'),
        (('Load weight end. Committed real weights after CUDA graph capture in ', ('capture_in', '%.2f', False), ' s (capture overlap window ', ('overlap_window', '%.2f', False), ' s, startup overlap total ', ('overlap_total', '%.2f', False), ' s)'), (('0.5.18', '0.5.23'),), 'model_executor/model_runner_components/startup_weight_load.py:537'),
    ),
    'weights_begin': (
        (('Load weight begin. avail mem=', ('avail_mem', '.2f', False), ' GB'), (('0.5.2', '0.5.23'),), 'model_executor/model_runner.py:1273'),
    ),
    'mamba': (
        (('Mamba Cache is allocated. conv_state size: ', ('conv_state_size', '.2f', False), 'GB, ssm_state size: ', ('ssm_state_size', '.2f', False), 'GB '), (('0.5.2', '0.5.3.post1'),), 'mem_cache/memory_pool.py:200'),
        (('Mamba Cache is allocated. conv_state size: ', ('conv_state_size', '.2f', False), 'GB, ssm_state size: ', ('ssm_state_size', '.2f', False), 'GB intermediate_ssm_state_cache size: ', ('intermediate_ssm_state_cache_size', '.2f', False), 'GB intermediate_conv_window_cache size: ', ('intermediate_conv_window_cache_size', '.2f', False), 'GB '), (('0.5.3', '0.5.3.post1'),), 'mem_cache/memory_pool.py:191'),
        (('Mamba Cache is allocated. max_mamba_cache_size: ', ('max_mamba_cache_size', '', False), ', conv_state size: ', ('conv_state_size', '.2f', False), 'GB, ssm_state size: ', ('ssm_state_size', '.2f', False), 'GB intermediate_ssm_state_cache size: ', ('intermediate_ssm_state_cache_size', '.2f', False), 'GB intermediate_conv_window_cache size: ', ('intermediate_conv_window_cache_size', '.2f', False), 'GB '), (('0.5.3.post2', '0.5.23'),), 'mem_cache/memory_pool.py:983'),
        (('Mamba Cache is allocated. max_mamba_cache_size: ', ('max_mamba_cache_size', '', False), ', conv_state size: ', ('conv_state_size', '.2f', False), 'GB, ssm_state size: ', ('ssm_state_size', '.2f', False), 'GB '), (('0.5.3.post2', '0.5.23'),), 'mem_cache/memory_pool.py:1004'),
    ),
    'summary': (
        (('max_total_num_tokens=', ('max_total_num_tokens', '', False), ', chunked_prefill_size=', ('chunked_prefill_size', '', False), ', max_prefill_tokens=', ('max_prefill_tokens', '', False), ', max_running_requests=', ('max_running_requests', '', False), ', context_len=', ('context_len', '', False), ', ', ('_10', '', False), '=', ('_12', '.2f', False), ' GB'), (('0.5.2', '0.5.23'),), 'managers/scheduler.py:1268'),
    ),
    'post_capture': (
        (('Post-capture KV sizing: max_running_requests ', ('max_running_requests', '%d', False), ' -> ', ('_2', '%d', False), ''), (('0.5.16', '0.5.23'),), 'model_executor/model_runner_components/kv_pool_runtime.py:172'),
    ),
}
# fmt: on
