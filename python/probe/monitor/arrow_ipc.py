"""A small Arrow IPC *stream* writer (numpy only), for the monitor's files.

Why hand-written: the agent runs inside training jobs whose environments we do not control,
and depends only on numpy, safetensors and orjson; pyarrow is a large dependency for a few
columns. The stream format is simple: encapsulated messages (continuation marker, metadata
length, a flatbuffer ``Message``, an 8-byte aligned body), a ``Schema`` first, then
``DictionaryBatch`` and ``RecordBatch`` messages, then an end marker. Only what the monitor
needs is supported: int32, float32 and float64 columns (nullable), and one utf8 column
dictionary-encoded with int32 indices, its dictionary written once.

Each ``record_batch`` call returns the complete bytes of one message, which the caller writes
with one ``write``: a process killed mid-run leaves whole messages (or a torn last one, which
readers detect) but never a message spliced from two steps.

The flatbuffers are laid out front to back: a table's vtable just before it, the objects it
refers to after it (flatbuffer offsets point forward), every scalar aligned to its size from
the buffer's start, which is what the readers' verifiers check.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Callable, Optional, Union

import numpy as np

# Message header types, type ids and enums of Arrow's Schema.fbs / Message.fbs.
_SCHEMA, _DICTIONARY_BATCH, _RECORD_BATCH = 1, 2, 3
_TYPE_INT, _TYPE_FLOAT, _TYPE_UTF8 = 2, 3, 5
_V5 = 4
_PRECISION = {np.dtype(np.float32): 1, np.dtype(np.float64): 2}
_CONTINUATION = b"\xff\xff\xff\xff"
END_OF_STREAM = _CONTINUATION + b"\x00\x00\x00\x00"


@dataclass(frozen=True)
class Column:
    """A column: its name and type (``int32``, ``float32``, ``float64`` or ``dict_utf8``)."""

    name: str
    kind: str
    nullable: bool = True


_Writer = Callable[["_Flatbuffer"], int]


@dataclass(frozen=True)
class _Scalar:
    """A scalar field of a table: its size, struct format and value."""

    size: int
    fmt: str
    value: Union[int, bool]


@dataclass(frozen=True)
class _Offset:
    """A field referring to an object written after the table."""

    write: _Writer


_Field = Optional[Union[_Scalar, _Offset]]


def _size(f: Union[_Scalar, _Offset]) -> int:
    return f.size if isinstance(f, _Scalar) else 4


class _Flatbuffer:
    """Builds one flatbuffer front to back (see the module docstring)."""

    def __init__(self) -> None:
        self.buf = bytearray(4)  # the root table's offset, patched by finish()

    def _pad(self, align: int, extra: int = 0) -> None:
        while (len(self.buf) + extra) % align:
            self.buf.append(0)

    def _patch_offset(self, at: int, target: int) -> None:
        struct.pack_into("<I", self.buf, at, target - at)

    def table(self, fields: list[_Field]) -> int:
        """Writes a table (``fields`` by field id; None: absent) and what it refers to."""
        scalars = [(i, f) for i, f in enumerate(fields) if f is not None]
        # The vtable: its size, the table's size, each field's offset in the table.
        layout: list[tuple[int, int]] = []  # (field id, offset in table)
        widest = max([4] + [_size(f) for _, f in scalars])
        self._pad(2)
        vt_len = 4 + 2 * len(fields)
        # Place the table so that it starts aligned to its widest scalar.
        vt_at = len(self.buf)
        table_at = vt_at + vt_len
        pad = (-table_at) % widest
        pos = table_at + pad + 4
        ordered = sorted(scalars, key=lambda f: -_size(f[1]))
        for i, f in ordered:
            size = _size(f)
            pos += (-pos) % size
            layout.append((i, pos - (table_at + pad)))
            pos += size
        table_size = pos - (table_at + pad)
        offsets = [0] * len(fields)
        for i, off in layout:
            offsets[i] = off
        self.buf += b"\x00" * pad  # padding before the vtable keeps the vtable adjacent
        vt_at += pad
        table_at += pad
        self.buf += struct.pack(f"<HH{len(fields)}H", vt_len, table_size, *offsets)
        assert len(self.buf) == table_at
        self.buf += b"\x00" * table_size
        struct.pack_into("<i", self.buf, table_at, table_at - vt_at)
        children: list[tuple[int, _Writer]] = []
        for i, off in layout:
            field = fields[i]
            if isinstance(field, _Offset):
                children.append((table_at + off, field.write))
            elif isinstance(field, _Scalar):
                struct.pack_into("<" + field.fmt, self.buf, table_at + off, field.value)
        for at, write in children:
            self._patch_offset(at, write(self))
        return table_at

    def string(self, s: str) -> int:
        data = s.encode()
        self._pad(4)
        at = len(self.buf)
        self.buf += struct.pack("<I", len(data)) + data + b"\x00"
        return at

    def tables(self, items: list[_Writer]) -> int:
        self._pad(4)
        at = len(self.buf)
        self.buf += struct.pack("<I", len(items)) + b"\x00" * (4 * len(items))
        for k, write in enumerate(items):
            self._patch_offset(at + 4 + 4 * k, write(self))
        return at

    def structs(self, rows: list[tuple[int, int]]) -> int:
        """A vector of structs of two int64 (FieldNode, Buffer), elements 8-aligned."""
        self._pad(8, extra=4)
        at = len(self.buf)
        self.buf += struct.pack("<I", len(rows))
        for a, b in rows:
            self.buf += struct.pack("<qq", a, b)
        return at

    def finish(self, root: _Writer) -> bytes:
        self._patch_offset(0, root(self))
        self._pad(8)
        return bytes(self.buf)


def _u8(v: int) -> _Field:
    return _Scalar(1, "B", v)


def _bool(v: bool) -> _Field:
    return _Scalar(1, "?", v)


def _i16(v: int) -> _Field:
    return _Scalar(2, "h", v)


def _i32(v: int) -> _Field:
    return _Scalar(4, "i", v)


def _i64(v: int) -> _Field:
    return _Scalar(8, "q", v)


def _off(w: _Writer) -> _Field:
    return _Offset(w)


def _int_type(bits: int) -> _Writer:
    return lambda fb: fb.table([_i32(bits), _bool(True)])


def _field(col: Column) -> _Writer:
    if col.kind == "int32":
        type_id, type_w = _TYPE_INT, _int_type(32)
    elif col.kind in ("float32", "float64"):
        precision = _PRECISION[np.dtype(col.kind)]
        type_id, type_w = _TYPE_FLOAT, (lambda fb: fb.table([_i16(precision)]))
    elif col.kind == "dict_utf8":
        type_id, type_w = _TYPE_UTF8, (lambda fb: fb.table([]))
    else:
        raise ValueError(f"column {col.name}: unsupported kind {col.kind!r}")
    dictionary: _Field = None
    if col.kind == "dict_utf8":
        dictionary = _off(lambda fb: fb.table([_i64(0), _off(_int_type(32)), _bool(False)]))
    return lambda fb: fb.table(
        [
            _off(lambda fb: fb.string(col.name)),
            _bool(col.nullable),
            _u8(type_id),
            _off(type_w),
            dictionary,
            _off(lambda fb: fb.tables([])),
        ]
    )


def _key_value(k: str, v: str) -> _Writer:
    return lambda fb: fb.table([_off(lambda fb: fb.string(k)), _off(lambda fb: fb.string(v))])


def _message(header_type: int, header: _Writer, body: bytes) -> bytes:
    fb = _Flatbuffer()
    meta = fb.finish(
        lambda fb: fb.table([_i16(_V5), _u8(header_type), _off(header), _i64(len(body))])
    )
    return _CONTINUATION + struct.pack("<i", len(meta)) + meta + body


#: Record batch metadata by layout: a monitor's steps share one (the same rows, columns
#: and nulls), so the flatbuffer is built once, not every step.
_LAYOUTS: dict[tuple[object, ...], bytes] = {}


def schema_message(columns: list[Column], metadata: dict[str, str]) -> bytes:
    """The stream's first message."""
    fields = [_field(c) for c in columns]
    kvs = [_key_value(k, v) for k, v in metadata.items()]
    header: _Writer = lambda fb: fb.table(  # noqa: E731
        [_i16(0), _off(lambda fb: fb.tables(fields)), _off(lambda fb: fb.tables(kvs))]
    )
    return _message(_SCHEMA, header, b"")


