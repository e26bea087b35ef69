"""The capture agent: hooks PyTorch between ``start()`` and ``stop()`` and writes a probe dump.

One module per concern, in layers (each imports only from the layers below it; checked by
``lint-imports``, pyproject.toml):

- the facade: ``profiler`` (``ApiProfiler``, the tutorial's start/stop/save over a
  Debugger), ``debugger`` (the ``Debugger``: step lifecycle, failure switch; ``seed_all``),
  ``iterations`` (automatic iteration counting: optimizer steps, else model forwards);
- the hooks, each given the capture's narrow context (``context.HookContext``), never the
  Debugger: ``api`` (the capture of one call of a hooked API), ``patcher`` (the hooked API
  list, the wrappers, installed through ``probe._patch``, and the dispatch to the running
  capture), ``modules`` (forward hooks on submodules: module records, the module path of
  API calls), ``ddp`` (DDP's communication hook), ``backward`` (autograd node hooks: backward
  records; parameter gradient hooks), ``waits`` (records of collectives whose result
  arrives after the call);
- ``context``: what a hook may use (recorder, lock, guard, selection, state flags);
- ``recorder``: what every captured tensor becomes (record, statistics, data, dataflow)
  and how a finished record reaches the dump;
- data: ``records`` (op and tensor records, nested-argument walking, dataflow ids),
  ``selection`` (steps, ranks, op/module filters, api_list, scope window, call counters),
  ``collectives`` (``group``/``coll_seq``), ``flight`` (dump on trigger: the last steps
  held in memory, written when a trigger fires), ``stacks`` (``stacks.jsonl``), ``buffer``
  (finished records whose statistics are still on the device), ``writer`` (manifest,
  ``ops.jsonl``, safetensors shards), ``stats`` (statistics, checksums, dtype names),
  ``fused`` and ``native`` (the CUDA and CPU statistics kernels);
- leaves, importing nothing else of the agent: ``threadstate`` (the per-thread capture
  flag; autograd's and torch.func's state), ``compiled`` (staying out of torch.compile's
  way), ``inplace`` (which argument an in-place call writes).
"""

from __future__ import annotations

from .debugger import Debugger, seed_all
from .profiler import ApiProfiler

__all__ = ["ApiProfiler", "Debugger", "seed_all"]
