"""``--engine builtin|sglang|both``: the installed SGLang's own sizing held against the builtin model.

Two groups:

* tests that run everywhere (no SGLang needed): what a user without SGLang sees, that the builtin path
  never imports SGLang or torch, the drift comparison and its verdict/exit code, and the builtin fixes
  the engine comparison found (each states the SGLang 0.5.23 behaviour it now matches);
* ``@pytest.mark.sglang``: wherever ``sglang`` imports (build the environment on a CPU machine with
  ``scripts/sglang_cpu_env.sh``), derive with both engines across the six model families of spec
  section 11, the pool-sizing branches, the cache strategies and the partition env, and require no
  drift; plus the drift path end to end (derive, plan, and check on real gloo ranks).
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from checker.core.errors import BudgetError, FlagError, LayoutError
from checker.core.sizing.geometry import resolve_dtypes
from checker.core.sizing.row import NOT_INSTALLED, RankRow
from checker.core.sizing.sizing import CapacityInputs, derive_stage, env_flag
from checker.engines.drift import DRIFT_VALUES, Drift, Outcome, compare, drift_lines, drift_summary
from checker.engines.sglang import (
    FIRST_SUPPORTED,
    SUPPORTED_VERSIONS,
    SglangUnavailable,
    check_version,
    installed_version,
)
from checker.families.geometry import load_geometry
from checker.preflight.verdict import decide
from checker.status import EXIT_CODES
from checker.status import ROW_DRIFT as STATUS_DRIFT
from checker.status import ROW_OK as STATUS_OK

REPO = Path(__file__).resolve().parent.parent
TIMEOUT_S = 120
FAMILIES = (
    "falcon_h1_0_5b",
    "granite_4_0_h_small",
    "kimi_linear_48b_a3b",
    "nemotron_h_8b",
    "qwen3_5_397b_a17b",
    "qwen3_next_80b_a3b",
)
GDN = "qwen3_5_gdn_small"
"""A GatedDeltaNet model whose class starts under PP, laid out as Qwen3-Next (48 layers, every 4th full
attention, 32 value heads): Qwen3.5's config at Qwen3-Next's size. Qwen3-Next itself asserts a single
stage in every release (checker/core/releases/pp_support.py), so the comparisons that need stages use this."""
no_sglang = pytest.mark.skipif(
    installed_version() is not None, reason=f"sglang {installed_version()} is installed here"
)


# ---- everywhere: no SGLang -------------------------------------------------------------------------


@no_sglang
@pytest.mark.parametrize(
    "argv",
    [
        ["derive", "--engine", "sglang"],
        ["derive", "--engine", "both", "--pp-size", "4"],
        ["plan", "--engine", "both", "--target-max-running-requests", "8"],
    ],
)
def test_engine_sglang_without_sglang_is_one_line_exit_2(
    run_checker: Callable[..., subprocess.CompletedProcess[str]], argv: list[str]
) -> None:
    """A user without SGLang gets exit 2 and one line naming how to get it, not a traceback or a
    silent fallback to the builtin model (which would report the builtin as if it were SGLang)."""
    proc = run_checker(argv)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in proc.stderr
    assert "SGLang is not installed" in lines[0] and "scripts/sglang_cpu_env.sh" in lines[0]
    assert proc.stdout == ""


@pytest.mark.slow
@no_sglang
def test_check_engine_sglang_without_sglang_is_an_error_verdict(tmp_path: Path) -> None:
    """On a rank the missing SGLang is that rank's input error: verdict error (exit 2), the message in
    the report, and the rank still joined the exchange (no hang, no infrastructure failure)."""
    from harness import run_world

    argv = [
        "check",
        "--model",
        "kimi-k3",
        "--budget-gib",
        "8",
        "--engine",
        "sglang",
        "--timeout-s",
        "20",
        "--allow-single-rank",
    ]
    res = run_world(argv, world_size=1, tmp_path=tmp_path)
    assert res.codes == [2], res.ranks[0].stderr[-400:]
    rep = res.report()
    assert rep["status"] == "error"
    assert "SGLang is not installed" in rep["errors"][0]


def test_engine_builtin_never_imports_sglang_or_torch() -> None:
    """derive --engine builtin (and the default) must stay torch-free and SGLang-free: importing SGLang
    costs seconds and drags torch in; a module-level import in checker.engines would show up here."""
    code = (
        "import sys\n"
        "from checker.cli.main import main\n"
        "rc1 = main(['derive', '--engine', 'builtin', '--pp-size', '8', '--format', 'json'])\n"
        "rc2 = main(['derive', '--pp-size', '4', '--format', 'json'])\n"
        "rc3 = main(['plan', '--target-max-running-requests', '8'])\n"
        "leaked = sorted(m for m in ('sglang', 'torch', 'triton') if m in sys.modules)\n"
        "print('RESULT', rc1, rc2, rc3, leaked)\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=TIMEOUT_S
    )
    last = proc.stdout.strip().splitlines()[-1]
    assert last == "RESULT 0 0 0 []", (last, proc.stderr[-400:])


@pytest.mark.parametrize("version", ["0.5.9", "0.5.8.post1", "0.5.2", "0.4.10", "not-a-version"])
def test_unsupported_version_names_the_supported_range(version: str) -> None:
    """A release older than the first whose sizing methods the engine can call (0.5.9 computes the
    request cap inline): a clear error naming the supported range, unless the user opts into a
    best-effort attempt."""
    with pytest.raises(SglangUnavailable) as info:
        check_version(version, best_effort=False)
    msg = str(info.value)
    assert version in msg and f"{FIRST_SUPPORTED} and later" in msg and "--sglang-best-effort" in msg
    assert check_version(version, best_effort=True) == version


@pytest.mark.parametrize("version", [*SUPPORTED_VERSIONS, "0.5.24", "0.6.0rc1", "0.5.23+cu130"])
def test_every_release_from_the_first_supported_on_is_supported(version: str) -> None:
    """Every modelled release from 0.5.10 and any later one (a release newer than the newest modelled
    runs its own code through strict stand-ins) is accepted."""
    assert check_version(version, best_effort=False) == version
    assert SUPPORTED_VERSIONS[0] == FIRST_SUPPORTED == "0.5.10" and SUPPORTED_VERSIONS[-1] == "0.5.23"


# ---- everywhere: the drift comparison and its verdict ------------------------------------------------


def _stage(**flags: Any):
    g = resolve_dtypes(load_geometry(model="kimi-k3"), env={})
    return derive_stage(CapacityInputs(geometry=g, budget_gib=8.0, pp_size=8, **flags), 3)


def test_compare_names_each_value_and_both_numbers() -> None:
    """A drift finding must name the value and both numbers; a value missed here would let a model
    error through as "engines agree"."""
    b = _stage()
    assert compare(Outcome(3, stage=b), Outcome(3, stage=b)) == []
    s = dataclasses.replace(
        b,
        max_mamba_cache_size=b.max_mamba_cache_size - 1,
        end_layer=b.end_layer + 1,
        stage_per_req_bytes=b.stage_per_req_bytes + 8,
    )
    found = compare(Outcome(3, stage=b), Outcome(3, stage=s))
    assert [d.value for d in found] == ["max_mamba_cache_size", "stage_slice", "stage_per_req_bytes"]
    assert found[0] == Drift(
        3, "max_mamba_cache_size", str(b.max_mamba_cache_size), str(b.max_mamba_cache_size - 1)
    )
    assert found[1].sglang == f"[{b.start_layer}, {b.end_layer + 1})"
    kv = ("kv_own_tokens", "max_total_num_tokens", "kv_cell_bytes", "context_len")
    for name in ("max_running_requests", "pp_max_micro_batch_size", *kv):
        assert [
            d.value
            for d in compare(Outcome(3, stage=b), Outcome(3, stage=dataclasses.replace(b, **{name: 1})))
        ] == [name]
    assert set(DRIFT_VALUES) >= {
        "max_mamba_cache_size",
        "max_running_requests",
        "pp_max_micro_batch_size",
        *kv,
    }


def test_one_engine_refusing_is_drift_both_refusing_is_not() -> None:
    """SGLang refusing to boot what the model derives (or the reverse) is drift; both refusing is an
    ordinary input error."""
    b = _stage()
    err = FlagError("SGLang rejects the flags: AssertionError: no_buffer ...")
    (d,) = compare(Outcome(3, stage=b), Outcome(3, error=err))
    assert (d.value, d.builtin) == ("outcome", "derives values") and "no_buffer" in d.sglang
    assert compare(Outcome(3, error=err), Outcome(3, error=BudgetError("x"))) == []
    lines = drift_lines([d], sglang_version="0.5.23")
    assert lines[0].startswith("MODEL DRIFT") and "0.5.23" in lines[0] and "pp_rank 3" in lines[1]
    assert drift_summary([d] * 5).count("outcome") == 3 and "and 2 more" in drift_summary([d] * 5)


def _row(rank: int, status: int, error: str = "", sglang: str | None = "0.5.23") -> RankRow:
    return RankRow(
        rank=rank,
        world_size=2,
        pp_rank=rank,
        status=status,
        max_mamba_cache_size=74,
        max_running_requests=18,
        pp_max_micro_batch_size=2,
        host="h",
        error=error,
        inputs={"sglang_installed": sglang},
    )


def _decoded(row: RankRow) -> RankRow:
    from checker.distributed.wire import decode_row, encode_row

    return decode_row(encode_row(row))  # through the wire, as the preflight sees it


def test_drift_rows_make_a_model_drift_verdict_with_exit_4() -> None:
    """A drifted rank makes the verdict model_drift (exit 4) on every rank, naming the findings; a rank
    with an input error still wins (exit 2): its values are not there to judge."""
    drift = "model drift: max_mamba_cache_size: builtin 74, sglang 73"
    v = decide([_decoded(_row(0, STATUS_OK)), _decoded(_row(1, STATUS_DRIFT, drift))], world_size=2)
    assert (v.status, v.exit_code) == ("model_drift", 4)
    assert v.errors == [f"rank 1 (h): {drift}"]
    assert EXIT_CODES["model_drift"] == 4 and sorted(EXIT_CODES.values()) == [0, 1, 2, 3, 4]
    v = decide([_decoded(_row(0, 2, "bad config")), _decoded(_row(1, STATUS_DRIFT, drift))], world_size=2)
    assert v.status == "error"


def test_sglang_installed_is_an_input_digest() -> None:
    """Ranks running different SGLang versions (or one without it) must be named as the root cause."""
    # Without SGLang a rank sends "not installed" (None is a rank that failed before reading its metadata).
    without = _row(1, STATUS_OK, sglang=NOT_INSTALLED)
    v = decide([_decoded(_row(0, STATUS_OK)), _decoded(without)], world_size=2)
    assert v.differing_inputs == ["sglang_installed"]
    assert v.root_causes[0].startswith("sglang_installed") and "0.5.23" in v.root_causes[0]


# ---- everywhere: builtin fixes the engine comparison found (SGLang 0.5.23 behaviour) -----------------


@pytest.mark.parametrize(
    ("value", "on"),
    [
        ("1", True),
        ("true", True),
        ("TRUE", True),
        ("yes", True),
        ("y", True),
        ("Y", True),
        ("0", False),
        ("no", False),
        ("on", False),
        (" 1", False),
        ("", False),
    ],
)
def test_skip_decode_lock_env_parses_like_sglang_envbool(value: str, on: bool) -> None:
    """SGLang reads SGLANG_OPT_MAMBA_SKIP_DECODE_LOCK as an EnvBool (lower-cased, not stripped, yes/y
    true, anything else false). The builtin used to read only 1/true: with "yes" it derived
    max_running_requests 52 where SGLang derives 69 (Qwen3-Next, pp 4, 8 GiB)."""
    assert env_flag(value) is on


def test_empty_partition_env_is_refused_like_sglang() -> None:
    """SGLANG_PP_LAYER_PARTITION set but empty: SGLang's int("") refuses to boot; the builtin used to
    treat it as unset and derive the default split."""
    g = resolve_dtypes(load_geometry(model="kimi-k3"), env={})
    with pytest.raises(LayoutError, match="SGLANG_PP_LAYER_PARTITION=''"):
        CapacityInputs(geometry=g, budget_gib=8.0, pp_size=4, partition_env="")
    CapacityInputs(geometry=g, budget_gib=8.0, pp_size=1, partition_env="")  # ignored at pp 1, as SGLang


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("SGLANG_MAMBA_SSM_DTYPE", "bf16"),
        ("SGLANG_MAMBA_SSM_DTYPE", "BFloat16"),
        ("SGLANG_MAMBA_CONV_DTYPE", "fp32"),
    ],
)
def test_env_dtype_must_be_spelt_as_sglang_matches_it(name: str, value: str) -> None:
    """SGLang matches env dtypes exactly and IGNORES other spellings: SGLANG_MAMBA_SSM_DTYPE=bf16 leaves
    fp32 state, so the builtin's old alias (bf16 -> bfloat16) overstated the pool about 2x (Qwen3-Next
    pp 4, 8 GiB: 410 slots derived, 209 real). Now a clear error instead."""
    g = load_geometry(model_config=REPO / "tests" / "fixtures" / "qwen3_next_80b_a3b.json")
    with pytest.raises(FlagError, match=f"{name}='{value}'.*SGLang ignores it"):
        resolve_dtypes(g, env={name: value})
    assert resolve_dtypes(g, env={name: "bfloat16"}, mamba_ssm_dtype="bf16").temporal_dtype == "bfloat16"


# ---- wherever SGLang imports ----------------------------------------------------------------------


# ---- wherever SGLang imports: the builtin model OF THE INSTALLED RELEASE against that release's code ----
# CapacityInputs(sglang_version=<installed>) derives as that release; the engine runs its own code. The
# expected values are SGLang's (the engine), never numbers written here. Base layout: pp 4, tp 2, 16 GiB.
RELEASE_CASES: dict[str, dict[str, Any]] = {
    "auto-fit": {},
    "auto-no-overlap": {"disable_overlap_schedule": True},
    "auto-paged": {"page_size": 16},
    "no_buffer": {"mamba_radix_cache_strategy": "no_buffer", "disable_overlap_schedule": True},
    "extra_buffer": {"mamba_radix_cache_strategy": "extra_buffer"},
    "extra_buffer_lazy-pp1": {"mamba_radix_cache_strategy": "extra_buffer_lazy", "pp_size": 1},
    "radix-off": {"disable_radix_cache": True},
    "explicit-K": {"max_mamba_cache_size": 30},
    "explicit-K-dp2": {"max_mamba_cache_size": 301, "dp_size": 2},
    "no-radix-mrr": {"disable_radix_cache": True, "max_running_requests": 40},
    "no-radix-mrr-dp2": {"disable_radix_cache": True, "max_running_requests": 40, "dp_size": 2},
    "spec": {"speculative_num_draft_tokens": 3, "max_running_requests": 32, "pp_size": 1},
    "spec-explicit-K": {
        "speculative_num_draft_tokens": 4,
        "max_running_requests": 64,
        "max_mamba_cache_size": 200,
        "pp_size": 1,
    },
    "spec-no-radix": {
        "speculative_num_draft_tokens": 2,
        "max_running_requests": 16,
        "disable_radix_cache": True,
        "pp_size": 1,
    },
    "dp2": {"dp_size": 2},
    "kv-binds": {"token_capacity": 3000, "context_len": 1024},
    "micro": {"pp_max_micro_batch_size": 5, "max_running_requests": 100},
    "pp8-ratio": {"pp_size": 5, "mamba_full_memory_ratio": 0.5, "budget_gib": 8.0},
    # The KV token pool's own inputs: an FP8 cell, a --max-total-tokens cap under the profile, and a page
    # size that is not a power of two where the release takes it (the radix cache off: no extra buffer
    # whose mamba_track_interval it must divide), which the pool aligns down to.
    "kv-fp8": {"kv_cache_dtype": "fp8_e4m3"},
    "kv-max-total-tokens": {"max_total_tokens": 100_000},
    "kv-page-3-radix-off": {"page_size": 3, "disable_radix_cache": True},
}
# Spec decoding at pp 1: 0.5.16-0.5.20 refuse it under PP at startup (check_server_args, which the engine
# does not run: see the engine's docstring), 0.5.21+ accept it; the pool sizing is the same either way.
# Cases where SGLang itself must derive values (a refusal there would make the comparison vacuous).
MUST_DERIVE = ("auto-fit", "no_buffer", "explicit-K", "no-radix-mrr", "spec", "dp2")
# 0.5.10-0.5.13.post1 refuse spec decoding with no_buffer and the radix cache on in ServerArgs, keyed on
# the speculative ALGORITHM, which the engine does not resolve (it would need a draft model; see the
# engine's docstring): the builtin refuses, the engine sizes. A known gap of the engine, like the
# PP + spec refusal of 0.5.10-0.5.20, not a model error.
SPEC_STARTUP_REFUSAL = "is not compatible with radix cache when using --mamba-scheduler-strategy no_buffer"


def _skip_engine_gap(engine: Any, texts: list[str]) -> None:
    from checker.core.releases.releases import release_model

    if release_model(engine.version).rules.radix_rule == "scheduler" and any(
        SPEC_STARTUP_REFUSAL in t for t in texts
    ):
        pytest.skip(f"SGLang {engine.version}'s spec + no_buffer startup refusal needs a real draft setup")


def _compare_release(
    engine: Any, source: Any, env: dict[str, str], **flags: Any
) -> tuple[list[Drift], list[Outcome]]:
    """Every stage with both: the builtin as the installed release, and that release's own code."""
    from checker.core.errors import CheckerInputError

    base: dict[str, Any] = {"budget_gib": 16.0, "pp_size": 4, "tp_size": 2} | flags
    base["pp_size"] = _stages(engine, source, base["pp_size"])
    g = resolve_dtypes(
        load_geometry(model=source.model, model_config=source.model_config, tp_size=base["tp_size"]), env=env
    )
    try:
        inputs = CapacityInputs(geometry=g, sglang_version=engine.version, **base)
    except CheckerInputError as exc:  # refused before either engine runs: SGLang must refuse too
        prepared_error: CheckerInputError | None = exc
        inputs = None
    else:
        prepared_error = None
    drifts: list[Drift] = []
    outs: list[Outcome] = []
    pp = base["pp_size"]
    try:
        prepared = engine.prepare(inputs, source, env) if inputs is not None else None
        sglang_error = None
    except CheckerInputError as exc:
        prepared, sglang_error = None, exc
    for k in range(pp):
        b = Outcome(k, error=prepared_error) if inputs is None else _builtin_outcome(inputs, k)
        s = (
            Outcome(k, error=sglang_error or prepared_error)
            if prepared is None
            else _sglang_outcome(prepared, k)
        )
        outs.append(s)
        drifts += compare(b, s)
        if inputs is not None and b.stage is not None and s.stage is not None:
            drifts += [
                Drift(k, name, str(getattr(b.stage, name)), str(getattr(s.stage, name)))
                for name in ("slots_per_request", "padding_slot_charged", "branch", *KV_FIELDS)
                if getattr(b.stage, name) != getattr(s.stage, name)
            ]
    return drifts, outs


