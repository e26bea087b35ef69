"""Capture inside ``torch.compile`` graphs: the graphs' API calls recorded on captured steps.

Why: compiled training is the default in current stacks, and the compiled run is often the
one that diverges; a dump that lacks every operator inside the graphs cannot name one. So
once a Debugger exists, every graph Dynamo compiles is also instrumented
(``graph_taps.instrument``: the same graph, whose last output is the statistics of the
tensors its API calls read and produce), and Dynamo gets a :class:`CompiledGraph` in place of
the backend's compiled function:

- Outside a captured step it runs the backend's compiled graph, untouched: one test per
  call of the graph.
- On a captured step it runs the instrumented copy, compiled by the same backend at its
  first captured call (with fake example inputs: no memory), and writes one record per API
  call of the graph (:meth:`GraphCapture.record`), numbered in the step's call counters as
  the eager calls around it are, with the module path and source line Dynamo traced and the
  graph's id. Statistics stay on the device and travel with the rest of the step's
  (``buffer.py``); on CPU they are read in one call per run of the graph.
- Its backward records come once the graph's backward ran: the gradient of the sink
  argument passed to the instrumented copy holds the statistics of every gradient its taps
  saw (:meth:`GraphCapture._grads`).
- Nothing the compiled code computes depends on the agent's state (no guard reads it): no
  ``start()`` or ``stop()`` recompiles the model.

A graph with symbolic shapes is instrumented for the sizes of each captured call
(:class:`_Dynamic`). A graph that cannot be instrumented or whose instrumented copy does not
compile runs as compiled, and a captured step that ran it is told: its operators are
missing, and the manifest says so (``compiled``, docs/format.md).
"""

from __future__ import annotations

import copy
import functools
import logging
import os
import sys
import threading
from typing import TYPE_CHECKING, Any, Callable, Optional

import torch

from .._api_list import load_api_list
from .._op_key import api_backward, api_key
from . import stats as _stats
from . import tap_lowering
from .compiled import TRACED_ROOTS, compiling
from .graph_taps import NO_CALLS, SYMBOLIC, Call, Names, Plan, instrument
from .patcher import _owners
from .stats import finish_stats, null_stats
from .tap_ops import COLUMNS, GRAD_COLUMNS
from .threadstate import tls

if TYPE_CHECKING:
    from .context import HookContext

log = logging.getLogger("probe")

_TORCH_DIR = os.path.dirname(os.path.abspath(torch.__file__))
_PKG_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

_lock = threading.Lock()
_hooked = False
_next_id = 0


class _Active:
    """The Debugger whose step is captured now (set by ``start()``, cleared by ``stop()``)."""

    current: Optional[GraphCapture] = None


ACTIVE = _Active()


def _spec(x: Any) -> Any:
    """What a compile needs of an example input: a tensor's size, stride, dtype, device,
    whether it requires grad and is a parameter; anything else as it is."""
    if isinstance(x, torch.Tensor):
        return (x.shape, x.stride(), x.dtype, x.device, x.requires_grad, type(x))
    return x


