"""``torch.compile`` (and TorchScript): what the agent does around compiled code.

Why: the operators inside a compiled graph are not Python calls of the hooked APIs, so no
hook sees them; only eager code is captured (as with msprobe). What the agent must still
guarantee is that compiling keeps working and says so:

- While TorchDynamo traces a function it runs the agent's wrappers and hooks on fake
  tensors. They must step aside before reading any state of the agent: a wrapper that
  captured there failed on the fake tensors and switched capture off mid-trace, removing the
  module hooks under Dynamo, which then crashed the training step; and a flag read there
  became a guard, so that every ``start()`` and ``stop()`` recompiled the model, until
  Dynamo's recompile limit (8) left it uncompiled for the rest of the run. So every entry
  point tests :func:`compiling` first; the model is then traced twice at most (with the
  agent's hooks and without). Dynamo also guards on the ids of ``always_call`` forward
  hooks, which are new at every ``start()``: a model it traces (:func:`traced`) gets plain
  ones (``modules.py``).
- Compiling a graph (AOT autograd, Inductor) also calls the hooked APIs from Python, on fake
  tensors, outside Dynamo's trace: a captured step whose first call compiled switched
  capture off that way. Its code also calls them on real tensors (constant folding, the
  runtime wrappers of a compiled graph), which are not the model's calls. Neither is
  captured (:func:`compiler_call`).
- The module paths of a compiled model are those of the model it wraps (``block.fc1``,
  not ``_orig_mod.block.fc1``), so that they match an eager run's (:func:`module_tree`).
- A TorchScript submodule is compiled code too: its operators are not seen, and it refuses
  the module hooks (registering them raised, and capture was off from the first
  ``start()``). It is left unhooked (:func:`module_tree`).
- The user is told once that compiled code ran while capturing (:func:`graph_count`,
  :func:`in_model`), since its operators are missing from the dump.
- Scripting or tracing while capturing (``torch.jit.script``, ``torch.jit.trace``,
  ``torch.fx`` symbolic tracing) must see PyTorch's own functions: scripting a function
  that calls ``torch.relu`` found the agent's wrapper and raised, a ``jit.trace`` made shape
  values tensors and a record unwritable (capture switched off), and FX tracing wrote
  records of proxies, which compute nothing. They run with the wrappers removed
  (:func:`tracer_patches`); what they produce is compiled code, not captured when it runs.
"""

from __future__ import annotations

import os
import sys
import weakref
from dataclasses import dataclass
from typing import Any, Callable

import torch

_is_compiling: Any = getattr(getattr(torch, "compiler", None), "is_compiling", None)
if _is_compiling is None:  # PyTorch before 2.3
    _is_compiling = getattr(torch._utils, "is_compiling", None)

#: Whether TorchDynamo is tracing the caller now: True only inside a trace, where Dynamo
#: evaluates it as a constant, so the code after it is never traced.
compiling: Callable[[], bool] = _is_compiling if _is_compiling is not None else lambda: False

_get_mode: Any = getattr(torch._C, "_get_dispatch_mode", None)
_FAKE: Any = getattr(getattr(torch._C, "_TorchDispatchModeKey", None), "FAKE", None)
_FakeTensor: Any
try:
    from torch._subclasses.fake_tensor import FakeTensor as _FakeTensor
except Exception:  # noqa: BLE001 - a PyTorch without it has no compiler to step aside for
    _FakeTensor = None


#: Where ``torch.compile``'s own Python code lives: its compilers, the meta functions and
#: Python references they trace with, and the runtime wrappers of compiled graphs (AOT
#: autograd's ``detach`` of each output at every call). Packages end with a separator.
_TORCH = os.path.dirname(torch.__file__)
_COMPILER_CODE = (
    *(
        os.path.join(_TORCH, p) + os.sep
        for p in (
            "_dynamo",
            "_functorch",
            "_inductor",
            "_subclasses",
            "_export",
            "_higher_order_ops",
            "_refs",
            "_prims",
            "_prims_common",
            "_decomp",
        )
    ),
    os.path.join(_TORCH, "_meta_registrations.py"),
)
#: The module names Inductor gives the Python code it generates (a compiled graph's
#: ``call``, loaded from its cache folder, wherever that is; ``codecache`` before 2.4). A
#: PyTorch function that code calls is the compiled graph's call, not the model's:
#: ``extern_kernels.mm`` is ``torch.mm`` as it was when Inductor was imported, the agent's
#: wrapper if that was during a capture.
_GENERATED = ("torch._inductor.runtime.compile_tasks.", "torch._inductor.codecache.")