# The KV pool beyond DRIFT_VALUES: what the stage's cell counts, the bytes the state pool left, the
# profile, the bytes the MIN leaves idle and which stage sets it.
KV_FIELDS = (
    "kv_attention_layers",
    "kv_available_bytes",
    "kv_profiled_tokens",
    "kv_idle_bytes",
    "kv_limiting",
)


def _stages(engine: Any, source: Any, pp: int) -> int:
    """``pp``, or 1 for a class the installed release does not start under PP (Qwen3-Next, Falcon-H1,
    Granite-4.0-H: checker/core/releases/pp_support.py):
    their sizing is compared on the deployment SGLang starts."""
    from checker.core.releases.model_support import registry_choice, runs_under_pp
    from checker.families.geometry import model_architectures

    archs = model_architectures(model=source.model, model_config=source.model_config)
    arch = registry_choice(engine.version, archs)
    return 1 if arch is not None and runs_under_pp(engine.version, arch) is False else pp


def _builtin_outcome(inputs: CapacityInputs, k: int) -> Outcome:
    from checker.core.errors import CheckerInputError

    try:
        return Outcome(k, stage=derive_stage(inputs, k))
    except CheckerInputError as exc:
        return Outcome(k, error=exc)


def _sglang_outcome(prepared: Any, k: int) -> Outcome:
    from checker.core.errors import CheckerInputError

    try:
        return Outcome(k, stage=prepared.derive(k))
    except CheckerInputError as exc:
        return Outcome(k, error=exc)


