"""No quiet fallback in the sglang engine: where the installed SGLang changed, the user reads it.

Every place the engine calls SGLang's code sorts what it raises (checker/engines/errors.py): SGLang's
refusal of the inputs (ValueError, assert, RuntimeError) is the input error of that phase, "SGLang
rejects the flags: ..."; a call that finds the code changed (a new signature: TypeError, a renamed
attribute: AttributeError, ...) is one line "the installed SGLang X changed where the checker calls it:
<where> raised ...", exit 2, never a number computed from a default and never a traceback.

The ``sglang`` tests change one real SGLang function of the installed release at a time (monkeypatched,
the way a new release changes it) and run ``derive --engine sglang`` through the real entry point;
scripts/sglang_cpu_env.sh runs them against each release. The others need no SGLang.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

from checker.core.errors import BudgetError, CheckerInputError, FlagError, LayoutError
from checker.engines.errors import SglangChanged, SglangUnavailable, StandInRead
from checker.engines.model_code import model_runner_assert, parse_source, read_class

REPO = Path(__file__).resolve().parent.parent
QWEN = str(REPO / "tests" / "fixtures" / "qwen3_5_397b_a17b.json")
CHANGED = "changed where the checker calls it"


# ---- without SGLang: the sorting itself, the source reader, the import ------------------------------


@pytest.mark.parametrize(
    ("raised", "phase", "expected", "words"),
    [
        (
            ValueError("page_size must be positive"),
            "resolve",
            FlagError,
            "SGLang rejects the flags: ValueError",
        ),
        (AssertionError("no_buffer"), "pool", FlagError, "SGLang rejects the flags: AssertionError"),
        (RuntimeError("Not enough memory"), "pool", BudgetError, "SGLang cannot size the state pool"),
        (ZeroDivisionError("division by zero"), "layout", LayoutError, "rejects the layer partition"),
        (TypeError("f() missing 1 required positional argument: 'x'"), "pool", SglangChanged, CHANGED),
        (AttributeError("'ServerArgs' object has no attribute 'y'"), "resolve", SglangChanged, CHANGED),
        (KeyError("mamba"), "config", SglangChanged, CHANGED),
    ],
)
def test_a_refusal_is_the_phase_s_input_error_a_changed_call_is_sglang_changed(
    raised: Exception, phase: str, expected: type, words: str
) -> None:
    from checker.engines.sglang import _sglang_call

    with (
        pytest.raises(CheckerInputError) as info,
        _sglang_call(phase, "Host.size", "0.5.99", asserts="resolve"),
    ):
        raise raised
    assert type(info.value) is expected and words in str(info.value)
    if expected is SglangChanged:
        assert f"SGLang 0.5.99 {CHANGED}: Host.size raised {type(raised).__name__}" in str(info.value)


def test_the_checker_s_own_errors_pass_through_unchanged() -> None:
    from checker.engines.sglang import _sglang_call

    own = StandInRead("SGLang 0.5.99's sizing code reads X.y, an input the checker does not know")
    with pytest.raises(StandInRead) as info, _sglang_call("pool", "Host.size", "0.5.99"):
        raise own
    assert info.value is own and isinstance(own, SglangChanged)


def test_an_exception_neither_refusal_nor_change_is_not_dressed_as_either() -> None:
    from checker.engines.sglang import _sglang_call

    with pytest.raises(OSError), _sglang_call("pool", "Host.size", "0.5.99"):
        raise OSError("disk")


def test_a_source_file_that_does_not_parse_is_named_not_skipped() -> None:
    """The model reader used to skip a file it could not parse, so a class it should have judged looked
    absent (and the pipeline check passed quietly). A byte-order mark is no reason (0.5.3.post1 to
    0.5.12.post1 ship models/qwen2_classification.py with one, which Python imports)."""
    assert parse_source("sglang/srt/models/m.py", "\ufeffclass M:\n    pass\n").body
    broken = "class M(:\n"
    with pytest.raises(SglangChanged, match=r"sglang/srt/models/m\.py does not parse here \(SyntaxError"):
        read_class("M", "sglang/srt/models/m.py", lambda path: broken)
    with pytest.raises(SglangChanged, match="model_runner.py does not parse"):
        model_runner_assert(lambda path: broken)


def test_an_import_that_raises_is_one_line_naming_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A module of the installed SGLang that raises while importing (here a KeyError): one line naming
    it, not a traceback."""
    from checker.engines.sglang import _import_api

    srt = tmp_path / "sglang" / "srt"
    srt.mkdir(parents=True)
    (tmp_path / "sglang" / "__init__.py").write_text("")
    (srt / "__init__.py").write_text("")
    (srt / "server_args.py").write_text("raise KeyError('an_import_time_table')\n")

    def imported() -> list[str]:
        return [m for m in sys.modules if m == "sglang" or m.startswith("sglang.")]

    for name in imported():  # a real SGLang imported before: put back after the test
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.syspath_prepend(str(tmp_path))
    failed = r"importing SGLang failed \(KeyError: 'an_import_time_table'\)"
    try:
        with pytest.raises(SglangUnavailable, match=failed):
            _import_api()
    finally:
        for name in imported():  # the fake package: gone for good
            del sys.modules[name]