def in_fake_mode() -> bool:
    """Whether a fake mode is active: the compiler traces on fake tensors, whose storages
    have no memory (reading their address is an error in newer PyTorch)."""
    return _get_mode is not None and _FAKE is not None and _get_mode(_FAKE) is not None


def compiler_memory(storage: Any = None) -> bool:
    """Whether a write to, or an allocation of, tensor memory is the compiler's, not the
    model's: while Dynamo traces, or under a fake mode (AOT autograd and Inductor lower on
    fake tensors), or on a ``meta`` storage (a fake tensor's: no memory behind it, and
    reading its address is an error in newer PyTorch). The agent's memory wrappers
    (``patcher.py``) track only the model's memory."""
    if compiling() or in_fake_mode():
        return True
    return storage is not None and storage.device.type == "meta"


def compiler_call(args: tuple[Any, ...]) -> bool:
    """Whether a call of a hooked API, with positional arguments ``args``, is made by
    ``torch.compile``, not by the model: AOT autograd and Inductor lower a graph by running
    PyTorch's Python API on fake tensors (also lazily, at the first backward), under a fake
    mode or on fake tensors directly; and, once Dynamo is imported (``import torch`` does
    not), the caller is its code, with real tensors (constant folding while compiling, the
    runtime wrappers of a compiled graph), or the code Inductor generated. Called from the
    wrapper's handler (``patcher._Dispatch``): the wrapper's caller is three frames up."""
    if args and _FakeTensor is not None and type(args[0]) is _FakeTensor:
        return True
    if in_fake_mode():
        return True
    if "torch._dynamo" not in sys.modules:
        return False
    try:
        caller = sys._getframe(3)
    except ValueError:  # called from native code with no Python caller
        return False
    if caller.f_code.co_filename.startswith(_COMPILER_CODE):
        return True
    name = caller.f_globals.get("__name__")
    return isinstance(name, str) and name.startswith(_GENERATED)


#: The attribute of a wrapper made by ``torch.compile(module)`` holding the module itself.
_ORIG = "_orig_mod"


def _wrapped(mod: torch.nn.Module) -> bool:
    """Whether ``mod`` is what ``torch.compile(module)`` returns (an ``OptimizedModule``)."""
    return isinstance(getattr(mod, _ORIG, None), torch.nn.Module) and type(mod).__name__ == (
        "OptimizedModule"
    )


def unwrap(model: torch.nn.Module) -> torch.nn.Module:
    """The module a ``torch.compile`` wrapper holds, or ``model`` itself."""
    while _wrapped(model):
        model = getattr(model, _ORIG)
    return model


def _scripted(mod: torch.nn.Module) -> bool:
    """Whether ``mod`` is a TorchScript module: its code runs in TorchScript's interpreter,
    where no wrapper sees it, and it refuses Python hooks."""
    return isinstance(mod, torch.jit.ScriptModule)


def module_tree(model: torch.nn.Module) -> list[tuple[str, torch.nn.Module]]:
    """``model.named_modules()`` as the agent hooks them: without ``torch.compile``
    wrappers, each compiled submodule under the path an eager run gives it, once (the
    wrapper calls the module it holds, whose hooks see the call); and without TorchScript
    modules and what they hold (registering a hook on one raises)."""
    return survey(model).tree


def in_model(model: torch.nn.Module) -> bool:
    """Whether ``model`` (or a submodule) was compiled: wrapped by ``torch.compile``,
    compiled in place (``module.compile()``) or scripted (TorchScript)."""
    if _wrapped(model):
        return True
    return any(
        _wrapped(m) or _scripted(m) or getattr(m, "_compiled_call_impl", None) is not None
        for m in model.modules()
    )


#: The modules whose code Dynamo compiled a graph of while the agent was installed
#: (``graphs.py`` adds them; held weakly: an id could be a later module's).
TRACED_ROOTS: weakref.WeakSet[torch.nn.Module] = weakref.WeakSet()


