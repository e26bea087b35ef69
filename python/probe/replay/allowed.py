"""What a replay may call: the operators a capture could have recorded, nothing else (issue 70).

Why: an op key is a string from a dump, and a dump may come from anyone. The replay used to
turn ``Torch.<name>`` into ``torch.<name>`` and walk it attribute by attribute; ``torch.os``
is the ``os`` module, so a record ``Torch.os.system.0.forward`` whose argument was ``"touch
X"`` ran a shell command, and ``Torch.save`` wrote a file anywhere. A name is now resolved
only when it is

- an API the capture agent hooks (``probe/api_list.json``, the very list the agent reads:
  ``Torch``, ``Functional``, ``Tensor`` methods, ``VF``, ``NPU`` for torch_npu's fused ops),
  under its namespace (:data:`API_ROOTS`);
- an ATen operator, ``torch.ops.aten.<op>`` or ``torch.ops.aten.<op>.<overload>`` (msprobe's
  ``Aten`` records), that is a real ``OpOverloadPacket`` or ``OpOverload``;
- a ``torch.nn`` class the replay rebuilds (:data:`MODULES`), a subclass of ``nn.Module``;

and the walk to it goes through torch's own submodules only (``kernel.resolve``). Anything
else is :class:`NotAnOperator`, raised before anything is looked up, imported or called.
The list is data: a name added to api_list.json is hooked by the agent and replayable alike.
"""

from __future__ import annotations

import re
from typing import Any, Callable

import torch

from .._api_list import load_api_list
from . import kernel

#: ApiType -> the namespace its names hang from.
API_ROOTS = {
    "Torch": "torch",
    "Functional": "torch.nn.functional",
    "Tensor": "torch.Tensor",
    "VF": "torch._VF",
    "Aten": "torch.ops.aten",
    "NPU": "torch_npu",
}

#: The ``torch.nn`` classes replayed as modules: the recorded parameters (or none) fix every
#: constructor argument that changes their forward. Conv2d's stride or LayerNorm's eps are
#: attributes the dump does not record.
MODULES = frozenset(
    {
        "Linear",
        "Bilinear",
        "Identity",
        "ReLU",
        "ReLU6",
        "SiLU",
        "Sigmoid",
        "Tanh",
        "Mish",
        "Softsign",
        "Tanhshrink",
    }
)

#: An ATen operator's path: an op name (one leading underscore at most: ``_softmax``) and an
#: optional overload that starts with a letter (``default``, ``Tensor``, ``out``).
_ATEN = re.compile(r"^torch\.ops\.aten\.(?!__)[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z][A-Za-z0-9_]*)?$")


def _paths() -> dict[str, frozenset[str]]:
    """Per target kind, the dotted paths a replay may resolve (ATen aside)."""
    listed = load_api_list()
    functions = {
        f"{API_ROOTS[t]}.{name}"
        for t in ("Torch", "Functional", "VF", "NPU")
        for name in listed.get(t, [])
    }
    return {
        "function": frozenset(functions),
        "method": frozenset(f"torch.Tensor.{name}" for name in listed.get("Tensor", [])),
        "module": frozenset(f"torch.nn.{name}" for name in MODULES),
    }


_ALLOWED = _paths()


class NotAnOperator(ValueError):
    """A name that is no operator a replay may run (the message says which, in one line)."""


def check(kind: Any, path: Any) -> None:
    """NotAnOperator unless ``path`` is an operator of its namespace that a target of
    ``kind`` (``function``/``api``, ``method``, ``module``) may name. Looks nothing up."""
    kind = "function" if kind == "api" else kind
    ok = isinstance(path, str) and (
        path in _ALLOWED.get(str(kind), ()) or (kind == "function" and bool(_ATEN.match(path)))
    )
    if not ok:
        raise NotAnOperator(
            f"{path!s:.200} is not an operator a replay may run (only the APIs the agent records,"
            " probe/api_list.json; ATen operators; the torch.nn classes it rebuilds): nothing run"
        )


def resolve(target: dict[str, Any]) -> Callable[..., Any]:
    """The callable a spec's ``target`` names, once :func:`check` allows it and what it
    resolves to is of its kind (an ATen path an ``OpOverload``/``OpOverloadPacket``, a
    module a ``torch.nn.Module`` class). AttributeError when this torch lacks it (or it
    exists only after the prelude: a custom op or torch_npu's), ImportError when torch_npu
    is not importable."""
    kind, path = target.get("kind"), target.get("path")
    check(kind, path)
    try:
        fn = kernel.resolve(target)
    except ValueError as e:  # the walk left torch's namespaces (a prelude replaced one)
        raise NotAnOperator(f"{e}: not an operator a replay may run, nothing run") from None
    ops = (torch._ops.OpOverload, torch._ops.OpOverloadPacket)
    if str(path).startswith("torch.ops.") and not isinstance(fn, ops):
        raise NotAnOperator(f"{path} is not an ATen operator: not an operator a replay may run")
    if kind == "module" and not (isinstance(fn, type) and issubclass(fn, torch.nn.Module)):
        raise NotAnOperator(f"{path} is not a torch.nn module: not an operator a replay may run")
    return fn
