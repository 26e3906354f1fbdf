"""Reading SGLang server logs as they arrive from real deployments: streamed, in bounded memory.

A log is read in chunks (:data:`CHUNK_BYTES`); only the places where one of the anchors of
:mod:`checker.postflight.formats` occurs are decoded and looked at, so a 2 GB log costs the time of a
few ``bytes.find`` passes over it, not a Python loop over its lines (bench/postflight_bench.py). What
wraps SGLang's own line is skipped: a container runtime's prefix (``2026-..+02:00 stderr F``), a
notebook's indentation, a progress bar glued to the line by ``\\r``. The message must follow SGLang's
bracket (``[%(asctime)s{prefix}] ``) directly; an anchor without one is counted as a line in a format
the checker does not know (a custom ``SGLANG_LOGGING_CONFIG_PATH``). Binary noise is decoded with
replacement characters; a line cut short (a terminal's width, a truncated file) gives only the fields
it holds whole; a run of more than :data:`MAX_LINE_BYTES` without a line break is skipped but for its
last :data:`TAIL_BYTES`.

Each rank is found by its prefix: the tokens ``DP PP ATTN_CP MOE_DP TP EP`` in any order (the order
changed in 0.5.5.post1), a token that is not there being rank 0. The same line read twice (a node's log
given alone and inside a combined log) counts once; lines of several starts of one rank are kept
apart, and the latest start wins (:mod:`checker.postflight.ranks`).
"""

from __future__ import annotations

import gzip
import io
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import BinaryIO, cast

from checker.core.errors import printable
from checker.postflight.formats import (
    ANCHORS,
    KINDS,
    PREFIX_TOKENS,
    OlderForm,
    best_scan,
    line_formats,
    looked_for,
    older_form,
)
from checker.postflight.log_formats import RELEASES

CHUNK_BYTES = 8 << 20
MAX_LINE_BYTES = 1 << 20
"""A run longer than this without a line break is not a log line (binary noise, a progress bar that
never ends its line): all but its last TAIL_BYTES are skipped, so memory stays bounded."""
TAIL_BYTES = 64 << 10
MAX_MESSAGE_CHARS = 4096
"""How much of a line after the anchor is read: every message read is a few hundred characters."""
EXAMPLE_CHARS = 200
KEEP_PER_RANK = 8
"""Distinct sightings of one message kept per rank (the rest counted): a server restarted a thousand
times in one log costs a few entries, not a thousand."""

# The needles searched with bytes.find: "Load weight " covers both weight anchors.
_NEEDLES = tuple(
    sorted({a.encode() if not a.startswith("Load weight") else b"Load weight " for a in ANCHORS.values()})
)
_BRACKET = re.compile(
    r"\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d(?:[.,]\d{1,6})?)((?: (?:" + "|".join(PREFIX_TOKENS) + r")\d+)*)\] \Z"
)
_TOKEN = re.compile(r" ([A-Z_]+?)(\d+)")


class LogReadError(OSError):
    """A log cannot be opened or read: one line naming it."""


@dataclass(frozen=True, order=True)
class RankKey:
    """Who wrote a line: the numbers of its prefix (0 for a token that is not there)."""

    dp: int = 0
    pp: int = 0
    tp: int = 0
    attn_cp: int = 0
    moe_dp: int = 0
    ep: int = 0

    @classmethod
    def parse(cls, prefix: str) -> RankKey | None:
        """`` PP1 TP3`` (tokens in any order) -> RankKey; None when a token repeats."""
        seen: dict[str, int] = {}
        for token, number in _TOKEN.findall(prefix):
            if token in seen:
                return None
            seen[token] = int(number)
        return cls(**{t.lower(): n for t, n in seen.items()})

    def text(self, tokens: Iterable[str]) -> str:
        """The prefix as written with ``tokens`` shown: ``DP0 PP1 TP3``."""
        return " ".join(f"{t}{getattr(self, t.lower())}" for t in tokens)


@dataclass(frozen=True)
class Where:
    path: str
    line: int
    """1-based line number in its log."""

    def __str__(self) -> str:
        return f"{printable(self.path)}:{self.line}"


