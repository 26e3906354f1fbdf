"""The deployment's SGLang launch command, parsed into the checker's sizing inputs (torch-free).

``checker ... -- python -m sglang.launch_server ARGS`` hands the command after ``--`` to
:func:`parse_launch_command`. Two parsers, with the same result type:

* **SGLang's own** (where the release asked for is the one installed and it imports): a fresh
  ``argparse.ArgumentParser`` filled by the release's ``ServerArgs.add_cli_args`` and the
  ``--config`` merge of ``prepare_server_args`` (``sglang/srt/server_args.py``), so defaults, aliases,
  abbreviations, types and choices are the release's. ``ServerArgs.from_cli_args`` is not called: in
  0.5.16-0.5.18 constructing a ``ServerArgs`` runs the whole startup resolution (device probing, model
  loading), which is the sglang engine's job (``checker/engines/sglang.py``); the parser's namespace
  already holds every raw value ``from_cli_args`` copies (it maps ``tensor_parallel_size`` ->
  ``tp_size`` etc. up to 0.5.13.post1, as :func:`_raw` does here).
* **the checker's model** of the release's flags (SGLang absent, or another release asked for): an
  argparse parser rebuilt from :mod:`checker.launch.flags`, the release's full table of option strings
  (each with how many values it takes) plus, for the flags sizing reads, dest, type, default,
  choices. The table was dumped from each release's own ``ServerArgs.add_cli_args``
  (``scripts/build_launch_flags.py``); ``tests/test_launch_command.py`` checks it against
  the live parser of every release importable in the SGLang CPU environment. Flags sizing does not
  read are accepted with their text, under SGLang's own dest (the first long option's), and kept in
  ``LaunchCommand.given_values``: the release's start-up checks of them (``--nnodes``,
  ``--enable-multi-layer-eagle``, ...: :mod:`checker.core.releases.launch_checks`) and the refusal of a sizing
  flag nothing models (:func:`checker.launch.merge.refuse_unmodelled`) read them there.

Forms (from each release's wheel): ``python[3] -m sglang.launch_server ARGS`` (every release);
``sglang serve ARGS`` (the ``sglang`` console script, ``sglang/cli/main.py``, 0.5.5+; ``--model-type``
is taken out by ``sglang/cli/serve.py`` from 0.5.10, and a leading positional model path becomes
``--model-path`` from 0.5.16); bare ``ARGS`` starting with ``-``.
"""

from __future__ import annotations

import argparse
import contextlib
import difflib
import importlib
import os
import re
import stat
from collections.abc import Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

from checker.argspec import read_parser
from checker.core.errors import FlagError, printable
from checker.core.releases.releases import installed_sglang_version, parse_version, release_key
from checker.core.sizing.models import path_stat, shown_path
from checker.core.weights.hub_cache import local_model_path
from checker.engines import quiet_sglang
from checker.launch.flags import RELEASES, release_rows
from checker.launch.repeats import OptionIndex, collapse_repeats

if TYPE_CHECKING:  # the table itself is imported where a parser is rebuilt from it
    from checker.launch.flags import FlagRow

