"""The exchange's wire format: fixed-schema int64 rows, never pickled objects (torch-free).

A peer can only send integers in known slots, so nothing it sends can run code on another rank.
Text a report must show (host, error message, input values) travels as UTF-8 bytes packed eight to an
int64, truncated to a fixed width; a digest of the full text decides equality.

Two gathers per run, always in this order and always of these sizes, so ranks whose arguments differ
still run the same collectives:

1. the header (``HEADER_LEN`` ints, fixed forever): schema version and row length, device free memory;
   ranks whose schema differs stop here with a clear error instead of a mismatched gather.
2. the row (``ROW_LEN`` ints): status, derived values, one digest + value text per input.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass

from checker.preflight.row import INPUT_NAMES, INT_FIELDS, MISSING, RankRow
from checker.status import ROW_OK

MAGIC = 0x50504348  # "PPCH"
# 3: the row defined once in checker.preflight.row; 4: the launch command input; 5: the installed release
# is the input ``sglang_installed`` (was ``sglang_version``), apart from ``derived_as``.
SCHEMA_VERSION = 5
HEADER_LEN = 8
HOST_BYTES = 64
ERROR_BYTES = 384
VALUE_BYTES = 120
"""Per input value: enough for a launch command's flags; the digest covers the whole text anyway."""
_HOST_INTS = HOST_BYTES // 8
_ERROR_INTS = ERROR_BYTES // 8
_VALUE_INTS = VALUE_BYTES // 8
ROW_LEN = 3 + len(INT_FIELDS) + _HOST_INTS + _ERROR_INTS + len(INPUT_NAMES) * (1 + _VALUE_INTS)


class WireError(ValueError):
    """A row that does not follow this schema (a peer running another checker version)."""


def digest(text: str | None) -> int:
    """A signed 64-bit digest of an input's full value text (None: unset)."""
    data = b"\x00unset" if text is None else text.encode()
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "little", signed=True)


def pack_text(text: str, num_bytes: int) -> list[int]:
    raw = text.encode()[:num_bytes]
    raw = raw + b"\x00" * (num_bytes - len(raw))
    return [int.from_bytes(raw[i : i + 8], "little", signed=True) for i in range(0, num_bytes, 8)]


def unpack_text(ints: Sequence[int]) -> str:
    raw = b"".join(int(i).to_bytes(8, "little", signed=True) for i in ints)
    return raw.rstrip(b"\x00").decode(errors="replace")


@dataclass(kw_only=True)
class Header:
    rank: int
    device_free_bytes: int = MISSING
    payload_len: int = 0
    """Length of an optional third gather (sweeps); every rank must agree on it."""
    checker_version: str = ""
    status: int = ROW_OK
    """A rank's local status before the exchange (sweeps: an input error ends the run early)."""

    def encode(self) -> list[int]:
        return [
            MAGIC,
            SCHEMA_VERSION,
            ROW_LEN,
            self.rank,
            self.device_free_bytes,
            self.payload_len,
            digest(self.checker_version),
            self.status,
        ]

    @classmethod
    def decode(cls, ints: Sequence[int]) -> Header:
        """Any schema's header reads: its first eight slots never change meaning."""
        ints = [int(i) for i in ints]
        if len(ints) != HEADER_LEN:
            raise WireError(f"header of {len(ints)} ints, expected {HEADER_LEN}")
        h = cls(rank=ints[3], device_free_bytes=ints[4], payload_len=ints[5], status=ints[7])
        h.schema = (ints[0], ints[1], ints[2])
        h.version_digest = ints[6]
        return h

    schema: tuple[int, int, int] = (MAGIC, SCHEMA_VERSION, 0)
    version_digest: int = 0


def encode_row(row: RankRow) -> list[int]:
    out = [MAGIC, SCHEMA_VERSION, ROW_LEN]
    out += [int(getattr(row, n)) for n in INT_FIELDS]
    out += pack_text(row.host, HOST_BYTES)
    out += pack_text(row.error, ERROR_BYTES)
    for name in INPUT_NAMES:
        value = row.inputs.get(name)
        out.append(digest(value))
        out += pack_text("" if value is None else value, VALUE_BYTES)
    if len(out) != ROW_LEN:
        raise WireError(f"encoded a row of {len(out)} ints, schema {SCHEMA_VERSION} has {ROW_LEN}")
    return out


def decode_row(ints: Sequence[int]) -> RankRow:
    ints = [int(i) for i in ints]
    if len(ints) != ROW_LEN or ints[0] != MAGIC or ints[1] != SCHEMA_VERSION or ints[2] != ROW_LEN:
        raise WireError(f"row of {len(ints)} ints with schema {ints[:3]} is not schema {SCHEMA_VERSION}")
    pos = 3
    values = dict(zip(INT_FIELDS, ints[pos : pos + len(INT_FIELDS)], strict=True))
    pos += len(INT_FIELDS)
    host = unpack_text(ints[pos : pos + _HOST_INTS])
    pos += _HOST_INTS
    error = unpack_text(ints[pos : pos + _ERROR_INTS])
    pos += _ERROR_INTS
    inputs: dict[str, str | None] = {}
    digests: dict[str, int] = {}
    unset = digest(None)
    for name in INPUT_NAMES:
        d = ints[pos]
        text = unpack_text(ints[pos + 1 : pos + 1 + _VALUE_INTS])
        digests[name] = d
        inputs[name] = None if d == unset else text
        pos += 1 + _VALUE_INTS
    return RankRow(**values, host=host, error=error, inputs=inputs, input_digests=digests)