class _Body:
    """A message body: buffers, each padded to 8 bytes, and the nodes and buffer specs."""

    def __init__(self) -> None:
        self.data = bytearray()
        self.buffers: list[tuple[int, int]] = []
        self.nodes: list[tuple[int, int]] = []

    def buffer(self, raw: bytes) -> None:
        self.buffers.append((len(self.data), len(raw)))
        self.data += raw
        self.data += b"\x00" * ((-len(self.data)) % 8)

    def column(self, values: np.ndarray, valid: Optional[np.ndarray]) -> None:
        n = len(values)
        nulls = 0 if valid is None else int(n - np.count_nonzero(valid))
        self.nodes.append((n, nulls))
        if nulls:
            assert valid is not None
            self.buffer(np.packbits(valid.astype(np.uint8), bitorder="little").tobytes())
        else:
            self.buffer(b"")
        self.buffer(np.ascontiguousarray(values).astype(values.dtype.newbyteorder("<")).tobytes())

    def batch_table(self, length: int) -> _Writer:
        nodes, buffers = list(self.nodes), list(self.buffers)
        return lambda fb: fb.table(
            [
                _i64(length),
                _off(lambda fb: fb.structs(nodes)),
                _off(lambda fb: fb.structs(buffers)),
            ]
        )


def dictionary_message(values: list[str]) -> bytes:
    """The dictionary (id 0) of the utf8 column: every value, once."""
    encoded = [v.encode() for v in values]
    offsets = np.zeros(len(encoded) + 1, dtype=np.int32)
    offsets[1:] = np.cumsum([len(e) for e in encoded])
    body = _Body()
    body.nodes.append((len(values), 0))
    body.buffer(b"")
    body.buffer(offsets.astype("<i4").tobytes())
    body.buffer(b"".join(encoded))
    batch = body.batch_table(len(values))
    header: _Writer = lambda fb: fb.table([_i64(0), _off(batch), _bool(False)])  # noqa: E731
    return _message(_DICTIONARY_BATCH, header, bytes(body.data))


_NUMPY = {"int32": np.int32, "float32": np.float32, "float64": np.float64, "dict_utf8": np.int32}


def record_batch_message(
    columns: list[Column], data: list[tuple[np.ndarray, Optional[np.ndarray]]]
) -> bytes:
    """One record batch: per column its values and validity (None: no nulls)."""
    length = len(data[0][0]) if data else 0
    body = _Body()
    for col, (values, valid) in zip(columns, data):
        body.column(np.asarray(values, dtype=_NUMPY[col.kind]), valid)
    key = (length, tuple(body.nodes), tuple(body.buffers))
    head = _LAYOUTS.get(key)
    if head is None:
        head = _message(_RECORD_BATCH, body.batch_table(length), bytes(len(body.data)))
        head = head[: len(head) - len(body.data)]
        if len(_LAYOUTS) < 64:
            _LAYOUTS[key] = head
    return head + bytes(body.data)
