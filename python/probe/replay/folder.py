"""The standalone repro folder of one replayed op: ``inputs.safetensors``, ``repro.py``,
``README.md``.

Why it is built from kernel.py's own source: the script must run on a machine that never
saw probe (only torch, and torch_npu for NPU ops), and it must do exactly what the replay
did. So ``repro.py`` is the call's spec written as a Python literal, followed by
kernel.py verbatim (which imports only the standard library and torch), followed by a call
of its ``main``. Inputs are written in the benchmark's recorded dtypes; the script casts
them to the comparison side's, as the replay did.
"""

from __future__ import annotations

import json
import os
import pprint
import re
import struct
from typing import Any

import torch

from . import kernel
from .kernel import CODES

_SAFE = re.compile(r"[^A-Za-z0-9._-]")


def folder_name(key: str, taken: set[str]) -> str:
    """A file name for an op key: characters other than letters, digits, ``._-`` become
    ``_``, at most 120 of them, never hidden, unique among ``taken``."""
    base = _SAFE.sub("_", key)[:120].lstrip(".") or "op"
    name, n = base, 2
    while name in taken:
        name, n = f"{base}-{n}", n + 1
    taken.add(name)
    return name


def write_safetensors(path: str, tensors: dict[str, torch.Tensor]) -> None:
    """``tensors`` as one safetensors file, keys sorted and data in that order (the same
    tensors always give the same bytes)."""
    codes = {d: c for c, d in CODES.items()}
    header: dict[str, Any] = {}
    blobs: list[bytes] = []
    offset = 0
    for name in sorted(tensors):
        t = tensors[name].detach().to("cpu").contiguous()
        blob = t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b""
        header[name] = {
            "dtype": codes[t.dtype],
            "shape": list(t.shape),
            "data_offsets": [offset, offset + len(blob)],
        }
        blobs.append(blob)
        offset += len(blob)
    text = json.dumps(header, separators=(",", ":"), sort_keys=True).encode("utf-8")
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as fh:
        fh.write(struct.pack("<Q", len(text)))
        fh.write(text)
        for blob in blobs:
            fh.write(blob)


def script(spec: dict[str, Any]) -> str:
    """The text of ``repro.py`` for ``spec``."""
    with open(kernel.__file__, encoding="utf-8") as fh:
        source = fh.read()
    body = source.split("from __future__ import annotations\n", 1)[1]
    head = (
        '#!/usr/bin/env python3\n"""Replays one recorded operator call on its recorded inputs,'
        " standalone (written by probe replay).\n\n"
        "Needs only PyTorch (and torch_npu for an NPU op). Usage:\n\n"
        "    python repro.py [--device cpu|cuda|npu] [--prelude FILE.py]\n\n"
        "It computes the call in float64 on the CPU (the reference), then runs FILE.py (to"
        " import torch_npu\nor install a patched kernel), then the call on --device in the"
        " dtypes of SPEC['dtypes'], and\nexits 1 when an output is further from the"
        " reference than SPEC['tolerance'] allows (0: within\ntolerance; 2: it cannot run)."
        ' See README.md beside it.\n"""\n\nfrom __future__ import annotations\n'
    )
    spec_text = "SPEC = " + pprint.pformat(spec, width=96, sort_dicts=True) + "\n"
    tail = '\n\nif __name__ == "__main__":\n    sys.exit(main(SPEC))\n'
    return (
        head
        + body.rstrip("\n")
        + "\n\n\n#: The recorded call (op key, arguments, dtypes, tolerance).\n"
        + spec_text
        + tail
    )


def call_text(spec: dict[str, Any]) -> str:
    """The call as one readable line: ``torch.nn.functional.gelu(input.0, approximate='none')``."""
    args = [_arg(a) for a in spec["args"]]
    args += [f"{k}={_arg(v)}" for k, v in spec["kwargs"].items()]
    return f"{spec['target']['path']}({', '.join(args)})"


def _arg(v: Any) -> str:
    if isinstance(v, list):
        return "[" + ", ".join(_arg(x) for x in v) + "]"
    if isinstance(v, dict):
        if "tensor" in v:
            return str(v["tensor"])
        if "dtype" in v:
            return f"torch.{v['dtype']}"
        if "device" in v:
            return "device"
        if "float" in v:
            return f"float({v['float']!r})"
        return "{" + ", ".join(f"{k!r}: {_arg(x)}" for k, x in v["dict"].items()) + "}"
    return repr(v)


def write(path: str, spec: dict[str, Any], tensors: dict[str, torch.Tensor], readme: str) -> None:
    """Write the folder ``path`` (created)."""
    os.makedirs(path)
    write_safetensors(os.path.join(path, "inputs.safetensors"), tensors)
    with open(os.path.join(path, "repro.py"), "w", encoding="utf-8") as fh:
        fh.write(script(spec))
    with open(os.path.join(path, "README.md"), "w", encoding="utf-8") as fh:
        fh.write(readme)
