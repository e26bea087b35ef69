"""Collective metadata on ``Distributed.*`` records: the process group and the collective's
position among that group's collectives in the step.

Why (docs/format.md): every ``Distributed.<name>.<call>.forward`` record gets ``group`` (the
global ranks of its process group, ascending; the default group gives all ranks) and
``coll_seq`` (the position of this collective among the collectives of that group in the
step, from 0). Every rank of a group issues the group's collectives in the same order
(torch.distributed requires it), so the same ``coll_seq`` names the same collective on every
rank of the group: that is what pairs them across ranks. Point-to-point calls (``send``,
``recv``, ``isend``, ``irecv``) get ``group`` = ``[sender, receiver]`` and a sequence per
ordered rank pair, so that a send and its matching receive carry the same ``group`` and
``coll_seq``.
"""

from __future__ import annotations

import inspect
from typing import Any, Callable, Optional

_P2P = {"send", "recv", "isend", "irecv"}
#: The API calls that carry no collective metadata (a list of P2POp: each op has its own
#: peer and group; the batch as a whole has neither).
_NO_META = {"batch_isend_irecv"}


def _dist() -> Any:
    import torch.distributed as dist

    return dist


def group_ranks(group: Any) -> Optional[list[int]]:
    """The global ranks of ``group`` (None: the default group), ascending, or None when
    torch.distributed is not initialised."""
    dist = _dist()
    if not (dist.is_available() and dist.is_initialized()):
        return None
    if group is None or group is dist.group.WORLD:
        return list(range(dist.get_world_size()))
    if isinstance(group, list) and all(isinstance(r, int) for r in group):
        return sorted(group)  # (the functional collectives take ranks too)
    if not isinstance(group, dist.ProcessGroup):
        # A functional collective's (mesh, dim), a 1-D DeviceMesh or a group's name.
        try:
            from torch.distributed import _functional_collectives as funcol
            from torch.distributed import distributed_c10d as c10d

            resolve = c10d._resolve_process_group  # type: ignore[attr-defined]
            group = resolve(funcol._resolve_group_name(group))
        except Exception:  # noqa: BLE001 - a form this PyTorch does not resolve: no group
            return None
    return sorted(int(r) for r in dist.get_process_group_ranks(group))


class Collectives:
    """Per-step sequence numbers of collectives, per process group and per p2p rank pair."""

    def __init__(self) -> None:
        self._seq: dict[tuple[Any, ...], int] = {}
        self._sigs: dict[Callable[..., Any], Optional[inspect.Signature]] = {}

    def new_step(self) -> None:
        self._seq.clear()

    def next_seq(self, key: tuple[Any, ...]) -> int:
        n = self._seq.get(key, 0)
        self._seq[key] = n + 1
        return n

    def _bind(
        self, name: str, orig: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> dict[str, Any]:
        # By function: torch.distributed's all_reduce and the functional one share a name.
        if orig not in self._sigs:
            try:
                self._sigs[orig] = inspect.signature(orig)
            except (TypeError, ValueError):
                self._sigs[orig] = None
        sig = self._sigs[orig]
        if sig is None:
            return dict(kwargs)
        try:
            return dict(sig.bind_partial(*args, **kwargs).arguments)
        except TypeError:
            return dict(kwargs)

    def meta(
        self, api: str, orig: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> Optional[tuple[list[int], int]]:
        """``(group, coll_seq)`` of one call of ``Distributed.<name>`` (None: none known)."""
        name = api.split(".", 1)[1]
        if name in _NO_META:
            return None
        bound = self._bind(name, orig, args, kwargs)
        group = bound.get("group")
        dist = _dist()
        if not (dist.is_available() and dist.is_initialized()):
            return None
        if name in _P2P:
            me = int(dist.get_rank())
            sends = name in ("send", "isend")
            peer = bound.get("dst" if sends else "src")
            gpeer = bound.get("group_dst" if sends else "group_src")
            if peer is None and gpeer is not None and group is not None:
                peer = dist.get_global_rank(group, int(gpeer))
            if peer is None:
                # recv from any source: the sender is only known afterwards.
                return [me], self.next_seq(("p2p", None, me))
            # [sender, receiver], numbered per ordered pair: a send and the recv that
            # matches it (point-to-point messages between two ranks arrive in order) get
            # the same group and coll_seq on the two ranks.
            pair = [me, int(peer)] if sends else [int(peer), me]
            return pair, self.next_seq(("p2p", *pair))
        ranks = group_ranks(group)
        if ranks is None:
            return None
        return ranks, self.next_seq(("group", *ranks))
