"""Op records: what one captured call becomes in ``ops.jsonl``, and the dataflow between them.

An :class:`OpRecord` is built while its op runs (forward) or while autograd delivers its
gradients (backward) and written once complete. Each tensor's JSON record is a plain dict
typed as :class:`TensorRecord`: it is what ``json.dumps`` writes, in the key order the dump
has always had (docs/format.md), and building it costs no conversion on the hot path. Its
statistics stay on the device (``TensorEntry``) until the op is finished, so that one
transfer brings all of them to the host.
"""

from __future__ import annotations

import copy
import weakref
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any, Callable, Optional, Union

import torch

from .stats import StatVector, memory_runs

if TYPE_CHECKING:
    from typing_extensions import NotRequired, TypedDict

    from .stats import Stats
    from .writer import RankFolder

    class TensorRecord(TypedDict):
        """One tensor of an op, as written (keys in this order, optional ones when known)."""

        name: str
        role: str
        dtype: str
        shape: tuple[int, ...]  # a tuple: see Recorder.add_tensor
        dtensor: NotRequired[dict[str, Any]]  # a DTensor's placement (stats.dtensor_local)
        # how it lies in memory (Dataflow.layout): strides where not contiguous, the
        # storage offset where not 0, the step's id of its storage, an NPU's format
        stride: NotRequired[tuple[int, ...]]
        offset: NotRequired[int]
        storage: NotRequired[int]
        format: NotRequired[Any]
        unwritten: NotRequired[bool]  # memory nothing wrote yet (Dataflow.unwritten)
        # first when reused from an earlier record, else last; None when unwritten
        stats: NotRequired[Optional[Stats]]
        checksum: NotRequired[str]
        file: NotRequired[str]
        data_offsets: NotRequired[list[int]]
        src: NotRequired[int]
        id: NotRequired[int]


#: What capturing one tensor gives: stats vector, host copy (tensor mode), checksum (or,
#: for an accelerator's tensor, the host copy it is taken of once the copy has landed).
Captured = tuple[StatVector, Optional[torch.Tensor], Union[str, torch.Tensor, None]]

#: What is taken of a tensor whose bytes nothing wrote yet (``Dataflow.unwritten``), passed
#: as ``Recorder.add_tensor``'s ``pre``: no statistics, data or checksum. Told apart by
#: identity, so it is built at run time: an equal tuple literal can be the same constant.
UNWRITTEN: Captured = tuple([None, None, None])  # type: ignore[assignment]

_PRIMITIVES = (int, float, bool, str)
_STRIDED = torch.strided


#: One tensor of an op being built: its record, its stats vector, and the tensor itself when
#: NaN/Inf counts may have to be taken late. A tuple, not a class: one is made per captured
#: tensor, and a tuple costs a third of an object's construction on that path.
TensorEntry = tuple["TensorRecord", StatVector, Optional[torch.Tensor]]
#: A tensor's storage, its address, and its ``layout_key`` (None below ``LAYOUT_MIN``
#: elements): what ``Dataflow`` looks a tensor up by and keeps it under.
Memory = tuple[Any, int, Optional[tuple[Any, ...]]]
#: What capture already knows of a tensor it meets again (same object, version and storage
#: writes): the entry it was captured as, whose record is complete once its op is finished
#: and whose statistics are reduced already.
Known = TensorEntry


class OpRecord:
    """One op record being built (``ops.jsonl`` line), and its backward bookkeeping.

    Attributes that most records leave at their default are class attributes: an instance
    only holds what was set on it, so building one (once per captured call) sets six.
    """

    stack: Optional[int] = None
    recompute = False
    args: Optional[dict[str, Any]] = None
    #: Overflow mode, API forward calls: the arguments (an in-place op's first one as it was
    #: before the call) and the result, made into tensor records and ``args`` only if the
    #: op is recorded.
    call_args: Optional[tuple[tuple[Any, ...], dict[str, Any]]] = None
    call_out: Any = None
    expect = 0  # backward: gradients hooked
    got = 0  # backward: gradient hooks that ran
    done = False
    #: Collectives (``Distributed.*``): global ranks of the process group, and the
    #: collective's position among that group's collectives in the step.
    group: Optional[list[int]] = None
    coll_seq: Optional[int] = None
    #: A call inside a compiled graph (graphs.py): the graph's id and the FX node's name.
    graph: Optional[dict[str, Any]] = None

    def __init__(
        self,
        key: str,
        kind: str,
        direction: str,
        module: Optional[str],
        folder: Optional[RankFolder],
    ) -> None:
        self.key = key
        self.kind = kind  # api, module, parameters_grad
        self.direction = direction  # forward, backward
        self.module = module
        self.folder = folder  # the step's folder: a late backward of a closed step is dropped
        self.entries: list[TensorEntry] = []

    def to_json(self, tensors: list[TensorRecord]) -> dict[str, Any]:
        """The ``ops.jsonl`` object (``seq`` is set by the folder when written)."""
        record: dict[str, Any] = {
            "seq": 0,
            "op": self.key,
            "kind": self.kind,
            "direction": self.direction,
            "module": self.module,
            "stack": self.stack,
            "recompute": self.recompute,
        }
        if self.group is not None:
            record["group"] = self.group
            record["coll_seq"] = self.coll_seq
        if self.graph is not None:
            record["graph"] = self.graph
        record["tensors"] = tensors
        if self.args:
            record["args"] = self.args
        return record


