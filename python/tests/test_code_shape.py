"""The shape of the agent's code (issue 46): small files and functions, and hook modules
that use what the capture hands them, not another object's private state.

Why a test: ``api.py`` had grown to 1,085 lines and ``debugger.py`` to 813, and the hook
modules reached into the Debugger's private attributes at over a hundred sites; nothing
stopped either from coming back. Import structure (no circles, layers) is checked by
``lint-imports`` (pyproject.toml, scripts/test.sh)."""

from __future__ import annotations

import ast
import functools
import os
from collections.abc import Iterator

import pytest

from conftest import REPO

PACKAGE = os.path.join(REPO, "python", "probe")
MAX_FILE_LINES = 900
MAX_FUNCTION_LINES = 150

#: Files or functions (``path/of/file.py::function``) allowed past a limit, each with why it
#: cannot be split. Empty: every file and function of the agent fits today.
EXCEPTIONS: dict[str, str] = {}

#: The modules that run as hooks inside the training process (PyTorch and the backends call
#: into them) and the recorder they record through: each gets the narrow context of the
#: capture (capture/context.py) and touches no other object's private attributes.
HOOK_MODULES = (
    "api.py",
    "backward.py",
    "ddp.py",
    "iterations.py",
    "modules.py",
    "patcher.py",
    "recorder.py",
    "waits.py",
)


def _sources() -> Iterator[tuple[str, str]]:
    for folder, _, files in os.walk(PACKAGE):
        for name in sorted(files):
            if name.endswith(".py"):
                path = os.path.join(folder, name)
                yield os.path.relpath(path, PACKAGE), path


def _functions(tree: ast.AST) -> Iterator[ast.FunctionDef | ast.AsyncFunctionDef]:
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield node


def test_no_file_or_function_of_the_agent_is_too_long() -> None:
    too_long = []
    for rel, path in _sources():
        with open(path, encoding="utf-8") as fh:
            text = fh.read()
        lines = len(text.splitlines())
        if lines > MAX_FILE_LINES and rel not in EXCEPTIONS:
            too_long.append(f"{rel}: {lines} lines (at most {MAX_FILE_LINES})")
        for fn in _functions(ast.parse(text)):
            span = (fn.end_lineno or fn.lineno) - fn.lineno + 1
            name = f"{rel}::{fn.name}"
            if span > MAX_FUNCTION_LINES and name not in EXCEPTIONS:
                too_long.append(f"{name}: {span} lines (at most {MAX_FUNCTION_LINES})")
    assert not too_long, "split these along their seams, or list them with a reason:\n" + (
        "\n".join(too_long)
    )


def test_every_exception_is_still_needed() -> None:
    """An exception outlives its reason once the file or function is split: drop it then."""
    sizes: dict[str, int] = {}
    for rel, path in _sources():
        with open(path, encoding="utf-8") as fh:
            text = fh.read()
        sizes[rel] = len(text.splitlines())
        for fn in _functions(ast.parse(text)):
            sizes[f"{rel}::{fn.name}"] = (fn.end_lineno or fn.lineno) - fn.lineno + 1
    for name, reason in EXCEPTIONS.items():
        assert reason, name
        limit = MAX_FUNCTION_LINES if "::" in name else MAX_FILE_LINES
        assert sizes.get(name, 0) > limit, f"{name} fits now: remove its exception"


@functools.cache
def _private_names() -> frozenset[str]:
    """The private names the agent defines: ``self._x`` attributes, ``_x`` methods and
    module-level ``_x`` names of every module of the package."""
    names: set[str] = set()
    for _, path in _sources():
        with open(path, encoding="utf-8") as fh:
            tree = ast.parse(fh.read())
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.add(node.name)
            elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
                names.add(node.attr)
            elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                names.add(node.id)
    return frozenset(n for n in names if n.startswith("_") and not n.startswith("__"))


def _private_uses(source: str) -> list[str]:
    """Where ``source`` uses another object's private state: ``obj._x`` where ``obj`` is not
    ``self``/``cls`` and ``_x`` is a private name the agent defines, or ``from .other import
    _x`` (torch's own private names, ``torch._C``, are not the agent's business here)."""
    private = _private_names()
    found = []
    for node in ast.walk(ast.parse(source)):
        if (
            isinstance(node, ast.Attribute)
            and node.attr in private
            and not (isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"))
        ):
            found.append(f"line {node.lineno}: .{node.attr}")
        elif isinstance(node, ast.ImportFrom) and node.level > 0:
            found += [
                f"line {node.lineno}: import {a.name}"
                for a in node.names
                if a.name.startswith("_") and not a.name.startswith("__")
            ]
    return found


@pytest.mark.parametrize("module", HOOK_MODULES)
def test_a_hook_module_touches_no_private_state_of_another_object(module: str) -> None:
    """A hook uses the context it was given (capture/context.py), not what lies behind it."""
    with open(os.path.join(PACKAGE, "capture", module), encoding="utf-8") as fh:
        found = _private_uses(fh.read())
    assert not found, f"{module} uses another object's private state: " + ", ".join(found)


def test_the_private_state_check_sees_a_violation() -> None:
    """What the hooks did before (6685c6b: ``dbg._guard.fail``, ``from .api import _after``)
    is found; a method's own state, and torch's private names, are not."""
    hook = (
        "from .api import _after, tls\n"
        "def hook(self, dbg, t):\n"
        "    dbg._guard.fail(None, '')\n"
        "    self._flow.find(t)\n"
        "    return torch._C._get_tracing_state(), dbg.config\n"
    )
    assert _private_uses(hook) == ["line 1: import _after", "line 3: ._guard"]
