"""What the ``sglang`` engine says when it cannot run the installed SGLang's code (torch-free, stdlib only).

Two kinds of failure, never a quiet fallback (docs/engine.md, "When the installed SGLang changed"):

* the user's inputs, refused by SGLang's own checks (:data:`SGLANG_REFUSES`): mapped to the checker's
  input errors by the phase that refused them (``checker.engines.sglang._map_error``);
* the installed SGLang changed where the engine calls it (:data:`SGLANG_CHANGED`, a module, a method or
  a field that is not what the engine was written against; a source file the engine reads that does not
  parse): :class:`SglangChanged`, one line naming the place and what it raised, exit 2. Its subclass
  :class:`StandInRead` is the same news found by a strict stand-in: the release reads an input the
  checker does not hold.
"""

from __future__ import annotations

from checker.core.errors import CheckerInputError

SGLANG_REFUSES: tuple[type[Exception], ...] = (ValueError, AssertionError, RuntimeError, ArithmeticError)
"""What SGLang's own checks raise on inputs they refuse: in 0.5.23's argument resolution, model configs,
sizing and slicing (server_args.py, arg_groups/, configs/, mem_cache/kv_cache_configurator.py,
model_executor/pool_configurator.py, distributed/utils.py) 593 ``raise ValueError``, 21 ``RuntimeError``,
15 ``NotImplementedError`` (a RuntimeError) and the bare ``assert``s; an arithmetic error is an input
the arithmetic cannot take (a 0-byte cell). The user changes the inputs."""

SGLANG_CHANGED: tuple[type[Exception], ...] = (AttributeError, TypeError, NameError, LookupError, ImportError)
"""What a call into SGLang raises when the code it reaches is not what the engine was written against: a
renamed attribute or field (AttributeError), a changed signature (TypeError), a moved name (NameError,
ImportError), a changed table (KeyError, IndexError). SGLang's own refusals of the inputs the engine
passes are :data:`SGLANG_REFUSES` (its few TypeErrors and AttributeErrors guard its internal contracts,
not user input). The user cannot fix it with a flag: :class:`SglangChanged`."""

IMPORT_FAILURES: tuple[type[Exception], ...] = (*SGLANG_REFUSES, *SGLANG_CHANGED, OSError, SyntaxError)
"""What importing the installed SGLang's modules raises beyond a missing module (a broken install, a
dependency of another release than the one it pins): one line naming it, never a traceback."""


class SglangUnavailable(CheckerInputError):
    """SGLang is not installed, not importable, or a version the checker does not support."""


class SglangChanged(SglangUnavailable):
    """The installed SGLang changed where the engine calls it: the engine stops in one line naming the
    place, instead of answering with a default for the release (exit 2)."""


class StandInRead(SglangChanged):
    """SGLang's sizing code read an input that a stand-in the engine hands it does not hold.

    The engine runs the release's own methods on objects made without their constructors (a
    configurator, a model runner, parallel widths, a preset's state shapes) holding exactly the inputs
    the checker knows. A release that reads anything else (a new field, a renamed one) must not get a
    silent default, so this is NOT an AttributeError: ``getattr(obj, name, default)`` and ``hasattr``
    let it through instead of answering for the release. One line, exit 2.
    """


def sglang_changed(version: str | None, where: str, exc: BaseException) -> SglangChanged:
    """:class:`SglangChanged` for ``exc``, raised by the installed SGLang at ``where`` (what the engine
    called or read there)."""
    text = " ".join(str(exc).split())
    raised = f"{type(exc).__name__}: {text}" if text else type(exc).__name__
    return SglangChanged(
        f"the installed SGLang {version or '?'} changed where the checker calls it: {where} raised {raised}; "
        "the engine runs the code of the releases it knows there, not a guess: run a checker that knows "
        "this release, or report the release and this line"
    )