def walk(obj: Any, prefix: str, fn: Callable[[str, torch.Tensor], torch.Tensor]) -> Any:
    """Apply ``fn(name, tensor)`` to every tensor in nested lists/tuples/dicts.

    Returns the structure rebuilt with ``fn``'s results, which is how inputs are swapped
    for autograd aliases. Names follow msprobe: list items ``.i``, dict items ``.key``.
    Subclasses count as what they subclass: a named tuple or ``torch.return_types`` result
    (``topk``'s values and indices) as a tuple, an ``OrderedDict`` or transformers'
    ``ModelOutput`` as a dict; they are rebuilt as their own type when an alias replaced
    one of their tensors (kept as they are if that fails: the alias then goes unused).
    """
    if isinstance(obj, torch.Tensor):
        return fn(prefix, obj)
    t = type(obj)
    if t is tuple or t is list:
        return t([walk(v, f"{prefix}.{i}", fn) for i, v in enumerate(obj)])
    if t is dict:
        return {k: walk(v, f"{prefix}.{k}", fn) for k, v in obj.items()}
    if isinstance(obj, (tuple, list)):
        return _rebuilt(obj, [walk(v, f"{prefix}.{i}", fn) for i, v in enumerate(obj)])
    if isinstance(obj, dict):
        return _rebuilt_dict(obj, {k: walk(v, f"{prefix}.{k}", fn) for k, v in obj.items()})
    return obj


def _rebuilt(obj: Any, items: list[Any]) -> Any:
    """``obj`` (a tuple or list subclass) with ``items``, as its own type."""
    if all(a is b for a, b in zip(items, obj)):
        return obj
    try:
        t = type(obj)
        return t(*items) if hasattr(t, "_fields") else t(items)  # named tuples take fields
    except Exception:  # noqa: BLE001 - a type that cannot be rebuilt keeps its tensors
        return obj


def _rebuilt_dict(obj: Any, items: dict[Any, Any]) -> Any:
    """``obj`` (a dict subclass) with ``items``, as a copy of its own type."""
    if all(items[k] is v for k, v in obj.items()):
        return obj
    try:
        new = copy.copy(obj)
        for k, v in items.items():
            new[k] = v
        return new
    except Exception:  # noqa: BLE001 - a type that cannot be copied keeps its tensors
        return obj


#: Containers whose items are visited: tuples (named tuples, ``torch.return_types``
#: results), lists and dicts (``OrderedDict``, ``ModelOutput``), subclasses included.
NESTED = (tuple, list, dict)


def named_tensors(obj: Any, prefix: str) -> Iterator[tuple[str, torch.Tensor]]:
    """Every tensor :func:`walk` would visit, with the same names, in the same order,
    without rebuilding anything: what a captured call does with its outputs, and with its
    inputs when nothing replaces them. A name is only formatted for a tensor or a container
    (most arguments of an op are numbers)."""
    if isinstance(obj, torch.Tensor):
        yield prefix, obj
        return
    if isinstance(obj, (tuple, list)):
        items: Iterable[tuple[Any, Any]] = enumerate(obj)
    elif isinstance(obj, dict):
        items = obj.items()
    else:
        return
    for k, v in items:
        if isinstance(v, torch.Tensor):
            yield f"{prefix}.{k}", v
        elif isinstance(v, NESTED):
            yield from named_tensors(v, f"{prefix}.{k}")


