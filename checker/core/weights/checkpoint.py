"""A model directory's safetensors checkpoint, read from its headers only (torch-free).

A safetensors file is an 8-byte little-endian header length N, N bytes of JSON naming every tensor's
dtype, shape and byte range, then the tensor data. This module reads the first ``8 + N`` bytes of each
shard and never the data, so a 100-shard, 800 GB checkpoint costs its headers (a few MB) and a few
milliseconds per shard. Which shards: as SGLang's loader picks them (``model_loader/loader.py``
``_prepare_weights``): every ``*.safetensors`` in the directory, or, when ``model.safetensors.index.json``
is there, the ones its ``weight_map`` names (``weight_utils.filter_duplicate_safetensors_files``).

Everything a broken or partial download can do is one :class:`ConfigError` line naming the file and the
way out, before any tensor is read: a shard the index names but the directory lacks, a header length over
the cap (:data:`MAX_HEADER_BYTES`, the safetensors library's own) or past the end of its file, a tensor
whose byte range runs past the end of the file (a truncated shard), a dtype safetensors does not define,
a byte range that does not match the dtype and shape, a tensor in two shards.
"""

from __future__ import annotations

import json
import os
import stat
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

from checker.core.errors import ConfigError, json_kind, printable, shorten

INDEX_NAME = "model.safetensors.index.json"
SUFFIX = ".safetensors"
MAX_HEADER_BYTES = 100_000_000
"""The largest header accepted: the safetensors library's own limit (``MAX_HEADER_SIZE``, 100 MB). Real
headers are a few hundred bytes per tensor: 2.4 MB for a 10,000-tensor shard."""
MAX_INDEX_BYTES = 64 * 2**20
"""``model.safetensors.index.json`` lists every tensor once: about 100 bytes each, so 6 MB for the
60,000 tensors of a 400B MoE checkpoint. 64 MiB is read at most."""
MAX_SHARDS = 100_000
MAX_DIMS = 8
MAX_ELEMENTS = 2**50
"""One tensor's element count: far above any real weight (2**40 elements is a 2 TB bf16 tensor), and low
enough that every byte count below stays an exact integer."""

# Bits per element of every dtype safetensors defines (its Rust ``Dtype`` enum; the sub-byte ones are
# packed). A dtype outside this table is refused: its bytes cannot be counted.
DTYPE_BITS: Mapping[str, int] = {
    "BOOL": 8,
    "U8": 8,
    "I8": 8,
    "F8_E5M2": 8,
    "F8_E4M3": 8,
    "F8_E4M3FNUZ": 8,
    "F8_E5M2FNUZ": 8,
    "F8_E8M0": 8,
    "F4": 4,
    "F6_E2M3": 6,
    "F6_E3M2": 6,
    "I16": 16,
    "U16": 16,
    "F16": 16,
    "BF16": 16,
    "I32": 32,
    "U32": 32,
    "F32": 32,
    "F64": 64,
    "I64": 64,
    "U64": 64,
    "C64": 64,
}
TORCH_DTYPE: Mapping[str, str] = {
    "F32": "float32",
    "F16": "float16",
    "BF16": "bfloat16",
    "F64": "float64",
    "F8_E4M3": "float8_e4m3fn",
    "F8_E5M2": "float8_e5m2",
    "I8": "int8",
    "U8": "uint8",
    "I32": "int32",
    "I64": "int64",
}
"""The torch name of a checkpoint dtype, for messages and for the dtype a class holds it in."""

_WAY_OUT = "re-download the checkpoint (or point --model-path at a complete copy)"