def _family(name: str) -> Any:
    from checker.engines import ModelSource

    return ModelSource(model_config=str(REPO / "tests" / "fixtures" / f"{name}.json"))


@pytest.mark.sglang
@pytest.mark.parametrize("case", list(RELEASE_CASES), ids=list(RELEASE_CASES))
@pytest.mark.parametrize("family", FAMILIES)
def test_builtin_of_the_installed_release_matches_its_code(sglang_engine, family: str, case: str) -> None:
    """For the INSTALLED release (0.5.16 .. 0.5.23), each sizing branch on each model family: the builtin
    model of that release and that release's own code derive the same K, max_running_requests,
    micro-batch, slice, stage_per_req, slots per request and padding-slot charge on every stage, or
    both refuse."""
    drifts, outs = _compare_release(sglang_engine, _family(family), {}, **RELEASE_CASES[case])
    _skip_engine_gap(sglang_engine, [d.builtin for d in drifts])
    assert drifts == [], [str(d) for d in drifts]
    if case in MUST_DERIVE:
        assert all(o.stage is not None for o in outs), [str(o.error) for o in outs if o.error]


@pytest.mark.sglang
@pytest.mark.parametrize(
    "env",
    [
        {"SGLANG_PP_LAYER_PARTITION": "16,12,12,8"},
        {"SGLANG_PP_LAYER_PARTITION": "0,16,16,16"},
        {"SGLANG_OPT_MAMBA_SKIP_DECODE_LOCK": "1"},
        {"SGLANG_MAMBA_SSM_DTYPE": "float16"},
    ],
    ids=lambda e: ",".join(f"{k}={v}" for k, v in e.items()),
)
def test_builtin_of_the_installed_release_matches_its_code_on_env(sglang_engine, env: dict[str, str]) -> None:
    """The env vars SGLang reads while sizing (partition, skip-decode-lock, state dtype), a GDN model of
    48 layers at pp 4, as the installed release reads them."""
    from checker.core.sizing.sizing import env_flag as flag

    flags: dict[str, Any] = {}
    if "SGLANG_PP_LAYER_PARTITION" in env:
        flags["partition_env"] = env["SGLANG_PP_LAYER_PARTITION"]
    if "SGLANG_OPT_MAMBA_SKIP_DECODE_LOCK" in env:
        flags["skip_decode_lock"] = flag(env["SGLANG_OPT_MAMBA_SKIP_DECODE_LOCK"])
    drifts, outs = _compare_release(sglang_engine, _family(GDN), env, budget_gib=8.0, **flags)
    assert drifts == [], [str(d) for d in drifts]
    if env.get("SGLANG_PP_LAYER_PARTITION", "").startswith("0,") and _divides_by_zero_cell(sglang_engine):
        # Stage 0 holds no layer, so no full-attention layer: its KV cell is 0 bytes and up to 0.5.16 the
        # release divides by it (ZeroDivisionError); from 0.5.17 it reports int64 max, out of the MIN.
        assert isinstance(outs[0].error, LayoutError) and "ZeroDivisionError" in str(outs[0].error)
        outs = outs[1:]
    assert all(o.stage is not None for o in outs), [str(o.error) for o in outs if o.error]


