"""Taps in a ``torch.compile`` graph: the statistics of its operators, computed by the graph.

Why: the operators inside a compiled graph are not Python calls, so no API wrapper sees
them. What Dynamo hands its backend, though, is an FX graph of exactly those calls, at the
level the eager agent records: ``F.linear``, ``F.gelu``, ``x + y``, ``x.view(...)``, with
each node's module path (``nn_module_stack``) and source line (``stack_trace``). So
:func:`instrument` copies the graph, names each node that calls a hooked API as the eager
agent names the call (``Functional.gelu``, ``Tensor.__add__``), and adds to the graph, for
every tensor those calls read or produce, a reduction to ``[max, min, sum, norm, NaN count,
Inf count]`` in float64 (:func:`~.tap_ops.tap`), all stacked into one ``[rows, 6]`` tensor returned as
one more output of the graph. The backend (Inductor) compiles the copy like the original;
each tap is one call of an opaque operator that reads the tensor the compiled code stored,
so the model's own kernels are generated as without the agent (a tap fused into them
changed their code, and the training's last bits: ``tap_ops.py``). Nothing is read back
inside the graph (no host sync, no graph break), and the values are those the compiled code
computed -- a fault in a compiled kernel is in them. Bodies of activation checkpointing
(and Dynamo's ``wrap``) are instrumented in place (:func:`_body`). For the backward records, each call's
outputs and inputs that require grad pass through :func:`~.tap_ops.grad_tap`, whose backward writes
the gradient's statistics into a row of one more argument, the sink: AOT autograd traces
those into the compiled backward graph. :class:`Plan` says which record each row belongs
to; ``graphs.py`` runs the copy on captured steps and writes the records.

Not tapped here: graphs with symbolic shapes (their sizes are only known when they run:
``graphs.specialize`` instruments them for the sizes of a run), and the bodies of other
higher-order operators (``torch.cond``, ``invoke_subgraph``, ...): a graph with such a
body that calls hooked APIs says so (``Plan.uncaptured``).
"""

from __future__ import annotations

import copy
import dataclasses
import operator
import re
from dataclasses import dataclass
from typing import Any, Optional, Union

import torch

from .._op_key import api_name
from .stats import STORABLE, dtype_name
from .tap_ops import grad_tap, tap

# Bound before any wrapper exists: the graph copy must call PyTorch's own functions.
_stack = torch.stack
_unbind = torch.unbind
_select = torch.select


@dataclass(frozen=True)
class Value:
    """A tensor of the graph that a recorded call reads or produces."""

    dtype: str
    shape: tuple[int, ...]
    #: Its row in the graph's statistics output; None for a tensor without statistics
    #: (empty, or of a dtype the dump does not store).
    row: Optional[int]
    #: The graph argument it is (a parameter, an input), else None.
    arg: Optional[int]
    numel: int


@dataclass(frozen=True)
class Call:
    """A node of the graph that calls a hooked API: one record per run of the graph."""

    api: str
    #: The module path inside the compiled module (``layers.0.attn``; "" at its root).
    module: str
    #: ``id`` of that module object (Dynamo's key for it), to find its path in the model.
    module_id: Optional[int]
    #: The FX node's name, unique in its graph (``linear_1``).
    node: str
    #: ``File "...", line N, in fn: source`` of the user's frames, outermost first.
    frames: tuple[str, ...]
    inputs: tuple[tuple[str, int], ...]  # (name, index into Plan.values)
    outputs: tuple[tuple[str, int], ...]
    args: Optional[dict[str, Any]]
    #: Its backward record's tensors: (name, row of the sink's gradient, the value whose
    #: gradient it is): ``input.k`` the gradient of output k, ``output.j`` that of input j.
    grads: tuple[tuple[str, int, int], ...] = ()
    #: The local variable of the graph's frame that Dynamo's source of ``module`` starts
    #: at (``self`` for ``L['self'].layers[0]``; ``self`` too for a call outside any
    #: submodule), or None: ``module`` is then relative to whichever module that
    #: variable holds when the graph runs, which need not be the one it was compiled for.
    local: Optional[str] = None
    #: It returns an input itself (:func:`_returns_input`): its backward record holds that
    #: tensor's whole gradient, as other such calls on the same tensor do.
    returns_input: bool = False