def _fakes(specs: list[Any]) -> list[Any]:
    """Fake tensors for ``specs``: a compile reads nothing else of them, and they take no
    memory (the real inputs are the model's parameters and a batch). Their mode has a
    shape environment, as Dynamo's has: Inductor's graph cache skips a compile without one,
    and every run of a job compiled its instrumented graphs anew."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.symbolic_shapes import ShapeEnv

    out: list[Any] = []
    with FakeTensorMode(shape_env=ShapeEnv()):
        for s in specs:
            if not isinstance(s, tuple) or len(s) != 6 or not isinstance(s[2], torch.dtype):
                out.append(s)
                continue
            shape, stride, dtype, device, grad, cls = s
            t = torch.empty_strided(shape, stride, dtype=dtype, device=device)
            if issubclass(cls, torch.nn.Parameter):
                t = torch.nn.Parameter(t, requires_grad=grad)
            elif grad:
                t.requires_grad_(True)
            out.append(t)
    return out


class CompiledGraph:
    """What Dynamo runs for one graph while the agent is installed (module docstring)."""

    def __init__(
        self,
        plain: Callable[..., Any],
        gm: torch.fx.GraphModule,
        plan: Plan,
        compiler: Callable[..., Any],
        specs: list[Any],
        root: Optional[int],
        id: Optional[int] = None,
    ) -> None:
        #: The graph's id in this process, in compile order (a record's ``graph.id``); a
        #: graph's instrumented copies for its shapes (:class:`_Dynamic`) share its id.
        self.id = _new_id() if id is None else id
        self.plain = plain
        self.plan = plan
        #: ``id`` of the module whose code the graph is (Dynamo's frame's ``self``).
        self.root = root
        self._gm: Optional[torch.fx.GraphModule] = gm
        self._compiler = compiler
        self._specs = specs
        self._tapped: Optional[Callable[..., Any]] = None
        self._failed = False

    def __call__(self, *args: Any) -> Any:
        cap = ACTIVE.current
        if cap is None or not tls.active or compiling():
            return self.plain(*args)
        if self._failed:
            cap.missing += 1  # its operators are not in the dump
            return self.plain(*args)
        return cap.run(self, args)

    def tapped(self) -> Optional[Callable[..., Any]]:
        """The instrumented graph, compiled at the first captured call; None when that
        compile failed (logged once: the graph then runs uninstrumented)."""
        if self._tapped is None and not self._failed:
            assert self._gm is not None
            try:
                self._tapped = self._compiler(self._gm, _fakes(self._specs))
            except Exception as exc:  # noqa: BLE001 - the model keeps running compiled
                self._failed = True
                log.warning("probe: could not compile graph %d with statistics: %s", self.id, exc)
            self._gm = None  # compiled (or not): its copy is no longer needed
            cap = ACTIVE.current
            if cap is not None:
                cap.compiled = True
        return self._tapped


def _new_id() -> int:
    global _next_id
    with _lock:
        _next_id += 1
        return _next_id - 1


class _Dynamic:
    """A compiled graph with symbolic shapes (dynamic shapes: Dynamo's ``dynamic=True``,
    or its automatic dynamic once a frame ran with two sizes, as FSDP2's compiled
    submodules and variable sequence lengths do). Its sizes are only known when it runs,
    so it is instrumented for the sizes of a captured call (:func:`specialize`): a
    :class:`CompiledGraph` per set of argument sizes, compiled at the first captured call
    that has them, at most :data:`MAX_SHAPES` of them; uncaptured calls run the graph as
    Dynamo compiled it, for any size. A captured call beyond those, or one whose graph
    does not specialize, runs as compiled, and the step is told (its operators are
    missing)."""

    def __init__(
        self,
        plain: Callable[..., Any],
        gm: torch.fx.GraphModule,
        compiler: Callable[..., Any],
        root: Optional[int],
    ) -> None:
        self.id = _new_id()
        self.plain = plain
        self.root = root
        self._gm = gm
        self._compiler = compiler
        self._shapes: dict[tuple[Any, ...], Optional[CompiledGraph]] = {}

    def __call__(self, *args: Any) -> Any:
        cap = ACTIVE.current
        if cap is None or not tls.active or compiling():
            return self.plain(*args)
        graph = self._for(args)
        if graph is None:
            cap.missing += 1  # its operators are not in the dump
            return self.plain(*args)
        return cap.run(graph, args)

    def _for(self, args: tuple[Any, ...]) -> Optional[CompiledGraph]:
        """The instrumented graph for these arguments' sizes, made the first time."""
        specs = [_spec(a) for a in args]
        try:
            key = tuple(specs)
            hash(key)
        except TypeError:
            return None
        if key in self._shapes:
            return self._shapes[key]
        if len(self._shapes) >= MAX_SHAPES:
            log.warning(
                "probe: compiled graph %d ran with more than %d sets of sizes in captured "
                "steps: its calls with others are not captured",
                self.id,
                MAX_SHAPES,
            )
            self._shapes[key] = None
            return None
        was = tls.active
        tls.active = False  # nothing the specialization calls is the model's call
        try:
            made = specialize(self._gm, specs)
        except Exception as exc:  # noqa: BLE001 - the model keeps running compiled
            log.warning("probe: could not instrument graph %d for its sizes: %s", self.id, exc)
            made = None
        finally:
            tls.active = was
        graph = None
        if made is not None:
            gm, plan = made
            if plan.grad_rows:
                specs.append(_sink_spec(plan.grad_rows, args))
            graph = CompiledGraph(self.plain, gm, plan, self._compiler, specs, self.root, self.id)
        self._shapes[key] = graph
        return graph