def _divides_by_zero_cell(engine: Any) -> bool:
    from checker.core.releases.kv_support import KV_CODE

    return KV_CODE[engine.version].zero_cell == "divide"


@pytest.mark.sglang
def test_worked_example_kimi_k3_per_release(sglang_engine) -> None:
    """kimi-k3, pp 8, 8 GiB, r 0.5, no_buffer with --disable-overlap-schedule, run by the installed
    release's own code: 0.5.16 charges every stage the whole model (pool 9, 3 requests, micro-batch 1);
    0.5.17+ charge the largest stage's share and the padding slot (74, 24, 3). The builtin of the same
    release agrees on every stage."""
    from checker.engines import ModelSource

    g = resolve_dtypes(load_geometry(model="kimi-k3"), env={})
    flags = dict(
        budget_gib=8.0,
        pp_size=8,
        mamba_full_memory_ratio=0.5,
        mamba_radix_cache_strategy="no_buffer",
        disable_overlap_schedule=True,
    )
    prepared = sglang_engine.prepare(
        CapacityInputs(geometry=g, sglang_version=sglang_engine.version, **flags),
        ModelSource(model="kimi-k3"),
        {},
    )
    got = {
        (s.max_mamba_cache_size, s.max_running_requests, s.pp_max_micro_batch_size)
        for s in (prepared.derive(k) for k in range(8))
    }
    expected = (9, 3, 1) if sglang_engine.policy == "whole-model" else (74, 24, 3)  # up to 0.5.16
    assert got == {expected}
    drifts, _ = _compare_release(sglang_engine, ModelSource(model="kimi-k3"), {}, tp_size=1, **flags)
    assert drifts == [], [str(d) for d in drifts]