# ServerArgs dests sizing reads (raw, by the release's own dest name). Every other flag is only named.
SIZING_DESTS = frozenset(
    {
        "model_path",
        "tensor_parallel_size",  # up to 0.5.13.post1; from_cli_args copies it to tp_size
        "tp_size",
        "pipeline_parallel_size",
        "pp_size",
        "data_parallel_size",
        "dp_size",
        "enable_dp_attention",
        "attn_dp_size",  # 0.5.22+
        "attn_cp_size",  # 0.5.14+
        "page_size",
        "disable_radix_cache",
        "disable_overlap_schedule",
        "mamba_radix_cache_strategy",  # 0.5.14+
        "mamba_scheduler_strategy",  # 0.5.7-0.5.13.post1
        "mem_fraction_static",
        "max_running_requests",
        "max_mamba_cache_size",
        "mamba_full_memory_ratio",
        "mamba_ssm_dtype",
        "mamba_track_interval",
        "speculative_algorithm",
        "speculative_num_steps",
        "speculative_eagle_topk",
        "speculative_num_draft_tokens",
        "enable_mixed_chunk",
        "context_length",
        "pp_max_micro_batch_size",
        "chunked_prefill_size",
        "max_prefill_tokens",
        "max_total_tokens",
        "enable_linear_replayssm_spec",
        "enable_gdn_replayssm_spec",
        "config",
    }
)
# Flags that say where the model is, read beside the sizing inputs (never compared, never sized with): the
# hub revision of a --model-path that names a hub id (checker.core.weights.hub_cache), and --download-dir,
# where SGLang's weights loader keeps its own cache. The flag tables store them as plain option rows.
LOCATION_DESTS = {"--revision": "revision", "--download-dir": "download_dir"}
# Sizing flags the stored tables keep as plain option rows (their choices change from release to release):
# read as the text given, and held to the release's own choices by the sizing (checker.core.sizing.kv_pool).
KV_DESTS = {
    "--kv-cache-dtype": "kv_cache_dtype",
    # the attention backends: the page size they force (checker.core.sizing.page_size)
    "--attention-backend": "attention_backend",
    "--decode-attention-backend": "decode_attention_backend",
    "--prefill-attention-backend": "prefill_attention_backend",
    "--speculative-draft-attention-backend": "speculative_draft_attention_backend",
}
# Flags that decide what a rank's model class holds (checker.core.weights.weights), read beside the sizing
# inputs
# for the weights figure; the same dests in every release's ServerArgs (``ep_size`` under any spelling).
WEIGHTS_DESTS = {
    "--ep-size": "ep_size",
    "--expert-parallel-size": "ep_size",
    "--ep": "ep_size",
    "--dtype": "dtype",
    "--quantization": "quantization",
    "--enable-dp-lm-head": "enable_dp_lm_head",
    "--language-model-only": "language_model_only",
    "--disable-shared-experts-fusion": "disable_shared_experts_fusion",
    "--moe-runner-backend": "moe_runner_backend",
    # a separate draft's checkpoint (checker.core.weights.weights.WeightsLayout.draft)
    "--speculative-draft-model-path": "speculative_draft_model_path",
    "--speculative-draft-model": "speculative_draft_model_path",
}
# Old dest -> the ServerArgs field from_cli_args copies it to (0.5.2-0.5.13.post1), or the older
# spelling of a field (--mamba-scheduler-strategy, renamed in 0.5.14).
_FIELD_OF = {
    "tensor_parallel_size": "tp_size",
    "pipeline_parallel_size": "pp_size",
    "data_parallel_size": "dp_size",
    "mamba_scheduler_strategy": "mamba_radix_cache_strategy",
    # 0.5.16's spelling of the spec-verify ring (0.5.17+ keep it as an alias of the new name)
    "enable_gdn_replayssm_spec": "enable_linear_replayssm_spec",
}
# SGLang field -> the checker's name (SizingFlags / ModelChoice / BudgetSource), where they differ.
CHECKER_NAME = {"model_path": "model_config", "context_length": "context_len"}
# The SGLang fields that are checker inputs under the same (or CHECKER_NAME's) name.
_DIRECT = (
    "pp_size",
    "page_size",
    "disable_radix_cache",
    "disable_overlap_schedule",
    "mamba_radix_cache_strategy",
    "mem_fraction_static",
    "max_running_requests",
    "max_mamba_cache_size",
    "mamba_full_memory_ratio",
    "mamba_ssm_dtype",
    "speculative_num_draft_tokens",
    "speculative_algorithm",
    "speculative_num_steps",
    "speculative_eagle_topk",
    "context_length",
    "pp_max_micro_batch_size",
    "kv_cache_dtype",
    "attention_backend",
    "decode_attention_backend",
    "prefill_attention_backend",
    "speculative_draft_attention_backend",
    "max_total_tokens",
    "enable_linear_replayssm_spec",
    "linear_replayssm_cache_len",
)
OWN_PARSER = "SGLang {version}'s own ServerArgs parser"
MODEL_PARSER = "the checker's model of SGLang {version}'s flags"
FORMS = (
    "python -m sglang.launch_server ARGS",
    "sglang serve ARGS",
    "ARGS (starting with --)",
)
MAX_LAUNCH_WORDS = 4096
"""The longest launch command read. Parsing is linear in the command's length (:mod:`~checker.launch.
repeats`) except where argparse itself is not (a release's custom actions, repeated); this bounds those,
before any bound of the run is armed."""
_PYTHON = re.compile(r"^python(\d+(\.\d+)?)?$")
_VERSION = re.compile(r"^(\d+)\.(\d+)\.(\d+)(?:\.?post(\d+))?$")


def _key(version: str) -> tuple[int, ...]:
    """A release's order (an installed pre-release or local build too: checker.core.releases.releases)."""

    m = _VERSION.match(version.strip())
    if m is None:
        return release_key(version)  # raises a one-line FlagError for what is no release number
    return tuple(int(x or 0) for x in m.groups())