@dataclass(frozen=True)
class Plan:
    """What the statistics output of an instrumented graph stands for."""

    values: tuple[Value, ...]
    calls: tuple[Call, ...]
    rows: int
    #: Per graph output: the value it is, when it is one.
    outputs: tuple[Optional[int], ...]
    #: Rows of the ``probe_sink`` input (the graph's last; 0: none, a graph without
    #: gradients), ``[grad_rows, GRAD_COLUMNS]`` float64, whose gradient the backward fills.
    grad_rows: int = 0
    #: Bodies of higher-order operators in the graph (``cond``, ``invoke_subgraph``, ...)
    #: that call hooked APIs and are not instrumented: their calls are missing from the dump.
    uncaptured: int = 0
    #: Per row of the sink: the graph outputs its gradient flows from (None: not known,
    #: always recorded). A gradient comes only where one of them got one: the compiled
    #: backward is handed zeros for an output the loss does not depend on (a ``sum``
    #: returned for an ``.item()``), where eager autograd runs no backward at all
    #: (``graphs.py`` asks the outputs' hooks).
    grad_reach: tuple[Optional[frozenset[int]], ...] = ()


#: ``operator`` functions Dynamo records for Python's operators on tensors, and the dunder
#: the eager agent's wrapper of ``torch.Tensor`` names the call by.
_OPERATORS: dict[Any, str] = {
    operator.add: "add",
    operator.sub: "sub",
    operator.mul: "mul",
    operator.truediv: "truediv",
    operator.floordiv: "floordiv",
    operator.mod: "mod",
    operator.pow: "pow",
    operator.matmul: "matmul",
    operator.and_: "and",
    operator.or_: "or",
    operator.xor: "xor",
    operator.lshift: "lshift",
    operator.rshift: "rshift",
}
_UNARY: dict[Any, str] = {
    operator.neg: "__neg__",
    operator.pos: "__pos__",
    operator.abs: "__abs__",
    operator.invert: "__invert__",
    operator.getitem: "__getitem__",
}
_INPLACE: dict[Any, str] = {
    operator.iadd: "__iadd__",
    operator.isub: "__isub__",
    operator.imul: "__imul__",
    operator.itruediv: "__itruediv__",
}


#: Calls whose output holds the elements of their first input, in another shape or order
#: (or a copy): its statistics are the input's when the element count and dtype agree (the
#: eager agent's ``Dataflow`` reuses them the same way), so they are not reduced again.
SAME_ELEMENTS = frozenset(
    f"{kind}.{name}"
    for kind in ("Tensor", "Torch")
    for name in (
        "view",
        "view_as",
        "reshape",
        "reshape_as",
        "transpose",
        "permute",
        "flatten",
        "contiguous",
        "t",
        "squeeze",
        "unsqueeze",
        "clone",
        "detach",
        "movedim",
        "swapaxes",
    )
)


class Names:
    """API names of a graph's call targets, from the agent's api_list: a function object
    named under several categories (``torch.conv2d`` is ``F.conv2d``) takes the first of
    Functional, Torch, VF, NPU, Tensor -- how models usually spell the call."""

    def __init__(self, api_list: dict[str, list[str]], owners: dict[str, Any]) -> None:
        self._tensor = frozenset(api_list.get("Tensor", ()))
        self._by_id: dict[int, str] = {}
        #: The objects named, held so that no id is reused while the table lives.
        self._held: list[Any] = []
        for kind in ("Functional", "Torch", "VF", "NPU", "Tensor"):
            owner = owners.get(kind)
            if owner is None:
                continue
            for name in api_list.get(kind, ()):
                holder: Any = owner
                *path, attr = name.split(".")
                for part in path:
                    holder = getattr(holder, part, None)
                fn = getattr(holder, attr, None)
                fn = getattr(fn, "__probe_wrapped__", fn)
                if fn is None or isinstance(fn, type):
                    continue
                self._held.append(fn)
                self._by_id.setdefault(id(fn), api_name(kind, name))
        # A functional Dynamo traces into (``F.pad`` is Python that calls
        # ``torch._C._nn.pad``) leaves the builtin it calls in the graph: named as the
        # functional the eager agent records.
        nn = getattr(torch._C, "_nn", None)
        for name in api_list.get("Functional", ()) if "Functional" in owners else ():
            inner = getattr(nn, name, None)
            if inner is not None and not isinstance(inner, type):
                self._held.append(inner)
                self._by_id.setdefault(id(inner), api_name("Functional", name))

    def tensor(self, method: str) -> Optional[str]:
        return api_name("Tensor", method) if method in self._tensor else None

    def of(self, node: Any) -> tuple[Optional[str], bool]:
        """The API ``node`` calls, and whether its first two arguments swap places in the
        eager call (``2 * x`` is ``x.__rmul__(2)``); None for a node that calls none."""
        if node.op == "call_method":
            return self.tensor(str(node.target)), False
        if node.op != "call_function":
            return None, False
        target = node.target
        if target in _OPERATORS:
            base = _OPERATORS[target]
            args = node.args
            if len(args) == 2 and not _is_tensor(args[0]) and _is_tensor(args[1]):
                return self.tensor(f"__r{base}__"), True
            return self.tensor(f"__{base}__"), False
        if target in _UNARY:
            return (self.tensor(_UNARY[target]) if _is_tensor(node.args[0]) else None), False
        if target in _INPLACE:
            return self.tensor(_INPLACE[target]), False
        return self._by_id.get(id(target)), False