#: The sets of sizes a graph with symbolic shapes is instrumented for (:class:`_Dynamic`):
#: each is a compile of the graph.
MAX_SHAPES = 8


def specialize(gm: torch.fx.GraphModule, specs: list[Any]) -> Optional[tuple[Any, Plan]]:
    """The instrumented copy of ``gm`` (a graph with symbolic shapes) for arguments of
    ``specs``' sizes, and its plan: the graph's values propagated on fake tensors of those
    sizes (each node's example value then has plain sizes, its symbolic ones' values), then
    instrumented as a static graph is. None when it still cannot be."""
    from torch.fx.passes.fake_tensor_prop import FakeTensorProp

    fakes = _fakes(specs)
    mode = next((f.fake_mode for f in fakes if hasattr(f, "fake_mode")), None)
    if mode is None:
        return None
    concrete = copy.deepcopy(gm)
    FakeTensorProp(concrete, mode=mode).propagate_dont_convert_inputs(*fakes)
    # A node whose value is another's (a no-op ``.to()``) keeps it (graph_taps reads that);
    # each old value is held here, so that no id is reused while this runs.
    same: dict[int, tuple[Any, Any]] = {}
    for n in concrete.graph.nodes:
        if "val" in n.meta:
            old = n.meta.get("example_value")
            new = same[id(old)][1] if id(old) in same else _grad_as(old, n.meta["val"])
            if isinstance(old, torch.Tensor):
                same[id(old)] = (old, new)
            n.meta["example_value"] = new
    made = instrument(concrete, _names(), (_TORCH_DIR, _PKG_DIR))
    if made is None or isinstance(made, str):
        return None
    carry_dynamo_attributes(gm, made[0])
    fill_examples(made[0], made[1].grad_rows)
    return made


def _grad_as(old: Any, new: Any) -> Any:
    """``new`` (a node's value propagated for plain sizes, detached) requiring grad where
    ``old`` (Dynamo's value of the node) does: the instrumentation taps the gradients of
    what requires grad."""
    if isinstance(new, (tuple, list)) and isinstance(old, (tuple, list)):
        return type(new)(_grad_as(o, v) for o, v in zip(old, new))
    if (
        isinstance(new, torch.Tensor)
        and isinstance(old, torch.Tensor)
        and old.requires_grad
        and not new.requires_grad
        and (new.is_floating_point() or new.is_complex())
    ):
        new.requires_grad_(True)
    return new


def _sink_spec(rows: int, args: Any) -> tuple[Any, ...]:
    """The spec of the sink argument (the last one of an instrumented graph whose
    arguments require grad), on the device of the graph's first tensor."""
    device = next((x.device for x in args if isinstance(x, torch.Tensor)), None)
    return ((rows, GRAD_COLUMNS), (GRAD_COLUMNS, 1), torch.float64, device, True, torch.Tensor)


def _backward_order(calls: list[tuple[Call, str, Optional[str], Any]]) -> list[Any]:
    """The calls of a graph in the order eager autograd writes their backward records:
    last call first, except that calls returning the same tensor (a no-op ``.to()``
    followed by ``contiguous()``: each returns its input itself) come in the order they
    were made, as the eager agent's records of one tensor do."""
    out: list[Any] = []
    run: list[Any] = []
    for item in reversed(calls):
        call = item[0]
        row = call.grads[0][1] if call.returns_input and call.grads else None
        if run and (row is None or run[0][0].grads[0][1] != row):
            out.extend(reversed(run))
            run = []
        if row is None:
            out.append(item)
        else:
            run.append(item)
    out.extend(reversed(run))
    return out


