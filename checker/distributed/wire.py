"""The exchange's wire format: fixed-schema int64 rows, never pickled objects (torch-free).

A peer can only send integers in known slots, so nothing it sends can run code on another rank.
Text a report must show (host, error message, input values) travels as UTF-8 bytes packed eight to an
int64, truncated to a fixed width; a digest of the full text decides equality.

Every run gathers in this order (:mod:`checker.distributed.exchange` runs it), so ranks whose arguments
differ still run the same collectives:

1. the header (``HEADER_LEN`` ints, fixed forever): schema version and row length, this rank's status
   before the exchange, the length of its payload, device free memory; ranks whose schema differs stop
   here with a clear error instead of a mismatched gather.
2. if some rank's header status is not ok (its command line, environment or local facts failed): one
   text gather (``ERROR_BYTES`` of each rank's message), and the run ends with every such rank named.
3. otherwise the payload: a ``PAYLOAD_PREFIX_LEN`` prefix (status and message, for a rank whose payload
   itself could not be computed), then the job's ints (check: the row of ``ROW_LEN`` ints: status,
   derived values, one digest + value text per input; sweep: its stage's whole sweep).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass

from checker.core.errors import printable
from checker.core.sizing.row import INPUT_NAMES, INT_FIELDS, MISSING, RankRow
from checker.status import ROW_OK

MAGIC = 0x50504348  # "PPCH"
SCHEMA_VERSION = 15
"""3: the row defined once in checker.core.sizing.row; 4: the launch command input; 5: a rank's error
travels in the header status and the text gather, the payload carries a status prefix, and the installed
release is the input ``sglang_installed`` (was ``sglang_version``), apart from ``derived_as``; 6: the same
slots, new meanings: ``model`` digests the model's own files (not resolved dtypes or TP), ``launch_command``
carries only the flags no other input does, and an input a rank did not resolve is unset (a rank of
schema 5 would differ from one of 6 in both without any difference in what they run); 7: the row carries
the model's layer count (``num_layers``), the digest of its definition (``model_digest``) and of the whole
launch command (``launch_digest``), so the verdict proves the stages tile one model; the input
``attention_layout`` (the TP/attention-DP flags as typed), and the sizing-flag inputs hold what was given,
never a release parser's default (a rank of 6 would name a default nobody typed); 8: the row carries the
operator's NODE_RANK (``operator_node_rank``) beside torchrun's GROUP_RANK; 9: two more int slots, each
rank's weights figure and its source (``weights_bytes``, ``weights_source``); 10: three inputs more, each
a slot of its own (the speculative algorithm, steps and top-k): the release resolves the speculative
setup from them, and the start-up refusals under PP read them; 11: two inputs more, the ReplaySSM
spec-verify ring's switch and length (``enable_linear_replayssm_spec``, ``linear_replayssm_cache_len``),
which the state-pool sizing charges (checker.core.sizing.replay); 12: the KV token pool (each rank's own
capacity and what the resolution after the MIN reads: cell, bytes, profile, release, page size, request
flags, context length) and two inputs more (--kv-cache-dtype, --max-total-tokens) and an env var
(SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN); 13: the weights figure's parts as integers (``param_bytes``,
``buffer_bytes``, ``margin_bytes``) and the --mem-fraction-static the budget used with its source
(``mem_fraction_millionths``, ``mem_fraction_source``), so the report carries them as fields of their own;
14: the speculative draft's part of the weights figure (``draft_bytes``); 15: where those bytes came from
(``draft_source``: the target's MTP layer or a separate draft, from shards or config.json, or inside a
figure given as a number)."""
HEADER_LEN = 8
HOST_BYTES = 64
ERROR_BYTES = 384
VALUE_BYTES = 120
"""Per input value: enough for a launch command's flags; the digest covers the whole text anyway."""
_HOST_INTS = HOST_BYTES // 8
_ERROR_INTS = ERROR_BYTES // 8
_VALUE_INTS = VALUE_BYTES // 8
ROW_LEN = 3 + len(INT_FIELDS) + _HOST_INTS + _ERROR_INTS + len(INPUT_NAMES) * (1 + _VALUE_INTS)
PAYLOAD_PREFIX_LEN = 1 + _ERROR_INTS
"""Status + message in front of every payload: a rank whose payload failed still sends the agreed length."""


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


CUT_MARK = "..."
"""Ends an input's text that the wire cut (``VALUE_BYTES``); the digest of the whole text decides equality."""


def sent_text(row: RankRow, name: str) -> str | None:
    """Input ``name``'s text as ``row`` carries it, ending in :data:`CUT_MARK` where the wire cut it: the
    text no longer matches the digest the rank computed of its whole value. The one rule every reader of
    a row uses (the verdict's lines, the report's inputs), so a value is marked cut in both or neither."""
    text = row.inputs.get(name)
    sent = row.input_digests.get(name)
    if text is None or sent is None or digest(text) == sent:
        return text
    return text + CUT_MARK


@dataclass(frozen=True, kw_only=True)
class Header:
    """What every rank says before the exchange (``HEADER_LEN`` ints). Slot 6 is unused: it carried a
    digest of the checker version that no rank compared (the row's ``checker_version`` input names a
    version difference by rank, with its text)."""

    rank: int
    device_free_bytes: int = MISSING
    payload_len: int = 0
    """Length of this rank's payload (the second gather); every rank must agree on it."""
    status: int = ROW_OK
    """This rank's status before the exchange: ok, or why it cannot take part (then its message follows
    in the text gather)."""
    schema: tuple[int, int, int] = (MAGIC, SCHEMA_VERSION, ROW_LEN)
    """What the sender speaks: magic, schema version, row length."""

    def encode(self) -> list[int]:
        return [*self.schema, self.rank, self.device_free_bytes, self.payload_len, 0, self.status]

    @classmethod
    def decode(cls, ints: Sequence[int]) -> Header:
        """Any schema's header reads: its first eight slots never change meaning."""
        ints = [int(i) for i in ints]
        if len(ints) != HEADER_LEN:
            raise WireError(f"header of {len(ints)} ints, expected {HEADER_LEN}")
        return cls(
            schema=(ints[0], ints[1], ints[2]),
            rank=ints[3],
            device_free_bytes=ints[4],
            payload_len=ints[5],
            status=ints[7],
        )


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
    # A peer's host name lands in rank 0's table, report and CI log: escaped as every echoed name is.
    host = printable(unpack_text(ints[pos : pos + _HOST_INTS]))
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
