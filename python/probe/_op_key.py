"""The op-key grammar, built in one place: what ``src/op_key.rs`` parses.

Why: an op key is the one name two dumps are matched by (docs/format.md, "Op keys"), and
the Rust side reads its parts back (kind, API or module, call index, direction). The agent
built keys with f-strings at ten sites; a change at one of them (a separator, the order of
call index and direction) would only have shown as ops that no longer pair. Every key the
agent writes is built here, and ``testdata/op_keys.json`` pins this module and the Rust
parser to the same examples (``python/tests/test_op_keys.py``, ``tests/op_key_golden.rs``).

Pure string functions, without torch: ``probe.config`` builds its pattern candidates with
them on a machine without PyTorch. The grammar (msprobe's):

- API call: ``{ApiType}.{api}.{call}.{direction}`` (``Functional.gelu.3.forward``);
- module call: ``Module.{path}.{Class}.{direction}.{call}`` (``Module.fc.Linear.forward.0``);
- parameter gradients: ``Module.{path}.{Class}.parameters_grad``.

A tensor's name is its op key, a dot and its slot (``.input.0``, ``.parameters.weight``).
"""

from __future__ import annotations

from typing import NamedTuple, Optional

FORWARD = "forward"
BACKWARD = "backward"
#: The first part of every module key (msprobe's MindSpore dumps say ``Cell``).
MODULE = "Module"
PARAMETERS_GRAD = "parameters_grad"


def api_name(api_type: str, name: str) -> str:
    """An API's name as keys hold it: ``Functional`` and ``gelu`` -> ``Functional.gelu``
    (``name`` may hold dots: ``Torch.linalg.vector_norm``)."""
    return f"{api_type}.{name}"


def api_key(api: str, call: int, direction: str = FORWARD) -> str:
    """The key of call ``call`` (per step, from 0) of API ``api`` (:func:`api_name`)."""
    return f"{api}.{call}.{direction}"


def api_backward(forward_key: str) -> str:
    """The backward record's key of the API call whose forward key is ``forward_key``:
    the same call index (``Functional.gelu.3.forward`` -> ``Functional.gelu.3.backward``)."""
    return f"{forward_key[: -len(FORWARD)]}{BACKWARD}"


def module_base(path: str, cls: str) -> str:
    """What a module's keys start with: ``Module.{path}.{Class}`` (``path`` as
    ``named_modules()`` gives it: ``layers.0.attn``)."""
    return f"{MODULE}.{path}.{cls}"


def module_key(base: str, direction: str, call: int) -> str:
    """The key of call ``call`` of the module :func:`module_base` names: the direction
    before the call index, unlike an API key (``Module.fc.Linear.backward.0``)."""
    return f"{base}.{direction}.{call}"


def parameters_grad_key(base: str) -> str:
    """The key of the record holding the parameter gradients of the module ``base``."""
    return f"{base}.{PARAMETERS_GRAD}"


class ParsedKey(NamedTuple):
    """An op key read back (what ``src/op_key.rs`` parses): ``kind`` is ``api``,
    ``module`` or ``parameters_grad``; ``prefix`` the ApiType or ``Module``; ``name`` the
    API (dots kept: ``linalg.vector_norm``) or the module class; ``path`` the module path."""

    kind: str
    prefix: str
    name: str
    path: Optional[str]
    call: Optional[int]
    direction: str


def parse_key(key: str) -> Optional[ParsedKey]:
    """The parts of an op key, or None when it is not one (the replay reads keys back to
    find the API to call and a backward record's forward twin)."""
    parts = key.split(".")
    if parts[0] == MODULE:
        if len(parts) >= 3 and parts[-1] == PARAMETERS_GRAD:
            return ParsedKey(
                PARAMETERS_GRAD, MODULE, parts[-2], ".".join(parts[1:-2]), None, BACKWARD
            )
        if len(parts) >= 5 and parts[-2] in (FORWARD, BACKWARD) and parts[-1].isdigit():
            return ParsedKey(
                "module", MODULE, parts[-3], ".".join(parts[1:-3]), int(parts[-1]), parts[-2]
            )
        return None
    if len(parts) >= 4 and parts[-1] in (FORWARD, BACKWARD) and parts[-2].isdigit():
        return ParsedKey("api", parts[0], ".".join(parts[1:-2]), None, int(parts[-2]), parts[-1])
    return None


def forward_twin(key: str) -> Optional[str]:
    """The forward record's key of a backward record's key (API or module), else None."""
    p = parse_key(key)
    if p is None or p.direction != BACKWARD or p.call is None:
        return None
    if p.kind == "api":
        return api_key(api_name(p.prefix, p.name), p.call)
    return module_key(module_base(p.path or "", p.name), FORWARD, p.call)