class _Uncaptured:
    """A compiled graph that could not be instrumented (hooked calls only inside bodies
    it cannot instrument, or a backend Dynamo gives no compiler function): run as it is;
    a captured step that runs it is told (its operators are missing)."""

    def __init__(self, plain: Callable[..., Any]) -> None:
        self.plain = plain

    def __call__(self, *args: Any) -> Any:
        cap = ACTIVE.current
        if cap is not None and tls.active:
            cap.missing += 1
        return self.plain(*args)


@functools.lru_cache(maxsize=1)
def _names() -> Names:
    """The API names of call targets (the api_list's functions, unwrapped), made once."""
    return Names(load_api_list(), _owners())


def _wrap(graph: Any, gm: torch.fx.GraphModule, example_inputs: list[Any], orig: Any) -> Any:
    """``OutputGraph.call_user_compiler`` with instrumentation: the backend's compiled
    function, wrapped in a :class:`CompiledGraph` when the graph can be instrumented."""
    module = _root(graph)
    if module is not None:
        TRACED_ROOTS.add(module)  # (its module hooks: modules.py)
    root = id(module) if module is not None else None
    made: Any = None
    try:
        made = instrument(gm, _names(), (_TORCH_DIR, _PKG_DIR))
    except Exception as exc:  # noqa: BLE001 - never in the compiler's way
        log.warning("probe: could not instrument a compiled graph: %s", exc)
    if made == NO_CALLS:
        return orig(graph, gm, example_inputs)  # nothing in it to capture
    kept = copy.deepcopy(gm) if made == SYMBOLIC else None  # (before the backend sees it)
    if made is not None:
        tap_lowering.install()  # (before Inductor lowers the graph: tap_lowering.py)
    compiled = orig(graph, gm, example_inputs)
    compiler = getattr(graph, "compiler_fn", None)
    if kept is not None and compiler is not None:
        carry_dynamo_attributes(gm, kept)  # (set by Dynamo for the backend: DDP's reads them)
        return _Dynamic(compiled, kept, compiler, root)
    if made is None or isinstance(made, str) or compiler is None:
        return _Uncaptured(compiled)
    tapped, plan = made
    specs = [_spec(x) for x in example_inputs]
    if plan.grad_rows:
        specs.append(_sink_spec(plan.grad_rows, example_inputs))  # (its last argument)
    carry_dynamo_attributes(gm, tapped)
    fill_examples(tapped, plan.grad_rows)
    return CompiledGraph(compiled, tapped, plan, compiler, specs, root)


def carry_dynamo_attributes(orig: torch.fx.GraphModule, copy_gm: torch.fx.GraphModule) -> None:
    """What Dynamo sets as attributes (not ``meta``, which a copy keeps) on the graph it
    hands its backend, once the backend has it (``OutputGraph._call_user_compiler``):
    each placeholder's ``_dynamo_source`` and the module's ``_param_name_to_source`` and
    ``_source_to_user_stacks``, onto the instrumented copy, made before Dynamo set them.
    DDP's compiler, which splits a graph at its gradient buckets, reads them; without them
    it refused the copy. The sink has no source in the user's frame (None)."""
    for name in ("_param_name_to_source", "_source_to_user_stacks"):
        if hasattr(orig, name):
            setattr(copy_gm, name, getattr(orig, name))
    sources = {
        n.name: n._dynamo_source
        for n in orig.graph.nodes
        if n.op == "placeholder" and hasattr(n, "_dynamo_source")
    }
    for n in copy_gm.graph.nodes:
        if n.op == "placeholder" and not hasattr(n, "_dynamo_source"):
            n._dynamo_source = sources.get(n.name)