def traced(model: torch.nn.Module) -> bool:
    """Whether Dynamo traces ``model``'s module calls: it (or a submodule) was compiled
    (:func:`in_model`), or Dynamo compiled a graph of its code or a submodule's (a
    ``torch.compile`` wrapper the agent was not given)."""
    return in_model(model) or any(m in TRACED_ROOTS for m in model.modules())


@dataclass(frozen=True)
class Survey:
    """What ``start()`` needs to know of a model, from one walk of its modules
    (:func:`survey`): four walks (:func:`module_tree`, :func:`in_model`, one for a
    TorchScript module, :func:`traced`) were ~0.2 ms of a captured step of the example
    model, and grow with the model."""

    #: :func:`module_tree` of the model.
    tree: list[tuple[str, torch.nn.Module]]
    #: :func:`in_model` of the model as given (a ``torch.compile`` wrapper is compiled).
    compiled: bool
    #: Whether the model holds a TorchScript module: compiled code whose operators the
    #: agent does not see.
    scripted: bool
    #: :func:`traced` of the module the wrapper holds.
    traced: bool


def survey(model: torch.nn.Module) -> Survey:
    """:class:`Survey` of ``model`` (the ``torch.compile`` wrapper or the module it holds):
    the answers of the four walks, in one."""
    inner = unwrap(model)
    tree: list[tuple[str, torch.nn.Module]] = []
    compiled = scripted = seen = False
    hidden: tuple[str, ...] = ()  # (the paths under a TorchScript module: left unhooked)
    for path, mod in inner.named_modules():
        if _scripted(mod):
            compiled = scripted = True
        elif _wrapped(mod) or getattr(mod, "_compiled_call_impl", None) is not None:
            compiled = True
        seen = seen or mod in TRACED_ROOTS
        if _wrapped(mod) or (hidden and (path + ".").startswith(hidden)):
            continue
        if _scripted(mod):
            hidden += (path + ".",)
            continue
        if _ORIG in path:
            path = ".".join(p for p in path.split(".") if p != _ORIG)
        tree.append((path, mod))
    return Survey(tree, compiled or _wrapped(model), scripted, compiled or seen)


def graph_count() -> int:
    """Graphs Dynamo compiled in this process so far; 0 when it was never imported (or its
    counters moved: this reads PyTorch internals, and only to warn)."""
    if "torch._dynamo" not in sys.modules:
        return 0
    try:
        from torch._dynamo.utils import counters

        return int(counters["stats"]["unique_graphs"])
    except Exception:  # noqa: BLE001 - a warning's input, never a failure
        return 0


#: The entry points of scripting and tracing: (module, class or None, attribute).
_TRACERS = (
    ("torch.jit", None, "script"),
    ("torch.jit._script", None, "script"),
    ("torch.jit", None, "trace"),
    ("torch.jit._trace", None, "trace"),
    ("torch.jit", None, "trace_module"),
    ("torch.jit._trace", None, "trace_module"),
    ("torch.fx", None, "symbolic_trace"),
    ("torch.fx._symbolic_trace", None, "symbolic_trace"),
    ("torch.fx", "Tracer", "trace"),
)


def tracer_patches(
    unhooked: Callable[[Callable[..., Any]], Callable[..., Any]],
) -> list[tuple[Any, str, Any]]:
    """``(owner, name, new)``: each entry point of scripting and tracing replaced by
    ``unhooked(orig)``, which runs it with the API wrappers removed; installed with them.
    One replacement for each function, wherever it is reachable from."""
    import importlib

    made: dict[int, Any] = {}
    out: list[tuple[Any, str, Any]] = []
    for mod, cls, name in _TRACERS:
        try:
            owner: Any = importlib.import_module(mod)
        except Exception:  # noqa: BLE001 - a PyTorch without it
            continue
        if cls is not None:
            owner = getattr(owner, cls, None)
        orig = getattr(owner, name, None)
        if not callable(orig):
            continue
        if id(orig) not in made:
            made[id(orig)] = unhooked(orig)
        out.append((owner, name, made[id(orig)]))
    return out
