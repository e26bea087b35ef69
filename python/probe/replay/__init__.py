"""Replaying one recorded operator call to prove the culprit (issue 50; docs/replay.md).

``python -m probe.replay --bench B --cmp C --op KEY -o DIR`` (or ``probe replay``) loads the
op's recorded inputs from the benchmark dump, re-executes the same API on this machine's
device in the comparison run's dtypes and in float64 on the CPU, and says whether this
device's kernel reproduces the divergence in isolation; each replayed op gets a standalone
repro folder that needs only torch. Nothing here is imported by ``import probe``.

Layers (import-linter, pyproject.toml): cli > engine > plan > spec, dump > kernel; report,
folder and verdict judge and write what the engine returns.
"""