@pytest.mark.sglang
@pytest.mark.parametrize("pp", [1, 2])
def test_kimi_linear_worked_case_per_release(sglang_engine, pp: int) -> None:
    """Issue 36's worked case run by the installed release's own KV pool code: Kimi-Linear-48B, tp 4,
    60 GiB, --disable-radix-cache. Every stage's own capacity, the pool after the MIN, the request cap and
    the micro-batch equal the builtin's of the same release (tests/test_kv_worked_case.py holds the
    builtin of 0.5.23 to the numbers); on 0.5.23 itself they are the issue's: 9,812,728 / 7,359,546 own,
    7,359,546 after the MIN, 3593 requests, micro-batch 1796 at pp 2; 2053 requests at pp 1."""
    source = _family("kimi_linear_48b_a3b")
    flags = dict(budget_gib=60.0, pp_size=pp, tp_size=4, disable_radix_cache=True)
    drifts, outs = _compare_release(sglang_engine, source, {}, **flags)
    assert drifts == [], [str(d) for d in drifts]
    assert all(o.stage is not None for o in outs), [str(o.error) for o in outs if o.error]
    if sglang_engine.version != "0.5.23":
        return
    got = [
        (
            o.stage.kv_own_tokens,
            o.stage.max_total_num_tokens,
            o.stage.max_running_requests,
            o.stage.pp_max_micro_batch_size,
        )
        for o in outs
        if o.stage is not None
    ]
    if pp == 2:
        assert got == [(9_812_728, 7_359_546, 3593, 1796), (7_359_546, 7_359_546, 3593, 1796)]
    else:
        assert [g[2] for g in got] == [2053]


def _both(cli: Callable[..., Any], argv: list[str], env: dict[str, str] | None = None) -> tuple[int, dict]:
    res = cli(["derive", "--engine", "both", "--format", "json", *argv], env)
    assert res.err == "" or res.rc != 0, res.err
    return res.rc, (json.loads(res.out) if res.out else {"error": res.err})


def _fixture(name: str) -> list[str]:
    return ["--model-config", str(REPO / "tests" / "fixtures" / f"{name}.json")]