def fill_examples(gm: torch.fx.GraphModule, grad_rows: int) -> None:
    """Example values (fake tensors, ``meta["example_value"]``) for the nodes the
    instrumentation added, as Dynamo gives every node of its graphs: a compiler that reads
    them before compiling (DDP's, which splits the graph at its buckets by the sizes of the
    parameters each part uses) refused the instrumented copy without them. Propagated
    through the graph in Dynamo's fake mode; the nodes' own values are kept."""
    graph = gm.graph
    if all("example_value" in n.meta for n in graph.nodes if n.op != "output"):
        return
    fake = next(
        (
            ex.fake_mode
            for n in graph.nodes
            if hasattr(ex := n.meta.get("example_value"), "fake_mode")
        ),
        None,
    )
    if fake is None:
        return
    from torch.fx.passes.fake_tensor_prop import FakeTensorProp

    args = []
    for n in graph.nodes:
        if n.op != "placeholder":
            continue
        ex = n.meta.get("example_value")
        if ex is None and n.target == "probe_sink":
            with fake:
                ex = torch.zeros(grad_rows, GRAD_COLUMNS, dtype=torch.float64, requires_grad=True)
        args.append(ex)
    kept = {n: n.meta["val"] for n in graph.nodes if "val" in n.meta}
    try:
        FakeTensorProp(gm, mode=fake).propagate_dont_convert_inputs(*args)
    except Exception:  # noqa: BLE001 - only a compiler that reads them needs the values
        for n, v in kept.items():
            n.meta["val"] = v
        return
    for n in graph.nodes:
        if n.op != "output" and "example_value" not in n.meta and "val" in n.meta:
            n.meta["example_value"] = n.meta["val"]
        if n in kept:
            n.meta["val"] = kept[n]


def _root(graph: Any) -> Optional[torch.nn.Module]:
    """The module whose code Dynamo traced (its frame's first module local)."""
    try:
        local = graph.root_tx.f_locals.values()
    except Exception:  # noqa: BLE001 - Dynamo's internals moved: paths stay relative
        return None
    return next((v for v in local if isinstance(v, torch.nn.Module)), None)


def install_compiler_hook() -> bool:
    """Instrument every graph Dynamo compiles from now on (once per process), once Dynamo
    is imported (``torch.compile`` imports it; importing it here would make every captured
    call look for the compiler's frames: ``compiled.compiler_call``). False while it is
    not, or where its entry point moved."""
    global _hooked
    if _hooked:
        return True
    output_graph = sys.modules.get("torch._dynamo.output_graph")
    if output_graph is None:
        return False
    with _lock:
        if _hooked:
            return True
        cls: Any = getattr(output_graph, "OutputGraph", None)
        orig = getattr(cls, "call_user_compiler", None)
        if orig is None:
            return False

        def call_user_compiler(self: Any, gm: Any, example_inputs: Any) -> Any:
            return _wrap(self, gm, example_inputs, orig)

        call_user_compiler.__wrapped__ = orig  # type: ignore[attr-defined]
        cls.call_user_compiler = call_user_compiler
        _hooked = True
        return True


def _came(came: set[int], i: int, grad: Optional[torch.Tensor]) -> None:
    """A graph output's gradient hook: output ``i`` got a gradient (autograd calls it
    with None for an output the loss does not depend on, when another output's gradient
    runs the graph's backward)."""
    if grad is not None:
        came.add(i)


#: How far up the stack a graph's module is looked for (:meth:`GraphCapture._caller`).
_FRAMES = 32