def _same_release(a: str, b: str) -> bool:
    try:
        return _key(a) == _key(b)
    except FlagError:
        return a.strip() == b.strip()


def _canonical(version: str, *, source: str = "--sglang-version") -> str:
    """A final or post release number (what the flag tables are keyed by); FlagError naming ``source``."""

    a, b, c, post = parse_version(version, source=source)
    return f"{a}.{b}.{c}" + (f".post{post}" if post else "")


@dataclass(frozen=True, kw_only=True)
class LaunchCommand:
    """A parsed launch command: the sizing inputs exactly as the release reads them."""

    form: str
    """Which form the command had: one of :data:`FORMS`."""
    parser: str
    """``sglang X's own ServerArgs`` or ``the checker's model of SGLang X's flags``."""
    release: str
    argv: tuple[str, ...]
    values: dict[str, object]
    """Checker inputs by the checker's names (SizingFlags fields, ``model_config``,
    ``mem_fraction_static``): every one given, and every one whose parser default is a value. A name
    absent here is resolved by SGLang at startup (parser default None: page size, mem fraction, ...)."""
    explicit: frozenset[str]
    """Which keys of ``values`` the command gave (the rest are the release's parser defaults)."""
    sglang_values: dict[str, object] = field(default_factory=dict)
    """Every sizing-relevant ServerArgs field, raw, by SGLang's name (tp_size is the whole TP group here,
    values["tp_size"] the attention-TP width); includes what the checker records but does not derive
    with (speculative algorithm/steps/top-k, chunked prefill, max total tokens, replay-SSM)."""
    sglang_explicit: frozenset[str] = frozenset()
    location: dict[str, str] = field(default_factory=dict)
    """``revision`` and ``download_dir`` where the command gives them (:data:`LOCATION_DESTS`)."""
    weights: dict[str, object] = field(default_factory=dict)
    """What the rank's weights depend on beyond the sizing inputs (:data:`WEIGHTS_DESTS`), where the
    command gives it: ``ep_size`` (int), ``dtype``, ``quantization`` (str), the switches (True)."""
    given_values: dict[str, object] = field(default_factory=dict)
    """Every flag the command gives, by its ServerArgs field (``tp_size``, ``nnodes``,
    ``enable_multi_layer_eagle``, ...), as the parser stored it: typed by SGLang's own parser; the table
    parser types the sizing inputs and keeps the text of the rest (a switch is True). What the start-up
    checks (``checker.core.releases.startup.check_launch``) and the
    refusal of unmodelled sizing flags read."""

    @property
    def label(self) -> str:
        return f"{self.form.split(' ARGS')[0]} ({self.parser})"

    def sizing_text(self) -> dict[str, str]:
        """One canonical text per sizing input (checker name, then SGLang-only fields as ``sglang.X``),
        for the report's digests: two nodes started with different commands differ in named keys."""
        names = set(self.values) | {CHECKER_NAME.get(n, n) for n in _DIRECT if n in self.sglang_values}
        out = {name: _text(self.values.get(name)) for name in sorted(names)}
        mapped = set(_DIRECT) | {"model_path", "config"}
        for name in sorted(set(self.sglang_values) - mapped):
            out[f"sglang.{name}"] = _text(self.sglang_values[name])
        return out


def _text(value: object) -> str:
    if isinstance(value, bool) or value is None:
        return {True: "true", False: "false", None: "none"}[value]
    if isinstance(value, float):
        return repr(value)
    return printable(str(value))  # quoted in root causes and logs: a newline in a path must not break them


# ------------------------------------------------------------------------------------------------------
# Forms
# ------------------------------------------------------------------------------------------------------

_FIRST_SERVE = "0.5.5"  # sglang/cli/main.py and the `sglang` console script
_FIRST_MODEL_TYPE = "0.5.10"  # sglang/cli/serve.py _extract_model_type_override
_FIRST_POSITIONAL = "0.5.16"  # sglang/cli/serve.py _normalize_positional_model_path