FLAG_SETS = {
    "auto": [],
    "auto-no-overlap": ["--disable-overlap-schedule"],
    "auto-paged": ["--page-size", "16"],
    "no_buffer": ["--mamba-radix-cache-strategy", "no_buffer", "--disable-overlap-schedule"],
    "extra_buffer": ["--mamba-radix-cache-strategy", "extra_buffer"],
    "radix-off": ["--disable-radix-cache"],
    "branch-A": ["--max-mamba-cache-size", "301", "--dp-size", "2"],
    "branch-B": ["--disable-radix-cache", "--max-running-requests", "40"],
    "spec": ["--speculative-num-draft-tokens", "3", "--max-running-requests", "32", "--pp-size", "1"],
    "spec-A": [
        "--speculative-num-draft-tokens",
        "4",
        "--max-running-requests",
        "64",
        "--max-mamba-cache-size",
        "20",
        "--pp-size",
        "1",
    ],
    "kv-binds": ["--token-capacity", "3000", "--context-len", "1024"],
    "ssm-bf16": ["--mamba-ssm-dtype", "bfloat16", "--mamba-full-memory-ratio", "0.5"],
    "micro": ["--pp-max-micro-batch-size", "5", "--max-running-requests", "100"],
}


@pytest.mark.sglang
@pytest.mark.parametrize("flags", list(FLAG_SETS), ids=list(FLAG_SETS))
@pytest.mark.parametrize("family", FAMILIES)
def test_engines_agree_across_families_and_branches(sglang_engine, cli, family: str, flags: str) -> None:
    """Every family x branch x strategy at pp 4 and tp 2: the builtin and SGLang's own code derive the
    same K, max_running_requests, micro-batch, slices and stage_per_req on every stage. A model error
    shows as exit 4 with the drift listed."""
    pp = _stages(sglang_engine, _family(family), 4)
    rc, doc = _both(
        cli,
        [*_fixture(family), "--pp-size", str(pp), "--tp-size", "2", "--budget-gib", "16", *FLAG_SETS[flags]],
    )
    if rc == 2:  # both refuse (e.g. a family the release gives no extra buffer): an input error, no drift
        assert "drift" not in doc and "SGLang" in doc["error"], doc
        return
    _skip_engine_gap(sglang_engine, [d["builtin"] for d in doc.get("drift", [])])
    assert rc == 0 and doc["drift"] == [], doc.get("drift") or doc
    assert doc["engine"] == "both" and doc["inputs"]["sglang_installed"] == sglang_engine.version


@pytest.mark.sglang
@pytest.mark.parametrize("pp", [1, 2, 3, 5, 8])
@pytest.mark.parametrize("model", [["--model", "kimi-k3"], ["--model-config", "QWEN35"]])
def test_engines_agree_across_pp_sizes(sglang_engine, cli, pp: int, model: list[str]) -> None:
    """The default split (the LAST L % P stages get the extra layer) and max-share over it, as SGLang's
    get_pp_indices and _handle_max_mamba_cache compute them; the preset runs through SGLang's pool
    sizing with the checker's geometry (before 0.5.17, which cannot load kimi-k3, its layers and
    shapes as a JSON model spec)."""
    from checker.core.releases.model_support import registers

    if model[1] == "QWEN35":
        model = _fixture("qwen3_5_397b_a17b")
    elif not registers(sglang_engine.version, "KimiK3ForConditionalGeneration"):
        model = _fixture("kimi_k3_shape_spec")
    rc, doc = _both(cli, [*model, "--pp-size", str(pp), "--budget-gib", "12.34"])
    assert rc == 0 and doc["drift"] == [], doc.get("drift") or doc


PARTITIONS = {  # GDN: 48 layers, every 4th full attention
    "front-heavy": "16,12,12,8",
    "uneven": "9,13,13,13",
    "empty-stage": "0,16,16,16",
    "padded": " 12,12, 12,12",
}


@pytest.mark.sglang
@pytest.mark.parametrize("name", list(PARTITIONS))
def test_engines_agree_on_the_partition_env(sglang_engine, cli, name: str) -> None:
    """SGLANG_PP_LAYER_PARTITION under max-share (the only policy SGLang ships): same slices, same
    busiest-stage share, same pool on every stage."""
    rc, doc = _both(
        cli,
        [*_fixture(GDN), "--pp-size", "4", "--budget-gib", "8"],
        {"SGLANG_PP_LAYER_PARTITION": PARTITIONS[name]},
    )
    if name == "empty-stage" and _divides_by_zero_cell(sglang_engine):
        # Up to 0.5.16 the empty stage's 0-byte KV cell is a ZeroDivisionError: both engines refuse.
        assert rc == 2 and "drift" not in doc and "holds no full-attention layer" in doc["error"], doc
        return
    assert rc == 0 and doc["drift"] == [], doc.get("drift") or doc
    assert [r["start_layer"] for r in doc["ranks"]][1:] == [
        int(sum(map(int, PARTITIONS[name].split(",")[:k]))) for k in range(1, 4)
    ]


ENVS = [
    {"SGLANG_OPT_MAMBA_SKIP_DECODE_LOCK": "yes"},
    {"SGLANG_OPT_MAMBA_SKIP_DECODE_LOCK": "1"},
    {"SGLANG_OPT_MAMBA_SKIP_DECODE_LOCK": "on"},
    {"SGLANG_MAMBA_SSM_DTYPE": "float16"},
    {"SGLANG_MAMBA_CONV_DTYPE": "float32"},
]


@pytest.mark.sglang
@pytest.mark.parametrize("env", ENVS, ids=lambda e: ",".join(f"{k}={v}" for k, v in e.items()))
@pytest.mark.parametrize("family", ["kimi_linear_48b_a3b", "qwen3_5_397b_a17b", "granite_4_0_h_small"])
def test_engines_agree_on_env(sglang_engine, cli, family: str, env: dict[str, str]) -> None:
    """The env vars SGLang reads at sizing time (slots per request, state dtypes; Kimi and Granite
    ignore the config dtype) parse the same way in both engines (Granite at pp 1: it does not start
    under PP)."""
    pp = _stages(sglang_engine, _family(family), 4)
    rc, doc = _both(cli, [*_fixture(family), "--pp-size", str(pp), "--budget-gib", "8"], env)
    assert rc == 0 and doc["drift"] == [], doc.get("drift") or doc