def results(out: Any) -> Any:
    """What a call's outputs are visited as: its tuple or list of results (named tuples and
    ``torch.return_types`` included: ``topk`` has ``output.0`` and ``output.1``), or its one
    result as ``output.0`` (a tensor, a dict, a ``ModelOutput``)."""
    return out if isinstance(out, (tuple, list)) else (out,)


def json_arg(v: Any) -> Any:
    """A JSON-safe rendering of a non-tensor argument, or None to leave it out."""
    tv = type(v)
    if tv is int or tv is bool or tv is str:
        return v
    if tv is float:
        return v if v - v == 0.0 else str(v)  # NaN and infinities as strings
    if isinstance(v, _PRIMITIVES):
        if isinstance(v, float) and v != v or v in (float("inf"), float("-inf")):
            return str(v)
        return v
    if isinstance(v, (torch.dtype, torch.device)):
        return str(v)
    if type(v) in (tuple, list) and len(v) <= 8 and all(isinstance(x, _PRIMITIVES) for x in v):
        return list(v)
    return None


def json_args(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Optional[dict[str, Any]]:
    """The ``args`` of a record: the JSON-safe non-tensor arguments, or None if none."""
    out: dict[str, Any] = {}
    for i, a in enumerate(args):
        if not isinstance(a, torch.Tensor):
            j = json_arg(a)
            if j is not None:
                out[f"input.{i}"] = j
    for k, a in kwargs.items():
        if not isinstance(a, torch.Tensor):
            j = json_arg(a)
            if j is not None:
                out[f"input.{k}"] = j
    return out or None


class Dataflow:
    """Which captured output an input comes from (``src`` -> ``id``), per rank and step, and
    which captured tensors' records can stand for a tensor captured again.

    An input *is* a captured output when it is the same object at the same version (its
    record, with stats, can then be reused), or *shares its storage* with one whose
    version is unchanged (a view made by uncaptured code). Tensors captured but produced by
    no captured op (parameters, gradients, data) are remembered too (:meth:`remember`): the
    same object at the same version captured again (a weight recorded by its module and
    then by ``F.linear`` at mix level, a gradient read by three optimizer ops) reuses its
    record's stats, as a module's output does the stats of the op that produced it.

    The version counter misses writes made through another tensor object that shares the
    storage without sharing the counter (``p.data.add_(...)``, as older optimizers write):
    so every captured in-place write is also counted per storage (:meth:`note_write`), and a
    kept record only stands for its tensor while its storage has no write it did not see.

    A tensor of at least :data:`LAYOUT_MIN` elements is also known by the memory it reads
    (:func:`layout_key`): another tensor object over exactly the same elements -- a
    transposed or reshaped view of it, the gradient a module's backward hook re-wraps, an
    op output that aliases its input -- holds the same values while nothing was written
    there, so it reuses the statistics instead of reducing them again (half the reductions
    of a transformer step at mix level). ``permuted``: whether the element order may
    differ (statistics do not depend on it; a checksum of the bytes in C order does).
    """

    def __init__(self, permuted: bool = True) -> None:
        self._permuted = permuted
        # id(tensor) -> (weakref, id, version, what is known of it, storage, writes then)
        self._ids: dict[int, tuple[Any, int, int, Optional[Known], int, int]] = {}
        # storage -> the outputs captured over it, newest last: (weakref, id, version,
        # writes to it then). Several, since the newest may die first: a module's
        # ``x.reshape(...)`` freed while ``x`` lives on, read through an alias (a module's
        # backward hook re-wraps its inputs), must still link to ``x`` (:meth:`source`).
        self._by_storage: dict[int, list[tuple[Any, int, int, int]]] = {}
        # id(tensor) -> (weakref, version, what is known of it, storage, writes to it then)
        self._seen: dict[int, tuple[Any, int, Known, int, int]] = {}
        # storage -> captured in-place writes to it
        self._writes: dict[int, int] = {}
        # layout_key -> (weak handle on the storage, its address, version, what is known
        # of it, writes to the storage then). Each entry owns its handle (_keep_layout).
        self._layouts: dict[tuple[Any, ...], tuple[int, int, int, Known, int]] = {}
        # storage address -> (weak handle on the storage, its id in the step): the
        # ``storage`` of tensor records (:meth:`layout`), numbered in order of first sight.
        self._sids: dict[int, tuple[int, int]] = {}
        self._sid_next = 0
        # storage address -> [weak handle on the storage, captured writes to it then, a
        # weak reference to the tensor whose version counter tells a write through it
        # (None until the first read after a resize), its version then, whether such a
        # write came (the bytes are then partly set)]: memory allocated and not yet
        # written (:meth:`mark_unwritten`).
        self.fresh: dict[int, list[Any]] = {}

    def clear(self) -> None:
        self._ids.clear()
        self._by_storage.clear()
        self._seen.clear()
        self._writes.clear()
        layouts, self._layouts = self._layouts, {}
        for e in layouts.values():
            _free_weak(e[0])
        fresh, self.fresh = self.fresh, {}
        for u in fresh.values():
            _free_weak(u[0])
        sids, self._sids, self._sid_next = self._sids, {}, 0
        if _WEAK_HANDLES:
            for h, _ in sids.values():
                _free_weak(h)

    def layout(self, rec: TensorRecord, t: torch.Tensor, npu_format: Any = None) -> None:
        """Add how ``t`` lies in memory to its record (docs/format.md, "Layout"): its
        strides where it is not contiguous (``is_contiguous``), its storage offset where not
        0, the step's id of its storage (the same for every view of one storage; storages
        numbered in order of first sight, so two runs of the same code number them alike),
        and ``npu_format(t)`` (``torch_npu.get_npu_format``) for an NPU's tensor. Sparse
        tensors get none of it (nor do nested ones: the caller does not ask); a tensor
        without memory (meta, empty) no storage. ~0.5 us a tensor (docs/capture.md)."""
        if t.layout is not _STRIDED:
            return
        if not t.is_contiguous():
            rec["stride"] = tuple(t.stride())
        off = t.storage_offset()
        if off:
            rec["offset"] = off  # type: ignore[typeddict-item]  # an int outside tracing
        try:
            storage = t.untyped_storage()
            ptr = storage.data_ptr()
        except Exception:  # noqa: BLE001 - no storage after all (a wrapper subclass)
            return
        if ptr:
            sids = self._sids
            e = sids.get(ptr)
            if e is None or (_WEAK_HANDLES and _expired(e[0])):
                # New memory, or the memory of a storage freed since, given to another.
                if e is not None:
                    _free_weak(e[0])
                e = sids[ptr] = (_weak(storage) if _WEAK_HANDLES else 0, self._sid_next)
                self._sid_next += 1
            rec["storage"] = e[1]
        if npu_format is not None and t.device.type == "npu":
            try:
                rec["format"] = npu_format(t)
            except Exception:  # noqa: BLE001 - a backend that does not say
                pass

    def mark_unwritten(self, storage: Any, t: Optional[torch.Tensor] = None) -> None:
        """``storage`` was just allocated, and its bytes are whatever the allocator left:
        the result ``t`` of ``torch.empty`` and its kind, or a storage ``resize_``d (FSDP
        allocates a gathered parameter's memory so before its backward). Until something
        writes there, a tensor read over it is recorded as unwritten (:meth:`unwritten`),
        not with statistics of leftover bytes: those differ from run to run and hold
        NaN now and then, so two equal runs compared as diverging and a clean one
        scanned as producing NaN."""
        if not _WEAK_HANDLES:
            return
        try:
            ptr = int(storage.data_ptr())
            ver = t._version if t is not None else 0
        except Exception:  # noqa: BLE001 - no data (meta, size 0), or an inference tensor
            return
        if ptr == 0:
            return
        fresh = self.fresh
        if len(fresh) >= FRESH_MAX:
            # A step that allocates without end: the memory freed since is let go first,
            # then every mark (its tensors are then read as they are, as before).
            for key in [k for k, u in fresh.items() if _expired(u[0])] or list(fresh):
                _free_weak(fresh.pop(key)[0])
        old = fresh.get(ptr)
        if old is not None:
            _free_weak(old[0])
        ref = weakref.ref(t) if t is not None else None
        fresh[ptr] = [_weak(storage), self._writes.get(ptr, 0), ref, ver, False]

    def unwritten(self, t: torch.Tensor, write_only: bool = False) -> bool:
        """Whether ``t`` reads memory that nothing wrote since it was allocated.

        A captured write to the storage ends that. So does a write through the tensor
        whose counter is watched (the allocated one, or after a resize the first one read
        over it), or through a view of it, which shares its counter: an uncaptured op's
        write too (FSDP2 copies a shard into its all-gather buffer so). A tensor over the
        storage that is neither is read as it is: its writes cannot be told.
        ``write_only``: the op only writes ``t`` (a gather's output buffer): it counts as
        unwritten while part of it still is."""
        try:
            ptr = int(t.untyped_storage().data_ptr())
            base = t._base if t._base is not None else t
            ver = base._version
        except Exception:  # noqa: BLE001 - no storage (meta, sparse), an inference tensor
            return False
        e = self.fresh.get(ptr)
        if e is None:
            return False
        if _expired(e[0]) or self._writes.get(ptr, 0) != e[1]:
            del self.fresh[ptr]
            _free_weak(e[0])
            return False
        if e[2] is None:
            e[2], e[3] = weakref.ref(base), ver
        else:
            watched = e[2]()
            if watched is None:
                # The allocated tensor is gone and its memory lives on in another that
                # shares its version counter: ``nn.Parameter(torch.empty(...))``, as every
                # ``nn.Linear`` built inside a captured step makes its weight before
                # ``reset_parameters`` fills it. A write through either bumped that count.
                e[2] = weakref.ref(base)
                if ver != e[3]:
                    e[4] = True
            elif watched is not base:
                return False
            elif ver != e[3]:
                e[4] = True
        return write_only or not e[4]

    def __del__(self) -> None:
        try:
            self.clear()
        except Exception:  # noqa: BLE001 - interpreter shutdown: torch may be gone
            pass

    @staticmethod
    def _storage(t: torch.Tensor) -> Optional[int]:
        try:
            return int(t.untyped_storage().data_ptr())
        except Exception:  # noqa: BLE001 - tensors without storage (meta, sparse)
            return None

    def _memory(self, t: torch.Tensor, keyed: bool = True) -> Optional[Memory]:
        """``t``'s storage, its address, and its :func:`layout_key` when it is large enough
        to be looked up by it and ``keyed`` (else None); None for a tensor without storage
        (meta, sparse). Taken once per captured tensor: the lookup and the keeping that
        follows it both use it."""
        try:
            storage = t.untyped_storage()
            ptr = int(storage.data_ptr())
            key = (
                layout_key(t, storage._cdata, self._permuted)
                if keyed and ptr != 0 and t.numel() >= LAYOUT_MIN and _WEAK_HANDLES
                else None
            )
        except Exception:  # noqa: BLE001 - tensors without storage (meta, sparse)
            return None
        return storage, ptr, key

    def source(self, t: torch.Tensor) -> tuple[Optional[int], Optional[Known], Optional[Memory]]:
        """The id of the captured output this input value came from, if any; what is known
        of exactly this tensor (same object and version: that output's record and
        statistics, or those :meth:`remember` keeps), which can then be reused instead of
        reduced again; and its memory when it was looked up by it (for :meth:`remember`).
        An inference tensor has no version counter, so nothing is known of it."""
        try:
            ver = t._version
        except RuntimeError:  # an inference tensor (torch.inference_mode)
            return None, None, None
        writes = self._writes
        e = self._ids.get(id(t))
        if e is not None and e[0]() is t and e[2] == ver and writes.get(e[4], 0) == e[5]:
            return e[1], e[3], None
        mem = self._memory(t)
        same = self._remembered(t, ver, mem)
        if mem is None:
            return None, same, None
        ptr = mem[1]
        chain = self._by_storage.get(ptr)
        if chain is not None:
            w = writes.get(ptr, 0)
            # The newest output still alive over this memory: one alive holds the storage,
            # so its address cannot have been given to other memory meanwhile.
            for e2 in reversed(chain):
                if e2[0]() is not None:
                    if e2[2] == ver and e2[3] == w:
                        return e2[1], same, mem
                    break
        return None, same, mem

    def source_id(self, t: torch.Tensor) -> Optional[int]:
        """:meth:`source`'s id alone, without what is known of the tensor itself (a
        compiled graph's input: its statistics come from the graph), at a third of the
        cost."""
        try:
            ver = t._version
        except RuntimeError:  # an inference tensor
            return None
        writes = self._writes
        e = self._ids.get(id(t))
        if e is not None and e[0]() is t and e[2] == ver and writes.get(e[4], 0) == e[5]:
            found: Optional[int] = e[1]
            return found
        ptr = self._storage(t)
        if ptr is None:
            return None
        for e2 in reversed(self._by_storage.get(ptr, ())):  # (as in source)
            if e2[0]() is not None:
                if e2[2] == ver and e2[3] == writes.get(ptr, 0):
                    found = e2[1]
                    return found
                break
        return None

    def find(self, t: torch.Tensor) -> tuple[Optional[Known], Optional[Memory]]:
        """What is known of exactly this tensor (same object, version and storage writes),
        if it was kept, and its memory when it was looked up by it (for :meth:`register`
        or :meth:`remember`); nothing for an inference tensor."""
        try:
            ver = t._version
        except RuntimeError:  # an inference tensor
            return None, None
        e = self._ids.get(id(t))
        if e is not None and e[0]() is t and e[2] == ver and self._writes.get(e[4], 0) == e[5]:
            return e[3], None
        mem = self._memory(t)
        return self._remembered(t, ver, mem), mem

    def _remembered(self, t: torch.Tensor, ver: int, mem: Optional[Memory]) -> Optional[Known]:
        """What :meth:`remember` keeps of exactly this tensor (at version ``ver``), if it
        still stands, else what is known of a kept tensor over the same elements
        (:meth:`_same_elements`)."""
        e = self._seen.get(id(t))
        if e is not None and e[0]() is t and e[1] == ver and self._writes.get(e[3], 0) == e[4]:
            return e[2]
        return self._same_elements(ver, mem)

    def _same_elements(self, ver: int, mem: Optional[Memory]) -> Optional[Known]:
        """What is known of a kept tensor that read exactly the memory a tensor at version
        ``ver`` reads (``mem``), if nothing was written there since: the same storage (held
        weakly, so it cannot have been freed and its memory given to another tensor
        meanwhile), at the same address, at the version it was kept at, which the tensor
        has too (views share the counter), and no captured in-place write to it since."""
        if mem is None or mem[2] is None:
            return None
        e = self._layouts.get(mem[2])
        ptr = mem[1]
        if (
            e is None
            or e[1] != ptr
            or e[2] != ver
            or self._writes.get(ptr, 0) != e[4]
            or _expired(e[0])
        ):
            return None
        return e[3]

    def remember(self, t: torch.Tensor, known: Known, mem: Optional[Memory] = None) -> None:
        """Keep the record and statistics of ``t`` as it is now (a captured tensor that no
        captured op produced), for :meth:`source` and :meth:`find`. ``mem``: what
        :meth:`source` or :meth:`find` returned for it, if anything. An inference tensor
        is not kept: without a version counter, a write to it could go unseen."""
        try:
            ver = t._version
        except RuntimeError:
            return
        if mem is None:
            mem = self._memory(t)
            if mem is None:
                return
        storage, ptr, key = mem
        writes = self._writes.get(ptr, 0)
        self._seen[id(t)] = (weakref.ref(t), ver, known, ptr, writes)
        if key is not None:
            self._keep_layout(key, storage, ptr, ver, known, writes)

    def note_write(self, written: Any) -> None:
        """Count a captured in-place write to ``written`` (a tensor, or the tensors of a
        list: a collective's, a multi-tensor op's), before its op's outputs are registered.

        Over memory not written yet (:meth:`mark_unwritten`), a write to part of it leaves
        the rest unwritten, as an uncaptured write through a view does (:meth:`unwritten`):
        FSDP2's ``_foreach_copy_`` of the local shard into its half of the all-gather
        buffer, read whole by the gather, ended the mark, and the gather's record read the
        other rank's half as the allocator left it (NaN)."""
        if isinstance(written, torch.Tensor):
            ptr = self._storage(written)
            if ptr is not None:
                n = self._writes[ptr] = self._writes.get(ptr, 0) + 1
                e = self.fresh.get(ptr)
                if e is not None and not _covers(written):
                    e[1], e[4] = n, True  # partly set
        elif isinstance(written, (tuple, list)):
            for w in written:
                self.note_write(w)

    def note_storage(self, storage: Any) -> None:
        """Count a write to ``storage`` made through the storage itself (a resize, a fill),
        which no version counter sees."""
        try:
            ptr = int(storage.data_ptr())
        except Exception:  # noqa: BLE001 - a storage without data (meta)
            return
        self._writes[ptr] = self._writes.get(ptr, 0) + 1

    def register(
        self,
        t: torch.Tensor,
        folder: RankFolder,
        known: Optional[Known] = None,
        mem: Optional[Memory] = None,
        tid: Optional[int] = None,
    ) -> int:
        """Give a captured output the folder's next id (``tid``: the id it has already, a
        compiled graph's output), and remember it by object (with its record and
        statistics, when recorded) and storage (not an inference tensor's). ``mem``: what
        :meth:`find` returned for it, if anything."""
        if tid is None:
            tid = folder.next_id
            folder.next_id += 1
        try:
            ver = t._version
        except RuntimeError:
            # An inference tensor: it has its id, but no later input is linked to it (a
            # write to it could go unseen without a version counter).
            return tid
        ref = weakref.ref(t)
        if mem is None:
            mem = self._memory(t, keyed=known is not None)  # only what is known is kept
        if mem is None:
            # No storage to watch: kept by object only, with a storage key no write uses.
            self._ids[id(t)] = (ref, tid, ver, known, -1, 0)
            return tid
        storage, ptr, key = mem
        w = self._writes.get(ptr, 0)
        self._ids[id(t)] = (ref, tid, ver, known, ptr, w)
        chain = self._by_storage.get(ptr)
        if chain is None:
            self._by_storage[ptr] = [(ref, tid, ver, w)]
        elif chain[-1][0]() is t:  # written in place again (an optimizer's parameter)
            chain[-1] = (ref, tid, ver, w)
        else:
            # (the dead let go, and at most BY_STORAGE_MAX kept)
            chain[:] = [e for e in chain[1 - BY_STORAGE_MAX :] if e[0]() is not None]
            chain.append((ref, tid, ver, w))
        if known is not None and key is not None:
            self._keep_layout(key, storage, ptr, ver, known, w)
        return tid

    def _keep_layout(
        self, key: tuple[Any, ...], storage: Any, ptr: int, ver: int, known: Known, writes: int
    ) -> None:
        """Keep ``known`` under the memory a tensor reads (:meth:`_same_elements`), with a
        weak handle on its storage, freeing the handle of the entry it replaces."""
        old = self._layouts.get(key)
        self._layouts[key] = (_weak(storage), ptr, ver, known, writes)
        if old is not None:
            _free_weak(old[0])


# A weak handle on a tensor's storage (an int: the storage's weak reference count holds
# it): it tells whether the storage was freed (its memory may then be another tensor's)
# without keeping the memory alive. A gradient's tensor objects die with the hook that
# received them while its storage lives on in the views autograd hands on (a module's
# backward hook receives it again). The handle itself is not a Python object: PyTorch's
# own wrapper (``StorageWeakRef``) is two objects for the garbage collector and a Python
# ``__del__`` per tensor kept, ~1 us; without these functions tensors are only known by
# object.
_weak: Callable[[Any], int] = getattr(torch.UntypedStorage, "_weak_ref", None)  # type: ignore[assignment]
_expired: Callable[[int], bool] = getattr(torch.UntypedStorage, "_expired", None)  # type: ignore[assignment]
_free_weak: Callable[[int], None] = getattr(torch.UntypedStorage, "_free_weak_ref", None)  # type: ignore[assignment]
_WEAK_HANDLES = _weak is not None and _expired is not None and _free_weak is not None

#: The most allocations a step keeps marked as unwritten (``Dataflow.mark_unwritten``).
FRESH_MAX = 1 << 14
#: Outputs kept per storage for :meth:`Dataflow.source`: a storage read through several
#: live views is rare past a handful.
BY_STORAGE_MAX = 8

#: Tensors of fewer elements are not looked up by the memory they read: their reductions
#: cost about what the lookup would (~2 us).
LAYOUT_MIN = 1 << 12


def _covers(t: torch.Tensor) -> bool:
    """Whether ``t`` spans its whole storage (a write to it sets every byte there)."""
    try:
        return bool(
            t.storage_offset() == 0
            and t.is_contiguous()
            and t.numel() * t.element_size() >= t.untyped_storage().nbytes()
        )
    except Exception:  # noqa: BLE001 - no storage (meta, sparse)
        return True


def layout_key(t: torch.Tensor, storage: int, permuted: bool) -> tuple[Any, ...]:
    """What identifies the elements ``t`` reads: its storage (``_cdata``), offset, dtype and
    the runs of memory it reads (``stats.memory_runs``)."""
    return (storage, t.storage_offset(), t.dtype, tuple(memory_runs(t, permuted)))