# ---- with the installed SGLang: each call it guards, changed -----------------------------------------

sglang = pytest.mark.sglang


def _derive(cli: Any) -> str:
    r = cli(["derive", "--model-config", QWEN, "--pp-size", "2", "--engine", "sglang"])
    assert r.rc == 2, r.err[-800:]
    assert "Traceback" not in r.err
    (line,) = r.err.strip().splitlines()
    return str(line)


def _signature_changed(real: Any) -> Any:
    """``real`` as a release that added a required parameter has it: the engine's call is a TypeError."""

    def changed(*args: Any, new_required_input: Any, **kwargs: Any) -> Any:
        return real(*args, **kwargs)

    return changed


@sglang
def test_changed_argument_resolution(sglang_engine: Any, cli: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    cls = sglang_engine.api.ServerArgs
    name = "resolve_once" if hasattr(cls, "resolve_once") else "__post_init__"

    def renamed(self: Any, *args: Any, **kwargs: Any) -> None:
        raise AttributeError(f"'{type(self).__name__}' object has no attribute 'mamba_renamed_field'")

    monkeypatch.setattr(cls, name, renamed)
    line = _derive(cli)
    assert f"{CHANGED}: ServerArgs(...) and its resolution raised AttributeError" in line
    assert "mamba_renamed_field" in line


@sglang
def test_a_refusal_in_argument_resolution_is_still_the_flags_error(
    sglang_engine: Any, cli: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    cls = sglang_engine.api.ServerArgs
    name = "resolve_once" if hasattr(cls, "resolve_once") else "__post_init__"

    def refuses(self: Any, *args: Any, **kwargs: Any) -> None:
        raise ValueError("this release refuses these flags")

    monkeypatch.setattr(cls, name, refuses)
    line = _derive(cli)
    assert "SGLang rejects the flags: ValueError: this release refuses these flags" in line
    assert CHANGED not in line


def _engine_sees(monkeypatch: pytest.MonkeyPatch, **changes: Any) -> None:
    """The installed SGLang as the engine imports it (``_import_api``), with ``changes`` (name -> the
    changed object, given the real one) in place of the real pieces: the functions the engine calls
    change, SGLang's own callers of them do not (its resolution captures some on first use)."""
    import checker.engines.sglang as engine

    real_import = engine._import_api

    def changed_import() -> Any:
        api = real_import()
        for name, change in changes.items():
            setattr(api, name, change(getattr(api, name)))
        return api

    monkeypatch.setattr(engine, "_import_api", changed_import)


@sglang
def test_changed_model_config(sglang_engine: Any, cli: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    api = sglang_engine.api
    if api.model_config_of is not None:  # 0.5.19+
        _engine_sees(monkeypatch, model_config_of=_signature_changed)
    else:

        def changed_class(real: Any) -> Any:
            class ModelConfig(real):  # type: ignore[misc,valid-type]
                @classmethod
                def from_server_args(cls, server_args: Any, *, new_required_input: Any) -> Any:
                    return real.from_server_args(server_args)

            return ModelConfig

        _engine_sees(monkeypatch, ModelConfig=changed_class)
    line = _derive(cli)
    where = f"the model config and its {api.host_cls.__name__} (mamba2_cache_params)"
    assert f"{CHANGED}: {where} raised TypeError" in line and "new_required_input" in line


@sglang
def test_changed_stage_slicing(sglang_engine: Any, cli: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    _engine_sees(monkeypatch, get_pp_indices=_signature_changed)
    line = _derive(cli)
    assert f"{CHANGED}: distributed.utils.get_pp_indices raised TypeError" in line


@sglang
def test_changed_pool_sizing(sglang_engine: Any, cli: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    api = sglang_engine.api
    monkeypatch.setattr(
        api.host_cls, api.ratio_method, _signature_changed(getattr(api.host_cls, api.ratio_method))
    )
    line = _derive(cli)
    assert f"{CHANGED}: {api.host_cls.__name__}.{api.pool_method}, {api.ratio_method}" in line
    assert "raised TypeError" in line


@sglang
def test_changed_request_cap(sglang_engine: Any, cli: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    api = sglang_engine.api
    method = getattr(api.host_cls, api.requests_method)
    monkeypatch.setattr(api.host_cls, api.requests_method, _signature_changed(method))
    line = _derive(cli)
    assert (
        f"{CHANGED}: the KV pool after the MIN and {api.host_cls.__name__}.{api.requests_method} "
        "raised TypeError" in line
    )


@sglang
def test_changed_kv_cache_dtype_resolution(
    sglang_engine: Any, cli: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from checker.engines.sglang import _optional_module

    module = _optional_module("sglang.srt.mem_cache.kv_cache_dtype")
    if module is not None and hasattr(module, "configure_kv_cache_dtype"):  # 0.5.16+
        monkeypatch.setattr(
            module, "configure_kv_cache_dtype", _signature_changed(module.configure_kv_cache_dtype)
        )
    else:  # 0.5.10-0.5.15: the model runner's own method
        cls = sglang_engine.api.host_cls
        monkeypatch.setattr(cls, "configure_kv_cache_dtype", _signature_changed(cls.configure_kv_cache_dtype))
    line = _derive(cli)
    assert f"{CHANGED}: configure_kv_cache_dtype raised TypeError" in line


@sglang
def test_changed_platform_question(sglang_engine: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Whether this host is a GPU platform used to be answered False whenever asking it raised (and the
    function it asked did not exist in any release, so it always was)."""
    from checker.engines.sglang import SglangEngine

    api = sglang_engine.api
    if api.get_platform is not None:  # 0.5.19+: runtime_context.get_platform()

        def renamed_flag(real: Any) -> Any:
            class Renamed:
                def __getattr__(self, name: str) -> Any:
                    if name == "is_hip":
                        raise AttributeError("'PlatformContext' object has no attribute 'is_hip'")
                    return getattr(real(), name)

            return lambda: Renamed()

        _engine_sees(monkeypatch, get_platform=renamed_flag)
        where = "runtime_context.get_platform() raised AttributeError"
    else:
        module = api.server_args_module
        if not hasattr(module, "is_cuda"):
            pytest.skip("this release asks no platform question the engine answers")
        monkeypatch.setattr(module, "is_cuda", _signature_changed(module.is_cuda))
        where = "server_args.is_cuda() raised TypeError"
    assert sglang_engine._platform_is_gpu is False  # this CPU host, asked the release's own way
    with pytest.raises(SglangChanged, match=rf"{CHANGED}: {where}".replace("(", r"\(").replace(")", r"\)")):
        SglangEngine()


@sglang
def test_changed_parallel_widths(sglang_engine: Any, cli: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """0.5.16-0.5.18 answer the widths from live process groups (an assert that none is initialized,
    which the engine answers with the resolution's widths); any other failure there is a change."""
    rt = sglang_engine.api.runtime
    if rt is None:
        pytest.skip("0.5.10-0.5.15 publish no parallel context")

    def renamed_width(real: Any) -> Any:
        class Parallel:
            def __getattr__(self, name: str) -> Any:
                if name == "attn_tp_size":
                    raise AttributeError("'ParallelContext' has no 'attn_tp_size'")
                return getattr(real.get_parallel(), name)

        class Runtime:  # the runtime module as the engine sees it: get_parallel() changed
            def __getattr__(self, name: str) -> Any:
                return (lambda: Parallel()) if name == "get_parallel" else getattr(real, name)

        return Runtime()

    _engine_sees(monkeypatch, runtime=renamed_width)
    line = _derive(cli)
    assert f"{CHANGED}: runtime_context.get_parallel().attn_tp_size raised AttributeError" in line
