"""How Inductor compiles a tap: it reads the tensor as the model's own kernels stored it.

Why: an operator Inductor does not know (``probe::tap_stats``) gets its inputs in the
strides eager code would give them. Inductor stores many activations otherwise: on the CPU,
the tensors around a convolution are channels-last. So every such tap cost a transposed
copy of its tensor, written inside the kernel that computes it: on the example model
(conv, BatchNorm, ReLU) two copies of 512K elements in one kernel took 4 of the 8 ms of the
instrumented forward graph (docs/performance.md, "Third pass"). Taking the tensor in any
layout is no way out either: a tap that reads a buffer whose layout is not yet decided fixes
it, Inductor then stored the model's buffers otherwise, and the training's last bits moved.

So two changes, both inside Inductor and both only where a graph has taps:

- **Taps last** (:func:`late_taps`, a post-grad pass): each tap moves to after the last
  other user of its tensor. Inductor lowers a graph in node order, so by the time a tap is
  lowered, the operators that decide how its tensor is stored (a convolution that wants
  its input channels-last) have done so. The post-grad graph is functional, so moving a
  read changes no value, except past a write into the tensor's storage (the update of
  BatchNorm's running statistics, an input mutation): taps of a written storage, and of the
  graph's inputs, stay where they are.
- **Read as stored** (the lowering :func:`install` registers): a tap of a tensor that is already a stored buffer
  with a fixed layout reads that buffer; any other is copied in eager strides, as before.
  Nothing the model computes is stored otherwise than without the agent, and Inductor's
  float32 training stays bit-identical with capture
  (``test_compile_capture.py``: a residual LayerNorm model and a conv/BatchNorm one).
- **Called directly** (:func:`_direct_kernel`): a CPU tap is a call of the operator's CPU
  kernel written into the graph's Python code, not the operator's call, whose way through
  PyTorch's dispatcher into a Python kernel was more than half a small tap's cost.

Both are Inductor internals (``register_lowering``, ``post_grad_custom_post_pass``): where
this PyTorch lacks one, :func:`install` says so in the debug log and taps keep PyTorch's
default (eager strides, copied where needed). Post passes the user set are kept and run
first (on a PyTorch that takes one post pass only, a user's pass leaves taps the default).
"""

from __future__ import annotations

import hashlib
import logging
import threading
from pathlib import Path
from typing import Any, Optional

import torch

from .._version import __version__
from .tap_ops import _TAP_OP, grad_tap, tap

log = logging.getLogger("probe")


def _version() -> str:
    """What Inductor's and AOTAutograd's caches key the taps by: a hash of the code that
    says how a tap is traced and lowered (this module and ``tap_ops.py``), so a cached
    graph is never one an older agent compiled."""
    h = hashlib.sha256()
    for name in ("tap_lowering.py", "tap_ops.py"):
        try:
            h.update(Path(__file__).with_name(name).read_bytes())
        except OSError:  # (a zipped install: the agent's version stands for its code)
            h.update(name.encode())
    return f"probe-{__version__}-taps-{h.hexdigest()[:16]}"


#: How the taps lowered in this process read their tensors: ``stored`` (the buffer as the
#: model's kernels stored it) or ``copied`` (in eager strides); ``direct``: of them, those
#: lowered as a direct call of the CPU kernel (:func:`_direct_kernel`). Counts for the
#: tests, never read on the hot path.
READS: dict[str, int] = {"stored": 0, "copied": 0, "direct": 0}

_lock = threading.Lock()
_installed: Optional[bool] = None


def late_taps(graph: torch.fx.Graph) -> int:
    """Move each tap of ``graph`` to after the last other user of its tensor (and before
    the first user of its row); returns how many moved. Taps of graph inputs and of
    storages some node writes into stay (module docstring)."""
    taps = list(graph.find_nodes(op="call_function", target=_TAP_OP))
    if not taps or graph.owning_module is None:
        return 0
    from torch._inductor.fx_utils import get_mutated_storages, get_node_storage

    pos = {n: i for i, n in enumerate(graph.nodes)}
    written = get_mutated_storages(graph.owning_module)
    tapset = set(taps)
    moved = 0
    for t in taps:
        x = t.args[0]
        if not isinstance(x, torch.fx.Node) or x.op == "placeholder":
            continue
        storage = get_node_storage(x)
        if storage is None or storage in written:
            continue
        users = [u for u in x.users if u not in tapset]
        if not users:
            continue
        last = max(users, key=pos.__getitem__)
        if pos[last] < pos[t]:
            continue
        first = min(t.users, key=pos.__getitem__, default=None)
        if first is not None and pos[first] <= pos[last]:
            first.prepend(t)  # (its row is needed before then: as late as it can be)
        else:
            last.append(t)
        moved += 1
    return moved


def _cacheable(config: Any, version: str) -> None:
    """Let AOTAutograd's cache keep instrumented graphs: it skips any graph that calls a
    function it does not know, such as :func:`~.tap_ops.tap` and
    :func:`~.tap_ops.grad_tap`, and then every run of a job traced each instrumented graph
    anew (tens of seconds for a small transformer on a CPU). Keyed by ``version``; on a
    PyTorch without the setting, such graphs are traced in each process as before."""
    marked = getattr(config, "unsafe_marked_cacheable_functions", None)
    if not isinstance(marked, dict):
        return
    names = {f"{f.__module__}.{f.__name__}": version for f in (tap, grad_tap)}
    config.unsafe_marked_cacheable_functions = {**marked, **names}