@pytest.mark.sglang
def test_auto_under_pp_resolves_as_the_builtin_says(sglang_engine) -> None:
    """The builtin resolves ``auto`` before PP turns the overlap schedule off (0.5.14+: extra_buffer, 4
    slots; 0.5.10-0.5.13.post1 always no_buffer, 3). SGLang's own resolution pipeline must agree; 3
    slots on 0.5.14+ would mean reading auto as no_buffer under PP is right."""
    from checker.engines import ModelSource

    g = resolve_dtypes(load_geometry(model="kimi-k3"), env={})
    inputs = CapacityInputs(geometry=g, budget_gib=8.0, pp_size=8, sglang_version=sglang_engine.version)
    prepared = sglang_engine.prepare(inputs, ModelSource(model="kimi-k3"), {})
    described = prepared.describe()
    assert (described["mamba_radix_cache_strategy"], described["disable_overlap_schedule"]) == (
        inputs.resolved_strategy,
        True,
    )
    assert prepared.derive(0).slots_per_request == inputs.slots_per_request()
    if inputs.release.rules.radix_rule == "strategies":
        assert (inputs.resolved_strategy, inputs.slots_per_request()) == ("extra_buffer", 4)


@pytest.mark.sglang
def test_a_model_error_is_reported_as_drift(sglang_engine, cli, monkeypatch) -> None:
    """Break the builtin's budget split by 1%: derive --engine both must exit 4 and name
    max_mamba_cache_size with the builtin's and SGLang's numbers (SGLang's being the unbroken one)."""
    from checker.core.sizing import formulas  # the budget split's one home, both paths call it

    argv = [*_fixture("nemotron_h_8b"), "--pp-size", "4", "--budget-gib", "8"]
    rc, good = _both(cli, argv)
    assert rc == 0
    real = formulas.mamba_budget_bytes
    monkeypatch.setattr(formulas, "mamba_budget_bytes", lambda b, r: real(b, r) * 1.01)
    rc, doc = _both(cli, argv)
    assert rc == 4
    k = [d for d in doc["drift"] if d["value"] == "max_mamba_cache_size"]
    assert len(k) == 4  # every stage
    assert {d["sglang"] for d in k} == {str(good["ranks"][0]["max_mamba_cache_size"])}
    assert all(int(d["builtin"]) > int(d["sglang"]) for d in k)
    text = cli(["derive", "--engine", "both", *argv])
    assert text.rc == 4 and "MODEL DRIFT" in text.out and "max_mamba_cache_size on pp_rank 0" in text.out


@pytest.mark.sglang
def test_engine_sglang_refuses_policies_sglang_does_not_have(sglang_engine, cli) -> None:
    """own-share/whole-model are the checker's what-ifs: asking SGLang for them is a clear exit 2.
    (Qwen3-Next at pp 1: every modelled release loads it, at one stage; the default kimi-k3 arrived in
    0.5.17.)"""
    res = cli(
        ["derive", "--engine", "sglang", *_fixture("qwen3_next_80b_a3b"), "--pp-size", "1"]
        + ["--policy", "own-share"]
    )
    assert res.rc == 2 and "--policy own-share is a checker what-if" in res.err
    assert len(res.err.strip().splitlines()) == 1


@pytest.mark.sglang
def test_engine_sglang_reports_sglang_refusals_as_input_errors(sglang_engine, cli) -> None:
    """A page size SGLang's validation refuses (256 % 24 != 0) is one line, exit 2, quoting SGLang
    (0.5.14+: before, auto is no_buffer and nothing checks the page size against the track interval)."""
    from checker.core.releases.releases import release_model

    if release_model(sglang_engine.version).rules.radix_rule != "strategies":
        pytest.skip(f"SGLang {sglang_engine.version} resolves auto to no_buffer: no extra-buffer page check")
    argv = [*_fixture(GDN), "--pp-size", "2", "--page-size", "24"]  # loads in every release the engine runs
    res = cli(["derive", "--engine", "sglang", *argv])
    assert res.rc == 2 and "SGLang rejects the flags" in res.err and "page_size" in res.err


BOTH_REFUSE = {  # SGLang 0.5.23's startup asserts (arg_groups/mamba_hook.py), which the builtin mirrors
    "no_buffer overlap on, pp 4": ["--mamba-radix-cache-strategy", "no_buffer"],
    "no_buffer overlap on, pp 1": ["--mamba-radix-cache-strategy", "no_buffer", "--pp-size", "1"],
    "no_buffer page 16": [
        "--mamba-radix-cache-strategy",
        "no_buffer",
        "--disable-overlap-schedule",
        "--page-size",
        "16",
    ],
    "extra_buffer page 24": ["--mamba-radix-cache-strategy", "extra_buffer", "--page-size", "24"],
    "auto page 3": ["--page-size", "3"],
    "extra_buffer_lazy page 96, pp 1": [
        "--mamba-radix-cache-strategy",
        "extra_buffer_lazy",
        "--pp-size",
        "1",
        "--page-size",
        "96",
    ],
    # pp 1: under PP 0.5.21+ start speculative decoding only with SGLANG_ENABLE_PP_SPEC (0.5.16-0.5.20 not
    # at all), a refusal of its own (tests/test_startup.py)
    "draft tokens 257": [
        "--speculative-num-draft-tokens",
        "257",
        "--max-running-requests",
        "8",
        "--pp-size",
        "1",
    ],
}


