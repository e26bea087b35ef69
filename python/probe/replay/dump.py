"""Reading what a replay needs from a dump: the rank folder, an op's records, their tensors.

Why not the Rust reader: the replay runs where PyTorch is, as ``python -m probe.replay``,
and needs a handful of tensors out of shards of gigabytes. It reads only the records it is
asked for (a line is parsed only when it holds the key's text) and only those tensors'
bytes (a seek per tensor), which keeps a replay of one op within its start-up budget
(docs/replay.md, "Cost"). The layout and robustness rules are docs/format.md's.
"""

from __future__ import annotations

import json
import mmap
import os
import re
import struct
from dataclasses import dataclass
from typing import Any, Optional

import torch

from .kernel import CODES, DTYPE_NAMES


class InputError(Exception):
    """A dump, key or argument the replay cannot use: one line, exit 2."""


@dataclass(frozen=True)
class RankDir:
    """One ``step<S>/rank<R>`` folder of a dump, and the dump's manifest (None if none)."""

    path: str
    step: Optional[int]
    rank: Optional[int]
    manifest: Optional[dict[str, Any]]


_STEP = re.compile(r"step(\d+)$")
_RANK = re.compile(r"rank(\d+)$")


def _numbered(path: str, pattern: re.Pattern[str]) -> dict[int, str]:
    found: dict[int, str] = {}
    for name in sorted(os.listdir(path)):
        m = pattern.match(name)
        if m and os.path.isdir(os.path.join(path, name)):
            found[int(m.group(1))] = os.path.join(path, name)
    return found


def _pick(found: dict[int, str], want: Optional[int], what: str, where: str) -> str:
    if want is not None:
        if want not in found:
            have = ", ".join(f"{what}{n}" for n in found) or "none"
            raise InputError(f"{where}: no {what}{want} (it holds {have})")
        return found[want]
    if len(found) != 1:
        have = ", ".join(f"{what}{n}" for n in found)
        raise InputError(f"{where}: holds {have}: choose one with --{what}")
    return next(iter(found.values()))


def locate(path: str, step: Optional[int], rank: Optional[int]) -> RankDir:
    """The rank folder ``path`` names: a dump root, a ``step<S>`` folder or a ``rank<R>``
    folder, as ``probe compare`` accepts; ``step``/``rank`` choose where there are several."""
    if not os.path.isdir(path):
        raise InputError(f"{path}: no such dump folder")
    folder = path
    if not os.path.isfile(os.path.join(folder, "ops.jsonl")):
        steps = _numbered(folder, _STEP)
        if steps:
            folder = _pick(steps, step, "step", path)
        ranks = _numbered(folder, _RANK)
        if not ranks:
            raise InputError(f"{path}: not a probe dump (no ops.jsonl, step<S> or rank<R>)")
        folder = _pick(ranks, rank, "rank", folder)
        if not os.path.isfile(os.path.join(folder, "ops.jsonl")):
            raise InputError(f"{folder}: no ops.jsonl")
    folder = os.path.abspath(folder)
    s = _STEP.match(os.path.basename(os.path.dirname(folder)))
    r = _RANK.match(os.path.basename(folder))
    return RankDir(
        folder, int(s.group(1)) if s else step, int(r.group(1)) if r else rank, _manifest(folder)
    )


def _manifest(folder: str) -> Optional[dict[str, Any]]:
    """The manifest of the dump the rank folder belongs to (its root is two levels up)."""
    for up in (folder, os.path.dirname(folder), os.path.dirname(os.path.dirname(folder))):
        p = os.path.join(up, "manifest.json")
        if os.path.isfile(p):
            try:
                with open(p, encoding="utf-8") as fh:
                    m = json.load(fh)
            except (OSError, ValueError) as e:
                raise InputError(f"{p}: not readable JSON ({e})") from None
            return m if isinstance(m, dict) else None
    return None