class GraphCapture:
    """Records the API calls of compiled graphs for one Debugger."""

    def __init__(self, ctx: HookContext, module_stack: list[str]) -> None:
        self._ctx = ctx
        self._stack = module_stack
        #: Module paths of the Debugger's model by ``id`` (Dynamo's ``nn_module_stack``
        #: keys), set by ``start()``.
        self.paths: dict[int, str] = {}
        #: Ids of the graphs that ran with statistics in this Debugger.
        self.graphs: set[int] = set()
        #: Runs of compiled graphs that could not be instrumented, while capturing.
        self.missing = 0
        #: Whether this step compiled an instrumented graph (seconds, once per graph): the
        #: forecast is then taken on a later step. Reset by the Debugger.
        self.compiled = False

    def run(self, graph: CompiledGraph, args: tuple[Any, ...]) -> Any:
        """One captured run of ``graph``: the instrumented copy, then its records."""
        was = tls.active
        tls.active = False  # nothing the compiler or the graph calls is the model's call
        try:
            fn = graph.tapped()
        finally:
            tls.active = was
        if fn is None:
            return graph.plain(*args)
        real = list(args)  # (what the graph's runtime may let go of)
        plan = graph.plan
        sink = None
        if plan.grad_rows:
            device = next((a.device for a in real if isinstance(a, torch.Tensor)), None)
            sink = torch.zeros(plan.grad_rows, GRAD_COLUMNS, dtype=torch.float64, device=device)
            sink.requires_grad_(True)
        tls.active = False
        try:
            out = fn(*args) if sink is None else fn(*args, sink)
        finally:
            tls.active = was
        stats, user = out[-1], out[:-1]
        if plan.uncaptured:
            self.missing += 1  # bodies it could not instrument ran: their calls are missing
        tls.active = False
        try:
            with self._ctx.lock:
                done = self.record(graph, real, stats, user)
            if sink is not None and done:
                # Which outputs get a gradient: the compiled backward is handed zeros for
                # the others, and the gradients that flow only from those are not
                # recorded, as eager autograd never computes them (Plan.grad_reach).
                came: set[int] = set()
                for i, t in enumerate(user):
                    if not isinstance(t, torch.Tensor) or not t.requires_grad:
                        continue
                    if t.grad_fn is None:
                        # A leaf (a parameter the graph returns as it is): a hook would stay
                        # on it after the step; its gradient is taken to come.
                        came.add(i)
                    else:
                        t.register_hook(functools.partial(_came, came, i))  # type: ignore[no-untyped-call]
                # Its gradient comes once the graph's backward ran: the backward records.
                sink.register_hook(  # type: ignore[no-untyped-call]
                    functools.partial(self._grads, graph, done, came)
                )
        except Exception as exc:  # noqa: BLE001
            self._ctx.guard.fail(exc, f"capturing compiled graph {graph.id}")
        finally:
            tls.active = was
        return user

    def record(
        self,
        graph: CompiledGraph,
        args: list[Any],
        stats: torch.Tensor,
        outs: Any = (),
    ) -> list[tuple[Call, str, Optional[str], Any]]:
        """The forward records of one run of ``graph`` whose statistics output is
        ``stats``; returns what its backward records need: (call, forward key, module,
        folder) of each selected call with gradients, when backward is captured. The
        graph's outputs ``outs`` that are recorded outputs keep their ids, so that a call
        reading one later (the next graph, eager code after a graph break) names it as its
        input's source, as in an eager dump.

        A record is written as its ``ops.jsonl`` object straight away (no ``OpRecord``,
        no pass of the recorder's ``finish`` per call): every record of a graph has the
        same shape, the statistics of a CPU graph are read in one call, a row's stats
        are made once for every record that holds that tensor, and the writer is asked
        for its queue and its error once per run, not once per call (~20 us a record
        before). An accelerator's rows stay on the device and are filled when the stats
        buffer reads its batch, as the eager records' are (on CPU too where tests turn
        ``stats.READ_ON_CPU`` off to run that path)."""
        ctx = self._ctx
        c = ctx.config
        rec = ctx.recorder
        files = rec.files
        folder = files.folder
        if folder is None:
            return []
        self.graphs.add(graph.id)
        plan = graph.plan
        values = plan.values
        on_host = stats.device.type == "cpu" and _stats.READ_ON_CPU
        row_stats = _row_stats(plan, stats.tolist()) if on_host else None
        ids: dict[int, int] = {}
        base = self.paths.get(graph.root) if graph.root is not None else None
        if base is None:
            base = self._stack[-1] if self._stack else ""
        bases: dict[str, Optional[str]] = {}  # (the modules that run it, by local name)
        forward, backward_on = c.forward, c.backward
        inputs, outputs, stack = c.inputs, c.outputs, c.stack
        api_call, add, source = ctx.select.api_call, rec.pending.add, rec.flow.source_id
        gid = graph.id
        backward: list[tuple[Call, str, Optional[str], Any]] = []
        for call in plan.calls:
            module = self._module(call, base, bases) or None
            n = api_call(call.api, module)
            if n is None:
                continue
            key = api_key(call.api, n)
            if backward_on and call.grads:
                backward.append((call, key, module, folder))
            if not forward:
                continue
            tensors: list[dict[str, Any]] = []
            fills: list[Any] = []
            parts: list[Any] = []
            if inputs:
                for name, v in call.inputs:
                    value = values[v]
                    tr: dict[str, Any] = {
                        "name": f"{key}.{name}",
                        "role": "input",
                        "dtype": value.dtype,
                        "shape": value.shape,
                    }
                    src = ids.get(v)
                    arg = value.arg
                    if src is None and arg is not None:
                        real = args[arg]
                        if isinstance(real, torch.Tensor):
                            src = source(real)
                    if src is not None:
                        tr["src"] = src
                    _put_stats(tr, value, row_stats, stats, fills, parts)
                    tensors.append(tr)
            if outputs:
                for name, v in call.outputs:
                    value = values[v]
                    tr = {
                        "name": f"{key}.{name}",
                        "role": "output",
                        "dtype": value.dtype,
                        "shape": value.shape,
                    }
                    tr["id"] = ids[v] = folder.next_id
                    folder.next_id += 1
                    _put_stats(tr, value, row_stats, stats, fills, parts)
                    tensors.append(tr)
            sid = rec.stacks.frames_id(folder, call.frames) if stack and call.frames else None
            line = _line(key, "forward", module, sid, gid, call.node, tensors)
            if inputs and call.args:
                line["args"] = call.args
            add(folder, line, fills, parts)
        if ids:
            register = rec.flow.register
            for t, made in zip(outs, plan.outputs):
                had = ids.get(made) if made is not None else None
                if had is not None and isinstance(t, torch.Tensor):
                    register(t, folder, tid=had)
        files.push(full_only=True)
        files.check()
        return backward

    def _grads(
        self,
        graph: CompiledGraph,
        calls: list[tuple[Call, str, Optional[str], Any]],
        came: set[int],
        grad: torch.Tensor,
    ) -> None:
        """The sink's gradient arrived (the graph's backward ran): the backward records of
        its calls, last call first as a backward runs them. A row whose flag is 0 is a
        gradient that never came (an output nothing used); a row whose gradient could only
        flow from graph outputs that ``came`` does not name holds the zeros the compiled
        backward was handed for them (no record either, as in eager autograd). The rows
        are read in one transfer (on an accelerator, one sync per graph and step), and the
        records written as :meth:`record` writes them."""
        was = tls.active
        tls.active = False
        try:
            with self._ctx.lock:
                if not self._ctx.running:
                    return  # stop() came first: the step is closed
                rows = grad.detach().tolist()
                c = self._ctx.config
                inputs, outputs = c.inputs, c.outputs
                rec = self._ctx.recorder
                files = rec.files
                plan = graph.plan
                values, reaches = plan.values, plan.grad_reach
                gid = graph.id
                now = files.folder
                made: dict[int, Any] = {}  # (a row's stats, shared as record() shares them)
                for call, key, module, folder in _backward_order(calls):
                    if now is None or folder is not now:
                        return  # the step these calls belonged to is already closed
                    bkey = api_backward(key)
                    tensors: list[dict[str, Any]] = []
                    for name, row, v in call.grads:
                        got = rows[row]
                        inp = name.startswith("input")
                        if got[COLUMNS] == 0.0 or not (inputs if inp else outputs):
                            continue
                        reach = reaches[row]
                        if reach is not None and reach.isdisjoint(came):
                            continue  # only zeros handed in for outputs without gradient
                        value = values[v]
                        st = made.get(row)
                        if st is None:
                            st = made[row] = finish_stats(got, value.numel, None)
                        tensors.append(
                            {
                                "name": f"{bkey}.{name}",
                                "role": "input" if inp else "output",
                                "dtype": value.dtype,
                                "shape": value.shape,
                                "stats": st,
                            }
                        )
                    if tensors:
                        if len(tensors) > 1:
                            # In name order for readers, as the eager backward records.
                            tensors.sort(key=_role_name)
                        line = _line(bkey, "backward", module, None, gid, call.node, tensors)
                        rec.pending.add(now, line, [], [])
                files.push(full_only=True)
                files.check()
        except Exception as exc:  # noqa: BLE001
            self._ctx.guard.fail(exc, f"capturing the backward of compiled graph {graph.id}")
        finally:
            tls.active = was

    def _caller(self, local: str) -> Optional[str]:
        """The path of the model's module that runs the graph now: the one held by
        variable ``local`` (``self``) of the nearest frame up the stack that has one.
        Dynamo runs one graph for every module of a class (their parameters are its
        arguments: one graph for all the blocks of a model compiled block by block), and a
        graph of code a module calls (the agent's wrapper of ``F.conv2d``, where Dynamo
        broke the graph) has no module of its own: its calls are that module's. None when
        no frame has one (the graph then takes the module it was compiled for)."""
        paths = self.paths
        f: Any = sys._getframe(4)  # (above _module, record, run and the graph's __call__)
        for _ in range(_FRAMES):
            if f is None:
                return None
            if local in f.f_code.co_varnames:
                obj = f.f_locals.get(local)
                if isinstance(obj, torch.nn.Module):
                    path = paths.get(id(obj))
                    if path is not None:
                        return path
            f = f.f_back
        return None

    def _module(self, call: Call, base: str, bases: dict[str, Optional[str]]) -> str:
        """A call's module path in the model: its path under the module that runs the
        graph (:meth:`_caller`, looked up once per variable and run in ``bases``), where
        Dynamo traced it from that variable; else its module's, or its path under the
        module the graph is the code of (or was called in)."""
        local = call.local
        if local is not None:
            if local not in bases:
                bases[local] = self._caller(local)
            here = bases[local]
            if here is not None:
                return f"{here}.{call.module}" if here and call.module else here or call.module
        if call.module_id is not None:
            path = self.paths.get(call.module_id)
            if path is not None:
                return path
        if not call.module:
            return base
        return f"{base}.{call.module}" if base else call.module