def _example(node: Any) -> Any:
    return node.meta.get("example_value") if hasattr(node, "meta") else None


def _is_tensor(arg: Any) -> bool:
    return isinstance(_example(arg), torch.Tensor)


def _static(t: torch.Tensor) -> Optional[tuple[int, ...]]:
    """``t``'s shape when every size is a plain int."""
    shape = tuple(t.shape)
    return shape if all(type(d) is int for d in shape) else None


_PART = re.compile(r"\.([A-Za-z_]\w*|\d+)|\[(\d+)\]|\[\s*'([^']*)'\s*\]|\[\s*\"([^\"]*)\"\s*\]")


def module_path(node: Any) -> tuple[str, Optional[int], Optional[str]]:
    """The module a node runs in, relative to the compiled one: Dynamo's source of it
    (``L['self'].layers[0].attn``, ``L['self']._modules['fc']``) as a dotted path, the
    module's ``id`` where Dynamo keys it by that, and the frame's local variable the
    source starts at (:attr:`Call.local`)."""
    stack = node.meta.get("nn_module_stack")
    if not stack:
        return "", None, "self"  # (the frame's own code: its module, if it is a method)
    key, entry = list(stack.items())[-1]
    mid = int(key) if isinstance(key, str) and key.isdigit() else None
    source = entry[0]
    if not isinstance(source, str):
        return "", mid, None
    head = re.match(r"^[A-Za-z_]\w*(\[\s*'[^']*'\s*\])?", source)
    rest = source[head.end() :] if head else source
    parts = []
    for m in _PART.finditer(rest):
        part = next(g for g in m.groups() if g is not None)
        if part not in ("_modules", "_orig_mod"):
            parts.append(part)
    local = re.fullmatch(r"L\[\s*'([A-Za-z_]\w*)'\s*\]", head.group(0)) if head else None
    return ".".join(parts), mid, local.group(1) if local else None


_FRAME = re.compile(r'^\s*File "(.*)", line (\d+), in (.*)$')


def frames(node: Any, skip: tuple[str, ...]) -> tuple[str, ...]:
    """The user's frames of a node's ``stack_trace``, as ``stacks.py`` formats frames,
    outermost first; frames in ``skip`` (torch, the agent) are left out."""
    text = node.meta.get("stack_trace") or ""
    lines = text.splitlines()
    out = []
    for i, line in enumerate(lines):
        m = _FRAME.match(line)
        if m is None or m.group(1).startswith(skip):
            continue
        src = lines[i + 1].strip() if i + 1 < len(lines) else ""
        out.append(f'File "{m.group(1)}", line {m.group(2)}, in {m.group(3)}: {src}')
    return tuple(out)


@dataclass
class _Site:
    """Where a recorded call is in its graph: its node, and the FX nodes of its inputs and
    outputs (as ``Call.inputs`` and ``Call.outputs`` order them), for its gradient taps."""

    node: Any
    inputs: list[Any]
    outputs: list[Any]


@dataclass
class _Scope:
    """One graph being instrumented: the top-level graph, or the body of a higher-order
    operator (:data:`BODY_HOPS`) inside it."""

    gm: torch.fx.GraphModule
    #: The node after which the taps of its placeholders go.
    anchor: Any
    #: Its sink argument (a row per gradient tap, each read by a ``select`` of its own: a
    #: tuple of rows would cross the parts DDP's compiler splits a graph into, which AOT
    #: autograd refused), or None: no gradients.
    rows: Any
    #: Nodes added by the instrumentation, which the walk skips.
    ours: set[Any]


