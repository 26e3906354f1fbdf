"""The log lines of every modelled SGLang release, as forms the reader scans and tests render.

:mod:`checker.postflight.log_formats` is the table (generated from the wheels by
``scripts/build_log_formats.py``); this module turns its rows into :class:`Form` objects. A form scans
a message without regular expressions: each field's text runs up to the literal that follows it, so a
field is read only when that literal is there too (a line a terminal cut after ``mem usage=18.6`` gives
no ``mem_usage``, never a wrong one), and a typed field (``:.2f``, ``%d``) must parse as its type.
:func:`render_line` writes a line exactly as the release does (its own line format through
:class:`logging.Formatter`, its own prefix rule): the tests and the bench build their logs with it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass, replace
from functools import cache

from checker.postflight import log_formats as table

WEIGHTS, WEIGHTS_BEGIN, MAMBA, SUMMARY, POST_CAPTURE = (
    "weights",
    "weights_begin",
    "mamba",
    "summary",
    "post_capture",
)
KINDS = tuple(table.ANCHORS)
ANCHORS: Mapping[str, str] = table.ANCHORS
PREFIX_TOKENS = ("DP", "PP", "ATTN_CP", "MOE_DP", "TP", "EP")
"""Every token a release's scheduler puts in the prefix (the newest releases' order)."""
assert {t for row in table.PREFIXES for t, _, _ in row[0]} <= set(PREFIX_TOKENS), table.PREFIXES


@dataclass(frozen=True)
class Field:
    name: str
    spec: str
    """The format spec as SGLang wrote it: '' (str()), '.2f' (f-string), '%d' / '%.2f' (%-format)."""
    optional: bool
    """Renders as '' in some starts (``{quant_str + ', ' if quant_str else ''}``)."""

    def parses(self, text: str) -> bool:
        if self.spec.endswith("f"):
            try:
                float(text)
            except ValueError:
                return False
            return True
        if self.spec.endswith("d"):
            return text.lstrip("-").isdigit()
        return "\n" not in text

    def render(self, value: object) -> str:
        if self.spec.startswith("%"):
            return self.spec % value
        return format(value, self.spec)


@dataclass(frozen=True)
class Scan:
    """What one form read from a message: the fields it read whole, and whether it read all of them."""

    form: Form
    values: dict[str, str]
    complete: bool
    end: int
    """Characters of the message the form accounted for."""
    loose: int = 0
    """Characters its optional fields took: free text, so a form that reads the message with less of it
    is the more specific one (0.5.10's ``{quant_str}, `` would also swallow 0.5.9's ``dtype=..., ``)."""


@dataclass(frozen=True)
class Form:
    kind: str
    head: str
    """The literal the message starts with (the anchor and the text up to the first field)."""
    fields: tuple[tuple[Field, str], ...]
    """Each field and the literal after it."""
    releases: tuple[str, ...]
    where: str
    """Where the newest release that writes this form writes it (file:line under sglang/srt)."""

    @property
    def text(self) -> str:
        """The form as one line, fields in braces: what an error names as the line it looked for."""
        return self.head + "".join("{" + f.name + "}" + lit for f, lit in self.fields)

    def scan(self, message: str) -> Scan | None:
        """The fields of ``message`` this form reads, or None when the message is not this form."""
        if not message.startswith(self.head):
            return None
        pos, loose = len(self.head), 0
        values: dict[str, str] = {}
        last = len(self.fields) - 1
        for i, (field, literal) in enumerate(self.fields):
            end_literal = literal.rstrip() if i == last else literal
            if end_literal:
                j = message.find(end_literal, pos)
                if j < 0:
                    return Scan(self, values, False, pos)
            else:  # the message ends with this field: the rest of the message (stripped)
                j = len(message.rstrip())
            text = message[pos:j]
            if not (field.optional and text == "") and not field.parses(text):
                return Scan(self, values, False, pos)
            values[field.name] = text
            loose += len(text) if field.optional else 0
            pos = j + len(end_literal)
        return Scan(self, values, True, pos, loose)

    def render(self, values: Mapping[str, object]) -> str:
        """The message as the release writes it; an optional field missing from ``values`` is ''."""
        out = [self.head]
        for field, literal in self.fields:
            if field.optional and values.get(field.name) in (None, ""):
                out.append(literal)
            elif field.optional:
                out.append(f"{values[field.name]}{literal}")
            else:
                out.append(field.render(values[field.name]) + literal)
        return "".join(out)


def expand(spans: tuple[tuple[str, str], ...]) -> tuple[str, ...]:
    """((first, last), ...) runs of modelled releases -> every release in them, oldest first."""
    order = table.RELEASES
    out: list[str] = []
    for first, last in spans:
        out += order[order.index(first) : order.index(last) + 1]
    return tuple(out)


def _form(kind: str, segments: tuple[object, ...], spans: tuple[tuple[str, str], ...], where: str) -> Form:
    head = segments[0]
    assert isinstance(head, str)
    fields = []
    for i in range(1, len(segments) - 1, 2):
        spelled = segments[i]
        assert isinstance(spelled, tuple)
        name, spec, optional = spelled
        literal = segments[i + 1]
        assert isinstance(literal, str)
        fields.append((Field(str(name), str(spec), bool(optional)), literal))
    return Form(kind, head, tuple(fields), expand(spans), where)


@cache
def forms(kind: str) -> tuple[Form, ...]:
    """Every form of ``kind`` any modelled release writes, the longest first (the one that reads the
    most wins when a shorter form reads a prefix of the same message: the spec-decoding Mamba line)."""
    rows = [_form(kind, segs, spans, where) for segs, spans, where in table.MESSAGES[kind]]
    return tuple(sorted(rows, key=lambda f: -len(f.fields)))


def forms_of(kind: str, release: str) -> tuple[Form, ...]:
    return tuple(f for f in forms(kind) if release in f.releases)


def best_scan(kind: str, message: str) -> tuple[Scan | None, tuple[str, ...]]:
    """The scan that read the most fields of ``message``, and every release that writes a form that
    reads it whole with the least free text (empty when no form does: the line was cut, or its form is
    unknown)."""
    scans = [s for s in (form.scan(message) for form in forms(kind)) if s is not None]
    if not scans:
        return None, ()
    best = max(scans, key=lambda s: (s.complete, len(s.values), s.end, -s.loose))
    # Of the forms that read it whole: the one that accounts for most of it (the spec-decoding Mamba
    # line read by the plain form leaves its tail unread), then the one with the least free text.
    whole = [s for s in scans if s.complete]
    top = max(((s.end, -s.loose) for s in whole), default=None)
    releases = {r for s in whole if (s.end, -s.loose) == top for r in s.form.releases}
    return best, tuple(r for r in table.RELEASES if r in releases)


# -- lines of releases older than any modelled -------------------------------------------------------------

OLDER_MESSAGES: dict[str, tuple[tuple[tuple[object, ...], str, str], ...]] = {
    # (segments as MESSAGES writes them, the release read, where it writes it): read from the sglang
    # 0.4.0 and 0.4.3 wheels. Their weights line has no mem usage; 0.4.0's summary no chunked_prefill_size,
    # 0.4.3's no available_gpu_mem. Integer fields are typed ('d'), so a modelled line never reads whole.
    "weights": (
        (
            ("Load weight end. type=", ("type", "", False), ", dtype=", ("dtype", "", False),
             ", avail mem=", ("avail_mem", ".2f", False), " GB"),
            "0.4.0",
            "model_executor/model_runner.py:260",
        ),
    ),
    "summary": (
        (
            ("max_total_num_tokens=", ("max_total_num_tokens", "d", False),
             ", max_prefill_tokens=", ("max_prefill_tokens", "d", False),
             ", max_running_requests=", ("max_running_requests", "d", False),
             ", context_len=", ("context_len", "d", False), ""),
            "0.4.0",
            "managers/scheduler.py:223",
        ),
        (
            ("max_total_num_tokens=", ("max_total_num_tokens", "d", False),
             ", chunked_prefill_size=", ("chunked_prefill_size", "d", False),
             ", max_prefill_tokens=", ("max_prefill_tokens", "d", False),
             ", max_running_requests=", ("max_running_requests", "d", False),
             ", context_len=", ("context_len", "d", False), ""),
            "0.4.3",
            "managers/scheduler.py:284",
        ),
    ),
}  # fmt: skip
"""Lines only releases older than any modelled write (the oldest modelled: ``table.RELEASES[0]``): a log
holding one is of a server the post-flight cannot hold to a prediction."""


@dataclass(frozen=True)
class OlderForm:
    form: Form
    release: str
    """The older release whose wheel it was read from."""
    where: str


@cache
def _older(kind: str) -> tuple[OlderForm, ...]:
    oldest = table.RELEASES[0]
    return tuple(
        OlderForm(replace(_form(kind, segments, ((oldest, oldest),), where), releases=()), release, where)
        for segments, release, where in OLDER_MESSAGES.get(kind, ())
    )


def older_form(kind: str, message: str) -> OlderForm | None:
    """The form of a release older than any modelled that reads ``message`` whole, to its end (None:
    none does)."""
    for older in _older(kind):
        scan = older.form.scan(message)
        if scan is not None and scan.complete and scan.end >= len(message.rstrip()):
            return older
    return None


# -- the line around the message ----------------------------------------------------------------------


@dataclass(frozen=True)
class LineFormat:
    line: str
    """``[%(asctime)s{maybe_ms}{prefix}] %(message)s``: configure_logger's format."""
    datefmt: str
    ms_env: str | None
    """The variable that adds ``.%(msecs)03d`` (SGLANG_LOG_MS, 0.5.6+); None: never."""
    config_env: str | None
    """The variable that replaces the whole logging config (SGLANG_LOGGING_CONFIG_PATH)."""
    releases: tuple[str, ...]