class Tensor(NamedTuple):
    """One tensor as its shard's header describes it (a tuple: a header lists up to 100,000 of them)."""

    dtype: str
    shape: tuple[int, ...]
    shard: str

    @property
    def numel(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n

    @property
    def nbytes(self) -> int:
        return nbytes(self.dtype, self.shape)


@dataclass(frozen=True)
class Checkpoint:
    """The tensors of a model directory's safetensors shards, from their headers."""

    directory: str
    shards: tuple[str, ...]
    tensors: Mapping[str, Tensor]
    indexed: bool
    """Whether ``model.safetensors.index.json`` chose the shards."""
    header_bytes: int
    """What was read from the shards: the headers and their length words, nothing else."""

    @property
    def total_bytes(self) -> int:
        """The tensor data on disk (what the headers say each tensor takes)."""
        return sum(t.nbytes for t in self.tensors.values())


def nbytes(dtype: str, shape: tuple[int, ...]) -> int:
    n = 1
    for d in shape:
        n *= d
    return (n * DTYPE_BITS[dtype] + 7) // 8


def has_safetensors(directory: str | Path) -> bool:
    """Whether SGLang would load safetensors from ``directory``: an index or a ``*.safetensors`` file."""
    d = Path(directory)
    try:
        if (d / INDEX_NAME).is_file():
            return True
        with os.scandir(d) as it:
            return any(e.name.endswith(SUFFIX) and e.is_file() for e in it)
    except OSError:
        return False


def _shown(path: Path | str) -> str:
    """A path for a message: printable, and its end kept when it is long (the file name matters)."""
    text = printable(str(path))
    return text if len(text) <= 200 else "..." + text[-197:]


def _read_at_most(path: Path, limit: int, what: str) -> bytes:
    try:
        with open(path, "rb") as f:
            if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
                raise ConfigError(f"{_shown(path)} is not a regular file; {what} must be one")
            data = f.read(limit + 1)
    except OSError as exc:
        raise ConfigError(f"cannot read {_shown(path)}: {exc.strerror or exc}") from None
    if len(data) > limit:
        raise ConfigError(
            f"{_shown(path)} is over {limit:,} bytes, too large for {what}; check the file ({_WAY_OUT})"
        )
    return data


def _shard_names(directory: Path) -> tuple[list[str], dict[str, str] | None]:
    """The shard file names SGLang loads, and the index's tensor -> shard map when there is an index."""
    index = directory / INDEX_NAME
    if index.exists():
        raw = _read_at_most(index, MAX_INDEX_BYTES, "a safetensors index")
        try:
            doc = json.loads(raw)
        except (ValueError, RecursionError) as exc:
            raise ConfigError(
                f"{_shown(index)} is not valid JSON ({shorten(str(exc), 80)}); {_WAY_OUT}"
            ) from None
        weight_map = doc.get("weight_map") if isinstance(doc, dict) else None
        if not isinstance(weight_map, dict) or not weight_map:
            raise ConfigError(
                f"{_shown(index)} has no weight_map (a JSON object of tensor name -> shard file); {_WAY_OUT}"
            )
        shards: dict[str, None] = {}
        for name, file in weight_map.items():
            if file in shards:
                continue  # each shard's name is checked once (a map names it thousands of times)
            if not isinstance(file, str) or not file.endswith(SUFFIX):
                raise ConfigError(
                    f"{_shown(index)}: weight_map[{shorten(name)}] is {shorten(file)}, not a .safetensors "
                    f"file name; {_WAY_OUT}"
                )
            parts = Path(file).parts
            if Path(file).is_absolute() or ".." in parts or not parts:
                raise ConfigError(
                    f"{_shown(index)}: weight_map[{shorten(name)}] names {shorten(file)}, outside the model "
                    "directory; shard names are relative to it"
                )
            shards[file] = None
            if len(shards) > MAX_SHARDS:
                raise ConfigError(f"{_shown(index)} names over {MAX_SHARDS:,} shards; check the index")
        return list(shards), {str(k): v for k, v in weight_map.items()}
    try:
        with os.scandir(directory) as it:
            names = sorted(e.name for e in it if e.name.endswith(SUFFIX) and e.is_file())
    except OSError as exc:
        raise ConfigError(f"cannot list {_shown(directory)}: {exc.strerror or exc}") from None
    if len(names) > MAX_SHARDS:
        raise ConfigError(f"{_shown(directory)} holds over {MAX_SHARDS:,} .safetensors files")
    return names, None


def _int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def read_header(path: Path, name: str) -> tuple[dict[str, Tensor], int]:
    """One shard's tensors from its header, and the bytes read (8 + the header). Nothing past the header
    is read; the file's size (stat) is what a truncated shard is measured against."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        raise ConfigError(
            f"shard {shorten(name)} is missing from {_shown(path.parent)}; {_WAY_OUT}"
        ) from None
    except OSError as exc:
        raise ConfigError(f"cannot open shard {_shown(path)}: {exc.strerror or exc}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise ConfigError(f"shard {_shown(path)} is not a regular file")
        size = st.st_size
        head = os.pread(fd, 8, 0)
        if len(head) < 8:
            raise ConfigError(
                f"shard {_shown(path)} is {size} bytes, shorter than the 8-byte header length every "
                f"safetensors file starts with (a truncated or empty file); {_WAY_OUT}"
            )
        n = int.from_bytes(head, "little")
        if n > MAX_HEADER_BYTES:
            raise ConfigError(
                f"shard {_shown(path)} declares a {n:,}-byte header, over the {MAX_HEADER_BYTES:,}-byte cap "
                f"safetensors itself sets (not a safetensors file, or a corrupt one); {_WAY_OUT}"
            )
        if 8 + n > size:
            raise ConfigError(
                f"shard {_shown(path)} declares a {n:,}-byte header but the file is {size:,} bytes "
                f"(a truncated file); {_WAY_OUT}"
            )
        raw = b""
        while len(raw) < n:
            chunk = os.pread(fd, n - len(raw), 8 + len(raw))
            if not chunk:
                raise ConfigError(f"shard {_shown(path)} ended while its header was read; {_WAY_OUT}")
            raw += chunk
    finally:
        os.close(fd)
    tensors, end_max = _parsed(raw, path, name)
    if end_max > size - 8 - n:
        raise ConfigError(
            f"shard {_shown(path)} is {size:,} bytes but its header places tensor data up to byte "
            f"{8 + n + end_max:,} (a truncated file: {8 + n + end_max - size:,} bytes missing); {_WAY_OUT}"
        )
    return dict(tensors), 8 + n


PARSED_CACHE_BYTES = 64 << 20
"""Headers whose tensors this process keeps (LRU, by header size): a process that reads the same shard
headers again (``derive --sglang-version A,B`` sizes each release from them; the test suite reads each
fixture checkpoint in many tests) parses them once. Keyed by the shard's name and its header's exact
bytes, so a changed header is parsed afresh; the file's size is checked against it on every read."""
_PARSED: OrderedDict[tuple[str, bytes], tuple[dict[str, Tensor], int]] = OrderedDict()
_parsed_bytes = 0


def _parsed(raw: bytes, path: Path, name: str) -> tuple[dict[str, Tensor], int]:
    """:func:`_parse_header`'s answer for these exact header bytes, from the cache when it holds them."""
    global _parsed_bytes
    key = (name, raw)
    hit = _PARSED.get(key)
    if hit is not None:
        _PARSED.move_to_end(key)
        return hit
    parsed = _PARSED[key] = _parse_header(raw, path, name)  # a header that fails is never cached
    _parsed_bytes += len(raw)
    while _parsed_bytes > PARSED_CACHE_BYTES and len(_PARSED) > 1:
        (_, dropped), _ = _PARSED.popitem(last=False)
        _parsed_bytes -= len(dropped)
    return parsed


def _parse_header(raw: bytes, path: Path, name: str) -> tuple[dict[str, Tensor], int]:
    """A header's tensors and the end of the data they place (checked against the file's size by the
    caller); one ConfigError line for an entry safetensors would not have written."""
    try:
        doc = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise ConfigError(
            f"shard {_shown(path)}: its header is not JSON ({shorten(str(exc), 80)}); {_WAY_OUT}"
        ) from None
    if not isinstance(doc, dict):
        raise ConfigError(
            f"shard {_shown(path)}: its header is {json_kind(doc)}, not a JSON object; {_WAY_OUT}"
        )
    tensors: dict[str, Tensor] = {}
    end_max = 0
    bits = DTYPE_BITS
    for key, entry in doc.items():
        if key == "__metadata__":
            continue
        # The common case is checked inline and fast (a header of 100,000 tensors is read in well under a
        # second); the message is built only for the entry that fails.
        try:
            dtype, shape, (begin, end) = entry["dtype"], entry["shape"], entry["data_offsets"]
            width = bits[dtype]
            numel = 1
            for d in shape:
                if type(d) is not int or d < 0:
                    raise TypeError
                numel *= d
            if type(begin) is not int or type(end) is not int or begin < 0 or len(shape) > MAX_DIMS:
                raise TypeError
        except (KeyError, TypeError, ValueError):
            _refuse_entry(path, key, entry)
        if numel > MAX_ELEMENTS:
            raise ConfigError(
                f"shard {_shown(path)}: tensor {shorten(key)} has shape {list(shape)}: {numel:,} elements is "
                "past any real weight"
            )
        want = (numel * width + 7) // 8
        if end - begin != want:
            raise ConfigError(
                f"shard {_shown(path)}: tensor {shorten(key)} spans bytes [{begin:,}, {end:,}) but a {dtype} "
                f"tensor of shape {list(shape)} takes {want:,} bytes (a corrupt header); {_WAY_OUT}"
            )
        if end > end_max:
            end_max = end
        tensors[key] = Tensor(dtype=dtype, shape=tuple(shape), shard=name)
    return tensors, end_max


def _refuse_entry(path: Path, key: str, entry: Any) -> None:
    """The one line for a header entry that is not ``{dtype, shape, data_offsets}`` as safetensors
    writes them."""
    where = f"shard {_shown(path)}: tensor {shorten(key)}"
    if not isinstance(entry, dict):
        raise ConfigError(f"{where} is {json_kind(entry)}, not an object of dtype, shape, data_offsets")
    dtype, shape, offsets = entry.get("dtype"), entry.get("shape"), entry.get("data_offsets")
    if not isinstance(dtype, str) or dtype not in DTYPE_BITS:
        raise ConfigError(
            f"{where} has dtype {shorten(dtype)}, which safetensors does not define "
            f"({', '.join(DTYPE_BITS)}); {_WAY_OUT}"
        )
    if (
        not isinstance(shape, list)
        or len(shape) > MAX_DIMS
        or not all(_int(d) and 0 <= d <= MAX_ELEMENTS for d in shape)
    ):
        raise ConfigError(f"{where} has shape {shorten(shape)}, not a list of at most {MAX_DIMS} sizes")
    raise ConfigError(f"{where} has data_offsets {shorten(offsets)}, not [begin, end]")


def read_checkpoint(directory: str | Path) -> Checkpoint:
    """Every tensor of the checkpoint in ``directory`` (dtype, shape, shard), from the shards' headers."""
    d = Path(directory)
    names, weight_map = _shard_names(d)
    if not names:
        raise ConfigError(f"{_shown(d)} holds no .safetensors file (and no {INDEX_NAME})")
    for name in names:  # every shard the index names is there, before any is read
        p = d / name
        if not p.is_file():
            raise ConfigError(
                f"{_shown(d / INDEX_NAME)} names shard {shorten(name)}, which {_shown(d)} does not hold "
                f"(an incomplete download); {_WAY_OUT}"
            )
    tensors: dict[str, Tensor] = {}
    read = 0
    for name in names:
        found, n = read_header(d / name, name)
        read += n
        for key, t in found.items():
            if key in tensors:
                raise ConfigError(
                    f"tensor {shorten(key)} is in two shards, {shorten(tensors[key].shard)} and "
                    f"{shorten(name)}; {_WAY_OUT}"
                )
            tensors[key] = t
    if weight_map is not None:
        for key, file in weight_map.items():
            held = tensors.get(key)
            if held is None or held.shard != file:
                where = "no shard" if held is None else f"shard {shorten(held.shard)}"
                raise ConfigError(
                    f"{_shown(d / INDEX_NAME)} places tensor {shorten(key)} in {shorten(file)} but {where} "
                    f"holds it; {_WAY_OUT}"
                )
    return Checkpoint(
        directory=str(d),
        shards=tuple(names),
        tensors=tensors,
        indexed=weight_map is not None,
        header_bytes=read,
    )
