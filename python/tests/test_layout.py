"""Layout evidence in tensor records (docs/format.md, "Layout") and compare telling it at the
op it names (docs/compare.md, "Layout evidence")."""

from __future__ import annotations

import os
from typing import Any, Callable

import pytest
import torch

import probe
from conftest import compare_summary, read_ops, run_agent_script
from probe.capture.records import Dataflow


def _capture(dump: str, fn: Callable[[], Any]) -> dict[str, dict[str, Any]]:
    """Run ``fn`` under an API-level capture; its tensor records by name."""
    dbg = probe.Debugger(None, dump_path=dump, level="api")
    dbg.start()
    fn()
    dbg.stop()
    dbg.close()
    ops = read_ops(os.path.join(dump, "step0", "rank0"))
    return {t["name"]: t for o in ops for t in o["tensors"]}


def _views() -> None:
    torch.manual_seed(0)
    x = torch.randn(4, 6)
    torch.neg(x.t())  # a transposed view: strides, x's storage
    torch.neg(x[1:])  # a contiguous slice: an offset, x's storage
    torch.neg(x[:, 2:])  # neither: both
    torch.neg(x.view(6, 4))  # a contiguous view of all of it
    torch.neg(torch.randn(2, 1, 3).transpose(0, 1))  # contiguous after all (a size-1 dim)
    y = torch.randn(3)
    y.add_(1)  # in place: the output is its input's storage


def test_records_say_how_tensors_lie_in_memory(tmp_path: Any) -> None:
    recs = _capture(str(tmp_path / "a"), _views)
    layout = {
        n: {k: t[k] for k in ("stride", "offset", "storage") if k in t}
        for n, t in recs.items()
        if n.startswith(("Torch.neg", "Tensor.add_"))
    }
    x = layout["Torch.neg.0.forward.input.0"]["storage"]
    assert layout["Torch.neg.0.forward.input.0"] == {"stride": [1, 6], "storage": x}
    assert layout["Torch.neg.1.forward.input.0"] == {"offset": 6, "storage": x}
    assert layout["Torch.neg.2.forward.input.0"] == {"stride": [6, 1], "offset": 2, "storage": x}
    assert layout["Torch.neg.3.forward.input.0"] == {"storage": x}
    assert "stride" not in layout["Torch.neg.4.forward.input.0"]
    # Outputs are memory of their own; an in-place op's output is its input's.
    outs = [layout[f"Torch.neg.{i}.forward.output.0"]["storage"] for i in range(5)]
    assert len(set(outs + [x])) == 6
    add = layout["Tensor.add_.0.forward.input.0"]["storage"]
    assert layout["Tensor.add_.0.forward.output.0"]["storage"] == add
    assert add not in outs + [x]
    # Keys after the shape, before the statistics (docs/format.md).
    keys = list(recs["Torch.neg.2.forward.input.0"])
    assert keys.index("shape") < keys.index("stride") < keys.index("offset")
    assert keys.index("storage") < keys.index("stats")


def test_storage_ids_are_the_same_in_two_runs(tmp_path: Any) -> None:
    def ids(d: str) -> list[tuple[str, Any]]:
        return sorted((n, t.get("storage")) for n, t in _capture(d, _views).items())

    assert ids(str(tmp_path / "a")) == ids(str(tmp_path / "b"))


def test_tensors_without_a_plain_layout() -> None:
    flow = Dataflow()
    x = torch.randn(4, 6)
    cases: list[tuple[torch.Tensor, dict[str, Any]]] = [
        (x.to_sparse(), {}),  # sparse: nothing
        (torch.empty(2, 3, device="meta").t(), {"stride": (1, 3)}),  # no memory: no storage
        (torch.empty(0, 3), {}),  # empty: no memory either
    ]
    for t, want in cases:
        rec: Any = {}
        flow.layout(rec, t)
        assert rec == want, t
    # A storage freed and its address given to another is another storage.
    a: Any = {}
    b: Any = {}
    t = torch.randn(1000)
    flow.layout(a, t)
    del t
    flow.layout(b, torch.randn(1000))
    assert a["storage"] != b["storage"]


SCRIPT = r"""
import sys, torch, torch.nn as nn, torch.nn.functional as F
import probe

dump, bug = sys.argv[1], sys.argv[2] == "1"

def row_major(shape):
    strides, n = [], 1
    for d in reversed(shape):
        strides.append(n)
        n *= d
    return tuple(reversed(strides))

def head_norm(h):
    # A device kernel that reads its input's memory in row-major order, as kernels that
    # take a pointer do: right for a contiguous tensor, wrong for a view.
    raw = torch.as_strided(h, h.shape, row_major(h.shape), h.storage_offset())
    return raw * torch.rsqrt(raw.pow(2).mean(-1, keepdim=True) + 1e-6)

class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(8, 16)
        self.fc2 = nn.Linear(16, 4)

    def forward(self, x):
        h = self.fc1(x).view(-1, 4, 4).transpose(1, 2)  # heads last
        if not bug:
            h = h.contiguous()  # the port drops this copy
        h = head_norm(h).reshape(-1, 16)
        return self.fc2(F.gelu(h))

torch.manual_seed(0)
net = Net()
opt = torch.optim.SGD(net.parameters(), lr=0.1)
x, y = torch.randn(6, 8), torch.randint(0, 4, (6,))
# Tensor mode: the kernel's output is its input's values in another order, which
# statistics do not see.
dbg = probe.Debugger(None, dump_path=dump, level="api", mode="tensor")
dbg.start(net)
loss = F.cross_entropy(net(x), y)
loss.backward()
opt.step()
dbg.stop()
dbg.close()
"""


def test_compare_names_the_op_and_its_layout_difference(tmp_path: Any) -> None:
    dumps = {}
    for name, bug in (("bench", "0"), ("cmp", "1")):
        dumps[name] = str(tmp_path / name)
        r = run_agent_script(SCRIPT, dumps[name], bug)
        assert r.returncode == 0, r.stderr
    code, s = compare_summary(dumps["bench"], dumps["cmp"], str(tmp_path / "out"))
    assert code == 1
    f = s["first_divergent"]["forward"]
    assert f["op"].startswith("Torch.as_strided."), f
    assert f["layout"] == [
        "cmp input.0 is a non-contiguous view (stride [16, 1, 4]) where bench is contiguous"
    ], f
    assert "non-contiguous view" in s["headline"]


@pytest.mark.parametrize("mode", ["checksum", "overflow"])
def test_other_modes_record_layouts_too(tmp_path: Any, mode: str) -> None:
    dump = str(tmp_path / "d")
    dbg = probe.Debugger(None, dump_path=dump, level="api", mode=mode)
    dbg.start()
    x = torch.randn(4, 6)
    y = torch.log(x.t() - 10)  # NaN from a view: recorded in overflow mode too
    dbg.stop()
    dbg.close()
    del y
    ops = read_ops(os.path.join(dump, "step0", "rank0"))
    recs = {t["name"]: t for o in ops for t in o["tensors"]}
    t = recs["Torch.log.0.forward.input.0"]
    # (An elementwise op's result keeps its input's order of dimensions in memory.)
    assert t["stride"] == [1, 6] and isinstance(t["storage"], int)
    sub = [n for n in recs if n.startswith("Tensor.__sub__") and n.endswith("input.0")]
    if mode != "overflow":
        assert recs[sub[0]]["stride"] == [1, 6]