@dataclass
class Sighting:
    """One message read: its values, the forms that read it whole, where it was first and last seen."""

    kind: str
    values: dict[str, str]
    complete: bool
    releases: tuple[str, ...]
    """The releases whose form reads the message whole (empty: cut, or a form no release writes)."""
    tokens: tuple[str, ...]
    """The prefix tokens as the line wrote them, in its order."""
    form_fields: tuple[str, ...]
    """The fields of the form that read it (a form without ``mem_usage``: the overlap load's line)."""
    first: Where
    stamp: str
    """The latest timestamp it was seen with (SGLang's asctime, which sorts as text)."""
    order: int
    """When it was last seen in the input (a counter over every log read)."""
    count: int = 1


@dataclass
class LogStats:
    """What one log held, for the reader's own summary and its one-line errors."""

    path: str
    bytes: int = 0
    lines: int = 0
    read: int = 0
    """Messages read in SGLang's own line format."""
    unknown_format: int = 0
    unknown_example: str = ""
    cut: int = 0
    cut_example: str = ""
    skipped_runs: int = 0
    """Runs longer than MAX_LINE_BYTES without a line break (binary noise)."""
    older: int = 0
    """Lines in a form only a release older than any modelled writes (formats.OLDER_MESSAGES)."""
    older_example: str = ""
    older_form: OlderForm | None = None
    compressed: bool = False
    ms: bool = False
    """Timestamps with milliseconds (SGLANG_LOG_MS)."""
    token_orders: set[tuple[str, ...]] = field(default_factory=set)

    @property
    def shown(self) -> str:
        """The log's name as a message line shows it (escaped: a terminal escape or a ``\\r`` in a
        file name must not act on the terminal nor split the line); ``path`` keeps it as given."""
        return printable(self.path)


@dataclass
class LogReading:
    """Every rank's sightings, by prefix, and each log's stats."""

    sightings: dict[RankKey, dict[str, list[Sighting]]] = field(default_factory=dict)
    dropped: dict[tuple[RankKey, str], int] = field(default_factory=dict)
    logs: list[LogStats] = field(default_factory=list)
    order: int = 0

    def add(self, key: RankKey, sighting: Sighting) -> None:
        kept = self.sightings.setdefault(key, {}).setdefault(sighting.kind, [])
        for old in kept:
            if old.values == sighting.values and old.tokens == sighting.tokens:
                old.count += 1
                old.stamp, old.order = max(old.stamp, sighting.stamp), sighting.order
                return
        if len(kept) >= KEEP_PER_RANK:
            # Keep the first sightings and the newest: replace the newest-but-one.
            self.dropped[(key, sighting.kind)] = self.dropped.get((key, sighting.kind), 0) + 1
            kept[-1] = sighting
            return
        kept.append(sighting)


def open_log(path: str, stdin: BinaryIO | None = None) -> tuple[BinaryIO, bool]:
    """A log as a binary stream (``-``: standard input); gzip is read transparently (its magic bytes)."""
    if path == "-" and stdin is None:
        raise LogReadError("- (standard input): this process has no standard input to read")
    try:
        raw: BinaryIO = stdin if path == "-" and stdin is not None else open(path, "rb")  # noqa: SIM115
    except OSError as exc:
        raise LogReadError(f"cannot read log {printable(path)}: {exc.strerror or exc}") from None
    buffered = raw if isinstance(raw, io.BufferedReader) else io.BufferedReader(cast(io.RawIOBase, raw))
    try:
        magic = buffered.peek(2)[:2]
    except OSError as exc:
        raise LogReadError(f"cannot read log {printable(path)}: {exc.strerror or exc}") from None
    if magic == b"\x1f\x8b":
        return cast(BinaryIO, gzip.GzipFile(fileobj=buffered, mode="rb")), True
    return cast(BinaryIO, buffered), False


def _chunks(stream: BinaryIO, path: str) -> Iterator[bytes]:
    while True:
        try:
            chunk = stream.read(CHUNK_BYTES)
        except (OSError, EOFError) as exc:  # a truncated gzip member, an I/O error mid-read
            raise LogReadError(f"cannot read log {printable(path)} past its first bytes: {exc}") from None
        if not chunk:
            return
        yield chunk


