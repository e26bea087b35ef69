"""Finding the ``probe`` command that was installed with this package.

The wheel puts the Rust binary in the environment's scripts folder (``bin/`` of a virtualenv,
``~/.local/bin`` for ``pip install --user``), next to nothing else we control; ``PATH`` may
not include it (``python -m probe`` from a venv that was never activated) or may hold another
program called ``probe``. So ``$PROBE_BIN`` (an explicit choice, e.g. a cargo build of a
checkout) comes first, then the scripts folders of this interpreter, then ``PATH``.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path
from typing import Optional

_EXE = "probe.exe" if os.name == "nt" else "probe"


class BinaryNotFound(FileNotFoundError):
    """No ``probe`` command next to this package, in ``$PROBE_BIN`` or on ``PATH``."""


def _scripts_dirs() -> list[Path]:
    dirs = [Path(sysconfig.get_path("scripts"))]
    user = f"{os.name}_user"  # pip install --user
    if user in sysconfig.get_scheme_names():
        dirs.append(Path(sysconfig.get_path("scripts", user)))
    dirs.append(Path(sys.executable).parent)
    return dirs


def binary() -> str:
    """The path of the ``probe`` command shipped with this package.

    ``$PROBE_BIN`` wins when set (a cargo build of a checkout). Raises
    :class:`BinaryNotFound` with what was searched when there is none.
    """
    override = os.environ.get("PROBE_BIN")
    if override:
        if os.path.isfile(override) and os.access(override, os.X_OK):
            return override
        raise BinaryNotFound(f"PROBE_BIN={override} is not an executable file")
    searched = []
    for folder in _scripts_dirs():
        candidate = folder / _EXE
        searched.append(str(folder))
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return str(candidate)
    found = shutil.which(_EXE)
    if found:
        return found
    raise BinaryNotFound(
        "the probe command is not installed next to this package (searched "
        + ", ".join(dict.fromkeys(searched))
        + " and PATH): install the wheel (pip install probe-dl, or pip install . in a checkout)"
        " or set PROBE_BIN"
    )


def main(argv: Optional[list[str]] = None) -> int:
    """``python -m probe ARGS``: run the shipped command with ARGS, return its exit code."""
    args = sys.argv[1:] if argv is None else argv
    try:
        exe = binary()
    except BinaryNotFound as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if os.name == "posix" and argv is None:
        # Replace this interpreter: signals, the terminal (progress bars) and the exit
        # code go straight to the user, as if they had typed `probe`.
        os.execv(exe, [exe, *args])
    return subprocess.call([exe, *args])
