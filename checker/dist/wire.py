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
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

MAGIC = 0x50504348  # "PPCH"
SCHEMA_VERSION = 2  # 2: the sglang_version input
HEADER_LEN = 8
HOST_BYTES = 64
ERROR_BYTES = 384
VALUE_BYTES = 56
UNSET = None

STATUS_OK = 0
STATUS_INTERNAL = 99
"""An unexpected exception on a rank (a bug, or a broken environment), still reported by every rank."""
STATUS_DRIFT = 98
"""``--engine both``: the builtin model and the installed SGLang derived different values on this rank
(the row carries the builtin's values, the error text names the findings)."""

# Integer slots of a row, in order. Adding a slot changes ROW_LEN; bump SCHEMA_VERSION with it.
INT_FIELDS = (
    "rank",
    "world_size",
    "pp_rank",
    "tp_rank",
    "node_rank",
    "local_rank",
    "status",
    "pp_size",
    "tp_size",
    "max_mamba_cache_size",
    "max_running_requests",
    "pp_max_micro_batch_size",
    "start_layer",
    "end_layer",
    "stage_linear_layers",
    "max_stage_linear_layers",
    "stage_per_req_bytes",
    "slots_per_request",
    "state_allocated_bytes",
    "state_charged_bytes",
    "budget_millionths_gib",
    "device_free_bytes",
    "predicted_bytes",
    "allocated_bytes",
    "materialize_status",
)
# Every input whose value can make ranks derive differently: one digest and one value text each.
INPUT_NAMES = (
    "checker_version",
    "torch_version",
    "sglang_version",
    "model",
    "budget_gib",
    "budget_source",
    "pp_size",
    "tp_size",
    "dp_size",
    "policy",
    "mamba_full_memory_ratio",
    "mamba_radix_cache_strategy",
    "page_size",
    "disable_radix_cache",
    "disable_overlap_schedule",
    "max_running_requests",
    "max_mamba_cache_size",
    "pp_max_micro_batch_size",
    "speculative_num_draft_tokens",
    "mamba_ssm_dtype",
    "token_capacity",
    "context_len",
    "SGLANG_PP_LAYER_PARTITION",
    "SGLANG_MAMBA_CONV_DTYPE",
    "SGLANG_MAMBA_SSM_DTYPE",
    "SGLANG_OPT_MAMBA_SKIP_DECODE_LOCK",
)
ENV_INPUTS = tuple(n for n in INPUT_NAMES if n.isupper())

_HOST_INTS = HOST_BYTES // 8
_ERROR_INTS = ERROR_BYTES // 8
_VALUE_INTS = VALUE_BYTES // 8
ROW_LEN = 3 + len(INT_FIELDS) + _HOST_INTS + _ERROR_INTS + len(INPUT_NAMES) * (1 + _VALUE_INTS)
MISSING = -1
"""Marks a derived value a rank could not compute (its status says why)."""


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
    status: int = STATUS_OK
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

    @staticmethod
    def schema_of(ints: Sequence[int]) -> tuple[int, int, int]:
        return int(ints[0]), int(ints[1]), int(ints[2])


@dataclass(kw_only=True)
class RankRow:
    """One rank's contribution: who it is, its status, what it derived, what it derived from."""

    ints: dict[str, int] = field(default_factory=dict)
    host: str = ""
    error: str = ""
    inputs: dict[str, str | None] = field(default_factory=dict)
    input_digests: dict[str, int] = field(default_factory=dict)

    def __getattr__(self, name: str) -> int:
        ints = self.__dict__.get("ints", {})
        if name in INT_FIELDS:
            return ints.get(name, MISSING)
        raise AttributeError(name)

    def encode(self) -> list[int]:
        out = [MAGIC, SCHEMA_VERSION, ROW_LEN]
        out += [int(self.ints.get(n, MISSING)) for n in INT_FIELDS]
        out += pack_text(self.host, HOST_BYTES)
        out += pack_text(self.error, ERROR_BYTES)
        for name in INPUT_NAMES:
            value = self.inputs.get(name)
            out.append(digest(value))
            out += pack_text("" if value is None else value, VALUE_BYTES)
        assert len(out) == ROW_LEN
        return out

    @classmethod
    def decode(cls, ints: Sequence[int]) -> RankRow:
        ints = [int(i) for i in ints]
        if len(ints) != ROW_LEN or ints[0] != MAGIC or ints[1] != SCHEMA_VERSION or ints[2] != ROW_LEN:
            raise WireError(f"row of {len(ints)} ints with schema {ints[:3]} is not schema {SCHEMA_VERSION}")
        pos = 3
        values = dict(zip(INT_FIELDS, ints[pos : pos + len(INT_FIELDS)]))
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
        return cls(ints=values, host=host, error=error, inputs=inputs, input_digests=digests)


def input_text(value: object) -> str | None:
    """Canonical text of a flag value: what the digest covers and the root cause quotes."""
    if value is None:
        return None
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return repr(value)
    return str(value)


def env_inputs(env: Mapping[str, str]) -> dict[str, str | None]:
    return {name: env.get(name) for name in ENV_INPUTS}