class _Builder:
    """Collects the values and calls of one graph (and of the bodies of the higher-order
    operators in it) while :func:`instrument` walks it."""

    def __init__(self, names: Names, skip: tuple[str, ...], args: dict[Any, int]) -> None:
        self.names = names
        self.skip = skip
        self.args = args
        self.values: list[Value] = []
        self.index: dict[Any, int] = {}  # FX node -> value
        #: A body's placeholder -> (the operand it is in the graph around it, the node
        #: after which that operand's tap goes there).
        self.alias: dict[Any, tuple[Any, Any]] = {}
        #: One per row of the statistics: (after node, node to reduce, whether that node
        #: already is the row: a row of a body's statistics output, in the graph around it).
        self.taps: list[tuple[Any, Any, bool]] = []
        self.calls: list[Call] = []
        self.sites: list[_Site] = []
        #: Gradient taps so far (rows of the sink).
        self.grad_rows = 0
        #: Higher-order operators whose bodies call hooked APIs that are not instrumented.
        self.uncaptured = 0
        #: The graph outputs each node of the graph as Dynamo gave it reaches (:func:`_reach`),
        #: and for an instrumented body's graph, those its operator's node reaches.
        self.reach: dict[Any, frozenset[int]] = {}
        self.graph_reach: dict[Any, Optional[frozenset[int]]] = {}
        #: Per gradient tap: :attr:`Plan.grad_reach`.
        self.grad_reach: list[Optional[frozenset[int]]] = []

    def reach_of(self, node: Any) -> Optional[frozenset[int]]:
        """The graph outputs ``node``'s value flows to: its own entry, its tuple's (a
        ``getitem`` the instrumentation added), or its body's operator's."""
        got = self.reach.get(node)
        if got is not None:
            return got
        if node.graph in self.graph_reach:
            return self.graph_reach[node.graph]
        if node.op == "call_function" and node.target is operator.getitem and node.args:
            src = node.args[0]
            if isinstance(src, torch.fx.Node):
                return self.reach_of(src)
        return None

    def value(self, node: Any, at: Any, same: Optional[int] = None) -> Optional[int]:
        """The value of tensor node ``node`` (tapped after node ``at``), made when new.
        ``same``: a value holding the same elements (``node`` is a view or copy of it), whose
        statistics it shares instead of being reduced again. A body's placeholder is the
        value of the operand it stands for."""
        got = self.index.get(node)
        if got is not None:
            return got
        if node in self.alias:
            outer, outer_at = self.alias[node]
            v = self.value(outer, outer_at)
            if v is not None:
                self.index[node] = v
            return v
        ex = _example(node)
        shape = _static(ex) if isinstance(ex, torch.Tensor) else None
        if shape is None:
            return None
        n = 1
        for d in shape:
            n *= d
        row = None
        name = dtype_name(ex.dtype)
        if same is not None and self.values[same].dtype == name and self.values[same].numel == n:
            row = self.values[same].row
        elif ex.dtype in STORABLE and n > 0 and ex.layout is torch.strided:
            row = len(self.taps)
            self.taps.append((at, node, False))
        self.values.append(Value(name, shape, row, self.args.get(node), n))
        self.index[node] = len(self.values) - 1
        return self.index[node]


#: What :func:`instrument` returns for a graph that calls no hooked API: nothing to capture,
#: and nothing missing from the dump.
NO_CALLS = "no calls"
#: What :func:`instrument` returns for a graph with symbolic sizes (an argument that is a
#: SymInt, or a tensor with a symbolic size): ``graphs.specialize`` instruments it for the
#: sizes of a run.
SYMBOLIC = "symbolic"

#: Higher-order operators whose first argument is a body (a graph) that they call on their
#: other positional arguments, returning its outputs: activation checkpointing
#: (``torch.utils.checkpoint`` in a compiled region) and Dynamo's plain ``wrap``. Their
#: bodies are instrumented too: the body returns its statistics as one more output, and
#: takes the sink as one more argument. (Before, the calls of a checkpointed block were
#: missing from the dump, and nothing said so.)
BODY_HOPS = frozenset({"tag_activation_checkpoint", "wrap"})


def _hop(node: Any) -> Optional[str]:
    """The name of the higher-order operator ``node`` calls, if it calls one."""
    if node.op == "call_function" and isinstance(node.target, torch._ops.HigherOrderOperator):
        return str(node.target.name())  # type: ignore[no-untyped-call]
    return None


def _attr(gm: Any, target: str) -> Any:
    for part in target.split("."):
        gm = getattr(gm, part, None)
    return gm


def _subgraphs(gm: Any, node: Any) -> list[torch.fx.GraphModule]:
    """The graphs a higher-order operator's node reads (its bodies)."""
    out = []
    for n in node.all_input_nodes:
        if n.op == "get_attr":
            sub = _attr(gm, str(n.target))
            if isinstance(sub, torch.fx.GraphModule):
                out.append(sub)
    return out