def _row_stats(plan: Plan, host: list[list[float]]) -> list[Any]:
    """The stats of each row of a graph's statistics output read on the host, made once
    for every record that holds the row's tensor (records share the dict: nothing changes
    a record's stats once made)."""
    out: list[Any] = [None] * len(host)
    for value in plan.values:
        row = value.row
        if row is not None and out[row] is None:
            out[row] = finish_stats(host[row], value.numel, None)
    return out


def _put_stats(
    tr: dict[str, Any],
    value: Any,
    row_stats: Optional[list[Any]],
    stats: torch.Tensor,
    fills: list[Any],
    parts: list[Any],
) -> None:
    """Give tensor record ``tr`` the stats of ``value``'s row: made already (read on the
    host), or a dict the stats buffer fills when it reads the device row with its batch
    (``Recorder.finish`` does the same for eager records); a tensor without a row has
    none to give (empty, or of a dtype without statistics)."""
    row = value.row
    if row is None:
        tr["stats"] = null_stats()
    elif row_stats is not None:
        tr["stats"] = row_stats[row]
    else:
        out: dict[str, Any] = {}
        tr["stats"] = out
        fills.append((out, COLUMNS, max(1, value.numel), stats.device))
        parts.append(stats[row])


def _line(
    key: str,
    direction: str,
    module: Optional[str],
    stack: Optional[int],
    gid: int,
    node: str,
    tensors: list[dict[str, Any]],
) -> dict[str, Any]:
    """The ``ops.jsonl`` object of a call inside a compiled graph, in the key order of
    ``OpRecord.to_json`` (``seq`` is set by the folder when written)."""
    return {
        "seq": 0,
        "op": key,
        "kind": "api",
        "direction": direction,
        "module": module,
        "stack": stack,
        "recompute": False,
        "graph": {"id": gid, "node": node},
        "tensors": tensors,
    }


def _role_name(t: dict[str, Any]) -> tuple[str, str]:
    return t["role"], t["name"]
