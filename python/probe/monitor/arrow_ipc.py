"""A small Arrow IPC *stream* writer (the monitor file's format, docs/monitor.md), with numpy.

Why hand-written: the agent runs inside training environments whose packages it must not
pull in or fight with (it depends on numpy, safetensors and orjson only), and the monitor
needs a tiny part of Arrow: flat columns of int32, float32 and float64 with validity, one
dictionary-encoded utf8 column whose dictionary is fixed, a schema with custom metadata,
and the stream framing. pyarrow, polars and the ``probe`` command read the result.

What is written (https://arrow.apache.org/docs/format/Columnar.html#ipc-streaming-format):
the Schema message, one DictionaryBatch (id 0, the dictionary of the one dictionary field),
then one RecordBatch message per :meth:`StreamEncoder.batch` call, and the end-of-stream
marker. Each encapsulated message is ``0xFFFFFFFF``, the int32 length of the metadata
flatbuffer (padded so that the body starts 8-aligned), the flatbuffer, then the body, each
buffer padded to 8 bytes. Metadata version V5, little endian.

The encoder only *returns* bytes: the caller writes each message (or each step's batch) with
one ``write``, so a killed process leaves whole messages and at most a cut-short last one.

The flatbuffers are encoded by :func:`_encode`: parents before children (so every uoffset
points forward), each vtable just before its table, each table placed at 4 mod 8 so that
its 8-byte fields come right after the 4-byte soffset on an 8-byte boundary, fields by
decreasing size; vectors of 8-byte structs start their elements 8-aligned. pyarrow's
flatbuffer verifier checks these alignments.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Any, Optional, Union

import numpy as np

#: Column kinds: the Arrow type each is written as.
INT32 = "int32"
FLOAT32 = "float32"
FLOAT64 = "float64"
DICT_UTF8 = "dictionary<int32, utf8>"

_NUMPY: dict[str, np.dtype[Any]] = {
    INT32: np.dtype("<i4"),
    FLOAT32: np.dtype("<f4"),
    FLOAT64: np.dtype("<f8"),
}
_NUMPY[DICT_UTF8] = _NUMPY[INT32]

# Flatbuffer enum values of Schema.fbs / Message.fbs.
_V5 = 4
_HEADER_SCHEMA, _HEADER_DICTIONARY, _HEADER_RECORD_BATCH = 1, 2, 3
_TYPE_INT, _TYPE_FLOAT, _TYPE_UTF8 = 2, 3, 5
_PRECISION = {FLOAT32: 1, FLOAT64: 2}  # SINGLE, DOUBLE

CONTINUATION = b"\xff\xff\xff\xff"
#: The stream's end marker: a continuation and a zero metadata length.
END_OF_STREAM = CONTINUATION + b"\x00\x00\x00\x00"


@dataclass(frozen=True)
class Column:
    """One field of the schema: its name, kind (:data:`INT32`, ...) and nullability."""

    name: str
    kind: str
    nullable: bool = True


# --- flatbuffers ---------------------------------------------------------------------------


@dataclass(frozen=True)
class _Scalar:
    fmt: str  # struct format of one little-endian scalar: "b", "B", "h", "i", "q", "d", "?"
    value: Union[int, float, bool]


@dataclass(frozen=True)
class _Table:
    #: (field id, value): a scalar, or a child (table, vector, string) stored by offset.
    fields: tuple[tuple[int, _Value], ...]


@dataclass(frozen=True)
class _Tables:
    """A vector of tables (a vector of uoffsets)."""

    items: tuple[_Table, ...]


@dataclass(frozen=True)
class _Structs:
    """A vector of 16-byte structs of two int64 (FieldNode, Buffer), given as raw bytes."""

    count: int
    data: bytes


@dataclass(frozen=True)
class _String:
    text: str


_Value = Union[_Scalar, _Table, _Tables, _Structs, _String]
_Child = Union[_Table, _Tables, _Structs, _String]


def _pad_to(buf: bytearray, align: int, rest: int = 0) -> None:
    """Append zeros until ``len(buf) % align == rest``."""
    buf.extend(b"\x00" * ((rest - len(buf)) % align))


def _place_table(table: _Table, buf: bytearray, todo: list[tuple[int, _Child]]) -> int:
    slots = 1 + max((fid for fid, _ in table.fields), default=-1)
    sized = [
        (struct.calcsize(v.fmt) if isinstance(v, _Scalar) else 4, fid, v) for fid, v in table.fields
    ]
    sized.sort(key=lambda s: -s[0])  # 8-byte fields first, right after the soffset
    offsets = [0] * slots
    at = 4
    for size, fid, _ in sized:
        offsets[fid] = at
        at += size
    vtable = struct.pack(f"<HH{slots}H", 4 + 2 * slots, at, *offsets)
    _pad_to(buf, 2)
    vt_pos = len(buf)
    buf.extend(vtable)
    _pad_to(buf, 8, 4)
    pos = len(buf)
    buf.extend(struct.pack("<i", pos - vt_pos))
    for _, _, v in sized:
        if isinstance(v, _Scalar):
            buf.extend(struct.pack("<" + v.fmt, v.value))
        else:
            todo.append((len(buf), v))
            buf.extend(b"\x00\x00\x00\x00")
    return pos


def _place(obj: _Child, buf: bytearray, todo: list[tuple[int, _Child]]) -> int:
    """Append ``obj`` (its children go to ``todo``, to be placed after it); its position."""
    if isinstance(obj, _Table):
        return _place_table(obj, buf, todo)
    if isinstance(obj, _Tables):
        _pad_to(buf, 4)
        pos = len(buf)
        buf.extend(struct.pack("<I", len(obj.items)))
        for item in obj.items:
            todo.append((len(buf), item))
            buf.extend(b"\x00\x00\x00\x00")
        return pos
    if isinstance(obj, _Structs):
        _pad_to(buf, 8, 4)  # the elements start 8-aligned
        pos = len(buf)
        buf.extend(struct.pack("<I", obj.count))
        buf.extend(obj.data)
        return pos
    _pad_to(buf, 4)
    pos = len(buf)
    raw = obj.text.encode("utf-8")
    buf.extend(struct.pack("<I", len(raw)))
    buf.extend(raw + b"\x00")
    return pos


def _encode(root: _Table) -> bytes:
    """The flatbuffer whose root table is ``root``, its length a multiple of 8."""
    buf = bytearray(4)
    todo: list[tuple[int, _Child]] = [(0, root)]
    i = 0
    while i < len(todo):
        slot, obj = todo[i]
        i += 1
        pos = _place(obj, buf, todo)
        struct.pack_into("<I", buf, slot, pos - slot)
    _pad_to(buf, 8)
    return bytes(buf)


# --- messages ------------------------------------------------------------------------------


def _message(header_type: int, header: _Table, body: bytes) -> bytes:
    """An encapsulated message: continuation, metadata length, metadata, body."""
    return _prefix(header_type, header, len(body)) + body


#: Encoded batch metadata by (nodes, buffers): a monitor's steps repeat a few null
#: patterns, and encoding the flatbuffer in Python is most of a step's writing time.
_BATCH_PREFIXES: dict[tuple[tuple[int, ...], tuple[int, ...]], bytes] = {}
_MAX_CACHED = 256


def _prefix(header_type: int, header: _Table, body_length: int) -> bytes:
    """Continuation, metadata length and metadata of a message whose body has that length."""
    meta = _encode(
        _Table(
            (
                (0, _Scalar("h", _V5)),
                (1, _Scalar("B", header_type)),
                (2, header),
                (3, _Scalar("q", body_length)),
            )
        )
    )
    return CONTINUATION + struct.pack("<i", len(meta)) + meta


def _int32_type() -> _Table:
    return _Table(((0, _Scalar("i", 32)), (1, _Scalar("?", True))))


def _field(col: Column) -> _Table:
    fields: list[tuple[int, _Value]] = [
        (0, _String(col.name)),
        (1, _Scalar("?", col.nullable)),
        (5, _Tables(())),
    ]
    if col.kind == INT32:
        fields += [(2, _Scalar("B", _TYPE_INT)), (3, _int32_type())]
    elif col.kind in _PRECISION:
        fields += [
            (2, _Scalar("B", _TYPE_FLOAT)),
            (3, _Table(((0, _Scalar("h", _PRECISION[col.kind])),))),
        ]
    elif col.kind == DICT_UTF8:
        encoding = _Table(((0, _Scalar("q", 0)), (1, _int32_type()), (2, _Scalar("?", False))))
        fields += [(2, _Scalar("B", _TYPE_UTF8)), (3, _Table(())), (4, encoding)]
    else:
        raise ValueError(f"unknown column kind {col.kind!r}")
    return _Table(tuple(fields))


def schema_message(columns: list[Column], metadata: dict[str, str]) -> bytes:
    """The Schema message (little endian, the columns, the custom metadata)."""
    pairs = tuple(_Table(((0, _String(k)), (1, _String(v)))) for k, v in metadata.items())
    schema = _Table(
        (
            (0, _Scalar("h", 0)),
            (1, _Tables(tuple(_field(c) for c in columns))),
            (2, _Tables(pairs)),
        )
    )
    return _message(_HEADER_SCHEMA, schema, b"")


class _Body:
    """The body of a batch being built: buffers padded to 8, with their (offset, length)."""

    def __init__(self) -> None:
        self.parts: list[bytes] = []
        self.specs: list[int] = []
        self.size = 0

    def add(self, data: bytes) -> None:
        self.specs += [self.size, len(data)]
        pad = -len(data) % 8
        self.parts.append(data + b"\x00" * pad if pad else data)
        self.size += len(data) + pad

    def bytes(self) -> bytes:
        return b"".join(self.parts)


def _record_batch(length: int, nodes: list[int], body: _Body) -> _Table:
    return _Table(
        (
            (0, _Scalar("q", length)),
            (1, _Structs(len(nodes) // 2, struct.pack(f"<{len(nodes)}q", *nodes))),
            (2, _Structs(len(body.specs) // 2, struct.pack(f"<{len(body.specs)}q", *body.specs))),
        )
    )


def dictionary_message(values: list[str], dictionary_id: int = 0) -> bytes:
    """The DictionaryBatch of a utf8 dictionary (not a delta)."""
    raw = [v.encode("utf-8") for v in values]
    offsets = np.zeros(len(raw) + 1, dtype="<i4")
    np.cumsum([len(r) for r in raw], out=offsets[1:])
    body = _Body()
    body.add(b"")  # validity: none null
    body.add(offsets.tobytes())
    body.add(b"".join(raw))
    batch = _record_batch(len(raw), [len(raw), 0], body)
    header = _Table(((0, _Scalar("q", dictionary_id)), (1, batch), (2, _Scalar("?", False))))
    return _message(_HEADER_DICTIONARY, header, body.bytes())


def record_batch_message(
    columns: list[Column],
    length: int,
    values: list[np.ndarray[Any, Any]],
    valid: list[Optional[np.ndarray[Any, Any]]],
) -> bytes:
    """One RecordBatch message: ``values[i]`` holds column i's ``length`` values (cast to
    the column's type); ``valid[i]`` is a bool mask of its non-null rows, or None (no null).
    Null rows' values are written as they are (Arrow leaves them undefined).

    Written once per step by the monitor: the validity bitmaps of all columns are packed
    and counted by one numpy call each, and the metadata comes from a cache."""
    masks = np.ones((len(columns), length), dtype=bool)
    for k, mask in enumerate(valid):
        if mask is not None:
            masks[k] = mask
    nulls = (length - np.count_nonzero(masks, axis=1)).tolist()
    bits = np.packbits(masks, axis=1, bitorder="little")
    bitmap_pad = b"\x00" * (-bits.shape[1] % 8)
    parts: list[bytes] = []
    nodes: list[int] = []
    specs: list[int] = []
    size = 0
    for k, (col, data) in enumerate(zip(columns, values)):
        if nulls[k] and not col.nullable:
            raise ValueError(f"column {col.name!r} is not nullable but has {nulls[k]} nulls")
        nodes += (length, nulls[k])
        if nulls[k]:
            parts += (bits[k].tobytes(), bitmap_pad)
            specs += (size, bits.shape[1])
            size += bits.shape[1] + len(bitmap_pad)
        else:
            specs += (size, 0)
        arr = np.asarray(data, dtype=_NUMPY[col.kind])
        if arr.shape != (length,):
            raise ValueError(f"column {col.name!r}: {arr.shape} values for {length} rows")
        raw = arr.tobytes()
        pad = -len(raw) % 8
        parts += (raw, b"\x00" * pad)
        specs += (size, len(raw))
        size += len(raw) + pad
    key = (tuple(nodes), tuple(specs))
    prefix = _BATCH_PREFIXES.get(key)
    if prefix is None:
        body = _Body()
        body.specs, body.size = specs, size
        prefix = _prefix(_HEADER_RECORD_BATCH, _record_batch(length, nodes, body), size)
        if len(_BATCH_PREFIXES) < _MAX_CACHED:
            _BATCH_PREFIXES[key] = prefix
    return prefix + b"".join(parts)