def split_form(argv: Sequence[str], release: str) -> tuple[str, list[str]]:
    """(form, the arguments ServerArgs' parser receives), as the release's entry point hands them on."""
    argv = [str(a) for a in argv]
    expected = "expected " + ", or ".join(f"`{f}`" for f in FORMS)
    if not argv:
        raise FlagError(f"the launch command after -- is empty; {expected}")
    head = os.path.basename(argv[0])
    if argv[0].startswith("-"):
        return FORMS[2], argv
    if _PYTHON.match(head):
        if argv[1:3] == ["-m", "sglang.launch_server"]:
            return FORMS[0], argv[3:]
        raise FlagError(f"launch command {' '.join(argv[:3])!r}: {expected}")
    if head == "sglang":
        if argv[1:2] != ["serve"]:
            raise FlagError(f"launch command {' '.join(argv[:2])!r}: only `sglang serve` launches a server")
        if _key(release) < _key(_FIRST_SERVE):
            raise FlagError(
                f"SGLang {release} has no `sglang serve` (the console script arrived in {_FIRST_SERVE}); "
                "use `python -m sglang.launch_server ARGS`"
            )
        args = argv[2:]
        if _key(release) >= _key(_FIRST_MODEL_TYPE):
            args = _take_model_type(args)
        if _key(release) >= _key(_FIRST_POSITIONAL) and args and not args[0].startswith("-"):
            args = ["--model-path", args[0], *args[1:]]
        return FORMS[1], args
    raise FlagError(f"launch command starting {argv[0]!r}: {expected}")


def _take_model_type(args: list[str]) -> list[str]:
    """``sglang serve`` removes ``--model-type`` before ServerArgs parses (cli/serve.py); only the LLM
    server (``auto``, ``llm``) sizes a state pool."""
    out, backend, i = [], "auto", 0
    while i < len(args):
        if args[i] == "--model-type":
            if i + 1 >= len(args):
                raise FlagError("sglang serve: --model-type requires a value")
            backend, i = args[i + 1], i + 2
            continue
        if args[i].startswith("--model-type="):
            backend, i = args[i].split("=", 1)[1], i + 1
            continue
        out.append(args[i])
        i += 1
    if backend not in ("auto", "llm"):
        raise FlagError(f"sglang serve --model-type {backend!r}: only the LLM server (auto, llm) is checked")
    return out


# ------------------------------------------------------------------------------------------------------
# Parsers
# ------------------------------------------------------------------------------------------------------


class _ArgparseError(Exception):
    pass


class _Parser(argparse.ArgumentParser):
    """argparse whose errors and exits raise instead of printing and exiting the process."""

    def error(self, message: str) -> NoReturn:
        raise _ArgparseError(message)

    def exit(self, status: int = 0, message: str | None = None) -> NoReturn:
        raise _ArgparseError(message or "-h/--help asked for help, not a server")

    def print_help(self, file: object = None) -> None:  # noqa: ARG002 - help is not a launch command
        raise _ArgparseError("-h/--help asked for help, not a server")


def parser_rows(parser: argparse.ArgumentParser) -> list[FlagRow]:
    """The table form of a parser (what :mod:`checker.launch.flags` stores per release): per action,
    ``(option strings, nargs)``; for :data:`SIZING_DESTS` also dest, type name, default, choices,
    required."""
    rows: list[FlagRow] = []
    for a in read_parser(parser).options:
        if a.kind == "help":
            continue
        opts = " ".join(a.strings)
        if a.dest not in SIZING_DESTS:
            rows.append((opts, a.nargs))
            continue
        t = a.type
        tname = (
            None if t is None else t.__name__ if t in (int, float, str) else getattr(t, "__name__", repr(t))
        )
        choices = None if a.choices is None else tuple(a.choices)
        rows.append((opts, a.nargs, a.dest, tname, a.default, choices, bool(a.required), a.const))
    return rows


def _human_readable_int(value: str) -> int:
    """``sglang.srt.utils.common.human_readable_int`` (0.5.10+): 1k, 1M, 1Ki, 1Mi, or a plain int."""
    value = value.strip()
    si = {"k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12}
    iec = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40}
    m = re.fullmatch(r"(\d+(?:\.\d+)?)(Ki|Mi|Gi|Ti|k|M|G|T)", value)
    if m:
        number, suffix = m.groups()
        if suffix in iec:
            if "." in number:
                raise argparse.ArgumentTypeError(
                    f"Decimals are not allowed with IEC suffixes like '{suffix}'. "
                    f"Use an integer IEC value such as '{int(Decimal(number))}{suffix}', "
                    f"or an SI value such as '{number}{suffix[0]}'."
                )
            return int(number) * iec[suffix]
        return int(Decimal(number) * si[suffix])
    try:
        return int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"Invalid integer value: '{value}'. "
            "Use a plain integer, SI suffixes (1k, 1M), or IEC suffixes (1Ki, 1Mi). "
            "Suffixes are case-sensitive."
        ) from None