def _calls_api(names: Names, gm: torch.fx.GraphModule) -> bool:
    """Whether ``gm`` (or a body inside it) calls a hooked API."""
    for node in gm.graph.nodes:
        if names.of(node)[0] is not None:
            return True
        if _hop(node) is not None and any(_calls_api(names, s) for s in _subgraphs(gm, node)):
            return True
    return False


def instrument(
    gm: torch.fx.GraphModule, names: Names, skip: tuple[str, ...]
) -> Union[tuple[torch.fx.GraphModule, Plan], str, None]:
    """A copy of ``gm`` whose last output is the ``[rows, 6]`` statistics of the tensors its
    API calls read and produce (and, when it has arguments that require grad, whose last
    argument is the sink its gradient taps write to), and the plan of those rows;
    :data:`NO_CALLS` for a graph that calls no hooked API; :data:`SYMBOLIC` for one with
    symbolic sizes; None when it cannot be instrumented otherwise (an argument of another
    kind, or hooked calls only inside bodies it cannot
    instrument). The bodies of :data:`BODY_HOPS` are instrumented in place; a graph with
    other bodies that call hooked APIs (``cond``, ``invoke_subgraph``, ...) has
    ``Plan.uncaptured``: those calls are missing from the dump, and a captured step says so."""
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    for p in placeholders:
        ex = _example(p)
        if not isinstance(ex, torch.Tensor) and ex is not None and not isinstance(ex, int):
            return SYMBOLIC if isinstance(ex, torch.SymInt) else None
        if isinstance(ex, torch.Tensor) and _static(ex) is None:
            return SYMBOLIC
    gm = copy.deepcopy(gm)
    graph = gm.graph
    placeholders = [n for n in graph.nodes if n.op == "placeholder"]
    b = _Builder(names, skip, {p: i for i, p in enumerate(placeholders)})
    b.reach = _reach(graph)
    anchor = placeholders[-1] if placeholders else None
    rows = None
    ours: set[Any] = set()
    if anchor is not None and any(_needs_grad(p) for p in placeholders):
        with graph.inserting_after(anchor):
            sink = graph.placeholder("probe_sink")
        rows = anchor = sink  # (taps of the arguments after every placeholder)
        ours = {sink}
    scope = _Scope(gm, anchor, rows, ours)
    first = _walk(b, scope)
    if not b.calls:
        return NO_CALLS if not b.uncaptured else None
    if rows is not None:
        _insert_grad_taps(b, scope, first)
    _insert_taps(graph, _tap_rows(b, graph))
    out_node = next(n for n in graph.nodes if n.op == "output")
    user = out_node.args[0]
    flat = user[:-1]  # (the statistics last)
    produced = tuple(
        b.index.get(_untapped(o)) if isinstance(o, torch.fx.Node) else None for o in flat
    )
    graph.lint()
    gm.recompile()
    plan = Plan(
        tuple(b.values),
        tuple(b.calls),
        len(b.taps),
        produced,
        b.grad_rows,
        b.uncaptured,
        tuple(b.grad_reach),
    )
    return gm, plan


def _walk(b: _Builder, scope: _Scope) -> int:
    """Records the calls of ``scope``'s graph (and of the bodies in it, instrumented as
    they come: :func:`_body`) in ``b``; returns the index of its first call in ``b.calls``
    (those from there on that sit in this graph get its gradient taps)."""
    first = len(b.calls)
    for node in list(scope.gm.graph.nodes):
        if node.op == "placeholder" or node in scope.ours:
            continue
        hop = _hop(node)
        if hop is not None:
            if hop in BODY_HOPS and _body(b, scope, node):
                continue
            if any(_calls_api(b.names, s) for s in _subgraphs(scope.gm, node)):
                b.uncaptured += 1
            continue
        api, swapped = b.names.of(node)
        if api is None:
            continue
        args = list(node.args)
        if swapped:
            args[0], args[1] = args[1], args[0]
        inputs: list[tuple[str, int]] = []
        in_nodes: list[Any] = []
        consts: dict[str, Any] = {}
        for key, a in (*enumerate(args), *node.kwargs.items()):
            for name, item in _tensor_args(a, f"input.{key}"):
                if isinstance(item, torch.fx.Node):
                    at = scope.anchor if item.op == "placeholder" else item
                    v = b.value(item, at)
                    if v is not None:
                        inputs.append((name, v))
                        in_nodes.append(item)
                elif name == f"input.{key}":
                    j = _json_arg(item)
                    if j is not None:
                        consts[name] = j
        same = inputs[0][1] if api in SAME_ELEMENTS and inputs else None
        got = _outputs(b, node, same)
        if got is None:
            continue
        outputs, out_nodes = got
        module, module_id, local = module_path(node)
        b.sites.append(_Site(node, in_nodes, out_nodes))
        b.calls.append(
            Call(
                api,
                module,
                module_id,
                node.name,
                frames(node, b.skip),
                tuple(inputs),
                tuple(outputs),
                consts or None,
                local=local,
            )
        )
    return first