@pytest.mark.sglang
@pytest.mark.parametrize("flags", list(BOTH_REFUSE), ids=list(BOTH_REFUSE))
def test_engines_refuse_the_same_cache_flags(sglang_engine, cli, flags: str) -> None:
    """Each cache-flag combination SGLang refuses at startup is refused by the builtin too: exit 2 with
    the builtin's one line, not exit 4 (one engine derives values) or 0 (both derive)."""
    res = cli(
        [
            "derive",
            "--engine",
            "both",
            *_fixture(GDN),
            "--pp-size",
            "4",
            "--budget-gib",
            "16",
            *BOTH_REFUSE[flags],
        ]
    )
    from checker.core.releases.releases import release_model

    if release_model(sglang_engine.version).rules.radix_rule != "strategies":
        # 0.5.10-0.5.13.post1 have most of these asserts not (no_buffer turns the overlap schedule off, the
        # page size is not checked against the track interval): both engines must then agree, deriving
        # the same values or refusing alike (no drift).
        _skip_engine_gap(sglang_engine, [res.out, res.err])
        assert res.rc in (0, 2) and "MODEL DRIFT" not in res.out, (res.rc, res.err, res.out[-300:])
        return
    lines = res.err.strip().splitlines()
    assert res.rc == 2 and len(lines) == 1, (res.rc, res.err)
    assert f"SGLang {sglang_engine.version} refuses" in lines[0], lines[0]


@pytest.mark.sglang
def test_plan_engines_agree_on_the_min_budget(sglang_engine, cli) -> None:
    """plan's budget boundary searched again with SGLang's derivation lands on the same 0.01 GiB
    (Kimi-Linear at pp 4 where the release starts it under PP, 0.5.17+; at one stage before)."""
    pp = str(_stages(sglang_engine, _family("kimi_linear_48b_a3b"), 4))
    res = cli(
        [
            "plan",
            "--engine",
            "both",
            "--target-max-running-requests",
            "40",
            "--format",
            "json",
            *_fixture("kimi_linear_48b_a3b"),
            "--pp-size",
            pp,
        ]
    )
    assert res.rc == 0, res.err
    doc = json.loads(res.out)
    # Without --policy the search runs under the release's own policy (whole-model on 0.5.16).
    assert doc["drift"] == [] and list(doc["min_budget_gib"]) == [sglang_engine.policy]
    alone = json.loads(
        cli(
            [
                "plan",
                "--engine",
                "sglang",
                "--target-max-running-requests",
                "40",
                "--format",
                "json",
                *_fixture("kimi_linear_48b_a3b"),
                "--pp-size",
                pp,
            ]
        ).out
    )
    assert alone["min_budget_gib"] == doc["min_budget_gib"]


# Loaded on one rank through PYTHONPATH: breaks the builtin's budget split by 1% there, so that rank's
# engines disagree (SGLang 0.5.23 has no known drift left to use for the real-ranks path).
_BREAK_BUILTIN = """\
from checker.core.sizing import formulas
_real = formulas.mamba_budget_bytes
formulas.mamba_budget_bytes = lambda budget_gib, ratio: _real(budget_gib, ratio) * 1.01
"""


@pytest.mark.sglang
def test_check_engine_both_on_real_ranks(sglang_engine, tmp_path: Path) -> None:
    """The preflight on 2 gloo ranks: each rank derives with both engines locally. Agreement is
    consistent (exit 0, sglang_installed in the inputs); flags both engines refuse (an explicit no_buffer
    without --disable-overlap-schedule, SGLang 0.5.23's startup assert) are an input error, exit 2 on
    every rank, not drift; a drift on any one rank (rank 1's builtin broken by 1%) is model_drift,
    exit 4 on every rank."""
    import os

    from harness import run_world

    base = [
        "check",
        *_fixture(GDN),
        "--budget-gib",
        "8",
        "--engine",
        "both",
        "--timeout-s",
        "180",  # two ranks import SGLang (up to a minute each on a loaded 2-core machine)
    ]
    res = run_world(base, world_size=2, tmp_path=tmp_path, kill_after_s=300)
    assert res.codes == [0, 0], [r.stderr[-400:] for r in res.ranks]
    assert res.report()["status"] == "consistent"
    from checker.core.releases.releases import release_model

    if release_model(sglang_engine.version).rules.radix_rule == "strategies":  # 0.5.14+: refused alike
        res = run_world(
            [*base, "--mamba-radix-cache-strategy", "no_buffer"],
            world_size=2,
            tmp_path=tmp_path,
            kill_after_s=300,
        )
        assert res.codes == [2, 2], [r.stderr[-400:] for r in res.ranks]
        rep = res.report()
        assert rep["status"] == "error" and len(rep["errors"]) == 1
        assert "--disable-overlap-schedule" in rep["errors"][0]
    broken = tmp_path / "broken_builtin"
    broken.mkdir()
    (broken / "sitecustomize.py").write_text(_BREAK_BUILTIN)
    # sitecustomize imports the checker before ``python -m`` puts the working directory on sys.path:
    # this tree goes on PYTHONPATH explicitly, or an installed checker elsewhere would answer.
    path = os.pathsep.join(p for p in (str(broken), str(REPO), os.environ.get("PYTHONPATH", "")) if p)
    res = run_world(
        base, world_size=2, tmp_path=tmp_path, kill_after_s=300, rank_env={1: {"PYTHONPATH": path}}
    )
    rep = res.report()
    assert res.codes == [4, 4], (rep.get("errors"), [r.stderr[-400:] for r in res.ranks])
    assert rep["status"] == "model_drift"
    assert [r["status"] for r in rep["ranks"]] == ["ok", "model_drift"], rep["ranks"]
