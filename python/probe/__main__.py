"""``python -m probe compare -b A -c B``: the same as the ``probe`` command."""

from __future__ import annotations

import sys

from ._cli import main

if __name__ == "__main__":
    sys.exit(main())
