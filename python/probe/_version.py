"""The agent's version, defined once.

``probe.__version__``, the ``producer`` of every dump manifest and the package metadata
(pyproject's dynamic version) all read it, so a release bumps one line. The Rust crate keeps
its own version in Cargo.toml.
"""

from __future__ import annotations

__version__ = "0.1.0"