#: The name a compiled graph's Python code calls a CPU tap's kernel by
#: (:func:`_direct_kernel`), and the import that defines it there.
DIRECT_NAME = "probe_tap_stats"
_DIRECT_IMPORT = f"from probe.capture.tap_ops import run_row as {DIRECT_NAME}"


def _direct_kernel(ir: Any, V: Any) -> Optional[Any]:
    """Inductor's node for a tap of a CPU tensor: a call of the operator's CPU kernel
    (``tap_ops.run_row``) written straight into the graph's Python code, without the
    operator's dispatch (its way into a Python kernel: ~5 us of a tap's ~9 us) or the
    metadata and alignment checks Inductor writes after an operator's result (~0.6 us:
    the kernel makes the row, whose shape and dtype are fixed). With Inductor's C++
    wrapper the node is the operator's call, as before; None where this Inductor has no
    such node to derive from."""
    base = getattr(ir, "FallbackKernel", None)
    if base is None or not hasattr(base, "codegen_args"):
        return None

    class DirectTap(base):  # type: ignore[misc, valid-type]
        def codegen(self, wrapper: Any) -> None:
            add_import = getattr(wrapper, "add_import_once", None)
            if V.graph.cpp_wrapper or add_import is None:
                super().codegen(wrapper)
                return
            comment = getattr(self, "codegen_comment", None)
            if comment is not None:
                comment(wrapper)
            add_import(_DIRECT_IMPORT)
            args = ", ".join([*self.codegen_args(), *self.codegen_kwargs()])
            wrapper.writeline(f"{self.get_name()} = {DIRECT_NAME}({args})")

    return DirectTap


def install() -> bool:
    """Register the tap's lowering and the post-grad pass, once per process; False where
    this PyTorch lacks the internals (then taps keep PyTorch's default)."""
    global _installed
    if _installed is not None:
        return _installed
    with _lock:
        if _installed is None:
            try:
                _installed = _install()
            except Exception as exc:  # noqa: BLE001 - Inductor's internals moved: the default
                log.debug("probe: taps keep Inductor's default layout (%r)", exc)
                _installed = False
    return _installed


def _install() -> bool:
    from torch._inductor import config, ir

    version = _version()
    _cacheable(config, version)
    if _TAP_OP is None:
        return False
    from torch._inductor.custom_graph_pass import CustomGraphPass
    from torch._inductor.fx_utils import (  # noqa: F401 - late_taps needs them
        get_mutated_storages,
        get_node_storage,
    )
    from torch._inductor.lowering import (
        constrain_to_fx_strides,
        fallback_handler,
        lowerings,
        register_lowering,
    )
    from torch._inductor.virtualized import V

    if _TAP_OP in lowerings:
        return True  # (this module loaded again: the process's lowering stands)
    fallback = fallback_handler(_TAP_OP, add_to_fallback_set=False)  # type: ignore[no-untyped-call]
    direct = _direct_kernel(ir, V)

    def _lower(x: Any, cols: int) -> Any:
        """The tap's kernel call: on the buffer as stored where it has a fixed layout,
        else on a copy in eager strides (what Inductor does for an operator it does not
        know); a CPU tensor's as a direct call of the kernel (:func:`_direct_kernel`)."""
        if ir.is_storage_and_layout(x) and isinstance(x.get_layout(), ir.FixedLayout):
            READS["stored"] += 1
        else:
            (x, _), _ = constrain_to_fx_strides(V.graph.current_node, x, cols)  # type: ignore[no-untyped-call]
            READS["copied"] += 1
        device = x.get_device()
        if direct is not None and device is not None and device.type == "cpu":
            READS["direct"] += 1
            return direct.create(_TAP_OP, x, cols).wrap_for_lowering()
        return fallback(x, cols)

    class _Late(CustomGraphPass):
        """:func:`late_taps` as Inductor's post-grad pass."""

        def __call__(self, graph: torch.fx.Graph) -> None:
            try:
                late_taps(graph)
            except Exception as exc:  # noqa: BLE001 - never in the compiler's way
                log.debug("probe: taps left in place in a graph (%r)", exc)

        def uuid(self) -> Any:
            return version

    # The user's own post passes run first. Before PyTorch took a list of them, one that
    # is set is left alone, and taps keep the default.
    set_ = config.post_grad_custom_post_pass
    theirs = list(set_) if isinstance(set_, (list, tuple)) else [] if set_ is None else [set_]
    try:
        from torch._inductor.custom_graph_pass import get_custom_graph_passes  # noqa: F401
    except ImportError:
        if theirs:
            return False
    passes: list[Any] = [*theirs, _Late()]
    register_lowering(_TAP_OP, type_promotion_kind=None)(_lower)
    config.post_grad_custom_post_pass = passes if len(passes) > 1 else passes[0]
    return True
