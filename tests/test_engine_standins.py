"""The engine's stand-ins are strict: SGLang code reading an input they do not hold fails, by name.

The sglang engine runs a release's own sizing methods on instances of the release's classes made
without their constructors (``checker.engines.sglang.strict_instance``) and on a few stand-ins of its
own. A release newer than the newest modelled one runs there by default; if it reads a new input, the
run must fail in one line naming it, and must not take a default: ``getattr(obj, name, default)`` and
``hasattr`` would silently answer for the release if the read raised AttributeError. These tests use
small classes shaped like SGLang's (a slots dataclass like 0.5.23's ``KVCacheConfigurator``, a plain
class like ``ModelRunner``); the same on the real classes runs in the ``sglang`` group
(tests/test_engine_newer.py).
"""

from __future__ import annotations

import dataclasses

import pytest

from checker.core.errors import CheckerInputError
from checker.engines.sglang import StandInRead, _CheckerMambaConfig, _ParallelState, strict_instance


@dataclasses.dataclass(slots=True, kw_only=True)
class Configurator:  # shaped like KVCacheConfigurator (0.5.23: slots, fields with defaults)
    pp_size: int
    attn_dp_size: int
    extra_mamba_cache_bytes_per_req: int = 0
    SCALE = 2  # a class constant is code, not an input

    @property
    def width(self) -> int:
        return self.pp_size * self.attn_dp_size

    def size(self) -> int:
        return self.width * self.SCALE + getattr(self, "new_input", 0)

    def size_if(self) -> int:
        return self.width + (1 if hasattr(self, "new_input") else 0)

    def extra(self) -> int:
        return self.extra_mamba_cache_bytes_per_req


class Runner:  # shaped like ModelRunner (a plain class; its mixin methods read self.X)
    RATIO = 3  # a class constant: code

    def handle(self) -> int:
        return self.server_args * self.dp_size // self.RATIO


def test_held_inputs_methods_properties_and_constants_work() -> None:
    c = strict_instance(Configurator, {"pp_size": 4, "attn_dp_size": 2, "new_input": 0}, version="0.5.24")
    assert isinstance(c, Configurator)
    assert (c.width, c.size(), c.size_if()) == (8, 16, 9)
    c.written = 3  # what SGLang's code writes is kept and read back
    assert c.written == 3


@pytest.mark.parametrize("method", ["size", "size_if"])
def test_a_new_input_read_with_a_default_is_not_answered_silently(method: str) -> None:
    """``getattr(self, "new_input", 0)`` and ``hasattr(self, "new_input")``: on a real instance both
    answer quietly; on the stand-in they raise, naming the class and the attribute."""
    c = strict_instance(Configurator, {"pp_size": 4, "attn_dp_size": 2}, version="0.5.24")
    with pytest.raises(StandInRead) as info:
        getattr(c, method)()
    msg = str(info.value)
    assert "SGLang 0.5.24" in msg and "Configurator.new_input" in msg and "\n" not in msg
    assert isinstance(info.value, CheckerInputError) and not isinstance(info.value, AttributeError)


def test_a_field_the_engine_does_not_hold_is_not_its_default() -> None:
    """A dataclass field with a default (the way 0.5.22 added extra_mamba_cache_bytes_per_req) is an
    input: unheld, it raises instead of reading 0."""
    c = strict_instance(Configurator, {"pp_size": 4, "attn_dp_size": 2}, version="0.5.24")
    with pytest.raises(StandInRead, match="Configurator.extra_mamba_cache_bytes_per_req"):
        c.extra()


def test_a_plain_class_attribute_is_no_input_but_a_missing_one_is_named() -> None:
    r = strict_instance(Runner, {"server_args": 6, "dp_size": 2}, version="0.5.12")
    assert r.handle() == 4
    with pytest.raises(StandInRead, match="Runner.mambaish_config"):
        r.mambaish_config  # noqa: B018


def test_the_engines_own_stand_ins_are_strict() -> None:
    ps = _ParallelState(4, 1, "0.5.24")
    assert (ps.pp_size, ps.attn_dp_size) == (4, 1)
    with pytest.raises(StandInRead, match=r"KVCacheConfigurator\.ps\.attn_cp_size"):
        getattr(ps, "attn_cp_size", 1)
    with pytest.raises(StandInRead, match="mambaish_config.full_attention_layer_ids"):
        hasattr(_CheckerMambaConfig.__new__(_CheckerMambaConfig), "full_attention_layer_ids")


def test_a_module_an_older_release_lacks_is_optional_a_broken_one_is_not(tmp_path, monkeypatch) -> None:
    """0.5.10-0.5.12 have no ``sglang.srt.arg_groups`` package at all: asking for one of its modules is
    "not there" (None), like a module missing from a package that exists; a module that exists but
    fails importing something else is a broken install and must surface."""
    from checker.engines.sglang import _optional_module

    (tmp_path / "pkg_present").mkdir()
    (tmp_path / "pkg_present" / "__init__.py").write_text("")
    (tmp_path / "pkg_present" / "broken.py").write_text("import a_dependency_that_is_missing\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert _optional_module("pkg_absent.mamba_hook") is None
    assert _optional_module("pkg_present.not_there") is None
    with pytest.raises(ModuleNotFoundError, match="a_dependency_that_is_missing"):
        _optional_module("pkg_present.broken")