def find_ops(rank: RankDir, keys: set[str]) -> dict[str, dict[str, Any]]:
    """The records of ``keys`` in the rank's op log (the first of each key). A line is
    parsed only when it holds a key's text; a malformed line holding one is an error, except
    a last line cut short (a crashed run), which is skipped."""
    path = os.path.join(rank.path, "ops.jsonl")
    needles = {k: json.dumps(k)[1:-1] for k in keys}
    found: dict[str, dict[str, Any]] = {}
    try:
        with open(path, encoding="utf-8") as fh:
            lines = fh.readlines()
    except (OSError, UnicodeDecodeError) as e:
        raise InputError(f"{path}: not readable ({e})") from None
    for n, line in enumerate(lines, 1):
        if not any(needle in line for needle in needles.values()):
            continue
        try:
            rec = json.loads(line)
        except ValueError:
            if n == len(lines) and not line.endswith("\n"):
                continue  # a crashed run's last line
            raise InputError(f"{path}:{n}: malformed op record") from None
        key = rec.get("op") if isinstance(rec, dict) else None
        if key in needles and key not in found:
            if not isinstance(rec.get("tensors"), list):
                raise InputError(f"{path}:{n}: op record without a tensors list")
            found[key] = rec
    return found


def slot(key: str, name: str) -> str:
    """A tensor's slot: its name less the op key (``input.0``, ``parameters.weight``)."""
    return name[len(key) + 1 :] if name.startswith(key + ".") else name


def load_tensors(rank: RankDir, rec: dict[str, Any], prefix: str = "") -> dict[str, torch.Tensor]:
    """The recorded data of a record's tensors, by slot (``prefix`` + slot). Tensors
    without data (statistics or checksum mode, leftover bytes) are left out."""
    out: dict[str, torch.Tensor] = {}
    headers: dict[str, tuple[dict[str, Any], int]] = {}
    for t in rec["tensors"]:
        file = t.get("file")
        if not isinstance(file, str) or t.get("unwritten"):
            continue
        if os.sep in file or "/" in file or file.startswith("."):
            raise InputError(f"{rank.path}: tensor {t.get('name')!r}: bad shard name {file!r}")
        out[prefix + slot(rec["op"], t["name"])] = _read(rank, file, t, headers)
    return out


def _read(
    rank: RankDir, file: str, t: dict[str, Any], headers: dict[str, tuple[dict[str, Any], int]]
) -> torch.Tensor:
    path = os.path.join(rank.path, file)
    name = str(t["name"])
    if not os.path.isfile(path):
        raise InputError(f"{path}: missing shard (tensor {name!r})")
    if file not in headers:
        headers[file] = _header(path)
    header, base = headers[file]
    meta = header.get(name)
    if not isinstance(meta, dict):
        raise InputError(f"{path}: no tensor {name!r} in the shard")
    dtype = CODES.get(str(meta.get("dtype")))
    if dtype is None or DTYPE_NAMES.get(str(t.get("dtype"))) != dtype:
        raise InputError(
            f"{path}: {name!r}: dtype {meta.get('dtype')} in the shard, {t.get('dtype')} in the op log"
        )
    shape = [int(s) for s in meta.get("shape", [])]
    if shape != list(t.get("shape", [])):
        raise InputError(
            f"{path}: {name!r}: shape {shape} in the shard, {t.get('shape')} in the op log"
        )
    begin, end = (int(x) for x in meta["data_offsets"])
    numel = 1
    for s in shape:
        numel *= s
    size = torch.empty((), dtype=dtype).element_size()
    if end - begin != numel * size or end < begin:
        raise InputError(f"{path}: {name!r}: data offsets do not fit its shape")
    if numel == 0:
        return torch.empty(shape, dtype=dtype)
    if os.path.getsize(path) < base + end:
        raise InputError(f"{path}: {name!r}: shard cut short")
    with open(path, "rb") as fh:  # mapped, copy on write: no read into fresh memory
        mapped = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_COPY)
    raw = torch.frombuffer(mapped, dtype=torch.uint8, count=end - begin, offset=base + begin)
    try:
        return raw.view(dtype).reshape(shape)
    except RuntimeError:  # data not aligned to its element size in the shard: copied
        return raw.clone().view(dtype).reshape(shape)


def _header(path: str) -> tuple[dict[str, Any], int]:
    """A shard's header and where its data section starts."""
    try:
        with open(path, "rb") as fh:
            raw = fh.read(8)
            (n,) = struct.unpack("<Q", raw) if len(raw) == 8 else (-1,)
            if n < 2 or n > 1 << 30:
                raise InputError(f"{path}: not a safetensors shard")
            header = json.loads(fh.read(n).decode("utf-8"))
    except (OSError, ValueError) as e:
        raise InputError(f"{path}: not a readable safetensors shard ({e})") from None
    if not isinstance(header, dict):
        raise InputError(f"{path}: not a safetensors shard")
    return header, 8 + n