def _body(b: _Builder, scope: _Scope, node: Any) -> bool:
    """Instruments the body of ``node``, a :data:`BODY_HOPS` call in ``scope``'s graph: its
    calls are recorded where the operator runs (the body's placeholders are the values of
    the operands they stand for, the operator's outputs the values of the body's), its
    statistics become one more output of the body, whose rows the graph around it reads,
    and its gradient taps write to the sink, passed as one more operand. Its forward runs
    once, so each call is recorded once (a checkpointed body is recomputed in the backward
    graph, not recorded again); the checkpoint stays: the taps only add outputs. False
    when the body does not have the expected form (it is then left as it is)."""
    outer = scope.gm.graph
    body_attr = node.args[0]
    body = _attr(scope.gm, str(body_attr.target)) if isinstance(body_attr, torch.fx.Node) else None
    if not isinstance(body, torch.fx.GraphModule):
        return False
    g = body.graph
    phs = [n for n in g.nodes if n.op == "placeholder"]
    operands = list(node.args[1:])
    out_node = next(n for n in g.nodes if n.op == "output")
    result = out_node.args[0]
    if len(phs) != len(operands) or not isinstance(result, (tuple, list)):
        return False
    if not _calls_api(b.names, body):
        return True  # nothing to record in it
    # Each instrumented body is its own module: another HOP node may share the original.
    body = copy.deepcopy(body)
    b.graph_reach[body.graph] = b.reach_of(node)  # (its gradients come through the operator)
    name = f"probe_{body_attr.target}_{node.name}".replace(".", "_")
    scope.gm.add_submodule(name, body)
    with outer.inserting_before(node):
        new_attr = outer.get_attr(name)
    node.update_arg(0, new_attr)
    if not body_attr.users:
        outer.erase_node(body_attr)
    g = body.graph
    phs = [n for n in g.nodes if n.op == "placeholder"]
    out_node = next(n for n in g.nodes if n.op == "output")
    result = tuple(out_node.args[0])
    for p, a in zip(phs, operands):
        if isinstance(a, torch.fx.Node):
            b.alias[p] = (a, scope.anchor if a.op == "placeholder" else a)
    anchor = phs[-1] if phs else None
    rows = None
    ours: set[Any] = set()
    if scope.rows is not None:
        with g.inserting_after(anchor) if anchor is not None else g.inserting_before(None):
            sink = g.placeholder("probe_sink")
        node.args = (*node.args, scope.rows)
        rows = anchor = sink
        ours = {sink}
    inner = _Scope(body, anchor, rows, ours)
    first = _walk(b, inner)
    # The operator's outputs are the body's: a call after it that reads one reads the
    # value the body's call produced (statistics and dataflow ids shared).
    for u in list(node.users):
        if u.op == "call_function" and u.target is operator.getitem and len(u.args) == 2:
            i = u.args[1]
            if isinstance(i, int) and i < len(result) and result[i] in b.index:
                b.index[u] = b.index[result[i]]
    if rows is not None:
        _insert_grad_taps(b, inner, first)
    mine = _tap_rows(b, g)
    if mine:
        with g.inserting_before(out_node):
            stacked = g.call_function(_stack, ([r for _, r in mine],))
        out_node.args = ((*out_node.args[0], stacked),)
        # Its rows, in the graph around it: entries of the final statistics like any tap.
        with outer.inserting_after(node):
            extra = outer.call_function(operator.getitem, (node, len(result)))
        with outer.inserting_after(extra):
            unb = outer.call_function(_unbind, (extra,))
        at = unb
        for j, (i, _) in enumerate(mine):
            with outer.inserting_after(at):
                at = outer.call_function(operator.getitem, (unb, j))
            b.taps[i] = (at, at, True)
        scope.ours.update({extra, unb})
    body.recompile()
    return True


def _needs_grad(node: Any) -> bool:
    ex = _example(node)
    return isinstance(ex, torch.Tensor) and ex.requires_grad


