"""The exchange's row format (checker.distributed.wire), in-process: what rank 0 decides on is exactly
what each rank derived, and a row of another schema is refused instead of misread.

The real gathers (tests/test_protocol.py, test_check.py) carry these ints through gloo; here the
encoding alone is checked over many rows, so a slot read from the wrong place shows at once.
"""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from checker.core.errors import printable
from checker.core.sizing.row import INPUT_NAMES, INT_FIELDS, RankRow
from checker.distributed.wire import (
    ERROR_BYTES,
    HOST_BYTES,
    MAGIC,
    ROW_LEN,
    SCHEMA_VERSION,
    VALUE_BYTES,
    WireError,
    decode_row,
    digest,
    encode_row,
)

INT64 = st.integers(min_value=-(2**63), max_value=2**63 - 1)


def _text(max_bytes: int) -> st.SearchStrategy[str]:
    # Any text but NUL (the padding), as long as it fits its slot; multi-byte characters included, so
    # every byte value reaches the top byte of an int64.
    chars = st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00")
    return st.text(chars, max_size=max_bytes).filter(lambda t: len(t.encode()) <= max_bytes)


@st.composite
def rows(draw: st.DrawFn) -> RankRow:
    ints = {name: draw(INT64) for name in INT_FIELDS}
    names = draw(st.lists(st.sampled_from(INPUT_NAMES), unique=True))
    inputs = {name: draw(st.none() | _text(VALUE_BYTES)) for name in names}
    return RankRow(
        **ints,
        host=draw(_text(HOST_BYTES)),
        error=draw(_text(ERROR_BYTES)),
        inputs=inputs,
        input_digests={name: digest(v) for name, v in inputs.items()},
    )


@given(rows())
def test_a_row_reads_back_as_it_was_sent(row: RankRow) -> None:
    ints = encode_row(row)
    # The gather is an int64 tensor: every slot must fit one.
    assert len(ints) == ROW_LEN and all(-(2**63) <= i < 2**63 for i in ints)
    back = decode_row(ints)
    assert {n: getattr(back, n) for n in INT_FIELDS} == {n: getattr(row, n) for n in INT_FIELDS}
    # The host arrives escaped (it is shown on rank 0's terminal): printable text unchanged.
    assert (back.host, back.error) == (printable(row.host), row.error)
    # Every input the row does not carry travels as unset; unset reads back as None, never as "".
    sent = {name: row.inputs.get(name) for name in INPUT_NAMES}
    assert dict(back.inputs) == sent
    assert dict(back.input_digests) == {name: digest(v) for name, v in sent.items()}


def test_texts_ending_in_any_character_read_back_whole() -> None:
    # Only the NUL padding is stripped: a host or value ending in a letter, a space or "X" keeps it.
    for text in ("node-X", "gpu-node-7 ", "XX"):
        back = decode_row(encode_row(RankRow(host=text, inputs={"model": text})))
        assert (back.host, back.inputs["model"]) == (text, text)


def test_unset_and_empty_are_different_inputs() -> None:
    back = decode_row(encode_row(RankRow(inputs={"model": ""})))
    assert back.inputs["model"] == "" and back.inputs["derived_as"] is None
    assert back.input_digests["model"] != back.input_digests["derived_as"]


def test_long_texts_are_cut_to_their_slot_but_still_compared_whole() -> None:
    # A launch command longer than its slot: the report shows the start, the digest decides.
    a, b = "x" * VALUE_BYTES + " --pp-size 4", "x" * VALUE_BYTES + " --pp-size 8"
    ra, rb = (decode_row(encode_row(RankRow(inputs={"launch_command": t}))) for t in (a, b))
    assert ra.inputs["launch_command"] == rb.inputs["launch_command"] == "x" * VALUE_BYTES
    assert ra.input_digests["launch_command"] != rb.input_digests["launch_command"]
    # Cut inside a multi-byte character (a non-English error message): still one readable line.
    # One ASCII byte first, so the slot ends half-way through an "é".
    error = "a" + "é" * ERROR_BYTES
    back = decode_row(encode_row(RankRow(error=error)))
    assert back.error.rstrip("\ufffd") == "a" + "é" * ((ERROR_BYTES - 1) // 2)


@pytest.mark.parametrize(
    "slot, value",
    [(0, MAGIC + 1), (1, SCHEMA_VERSION - 1), (1, SCHEMA_VERSION + 1), (2, ROW_LEN - 1)],
    ids=["magic", "older-schema", "newer-schema", "row-length-slot"],
)
def test_a_row_of_another_schema_is_refused_naming_the_schema(slot: int, value: int) -> None:
    ints = encode_row(RankRow(rank=3))
    ints[slot] = value
    with pytest.raises(WireError) as e:
        decode_row(ints)
    assert f"not schema {SCHEMA_VERSION}" in str(e.value) and str(value) in str(e.value)


@pytest.mark.parametrize("delta", [-1, 1])
def test_a_row_of_another_length_is_refused(delta: int) -> None:
    ints = encode_row(RankRow(rank=3))
    ints = ints[:delta] if delta < 0 else [*ints, 0]
    with pytest.raises(WireError, match=f"row of {ROW_LEN + delta} ints"):
        decode_row(ints)