@cache
def line_formats() -> tuple[LineFormat, ...]:
    return tuple(
        LineFormat(line, datefmt or "", ms_env, config_env, expand(spans))
        for (line, datefmt, ms_env, config_env), spans, _ in table.LINE_FORMATS
    )


def line_format(release: str) -> LineFormat:
    return next(f for f in line_formats() if release in f.releases)


def prefix_rule(release: str) -> tuple[tuple[str, str, str], ...]:
    """((token, what its condition tests, the condition), ...) in the release's order."""
    return next(row[0] for row in table.PREFIXES if release in expand(row[1]))


def prefix(release: str, ranks: Mapping[str, int | None], sizes: Mapping[str, int]) -> str:
    """The scheduler's prefix, as the release builds it: `` DP1 PP0 TP3``. ``ranks``: each token's
    number (``DP``: None when the process has no DP rank); ``sizes``: ``tp_size``, ``pp_size``, ..."""
    out = ""
    for token, subject, condition in prefix_rule(release):
        if condition == "is not None":
            shown = ranks.get(token) is not None
        else:
            assert condition == "> 1", condition
            shown = sizes.get(subject, 1) > 1
        if shown:
            out += f" {token}{ranks.get(token) or 0}"
    return out


def render_line(
    release: str,
    message: str,
    *,
    prefix_text: str = "",
    created: float = 1_767_225_600.0,
    ms: bool = False,
) -> str:
    """One log line as the release's ``configure_logger`` formats it (``logging.Formatter``; the
    timestamp in UTC, where SGLang's logging uses the host's zone: the same text on every machine).
    ``ms``: SGLANG_LOG_MS set (0.5.6+)."""
    fmt = line_format(release)
    text = fmt.line.replace("{prefix}", prefix_text).replace(
        "{maybe_ms}", ".%(msecs)03d" if ms and fmt.ms_env else ""
    )
    record = logging.LogRecord("sglang", logging.INFO, __file__, 0, message, None, None)
    record.created, record.msecs = created, (created % 1) * 1000
    formatter = logging.Formatter(text, datefmt=fmt.datefmt)
    formatter.converter = time.gmtime
    return formatter.format(record)


def looked_for() -> str:
    """The line the reader looks for first, as the newest release writes it (for the one-line errors):
    its line format around its ``Load weight end.`` message."""
    newest = table.RELEASES[-1]
    head = line_format(newest).line.replace("{maybe_ms}", "").replace("%(message)s", "").strip()
    weights = next(f for f in forms_of(WEIGHTS, newest) if any(x.name == "mem_usage" for x, _ in f.fields))
    return f"{head} {weights.text}"


def prefix_releases(tokens: tuple[str, ...]) -> tuple[str, ...]:
    """The releases whose prefix rule writes ``tokens`` in this order (``TP0 PP1``: 0.5.2-0.5.5;
    ``PP1 TP0``: 0.5.5.post1 and later); fewer than two tokens say nothing (every release)."""
    out: set[str] = set()
    for rule, spans, _ in table.PREFIXES:
        order = [t for t, _, _ in rule]
        if all(t in order for t in tokens) and [order.index(t) for t in tokens] == sorted(
            order.index(t) for t in tokens
        ):
            out.update(expand(spans))
    return tuple(r for r in table.RELEASES if r in out)