def _reach(graph: Any) -> dict[Any, frozenset[int]]:
    """For each node, the positions of the graph's outputs that depend on it (through any
    of its users): where a gradient of it can come from."""
    reach: dict[Any, frozenset[int]] = {}
    for node in reversed(graph.nodes):
        if node.op == "output":
            user = node.args[0]
            flat = user if isinstance(user, (tuple, list)) else (user,)
            for i, o in enumerate(flat):
                if isinstance(o, torch.fx.Node):
                    reach[o] = reach.get(o, frozenset()) | {i}
            continue
        mine = reach.get(node, frozenset())
        for u in node.users:
            mine |= reach.get(u, frozenset())
        reach[node] = mine
    return reach


def _untapped(n: torch.fx.Node) -> torch.fx.Node:
    """The node a gradient tap hands on (:func:`_insert_grad_taps`), or ``n``: the value a
    graph output is when the output is a tapped tensor."""
    while n.op == "call_function" and n.target is grad_tap:
        n = n.args[0]  # type: ignore[assignment]
    return n


def _insert_grad_taps(b: _Builder, scope: _Scope, first: int) -> None:
    """Gradient taps (:func:`grad_tap`) around each call of ``scope``'s graph from
    ``b.calls[first]`` on, for its backward record: on each output that requires grad,
    before all its uses (its gradient, summed over them, is what the eager backward
    record's ``input.k`` holds), and on each input that requires grad, for this call only
    (``output.j``: the gradient this call gives its input). Each tap gets its own row of
    the sink; the calls get their ``grads``."""
    graph = scope.gm.graph
    current: dict[Any, Any] = {}  # a tapped output -> its tap, which its users now read
    same: dict[Any, Any] = {}  # the output node of a call that returns its input -> that
    for k in range(first, len(b.calls)):
        call, site = b.calls[k], b.sites[k]
        if site.node.graph is not graph:
            continue  # (a body's call: tapped in its body)
        alias = _returns_input(call, site)
        if alias is not None:
            grads = _alias_grads(b, scope, call, site, alias, current, same)
            b.calls[k] = dataclasses.replace(call, grads=grads, returns_input=True)
            continue
        taps: list[tuple[str, int, int]] = []
        for (name, v), orig in zip(call.inputs, site.inputs):
            cur = current.get(orig, orig)
            if not _needs_grad(orig) or cur not in site.node.all_input_nodes:
                continue  # (the same tensor twice: its first tap carries both gradients)
            with graph.inserting_before(site.node):
                row = graph.call_function(_select, (scope.rows, 0, b.grad_rows))
                tapped = graph.call_function(grad_tap, (cur, row))
            site.node.replace_input_with(cur, tapped)
            taps.append(("output" + name[len("input") :], b.grad_rows, v))
            b.grad_reach.append(b.reach_of(site.node))  # (what the call's outputs reach)
            b.grad_rows += 1
        for (name, v), n in zip(call.outputs, site.outputs):
            if not _needs_grad(n):
                continue
            with graph.inserting_after(n):
                row = graph.call_function(_select, (scope.rows, 0, b.grad_rows))
            with graph.inserting_after(row):
                tapped = graph.call_function(grad_tap, (n, row))
            n.replace_all_uses_with(tapped, delete_user_cb=lambda u, t=tapped: u is not t)
            current[n] = tapped
            taps.append(("input" + name[len("output") :], b.grad_rows, v))
            b.grad_reach.append(b.reach_of(n))
            b.grad_rows += 1
        b.calls[k] = dataclasses.replace(call, grads=tuple(taps))


def _returns_input(call: Call, site: _Site) -> Optional[int]:
    """Which input a call returns as its output, as the very same tensor (``x.to(dtype)``
    of a tensor of that dtype, ``contiguous()`` of a contiguous one, ``float()`` of a float
    one: Dynamo's example value of the output is the input's), when it is not an in-place
    call; else None."""
    if len(site.outputs) != 1 or call.api.endswith("_") or call.api.split(".")[-1][:3] == "__i":
        return None
    ex = _example(site.outputs[0])
    if not isinstance(ex, torch.Tensor):
        return None
    return next((i for i, n in enumerate(site.inputs) if _example(n) is ex), None)


