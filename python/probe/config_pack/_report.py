"""How a config pack reports its first failure: a log warning and one line on stderr.

The pack is usually set up once at the top of a training script and never looked at again,
so its failures are also printed where the user will see them.
"""

from __future__ import annotations

import logging
import sys

log = logging.getLogger("probe.config_pack")


def report_failure(exc: BaseException, what: str) -> None:
    log.warning("probe: config pack: %s failed: %s (further errors not shown)", what, exc)
    print(f"probe: config pack: {what} failed: {exc!r}", file=sys.stderr)