_TYPES: dict[str | None, Any] = {
    None: None,
    "int": int,
    "float": float,
    "str": str,
    "human_readable_int": _human_readable_int,
}
_human_readable_int.__name__ = "human_readable_int"  # argparse names the type in "invalid X value"


def table_parser(version: str) -> argparse.ArgumentParser:
    """An argparse parser rebuilt from the stored table of SGLang ``version``'s flags."""

    rows = release_rows(version)
    parser = _Parser(prog="sglang serve")
    for i, row in enumerate(rows):
        opts = row[0].split()
        nargs = row[1]
        if len(row) == 2:  # not read by sizing: only its spelling and arity matter
            where = next((LOCATION_DESTS[o] for o in opts if o in LOCATION_DESTS), None)
            where = where or next((KV_DESTS[o] for o in opts if o in KV_DESTS), None)
            weights = next((WEIGHTS_DESTS[o] for o in opts if o in WEIGHTS_DESTS), None)
            if where is not None and nargs is None:
                parser.add_argument(*opts, dest=where, default=None)
            elif weights is not None and nargs == 0:
                parser.add_argument(*opts, dest=weights, action="store_const", const=True, default=None)
            elif weights is not None and nargs is None:
                parser.add_argument(*opts, dest=weights, default=None)
            else:
                # SGLang's own dest, as argparse derives it from the first long option (no two rows of a
                # release share one): the start-up checks read a flag sizing does not by that name.
                dest = next((o[2:].replace("-", "_") for o in opts if o.startswith("--")), f"_other_{i}")
                if nargs == 0:
                    parser.add_argument(*opts, dest=dest, action="store_const", const=True)
                else:
                    parser.add_argument(*opts, dest=dest, nargs=nargs)
            continue
        _, _, dest, tname, default, choices, required, const = row
        kwargs: dict[str, Any] = dict(dest=dest, default=default, required=required)
        if nargs == 0:
            kwargs.update(action="store_const", const=const)
        else:
            kwargs.update(nargs=nargs, type=_TYPES[tname], choices=choices)
        parser.add_argument(*opts, **kwargs)
    return parser


def _own_parser(version: str) -> tuple[argparse.ArgumentParser, Any]:
    """The installed release's parser (``prepare_server_args``' steps) and its --config merger class."""
    saved = dict(os.environ)
    try:
        with quiet_sglang(stderr=True):
            server_args = importlib.import_module("sglang.srt.server_args")
            merger = None
            for name in (
                "sglang.srt.utils.server_args_config_parser",
                "sglang.srt.server_args_config_parser",
            ):
                with contextlib.suppress(ImportError):
                    merger = importlib.import_module(name).ConfigArgumentMerger
                    break
    except Exception as exc:
        raise _Unavailable(f"{type(exc).__name__}: {exc}") from exc
    finally:
        os.environ.clear()
        os.environ.update(saved)
    parser = _Parser(prog="sglang serve")
    server_args.ServerArgs.add_cli_args(parser)
    return parser, merger


class _Unavailable(Exception):
    pass


def _merge_config(parser: argparse.ArgumentParser, merger: Any, args: list[str]) -> list[str]:
    """``--config FILE``: the release's own ConfigArgumentMerger, as ``prepare_server_args`` calls it."""
    if merger is None:
        raise FlagError("--config: this SGLang has no config-file merger")
    try:
        try:
            m = merger(parser)  # 0.5.8+
        except TypeError:
            booleans = [a.dest for a in read_parser(parser).options if a.boolean]
            m = merger(boolean_actions=booleans)  # 0.5.3-0.5.7
        return list(m.merge_config_with_args(list(args)))
    except Exception as exc:
        raise FlagError(f"--config: SGLang refuses the config file: {type(exc).__name__}: {exc}") from None


class _UnknownFlags(Exception):
    def __init__(self, words: list[str], index: OptionIndex) -> None:
        super().__init__(words)
        self.words, self.index = words, index

    def line(self, version: str, label: str) -> str:
        """``SGLang 0.5.23 does not know --pp-szie; did you mean --pp-size? (...)``: the release's own
        flags are the vocabulary, as the checker's flags get "did you mean" from the checker's."""
        shown = ", ".join(_printable(w) for w in self.words[:SHOW_UNKNOWN])
        if len(self.words) > SHOW_UNKNOWN:
            shown += f", ... ({len(self.words):,} unknown flags)"
        return f"SGLang {version} does not know {shown}{did_you_mean(self.words, self.index.long)} ({label})"