def _last_break(buf: bytes) -> int:
    return max(buf.rfind(b"\n"), buf.rfind(b"\r"))


def read_log(reading: LogReading, path: str, stream: BinaryIO, *, compressed: bool = False) -> LogStats:
    """Read one log into ``reading``; its stats are appended to ``reading.logs`` and returned."""
    stats = LogStats(path=path, compressed=compressed)
    reading.logs.append(stats)
    carry = b""
    line_base = 1  # the line number of carry's first byte
    for chunk in _chunks(stream, path):
        stats.bytes += len(chunk)
        buf = carry + chunk
        cut = _last_break(buf) + 1
        if cut == 0:
            if len(buf) <= MAX_LINE_BYTES:
                carry = buf
                continue
            cut = len(buf) - TAIL_BYTES
            stats.skipped_runs += 1
        _scan(reading, stats, buf, cut, line_base)
        line_base += buf.count(b"\n", 0, cut)
        carry = buf[cut:]
    if carry:  # the last line, with no line break after it (a log cut mid-line)
        _scan(reading, stats, carry, len(carry), line_base)
    stats.lines = line_base - 1 + carry.count(b"\n") + (1 if carry and not carry.endswith(b"\n") else 0)
    return stats


def _scan(reading: LogReading, stats: LogStats, buf: bytes, end: int, line_base: int) -> None:
    """Every anchor in ``buf[:end]``; a message may run past ``end`` up to its line break."""
    hits: list[int] = []
    for needle in _NEEDLES:
        pos = buf.find(needle, 0, end)
        while pos >= 0:
            hits.append(pos)
            pos = buf.find(needle, pos + 1, end)
    if not hits:
        return
    hits.sort()
    counted, line = 0, line_base
    for pos in hits:
        line += buf.count(b"\n", counted, pos)
        counted = pos
        start = _last_break(buf[max(0, pos - MAX_MESSAGE_CHARS) : pos])
        start = max(0, pos - MAX_MESSAGE_CHARS) + start + 1 if start >= 0 else max(0, pos - MAX_MESSAGE_CHARS)
        stop = len(buf)
        for sep in (b"\n", b"\r"):
            j = buf.find(sep, pos, pos + MAX_MESSAGE_CHARS)
            if j >= 0:
                stop = min(stop, j)
        stop = min(stop, pos + MAX_MESSAGE_CHARS)
        _one(
            reading,
            stats,
            buf[start:pos].decode("utf-8", "replace"),
            buf[pos:stop].decode("utf-8", "replace"),
            line,
            stats.path,
        )


def _kind(message: str) -> str | None:
    for kind in KINDS:
        if message.startswith(ANCHORS[kind]):
            return kind
    return None


def _one(reading: LogReading, stats: LogStats, before: str, message: str, line: int, path: str) -> None:
    kind = _kind(message)
    if kind is None:
        return
    m = _BRACKET.search(before)
    if m is None:
        # "max_total_num_tokens=" and "Load weight begin." also appear inside other messages; the two
        # messages that only ever start a line say that this log's lines are in another format.
        if kind in ("weights", "mamba") and not before.rstrip().endswith(("(", "=", ",")):
            stats.unknown_format += 1
            stats.unknown_example = stats.unknown_example or _example(path, line, before + message)
        return
    key = RankKey.parse(m.group(2))
    if key is None:
        return
    scan, releases = best_scan(kind, message)
    if scan is None or not scan.complete:
        older = older_form(kind, message)
        if older is not None:  # not a cut line of a modelled release: a whole line of an older one
            stats.older += 1
            stats.older_form = stats.older_form or older
            stats.older_example = stats.older_example or _example(path, line, message)
            return
    if scan is None:
        return
    stats.read += 1
    if not scan.complete:
        stats.cut += 1
        stats.cut_example = stats.cut_example or _example(path, line, message)
    stamp = m.group(1)
    stats.ms = stats.ms or len(stamp) > 19
    tokens = tuple(t for t, _ in _TOKEN.findall(m.group(2)))
    stats.token_orders.add(tokens)
    reading.order += 1
    reading.add(
        key,
        Sighting(
            kind=kind,
            values=scan.values,
            complete=scan.complete,
            releases=releases,
            tokens=tokens,
            form_fields=tuple(f.name for f, _ in scan.form.fields),
            first=Where(path, line),
            stamp=stamp,
            order=reading.order,
        ),
    )


