"""The capture agent: hooks PyTorch between ``start()`` and ``stop()`` and writes a probe dump.

One module per concern:

- ``debugger``: the ``Debugger`` facade (step lifecycle, failure switch, the path of a
  captured tensor: record -> statistics -> writer) and ``seed_all``;
- ``profiler``: ``ApiProfiler``, the tutorial's start/stop/save facade over a Debugger;
- ``iterations``: automatic iteration counting (optimizer steps, else model forwards);
- ``selection``: steps, ranks, op/module filters, api_list, scope window, per-step call
  counters;
- ``api``: the hooked API list, its wrappers (installed through ``probe._patch``) and the
  capture of one API call;
- ``modules``: forward hooks on submodules (module records, the module path of API calls);
- ``backward``: autograd node hooks (backward records) and parameter gradient hooks;
- ``stacks``: deduplicated call stacks (``stacks.jsonl``);
- ``records``: op and tensor records, nested-argument walking, dataflow ids;
- ``stats``: on-device statistics, checksums, dtype names;
- ``writer``: manifest, ``ops.jsonl``, background safetensors shard writer.
"""

from __future__ import annotations

from .debugger import Debugger, seed_all
from .profiler import ApiProfiler

__all__ = ["ApiProfiler", "Debugger", "seed_all"]