def close_flag(word: str, flags: Sequence[str]) -> str | None:
    """The release's flag a mistyped ``word`` most likely meant (``--pp-szie``, ``-pp-size``,
    ``--pp_size``, ``--PP-SIZE`` -> ``--pp-size``), or None. ``flags``: the release's long options."""
    if not word.startswith("-") or word in ("-", "--"):
        return None
    name = word.split("=", 1)[0]
    # The slips difflib scores poorly: one dash, snake case, capitals.
    normal = "--" + name.lstrip("-").lower().replace("_", "-")
    if normal in flags and normal != name:
        return normal
    match = difflib.get_close_matches(normal, flags, n=1, cutoff=0.6)
    return match[0] if match else None


def did_you_mean(words: Sequence[str], flags: Sequence[str]) -> str:
    """``; did you mean --pp-size?`` for the unknown ``words`` of a launch command (the first
    :data:`SHOW_UNKNOWN`), from the release's own flag table, as the checker's flags get it from the
    checker's; "" when none is close."""
    close = [(w, m) for w in words[:SHOW_UNKNOWN] if (m := close_flag(w, flags)) is not None]
    if not close:
        return ""
    if len(close) == 1 and sum(w.startswith("-") for w in words) == 1:
        return f"; did you mean {close[0][1]}?"
    return "; did you mean " + ", ".join(f"{m} for {_printable(w)}" for w, m in close) + "?"


SHOW_UNKNOWN = 5
"""Unknown launch-command flags named in the refusal (and given a "did you mean"); the rest are counted."""


def _printable(word: str, limit: int = 80) -> str:
    """A word of the command as one line shows it: control characters escaped, a long one cut."""
    text = word if word.isprintable() else repr(word)[1:-1]
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _parse(parser: argparse.ArgumentParser, args: list[str]) -> tuple[dict[str, Any], set[str]]:
    """(every dest's value, the dests the command gave): a second parse with every default suppressed
    tells given from defaulted (a store_true flag given and a default of True read the same).

    Linear in the command's length (:mod:`checker.launch.repeats`): unknown flags are named before
    argparse runs (as the checker's own flags are, cli/main.py), repeats of a last-wins flag collapsed."""
    index = OptionIndex(parser)
    if index.simple:
        end = args.index("--") if "--" in args else len(args)
        unknown = [w for w in args[:end] if index.unknown(w)]
        if unknown:
            raise _UnknownFlags(unknown, index)
    args = collapse_repeats(index, args)
    with quiet_sglang(stderr=True):
        ns = parser.parse_args(args)
        given = index.spec.given(args)
    return vars(ns), given


# ------------------------------------------------------------------------------------------------------
# From raw ServerArgs values to the checker's inputs
# ------------------------------------------------------------------------------------------------------


def _raw(ns: dict[str, Any], given: set[str]) -> tuple[dict[str, Any], set[str]]:
    """The sizing-relevant ServerArgs fields, as ``from_cli_args`` names them."""
    values: dict[str, Any] = {}
    explicit: set[str] = set()
    kv_dests = set(KV_DESTS.values())
    for dest in (*SIZING_DESTS, *kv_dests):
        if dest not in ns:
            continue
        if dest in kv_dests and dest not in given:
            continue  # given only: the tables keep no default for them (never a release parser's default)
        name = _FIELD_OF.get(dest, dest)
        if name in values and dest not in given:
            continue  # two spellings of one field: the given one wins
        values[name] = ns[dest]
        if dest in given:
            explicit.add(name)
    for dest, kind in _TYPED_LATER.items():
        # Given only: the table keeps no default for them, and the release's own is what the core models.
        if ns.get(dest) is None or dest not in given:
            continue
        value = ns[dest]
        if isinstance(value, str):  # the table stores the flag's spelling only: typed here, as SGLang does
            try:
                value = kind(value)
            except ValueError:
                flag = "--" + dest.replace("_", "-")
                raise FlagError(
                    f"launch command {flag} {_printable(value)}: not an {kind.__name__}"
                ) from None
        values[dest] = value
        if dest in given:
            explicit.add(dest)
    return values, explicit


_TYPED_LATER = {"linear_replayssm_cache_len": int}
"""Sizing inputs the flag tables were dumped without a type for (they store the option's spelling): read
from the namespace and typed as every release's parser types them."""