def _example(path: str, line: int, text: str) -> str:
    text = text.strip()
    shown = text if len(text) <= EXAMPLE_CHARS else text[: EXAMPLE_CHARS - 3] + "..."
    return f"{printable(path)}:{line}: {shown!r}"


def read_logs(paths: Iterable[str], stdin: BinaryIO | None = None) -> LogReading:
    """Every log of ``paths`` (``-``: ``stdin``) into one reading, in the order given."""
    reading = LogReading()
    for path in paths:
        stream, compressed = open_log(path, stdin)
        try:
            read_log(reading, "<stdin>" if path == "-" else path, stream, compressed=compressed)
        finally:
            if path != "-":
                stream.close()
    return reading


class UnknownLogFormat(LogReadError):
    """No line the checker reads was found: one line naming what it looked for."""


class OlderRelease(UnknownLogFormat):
    """A line only a release older than any modelled writes: one line naming the form and the release."""


def looked_for_releases() -> str:
    """The releases whose lines the post-flight reads: ``0.5.2-0.5.23``."""
    return f"SGLang {RELEASES[0]}-{RELEASES[-1]}"


def findings(reading: LogReading) -> tuple[list[str], list[str]]:
    """(errors, warnings) about the logs themselves. Raises :class:`UnknownLogFormat` when no rank's line
    was read at all: a log in another format (a custom logging config), or not the server's log."""

    logs = ", ".join(s.shown for s in reading.logs) or "no log"
    older = [s for s in reading.logs if s.older]
    if older:
        s = older[0]
        f = s.older_form
        assert f is not None  # set with the count
        raise OlderRelease(
            f"{s.shown}: {sum(x.older for x in older)} line(s) in the form SGLang {f.release} writes "
            f"(sglang/srt/{f.where} of {f.release}; first: {s.older_example}): the server is older than any "
            f"modelled release, and the post-flight reads the lines of {looked_for_releases()}; hold a log "
            "of a modelled release (upgrade the server)"
        )
    if not reading.sightings:
        unknown = [s for s in reading.logs if s.unknown_format]
        wanted = looked_for()
        config = line_formats()[-1].config_env
        if unknown:
            s = unknown[0]
            raise UnknownLogFormat(
                f"{logs}: {sum(x.unknown_format for x in unknown)} SGLang line(s) but none in SGLang's own "
                f"format (first: {s.unknown_example}); the checker reads `{wanted}`: a custom logging config "
                f"({config})? Log without it for the post-flight"
            )
        size = sum(s.bytes for s in reading.logs)
        raise UnknownLogFormat(
            f"{logs} ({size:,} bytes): no line of an SGLang server's start; looked for `{wanted}`. Give the "
            "server's own log (every node's), from its start"
        )
    errors: list[str] = []
    warnings: list[str] = []
    for s in reading.logs:
        if s.unknown_format:
            warnings.append(
                f"{s.shown}: {s.unknown_format} line(s) in a format the checker does not read (first: "
                f"{s.unknown_example})"
            )
        if s.cut:
            warnings.append(f"{s.shown}: {s.cut} line(s) cut short (first: {s.cut_example})")
        if s.skipped_runs:
            warnings.append(
                f"{s.shown}: {s.skipped_runs} run(s) of over {MAX_LINE_BYTES >> 20} MiB without a line break "
                "skipped (binary data?)"
            )
    for (key, kind), n in sorted(reading.dropped.items()):
        warnings.append(
            f"[{key.text(PREFIX_TOKENS)}]: {n} more different '{ANCHORS[kind]}' lines than the reader keeps "
            f"({KEEP_PER_RANK}); the first and the latest are kept"
        )
    return errors, warnings