def _alias_grads(
    b: _Builder,
    scope: _Scope,
    call: Call,
    site: _Site,
    i: int,
    current: dict[Any, Any],
    same: dict[Any, Any],
) -> tuple[tuple[str, int, int], ...]:
    """The backward record's tensors of a call that returns its input ``i`` itself. In
    eager code its output is that tensor, so the gradient the eager record holds for it
    (and gives the input) is the tensor's whole gradient, summed over all its uses, those
    before the call included (a LLaMA RMSNorm's ``hidden_states.to(torch.float32)`` in
    float32: its input is also the residual). The graph has a node of its own for the
    output, whose gradient is only that of the uses after the call: both names take the
    row of a tap of the input before all its uses, the tap its producer's record has where
    it has one. ``current``: :func:`_insert_grad_taps`' taps of tensors before all their
    uses so far; ``same``: the tensor each such call's output is (a chain of them is one
    tensor)."""
    orig = same.get(site.inputs[i], site.inputs[i])
    same[site.outputs[0]] = orig
    if not _needs_grad(orig):
        return ()
    cur = current.get(orig, orig)
    if cur is not orig:
        row = cur.args[1].args[2]  # (the tap's row: grad_tap(x, select(sink, 0, row)))
    else:
        graph = scope.gm.graph
        with graph.inserting_after(scope.anchor if cur.op == "placeholder" else cur):
            select = graph.call_function(_select, (scope.rows, 0, b.grad_rows))
        with graph.inserting_after(select):
            tapped = graph.call_function(grad_tap, (cur, select))
        cur.replace_all_uses_with(tapped, delete_user_cb=lambda u: u is not tapped)
        current[orig] = tapped
        row = b.grad_rows
        b.grad_reach.append(b.reach_of(orig))
        b.grad_rows += 1
    (out_name, out_v), (in_name, in_v) = call.outputs[0], call.inputs[i]
    return (
        ("input" + out_name[len("output") :], row, out_v),
        ("output" + in_name[len("input") :], row, in_v),
    )


def _tensor_args(a: Any, prefix: str) -> list[tuple[str, Any]]:
    """``(name, arg)`` of an argument: a list's items named ``prefix.i`` as the eager
    agent names them; anything else as itself."""
    if isinstance(a, (tuple, list)) and any(isinstance(x, torch.fx.Node) for x in a):
        return [(f"{prefix}.{i}", x) for i, x in enumerate(a)]
    return [(prefix, a)]


def _json_arg(v: Any) -> Any:
    from .records import json_arg

    return None if isinstance(v, torch.fx.Node) else json_arg(v)


def _outputs(
    b: _Builder, node: Any, same: Optional[int] = None
) -> Optional[tuple[list[tuple[str, int]], list[Any]]]:
    """The output values of a call node (a tuple's tensors through ``getitem`` nodes added
    after it) and their FX nodes, or None when its outputs cannot be tapped (symbolic
    shapes). ``same``: the value whose elements a single output holds
    (:data:`SAME_ELEMENTS`)."""
    ex = _example(node)
    if isinstance(ex, torch.Tensor):
        v = b.value(node, node, same)
        return None if v is None else ([("output.0", v)], [node])
    if not isinstance(ex, (tuple, list)):
        return [], []
    out: list[tuple[str, int]] = []
    nodes: list[Any] = []
    # The graph's own ``getitem`` of each element where it has one: its users read the
    # element through it, so that is where a gradient tap must sit.
    gets = {
        u.args[1]: u
        for u in node.users
        if u.op == "call_function" and u.target is operator.getitem and len(u.args) == 2
    }
    at = node
    for i, item in enumerate(ex):
        if not isinstance(item, torch.Tensor):
            continue
        get = gets.get(i)
        if get is None:
            with node.graph.inserting_after(at):
                get = node.graph.call_function(operator.getitem, (node, i))
            get.meta["example_value"] = item
            at = get
        v = b.value(get, get)
        if v is None:
            return None
        out.append((f"output.{i}", v))
        nodes.append(get)
    return out, nodes


def _tap_rows(b: _Builder, graph: Any) -> list[tuple[int, Any]]:
    """(row, node) of each row of the statistics that ``graph`` computes: a ``tap`` right
    after its ``at`` node, or a row a body in it returned."""
    out = []
    for i, (at, node, ready) in enumerate(b.taps):
        if at.graph is not graph:
            continue
        if ready:
            out.append((i, node))
            continue
        with graph.inserting_after(at):
            out.append((i, graph.call_function(tap, (node,))))
    return out


def _insert_taps(graph: Any, rows: list[tuple[int, Any]]) -> None:
    """The stack of the rows of the statistics (all in ``graph`` by now, in row order) as
    its last output."""
    out_node = next(n for n in graph.nodes if n.op == "output")
    with graph.inserting_before(out_node):
        stacked = graph.call_function(_stack, ([r for _, r in sorted(rows, key=lambda x: x[0])],))
    user = out_node.args[0]
    flat = tuple(user) if isinstance(user, (tuple, list)) else (user,)
    out_node.args = ((*flat, stacked),)