def _attention(raw: dict[str, Any], given: set[str], version: str) -> tuple[int, int, bool]:
    """(attention-TP width, attention-DP size, whether any of it was given), as the release derives them.

    Up to 0.5.21 attention DP is ``--enable-dp-attention`` with ``--dp-size`` (attention TP =
    tp // dp, ``compute_dp_attention_world_info``); 0.5.22+ has ``--attn-dp-size`` and turns the old
    spelling into it (``arg_groups/parallel_hook.py`` ``handle_deprecated_dp_attention``), attention TP
    = ``tp // attn_dp // attn_cp`` (``runtime_context.derive_attn_tp_size``). Without attention DP,
    ``--dp-size`` makes independent replicas: each sizes its own pool with attention DP 1.
    """
    tp, dp = int(raw.get("tp_size") or 1), int(raw.get("dp_size") or 1)
    attn_dp = int(raw.get("attn_dp_size") or 1)
    if raw.get("enable_dp_attention") and attn_dp == 1:
        attn_dp = dp
    cp = int(raw.get("attn_cp_size") or 1)
    if cp != 1:
        raise FlagError(
            f"--attn-cp-size {cp}: attention context parallelism is not modelled by the checker "
            "(run SGLang's own sizing with --engine sglang, or leave it out)"
        )
    if tp < 1 or attn_dp < 1 or tp % attn_dp:
        raise FlagError(
            f"SGLang {version}: --tp-size {tp} must be a positive multiple of the attention DP size "
            f"{attn_dp} (attention TP = tp_size // dp_size)"
        )
    touched = bool(given & {"tp_size", "dp_size", "enable_dp_attention", "attn_dp_size", "attn_cp_size"})
    return tp // attn_dp, attn_dp, touched


def _model_config(path: str, *, revision: str | None = None, release: str | None = None) -> str:
    """The local model SGLang reads for ``--model-path`` (a hub id: its cached snapshot of ``revision``,
    :func:`checker.core.weights.hub_cache.local_model_path`)."""

    path = local_model_path(path, revision=revision, flag="--model-path", release=release)
    p = Path(path)
    shown = shown_path(path)
    st = path_stat(p, f"--model-path {shown}")  # a name too long or a NUL byte: one line, not an OSError
    if st is not None and stat.S_ISDIR(st.st_mode):
        config = path_stat(p / "config.json", f"--model-path {shown}")
        if config is None or stat.S_ISDIR(config.st_mode):
            raise FlagError(
                f"--model-path {shown}: no config.json in that directory (the checker reads the model's "
                "config.json; download a hub model first)"
            )
        return str(p)
    if st is not None:
        return str(p)  # a file (read_json says what else it may be)
    raise FlagError(
        f"--model-path {shown}: not a directory or file here, nor a Hugging Face hub id (ORG/NAME); give "
        "the model's directory (the checker reads its config.json)"
    )


def _checker_values(
    raw: dict[str, Any],
    given: set[str],
    version: str,
    *,
    check_model_path: bool,
    revision: str | None = None,
) -> tuple[dict[str, object], set[str]]:
    values: dict[str, object] = {}
    explicit: set[str] = set()
    for name in _DIRECT:
        if name in raw and (raw[name] is not None or name in given):
            key = CHECKER_NAME.get(name, name)
            values[key] = raw[name]
            if name in given:
                explicit.add(key)
    tp, dp, touched = _attention(raw, given, version)
    values["tp_size"], values["dp_size"] = tp, dp
    if touched:
        explicit |= {"tp_size", "dp_size"}
    if raw.get("model_path") is not None:
        path = str(raw["model_path"])
        values["model_config"] = (
            _model_config(path, revision=revision, release=version) if check_model_path else path
        )
        explicit.add("model_config")
    return values, explicit


# ------------------------------------------------------------------------------------------------------
# The entry point
# ------------------------------------------------------------------------------------------------------


def tabled_releases() -> tuple[str, ...]:
    return tuple(RELEASES)


def _installed() -> str | None:
    return installed_sglang_version()


