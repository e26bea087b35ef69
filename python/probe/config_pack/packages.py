"""Installed software and hardware: Python, OS, CPU, distributions, accelerator stack.

"The NPU run diverges" is often a different torch, torch_npu, CANN, CUDA or driver version;
these are read from the running process and the vendors' version files, never by running
tools, so collecting them is quick and cannot hang.
"""

from __future__ import annotations

import os
import platform
import sys
from collections.abc import Iterable
from typing import Any, Optional


def _read_first(paths: Iterable[str], key: Optional[str] = None) -> Optional[str]:
    """First line of the first readable file, or the value of ``key=...`` in it."""
    for p in paths:
        try:
            with open(p, encoding="utf-8", errors="replace") as f:
                text = f.read(65536)
        except OSError:
            continue
        if key is None:
            lines = text.strip().splitlines()
            return lines[0].strip() if lines else None
        for line in text.splitlines():
            k, sep, v = line.partition("=")
            if sep and k.strip().lower() == key.lower():
                return v.strip().strip('"')
    return None


def cann_version() -> Optional[str]:
    """CANN version from the Ascend toolkit's version info, when installed."""
    roots = [
        os.environ.get("ASCEND_TOOLKIT_HOME", ""),
        os.environ.get("ASCEND_HOME_PATH", ""),
        "/usr/local/Ascend/ascend-toolkit/latest",
        "/usr/local/Ascend/cann",
    ]
    files = []
    for r in roots:
        if r:
            files += [os.path.join(r, "version.cfg"), os.path.join(r, "version.info")]
            arch = platform.machine()
            files.append(os.path.join(r, f"{arch}-linux", "ascend_toolkit_install.info"))
    for key in ("version", "Version", "toolkit_installed_version"):
        v = _read_first(files, key)
        if v:
            return v
    return None


def collect_packages() -> dict[str, Any]:
    """The ``packages`` section: Python, OS, CPU, installed distributions, accelerator stack."""
    import importlib.metadata as md

    dists: dict[str, str] = {}
    for d in md.distributions():
        try:
            name = d.metadata["Name"]
        except Exception:  # noqa: BLE001
            name = None
        if name and name not in dists:
            dists[name] = d.version
    cpu_model = _read_first(["/proc/cpuinfo"], "model name") or platform.processor() or None
    acc: dict[str, Any] = {
        "torch": None,
        "torch_npu": None,
        "cann": cann_version(),
        "cuda": None,
        "cudnn": None,
        "hip": None,
        "driver": None,
        "device_name": None,
        "device_count": 0,
    }
    torch: Any = sys.modules.get("torch")
    if torch is not None:
        acc["torch"] = torch.__version__
        acc["cuda"] = getattr(torch.version, "cuda", None)
        acc["hip"] = getattr(torch.version, "hip", None)
        try:
            v = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
            acc["cudnn"] = str(v) if v is not None else None
        except Exception:  # noqa: BLE001
            pass
        try:
            if torch.cuda.is_available():
                acc["device_name"] = torch.cuda.get_device_name(0)
                acc["device_count"] = torch.cuda.device_count()
        except Exception:  # noqa: BLE001
            pass
    tnpu: Any = sys.modules.get("torch_npu")
    if tnpu is not None:
        acc["torch_npu"] = getattr(tnpu, "__version__", None)
        try:
            if torch is not None and torch.npu.is_available():
                acc["device_name"] = torch.npu.get_device_name(0)
                acc["device_count"] = torch.npu.device_count()
        except Exception:  # noqa: BLE001
            pass
    acc["driver"] = _read_first(["/usr/local/Ascend/driver/version.info"], "Version") or (
        _read_first(["/proc/driver/nvidia/version"])
    )
    return {
        "python": {
            "version": platform.python_version(),
            "implementation": platform.python_implementation(),
        },
        "os": {
            "system": platform.system(),
            "release": platform.release(),
            "machine": platform.machine(),
            "libc": "-".join(platform.libc_ver()) or None,
        },
        "cpu": {"model": cpu_model, "count": os.cpu_count()},
        "distributions": dict(sorted(dists.items(), key=lambda kv: kv[0].lower())),
        "accelerator": acc,
    }