def parse_launch_command(
    argv: Sequence[str],
    *,
    release: str | None,
    prefer_installed: bool = True,
    check_model_path: bool = True,
) -> LaunchCommand:
    """Parse ``argv`` (the command after ``--``) as SGLang ``release`` reads it.

    ``release`` None: the installed SGLang's version, else the newest tabled release. SGLang's own
    parser is used when ``prefer_installed`` and the installed release is ``release`` and imports;
    otherwise the checker's table of ``release``'s flags. Raises FlagError (one line) on a form the
    release does not have, a flag it does not know, or a value its parser refuses.
    ``check_model_path``: require ``--model-path`` to be a local directory holding config.json, or a file.
    """
    if len(argv) > MAX_LAUNCH_WORDS:
        raise FlagError(
            f"the launch command after -- has {len(argv):,} words, more than any real one (every flag of "
            f"the newest release once is about 900); the checker reads at most {MAX_LAUNCH_WORDS:,}"
        )
    tabled = tabled_releases()
    installed = _installed()
    source = "--sglang-version" if release is not None else "the installed SGLang's version"
    if release is None:
        release = installed or tabled[-1]
    # The installed release reads its own command (a release without a table too: one newer than the
    # tabled ones, a pre-release, a local build); any other release needs the checker's table.
    own = None
    if prefer_installed and installed is not None and _same_release(release, installed):
        with contextlib.suppress(_Unavailable):
            own = _own_parser(installed)
    version = installed if own is not None and installed is not None else _canonical(release, source=source)
    if own is None and version not in tabled:
        raise FlagError(
            f"SGLang {version}: the checker has no table of that release's flags "
            f"(tabled: {tabled[0]} to {tabled[-1]}); only the installed release, with its own parser, "
            "reads a command without one"
        )
    form, args = split_form(argv, version)
    if own is not None:
        parser, merger = own
        label = OWN_PARSER.format(version=version)
        if "--config" in args:
            args = _merge_config(parser, merger, args)
        try:
            ns, given = _parse(parser, args)
        except _UnknownFlags as exc:
            raise FlagError(exc.line(version, label)) from None
        except _ArgparseError as exc:
            m = re.match(r"unrecognized arguments: (.*)$", str(exc))
            hint = did_you_mean(m.group(1).split(), OptionIndex(parser).long) if m else ""
            raise FlagError(f"SGLang {version} refuses the launch command: {exc}{hint}") from None
    else:
        label = MODEL_PARSER.format(version=version)
        if any(a == "--config" or a.startswith("--config=") for a in args):
            raise FlagError(
                f"--config: {label} does not read config files; run where SGLang {version} is installed, "
                "or spell the flags out"
            )
        parser = table_parser(version)
        try:
            ns, given = _parse(parser, args)
        except _UnknownFlags as exc:
            raise FlagError(exc.line(version, label)) from None
        except _ArgparseError as exc:
            m = re.match(r"unrecognized arguments: (.*)$", str(exc))
            if m:  # words argparse could not place (a value after `--`, a stray word, `-pp-size`)
                hint = did_you_mean(m.group(1).split(), OptionIndex(parser).long)
                raise FlagError(f"SGLang {version} does not know {m.group(1)}{hint} ({label})") from None
            raise FlagError(f"SGLang {version} refuses the launch command: {exc} ({label})") from None
    raw, raw_explicit = _raw(ns, given)
    location = {d: str(ns[d]) for d in LOCATION_DESTS.values() if ns.get(d) is not None}
    weights = _weights_values(ns, given)
    values, explicit = _checker_values(
        raw, raw_explicit, version, check_model_path=check_model_path, revision=location.get("revision")
    )
    return LaunchCommand(
        form=form,
        parser=label,
        release=version,
        argv=tuple(str(a) for a in argv),
        values=values,
        explicit=frozenset(explicit),
        sglang_values=raw,
        sglang_explicit=frozenset(raw_explicit),
        location=location,
        weights=weights,
        given_values={_FIELD_OF.get(d, d): ns[d] for d in sorted(given) if not d.startswith("_other_")},
    )


def _weights_values(ns: dict[str, Any], given: set[str]) -> dict[str, object]:
    """The weights-deciding flags the command gave (:data:`WEIGHTS_DESTS`): the release's own parser
    stores them typed, the table parser as text (``--ep-size`` read as SGLang's ``int``)."""
    out: dict[str, object] = {}
    for dest in sorted(set(WEIGHTS_DESTS.values())):
        value = ns.get(dest)
        if value is None or value is False or (dest not in given and dest != "ep_size"):
            continue
        if dest == "ep_size":
            try:
                value = int(value)
            except (TypeError, ValueError):
                raise FlagError(f"--ep-size {value} in the launch command is not an integer") from None
            if value < 1:
                raise FlagError(f"--ep-size {value} in the launch command must be a positive integer")
        out[dest] = value
    return out
