"""The buffered statistics path (capture/buffer.py) loses, reorders and misreads nothing.

An accelerator's statistics are stacked on the device and read in batches (every ``limit``
ops and at ``stop()``), so a record is written long after its op ran; CPU statistics are
read at once and their records written in the same batches. ``READ_ON_CPU`` off runs the
accelerator's path on CPU. These tests drive op sequences
through several flushes, with tensors modified in place right after being captured, and check
every record against values computed independently here at the time of the call.
"""

from __future__ import annotations

import math
import os
from typing import Any, Optional

import pytest
import torch

import probe
from conftest import read_ops
from probe.capture import stats as stats_mod
from probe.capture.buffer import StatsBuffer


def _expected(t: torch.Tensor) -> dict[str, Any]:
    """The stats a record must hold for ``t`` as it is now (same reductions as the agent)."""
    with torch.no_grad():
        t = t.detach().clone()
        tf = t if t.dtype in (torch.float32, torch.float64) else t.to(torch.float64)
        mn, mx = torch.aminmax(tf)
        total = torch.sum(tf)
        norm = torch.linalg.vector_norm(tf)
        nan = int(torch.isnan(t).sum()) if t.is_floating_point() else 0
        inf = int(torch.isinf(t).sum()) if t.is_floating_point() else 0

    def num(v: float) -> Any:
        if math.isnan(v):
            return "nan"
        if math.isinf(v):
            return "inf" if v > 0 else "-inf"
        return v

    return {
        "max": num(mx.item()),
        "min": num(mn.item()),
        "mean": num(total.item() / max(1, t.numel())),
        "norm": num(norm.item()),
        "nan": nan,
        "inf": inf,
    }


def _close(got: dict[str, Any], want: dict[str, Any]) -> None:
    """Stats of the same elements, summed in another order or by the native kernel
    (native.py): max, min and counts exact, the sums within float32 rounding (1e-6)."""
    assert (got["max"], got["min"], got["nan"], got["inf"]) == (
        want["max"],
        want["min"],
        want["nan"],
        want["inf"],
    ), (got, want)
    for k in ("mean", "norm"):
        if isinstance(want[k], str) or isinstance(got[k], str):  # "nan", "inf"
            assert got[k] == want[k], (k, got, want)
        else:
            assert abs(got[k] - want[k]) <= 1e-6 * max(1.0, abs(want[k])), (k, got, want)


def _torch_reductions(monkeypatch: Any) -> None:
    """Statistics by PyTorch's reductions only (no native kernel): for tests that compare
    the read paths byte for byte, which the kernel's last bits would not match."""
    monkeypatch.setattr(stats_mod, "NATIVE", None)
    monkeypatch.setattr(stats_mod, "_native_tried", True)


def _run(
    dump: str, limit: int, mode: str = "statistics"
) -> tuple[list[dict[str, Any]], list[tuple[str, str, Any]]]:
    """An op sequence with in-place changes right after each capture; returns the records
    and, per captured tensor, (op key prefix, tensor name suffix, expected stats)."""
    dbg = probe.Debugger(None, dump_path=dump, level="api", stack=False, mode=mode)
    dbg._recorder.pending.limit = limit
    expected: list[tuple[str, str, Any]] = []
    g = torch.Generator().manual_seed(7)
    x = torch.randn(64, generator=g)
    dbg.start()
    counts: dict[str, int] = {}

    def key(api: str) -> str:
        n = counts.get(api, 0)
        counts[api] = n + 1
        return f"{api}.{n}.forward"

    for i in range(40):
        # y is a fresh output; its stats must be those before the in-place ops below.
        before = _expected(x)
        y = torch.mul(x, 1.5)
        k = key("Torch.mul")
        expected.append((k, "input.0", before))
        expected.append((k, "output.0", _expected(y)))
        # In place right after: input.0 is y as mul made it, output.0 as add_ leaves it.
        pre = _expected(y)
        y.add_(float(i))
        k = key("Tensor.add_")
        expected.append((k, "input.0", pre))
        expected.append((k, "output.0", _expected(y)))
        if i % 7 == 3:
            # NaN and Inf written in place, then cleaned in place: the counts of each version.
            y[0] = float("nan")
            k_set = key("Tensor.__setitem__")
            y[1] = float("inf")
            k_set2 = key("Tensor.__setitem__")
            pre = _expected(y)
            expected.append((k_set2, "output.0", pre))
            y.nan_to_num_(nan=0.0, posinf=1.0)
            k = key("Tensor.nan_to_num_")
            expected.append((k, "input.0", pre))
            expected.append((k, "output.0", _expected(y)))
            assert pre["nan"] == 1 and pre["inf"] == 1
            del k_set
        x = torch.tanh(y)
        k = key("Torch.tanh")
        expected.append((k, "output.0", _expected(x)))
    dbg.stop()
    dbg.step()
    dbg.close()
    return read_ops(os.path.join(dump, "step0", "rank0")), expected


@pytest.mark.parametrize("read_on_cpu", [True, False])
@pytest.mark.parametrize("limit", [1, 3, 7, 256])
def test_buffered_records_are_complete_ordered_and_taken_before_inplace_changes(
    tmp_path: Any, limit: int, read_on_cpu: bool, monkeypatch: Any
) -> None:
    # Off: CPU statistics take the accelerator's path (stacked and read per batch).
    monkeypatch.setattr(stats_mod, "READ_ON_CPU", read_on_cpu)
    ops, expected = _run(str(tmp_path / f"dump{limit}"), limit)
    # Every op, in call order, numbered without gaps.
    assert [op["seq"] for op in ops] == list(range(len(ops)))
    keys = [op["op"] for op in ops]
    order = []
    for k, _, _ in expected:
        if k not in order:
            order.append(k)
    assert [k for k in keys if k in set(order)] == order
    by_name = {t["name"]: t for op in ops for t in op["tensors"]}
    for k, suffix, stats in expected:
        _close(by_name[f"{k}.{suffix}"]["stats"], stats)


def test_flush_limit_and_read_path_do_not_change_the_dump(tmp_path: Any, monkeypatch: Any) -> None:
    """A flush every op and one per step write byte-identical op logs, whether CPU
    statistics are read at once or stacked and read per batch like an accelerator's (with
    PyTorch's reductions; the native kernel's flushes are checked against each other)."""
    native = []
    for limit in (1, 5, 100000):
        d = str(tmp_path / f"native{limit}")
        _run(d, limit)
        with open(os.path.join(d, "step0", "rank0", "ops.jsonl"), "rb") as fh:
            native.append(fh.read())
    assert all(t == native[0] for t in native)
    _torch_reductions(monkeypatch)
    texts = []
    for read_on_cpu in (True, False):
        monkeypatch.setattr(stats_mod, "READ_ON_CPU", read_on_cpu)
        for limit in (1, 5, 100000):
            d = str(tmp_path / f"d{limit}{read_on_cpu}")
            _run(d, limit)
            with open(os.path.join(d, "step0", "rank0", "ops.jsonl"), "rb") as fh:
                texts.append(fh.read())
    assert len(texts) == 6 and all(t == texts[0] for t in texts)


def test_checksums_taken_later_read_the_bytes_as_they_were_captured(
    tmp_path: Any, monkeypatch: Any
) -> None:
    """Checksum mode on an accelerator checksums a host copy once its batch has landed
    (no host sync per tensor); run on CPU with ``READ_ON_CPU`` off, its op logs are
    byte-identical to those of checksums taken at once, although every tensor is changed in
    place right after it is captured, and each checksum is that of the bytes the op saw."""
    import zlib

    _torch_reductions(monkeypatch)  # the statistics read at once and later: the same bits
    texts = []
    for read_on_cpu, cap in ((True, None), (False, None), (False, 1)):
        monkeypatch.setattr(stats_mod, "READ_ON_CPU", read_on_cpu)
        if cap is not None:
            # Pending copies past the cap: every record is written at once, waiting.
            monkeypatch.setattr(StatsBuffer, "MAX_COPY_BYTES", cap)
        for limit in (1, 5, 100000):
            d = str(tmp_path / f"d{limit}{read_on_cpu}{cap}")
            ops, _ = _run(d, limit, mode="checksum")
            with open(os.path.join(d, "step0", "rank0", "ops.jsonl"), "rb") as fh:
                texts.append(fh.read())
            by_name = {t["name"]: t for op in ops for t in op["tensors"]}
            assert all(t["checksum"].startswith("crc32:") for t in by_name.values())
            # The first add_ is y = x * 1.5 plus 0.0, its output the same values.
            x = torch.randn(64, generator=torch.Generator().manual_seed(7))
            y = torch.mul(x, 1.5)
            crc = "crc32:%08x" % (zlib.crc32(y.numpy().tobytes()) & 0xFFFFFFFF)
            assert by_name["Tensor.add_.0.forward.input.0"]["checksum"] == crc
            assert by_name["Tensor.add_.0.forward.output.0"]["checksum"] == crc
    assert len(texts) == 9 and all(t == texts[0] for t in texts)
    assert b'"checksum":"crc32:' in texts[0]


def test_host_copies_awaiting_their_checksums_are_bounded(monkeypatch: Any) -> None:
    """Records holding more host copies than ``MAX_COPY_BYTES`` are written at once (the
    wait is counted), however few ops are pending; below it they wait for their batch."""
    folder = _Folder()
    buf = StatsBuffer(limit=1000)
    monkeypatch.setattr(StatsBuffer, "MAX_COPY_BYTES", 3 * 400)
    for i in range(10):
        copy = torch.full((100,), float(i))  # 400 bytes
        rec = {"seq": 0, "op": f"op{i}", "tensors": [{"checksum": copy}]}
        buf.add(folder, rec, [], [], rec["tensors"])
    # The 4th copy passed the cap: 4 written, then 4 more; 2 pending.
    assert [r["op"] for r in folder.written] == [f"op{i}" for i in range(8)]
    assert buf.waits == 2 and len(buf) == 2
    buf.flush()
    assert len(folder.written) == 10
    from probe.capture.stats import crc32_of

    for i, r in enumerate(folder.written):
        assert r["tensors"][0]["checksum"] == crc32_of(torch.full((100,), float(i)))


class _Folder:
    """Stands in for a RankFolder: collects what is written, can fail at one record."""

    def __init__(self, fail_at: Optional[int] = None) -> None:
        self.written: list[dict[str, Any]] = []
        self.fail_at = fail_at

    def write_op(self, record: dict[str, Any]) -> None:
        if self.fail_at is not None and len(self.written) == self.fail_at:
            raise OSError(28, "No space left on device")
        self.written.append(record)


def _item(folder: Any, i: int) -> tuple[Any, dict[str, Any], list[Any], list[torch.Tensor]]:
    stats: dict[str, Any] = {}
    rec = {"seq": 0, "op": f"op{i}", "tensors": [{"stats": stats}]}
    vec = torch.tensor([float(i), -float(i), 2.0 * i, float(i) + 0.5])
    if i % 2:
        vec = vec.to(torch.float64)  # mixed dtypes across ops promote losslessly
    return folder, rec, [(stats, 4, 2, vec.device)], [vec]


def test_stats_buffer_writes_in_order_with_one_batch_in_flight() -> None:
    folder = _Folder()
    buf = StatsBuffer(limit=4)
    for i in range(10):
        buf.add(*_item(folder, i))
        # At most one full batch waits for the next flush, besides the open one.
        assert len(buf) <= 8
    assert len(folder.written) == 4  # batch 0-3 written when batch 4-7 was launched
    buf.flush()
    assert [r["op"] for r in folder.written] == [f"op{i}" for i in range(10)]
    for i, r in enumerate(folder.written):
        assert r["tensors"][0]["stats"] == {
            "max": float(i),
            "min": -float(i),
            "mean": float(i),
            "norm": float(i) + 0.5,
            "nan": 0,
            "inf": 0,
        }
    assert len(buf) == 0


class _Dev:
    """A device key of its own (the buffer groups parts by device), read like the CPU."""

    type = "cpu"


def test_stats_buffer_groups_the_parts_of_an_op_across_devices() -> None:
    """An op whose tensors lie on two devices (a copy between them) has its parts stacked
    with each device's, and every tensor still gets its own numbers."""
    folder = _Folder()
    buf = StatsBuffer(limit=3)
    other = _Dev()
    expect = []
    for i in range(7):
        a: dict[str, Any] = {}
        b: dict[str, Any] = {}
        va = [float(i), -1.0 - i, 4.0 * i, 10.0 + i]
        vb = [100.0 + i, 50.0, 300.0, 7.0 * i, 0.0, 2.0]
        parts = [torch.tensor(va), torch.tensor(vb)]
        dev_b = other if i % 2 else torch.device("cpu")
        rec = {"op": f"op{i}", "tensors": [{"stats": a}, {"stats": b}]}
        buf.add(folder, rec, [(a, 4, 2, torch.device("cpu")), (b, 6, 3, dev_b)], parts)
        expect.append(
            (
                {"max": va[0], "min": va[1], "mean": va[2] / 2, "norm": va[3], "nan": 0, "inf": 0},
                {"max": vb[0], "min": 50.0, "mean": 100.0, "norm": vb[3], "nan": 0, "inf": 2},
            )
        )
    buf.flush()
    got = [(r["tensors"][0]["stats"], r["tensors"][1]["stats"]) for r in folder.written]
    assert got == expect


def test_stats_buffer_reads_fused_slots_from_their_slabs(monkeypatch: Any) -> None:
    """Fused CUDA statistics lie in slab slots (fused.py), read here from CPU slabs: every
    slot taken before a flush is read from its retired slab, including slabs that filled
    up in the middle of a batch and a slot reused by an op finished batches later (a tensor
    captured again), NaN included."""
    from probe.capture import fused

    monkeypatch.setattr(fused.Slab, "CAP", 4)
    folder = _Folder()
    buf = StatsBuffer(limit=3)
    cpu = torch.device("cpu")
    expect = []
    early: Any = None
    for i in range(11):
        slab, k = fused.slot(cpu)
        assert slab.buf is not None
        nan = 1.0 if i == 5 else 0.0
        extreme = math.nan if nan else float(i)  # as the kernel writes them
        row = [extreme, -extreme, 4.0 * i, i + 0.5, nan, float(i % 3 == 0)]
        slab.buf[k * 6 : (k + 1) * 6] = torch.tensor(row, dtype=torch.float64)
        a: dict[str, Any] = {}
        fills = [(a, 6, 2, cpu)]
        parts: list[Any] = [(slab, k)]
        want = [
            {
                "max": "nan" if nan else float(i),
                "min": "nan" if nan else -float(i),
                "mean": 2.0 * i,
                "norm": i + 0.5,
                "nan": int(nan),
                "inf": int(i % 3 == 0),
            }
        ]
        if i == 1:
            early = (slab, k), want[0]
        if i == 9:
            b: dict[str, Any] = {}
            fills.append((b, 6, 2, cpu))
            parts.append(early[0])
            want.append(early[1])
        rec = {"op": f"op{i}", "tensors": [{"stats": d} for d, _, _, _ in fills]}
        buf.add(folder, rec, fills, parts)
        expect.append(want)
    buf.flush()
    assert [[t["stats"] for t in r["tensors"]] for r in folder.written] == expect
    assert not fused._open and not fused._full


def test_stats_buffer_drops_what_follows_a_failed_write() -> None:
    folder = _Folder(fail_at=5)
    buf = StatsBuffer(limit=4)
    for i in range(7):
        buf.add(*_item(folder, i))
    with pytest.raises(OSError):
        buf.flush()
    assert [r["op"] for r in folder.written] == [f"op{i}" for i in range(5)]
    assert len(buf) == 0
    buf.flush()  # nothing left, nothing raised
    assert len(folder.written) == 5


def test_late_gradient_after_stop_is_written(tmp_path: Any) -> None:
    """A backward that runs after stop() (before step()) still reaches the op log."""
    dump = str(tmp_path / "late")
    dbg = probe.Debugger(None, dump_path=dump, level="api", stack=False)
    w = torch.randn(4, requires_grad=True)
    dbg.start()
    loss = torch.mul(w, 2.0).sum()
    dbg.stop()
    loss.backward()
    dbg.step()
    dbg.close()
    ops = read_ops(os.path.join(dump, "step0", "rank0"))
    assert [op["seq"] for op in ops] == list(range(len(ops)))
    assert [op["op"] for op in ops] == [
        "Torch.mul.0.forward",
        "Tensor.sum.0.forward",
        "Tensor.sum.0.backward",
        "Torch.mul.0.backward",
    ]
    grad = {t["name"]: t for t in ops[3]["tensors"]}["Torch.mul.0.backward.output.0"]
    assert grad["stats"] == _expected(torch.full((4,), 2.0))


def test_op_log_reads_the_same_with_and_without_orjson(tmp_path: Any, monkeypatch: Any) -> None:
    """orjson (the fast encoder) and the json module write numbers differently (``0.00001``
    / ``1e-05``) but every record must read back to the same values; without orjson the
    agent falls back to json."""
    from probe.capture import writer

    dumps = writer._orjson_dumps
    assert dumps is not None, "orjson is a dependency of the agent"
    calls = []

    def counted(record: Any, option: int = 0) -> bytes:
        calls.append(1)
        return dumps(record, option=option)

    monkeypatch.setattr(writer, "_orjson_dumps", counted)
    fast, expected = _run(str(tmp_path / "fast"), 7)
    assert len(calls) == len(fast) > 100
    monkeypatch.setattr(writer, "_orjson_dumps", None)
    slow, _ = _run(str(tmp_path / "slow"), 7)
    assert fast == slow
    by_name = {t["name"]: t for op in fast for t in op["tensors"]}
    for k, suffix, stats in expected:
        _close(by_name[f"{k}.{suffix}"]["stats"], stats)


def test_record_orjson_refuses_is_written_by_json() -> None:
    """An integer argument beyond 64 bits (orjson's limit) still gets its line."""
    import json

    from probe.capture import writer

    record = {"seq": 3, "op": "Torch.full.0.forward", "args": {"input.1": 2**70, "input.2": 1e-05}}
    line = writer._encode_record(record)
    assert line.endswith(b"\n") and line.count(b"\n") == 1
    assert json.loads(line) == record
    small = {"seq": 1, "op": "é", "args": {"input.1": 1e-05, "input.2": [1, 2]}}
    assert json.loads(writer._encode_record(small)) == small


@pytest.mark.parametrize(
    "view,dense",
    [
        (lambda b: b, True),
        (lambda b: b.permute(0, 2, 3, 1), True),  # channels-last
        (lambda b: b.transpose(1, 2), True),  # attention heads
        (lambda b: b.reshape(20, 42).t(), True),
        (lambda b: b[:1].transpose(0, 3), True),  # a size-1 dimension among them
        (lambda b: b[:, ::2], False),  # gaps
        (lambda b: b[..., :3], False),
        (lambda b: b[:1].expand(3, 5, 6, 7), False),  # elements repeated
        (lambda b: b.reshape(-1)[50:150], True),  # a contiguous part, past the start
        (lambda b: b[2:].transpose(1, 2), True),  # permuted, past the start
    ],
)
def test_dense_span_is_the_memory_of_exactly_the_tensor(view: Any, dense: bool) -> None:
    """The fused CUDA statistics reduce a transposed or permuted tensor in memory order
    (``stats.dense_span``): its span must hold exactly the tensor's elements, and any
    layout with gaps or repeats must be refused."""
    from probe.capture.stats import dense_span

    base = torch.arange(4 * 5 * 6 * 7, dtype=torch.float32).reshape(4, 5, 6, 7)
    t = view(base)
    span = dense_span(t)
    if not dense:
        assert span is None
        return
    assert span is not None and span.is_contiguous() and span.numel() == t.numel()
    assert sorted(span.tolist()) == sorted(t.reshape(-1).tolist())


@pytest.mark.parametrize(
    "shape,view,dtype",
    [
        ((16, 64, 8, 8), lambda b: b.permute(0, 2, 3, 1), torch.float32),  # channels-last
        ((4, 32, 8, 16), lambda b: b.transpose(1, 2), torch.float32),  # attention heads
        ((16, 16, 3, 4, 8), lambda b: b.permute(2, 0, 3, 1, 4)[1], torch.float32),  # not dense
        ((64, 64), lambda b: b[::3, 1::2], torch.float64),
        ((8, 8), lambda b: b.t(), torch.float16),
    ],
)
def test_stats_of_non_contiguous_tensors_match_their_contiguous_copy(
    shape: tuple[int, ...], view: Any, dtype: torch.dtype
) -> None:
    """Non-contiguous tensors take amax/amin instead of aminmax (which walks them element by
    element); max and min must be those of the same values laid out contiguously, and NaN
    and Inf must still be counted."""
    from probe.capture.stats import finish_stats, stat_vector

    for poison in (None, float("nan"), float("-inf")):
        base = torch.randn(*shape, generator=torch.Generator().manual_seed(3)).to(dtype)
        if poison is not None:
            base.view(-1)[base.numel() // 2 + 1] = poison
        t = view(base)
        assert not t.is_contiguous()
        vec = stat_vector(t)
        assert vec is not None
        got = finish_stats([float(v) for v in vec], t.numel(), t)
        want = _expected(t.contiguous())
        assert got["max"] == want["max"] and got["min"] == want["min"], (got, want)
        assert (got["nan"], got["inf"]) == (want["nan"], want["inf"])
        assert got["nan"] + got["inf"] == (0 if poison is None else 1) or t.numel() < base.numel()


@pytest.mark.parametrize(
    "make",
    [
        lambda g: torch.randn(1 << 22, generator=g),  # 4M, contiguous
        lambda g: torch.randn(3 * 4096 * 97 + 5, generator=g),  # not a multiple of a part
        lambda g: torch.randn(16, 128, 32, 32, generator=g).permute(0, 2, 3, 1),  # channels-last
        lambda g: torch.randn(2 * (1 << 20) + 6, generator=g)[::2],  # no unit stride
        lambda g: torch.randn(512, 512, generator=g).expand(8, 512, 512),  # broadcast mask
        lambda g: torch.randn(8, 64, 64, 64, generator=g).to(torch.bfloat16),
    ],
)
def test_the_norm_of_a_large_cpu_tensor_is_accurate(make: Any) -> None:
    """PyTorch's own float32 CPU norm drifts with the size (1e-4 relative at 4M elements,
    past float32's error tolerance); the agent's must stay within 1e-6 of the float64 norm
    of the same values, contiguous or not, and keep max, min and mean exact."""
    from probe.capture.stats import finish_stats, stat_vector

    t = make(torch.Generator().manual_seed(5)) + 0.5
    vec = stat_vector(t)
    assert vec is not None
    got = finish_stats([float(v) for v in vec], t.numel(), t)
    exact = t.to(torch.float64)
    want = torch.linalg.vector_norm(exact).item()
    assert abs(got["norm"] - want) <= 1e-6 * want, (got["norm"], want)
    assert got["max"] == exact.max().item() and got["min"] == exact.min().item()
    assert abs(got["mean"] - exact.mean().item()) <= 1e-6 * exact.abs().mean().item()


def _ops_by_name(dump: str) -> dict[str, Any]:
    return {
        t["name"]: t for op in read_ops(os.path.join(dump, "step0", "rank0")) for t in op["tensors"]
    }


def _finished_tensors(dbg: Any, dump: str) -> dict[str, Any]:
    """End the captured step and close the dump; its tensor records by name."""
    dbg.stop()
    dbg.step()
    dbg.close()
    return _ops_by_name(dump)


def test_a_tensor_captured_again_reuses_its_stats_until_it_is_written(
    tmp_path: Any, monkeypatch: Any
) -> None:
    """A gradient read by three optimizer ops is reduced once; a write to its storage
    through another tensor object (``.data``, which has a version counter of its own) makes
    the next capture reduce it again, for captured outputs as for remembered inputs."""
    from probe.capture import recorder as dbg_mod
    from probe.capture.threadstate import tls

    calls = []
    real = dbg_mod.stat_vector

    def counting(t: torch.Tensor) -> Any:
        calls.append(t.numel())
        return real(t)

    def expect(t: torch.Tensor) -> dict[str, Any]:
        # Computed with capture off, so that these reductions are not captured calls.
        was, tls.active = tls.active, False
        try:
            return _expected(t)
        finally:
            tls.active = was

    monkeypatch.setattr(dbg_mod, "stat_vector", counting)
    dump = str(tmp_path / "d")
    dbg = probe.Debugger(None, dump_path=dump, level="api", stack=False)
    g = torch.randn(32, generator=torch.Generator().manual_seed(1))
    m = torch.zeros(32)
    v = torch.zeros(32)
    expected: dict[str, Any] = {}
    dbg.start()
    with torch.no_grad():
        expected["Tensor.lerp_.0.forward.input.1"] = expect(g)
        m.lerp_(g, 0.1)  # m, g, m after: 3
        expected["Tensor.addcmul_.0.forward.input.1"] = expect(g)
        expected["Tensor.addcmul_.0.forward.input.2"] = expect(g)
        v.addcmul_(g, g, value=0.5)  # v, v after; g twice from lerp_'s record: 2
        g.data.mul_(3.0)  # g.data, after: 2; g's own version counter misses this write
        expected["Tensor.add_.0.forward.input.1"] = expect(g)
        m.add_(g)  # m as lerp_ left it reused; g again (written), m after: 2
        y = torch.mul(m, 2.0)  # m reused, y: 1
        y.data.add_(1.0)  # y.data, after: 2
        expected["Torch.sub.0.forward.input.0"] = expect(y)
        torch.sub(y, 1.0)  # y again (written), the output: 2
    got = _finished_tensors(dbg, dump)
    for name, stats in expected.items():
        _close(got[name]["stats"], stats)
    assert len(calls) == 3 + 2 + 2 + 2 + 1 + 2 + 2, calls


def test_mix_level_reduces_a_module_parameter_and_output_once(
    tmp_path: Any, monkeypatch: Any
) -> None:
    """At mix level a Linear's weight is recorded by its module and by ``F.linear``, and its
    output by both: each is reduced once and both records hold its stats."""
    from probe.capture import recorder as dbg_mod

    calls = []
    real = dbg_mod.stat_vector
    monkeypatch.setattr(dbg_mod, "stat_vector", lambda t: calls.append(1) or real(t))
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 4))
    x = torch.randn(3, 8)
    with torch.no_grad():
        want_out = _expected(model(x))
    dump = str(tmp_path / "d")
    dbg = probe.Debugger(None, model, dump_path=dump, level="mix", stack=False)
    dbg.start()
    with torch.no_grad():
        model(x)
    got = _finished_tensors(dbg, dump)
    w, b = model[0].weight, model[0].bias
    mod = "Module.0.Linear.forward.0"
    api = "Functional.linear.0.forward"
    _close(got[f"{mod}.parameters.weight"]["stats"], _expected(w))
    assert got[f"{api}.input.1"]["stats"] == got[f"{mod}.parameters.weight"]["stats"]
    _close(got[f"{api}.input.2"]["stats"], _expected(b))
    _close(got[f"{api}.output.0"]["stats"], want_out)
    assert got[f"{mod}.output.0"]["stats"] == got[f"{api}.output.0"]["stats"]
    # x (module input, then F.linear's), weight, bias, the output: each reduced once.
    assert len(calls) == 4, len(calls)


def _counting(monkeypatch: Any) -> list[int]:
    from probe.capture import recorder as dbg_mod

    calls: list[int] = []
    real = dbg_mod.stat_vector
    monkeypatch.setattr(dbg_mod, "stat_vector", lambda t: calls.append(t.numel()) or real(t))
    return calls


def test_views_over_the_same_elements_reuse_their_stats_until_written(
    tmp_path: Any, monkeypatch: Any
) -> None:
    """A transposed, reshaped or viewed tensor reads the elements of the tensor it views:
    a large one reuses that tensor's statistics instead of reducing them again, and is
    reduced again once anything was written there (through it, through another view, or
    through ``.data``, which has a version counter of its own), or when it reads other
    elements (a slice)."""
    from probe.capture.threadstate import tls
    from probe.capture.records import LAYOUT_MIN

    calls = _counting(monkeypatch)
    dump = str(tmp_path / "d")
    dbg = probe.Debugger(None, dump_path=dump, level="api", stack=False)
    x = torch.randn(64, 128, generator=torch.Generator().manual_seed(3))
    assert x.numel() >= LAYOUT_MIN
    want: dict[str, Any] = {}

    def expect(name: str, t: torch.Tensor) -> None:
        was, tls.active = tls.active, False  # not a captured call
        try:
            want[name] = _expected(t.contiguous())
        finally:
            tls.active = was

    dbg.start()
    with torch.no_grad():
        y = torch.mul(x, 2.0)  # x, y: 2
        expect("Torch.mul.0.forward.output.0", y)
        z = torch.transpose(y, 0, 1)  # y, z reused: 0
        expect("Torch.transpose.0.forward.output.0", z)
        v = z.reshape(-1)  # z, v (a view of y again) reused: 0
        expect("Tensor.reshape.0.forward.output.0", v)
        s = y[:, :64]  # y reused, the slice: other elements, 1 (the index is no tensor)
        expect("Tensor.__getitem__.0.forward.output.0", s)
        v.add_(1.0)  # v reused; written: v after, 1
        expect("Tensor.add_.0.forward.output.0", v)
        w = y.t()  # y after add_ through v: the same elements as v now, reused; w too: 0
        expect("Tensor.t.0.forward.output.0", w)
        y.data.mul_(2.0)  # y.data, after: 2 (a captured write to the storage)
        u = y.view(128, 64)  # y written through .data: 1; u reused: 0
        expect("Tensor.view.0.forward.input.0", y)
        expect("Tensor.view.0.forward.output.0", u)
    got = _finished_tensors(dbg, dump)
    for name, stats in want.items():
        _close(got[name]["stats"], stats)
    assert len(calls) == 2 + 0 + 0 + 1 + 1 + 0 + 2 + 1, calls


def test_checksum_mode_shares_a_checksum_only_in_the_same_byte_order(
    tmp_path: Any, monkeypatch: Any
) -> None:
    """A checksum is of the bytes in C order: a reshaped view has the bytes of the tensor
    it views and may reuse its checksum, a transposed one has other bytes and must not."""
    import zlib

    from probe.capture.threadstate import tls

    dump = str(tmp_path / "d")
    dbg = probe.Debugger(None, dump_path=dump, level="api", stack=False, mode="checksum")
    x = torch.randn(64, 128, generator=torch.Generator().manual_seed(4))

    def crc(t: torch.Tensor) -> str:
        was, tls.active = tls.active, False
        try:
            raw = t.contiguous().numpy().tobytes()
        finally:
            tls.active = was
        return "crc32:%08x" % (zlib.crc32(raw) & 0xFFFFFFFF)

    dbg.start()
    with torch.no_grad():
        y = torch.mul(x, 2.0)
        z = torch.transpose(y, 0, 1)
        v = y.reshape(-1)
        want = {"Torch.transpose.0.forward.output.0": crc(z), "Tensor.reshape.0.forward.output.0": crc(v)}
    got = _finished_tensors(dbg, dump)
    for name, c in want.items():
        assert got[name]["checksum"] == c, name
    assert got["Torch.transpose.0.forward.output.0"]["checksum"] != crc(y)
    _close(got["Torch.transpose.0.forward.output.0"]["stats"], _expected(z.contiguous()))


def test_a_gradient_received_again_by_a_module_hook_is_reduced_once(
    tmp_path: Any, monkeypatch: Any
) -> None:
    """At mix level a module's backward hook receives the gradients its first and last ops'
    backward records received, as other tensor objects (autograd's views of them) whose
    Python objects died with the op's hook, and a parameter's ``.grad`` is the gradient its
    op's backward record received: each large gradient is reduced once, and every record
    holds its values."""
    from probe.capture.records import LAYOUT_MIN

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 128))
    x = torch.randn(64, 64, requires_grad=True)
    out = model(x)
    gx, gout = torch.autograd.grad(out.square().sum(), (x, out))
    assert min(gx.numel(), gout.numel()) >= LAYOUT_MIN
    model.zero_grad()
    calls = _counting(monkeypatch)
    dump = str(tmp_path / "d")
    dbg = probe.Debugger(None, model, dump_path=dump, level="mix", stack=False)
    dbg.start()
    model(x).square().sum().backward()
    with torch.no_grad():
        model[0].weight.grad.mul(2.0)  # as an optimizer reads it: reused, its output new
    got = _finished_tensors(dbg, dump)
    mod, api = "Module.0.Linear.backward.0", "Functional.linear.0.backward"
    for name, g in (
        (f"{mod}.input.0", gout),
        (f"{api}.input.0", gout),
        (f"{mod}.output.0", gx),
        (f"{api}.output.0", gx),
    ):
        _close(got[name]["stats"], _expected(g))
    w = model[0].weight
    big = sorted(n for n in calls if n >= LAYOUT_MIN)
    _close(got["Module.0.Linear.parameters_grad.weight"]["stats"], _expected(w.grad))
    assert (
        got["Tensor.mul.0.forward.input.0"]["stats"]
        == got["Module.0.Linear.parameters_grad.weight"]["stats"]
    )
    # Forward: x, the weight, the output (the module's records reuse all three), the
    # square. Backward: d(square) (sum's gradient), d(out) once for four records, the
    # weight's gradient once for F.linear's record and the parameters_grad record (autograd
    # accumulated it into .grad), d/dx once for two records.
    want = [x.numel(), w.numel(), out.numel(), out.numel()]
    want += [out.numel(), out.numel(), w.numel(), x.numel(), w.numel()]  # and mul's output
    assert big == sorted(want), big


def test_a_tensor_in_freed_or_other_memory_never_takes_kept_stats(monkeypatch: Any) -> None:
    """What is known by the memory a tensor reads stands only while that storage lives at
    that address: forced to collide on the layout key, a tensor in other memory misses
    while the kept one lives, and once the kept storage is freed nothing stands for it
    (its memory may be another tensor's); a view that keeps the storage alive hits."""
    from probe.capture import records

    flow = records.Dataflow()
    known: Any = ({"name": "kept"}, [1.0, 0.0, 0.0, 1.0], None)
    a = torch.randn(records.LAYOUT_MIN)
    flow.remember(a, known)
    view = a.view(64, -1)
    assert flow.find(view)[0] is known
    del a
    assert flow.find(view)[0] is known  # the view keeps the storage alive
    monkeypatch.setattr(records, "layout_key", lambda t, storage, permuted: ("one key",))
    b = torch.randn(records.LAYOUT_MIN)
    flow.remember(b, known)
    other = torch.randn(records.LAYOUT_MIN)
    assert flow.find(other)[0] is None  # b lives at another address
    # As if other lay where b lies: only b's storage being alive still tells them apart.
    entry = flow._layouts[("one key",)]
    flow._layouts[("one key",)] = (entry[0], other.untyped_storage().data_ptr(), *entry[2:])
    assert flow.find(other)[0] is known
    del b
    assert flow.find(other)[0] is None  # b's storage is freed: its memory may be other's


@pytest.mark.parametrize(
    "dtype",
    [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int64, torch.uint8, torch.bool],
)
def test_a_one_element_cpu_tensor_reads_as_the_reductions_give_it(
    dtype: torch.dtype, monkeypatch: Any
) -> None:
    """A one-element CPU tensor's statistics are its value, read once: the same numbers,
    NaN/Inf counts included, as the reductions of the device path give (0-d and 1-d)."""
    from probe.capture.stats import finish_stats, stat_vector

    values = [0.0, -0.0, 1.5, -3.25, 7.0, 1e30]
    if dtype.is_floating_point:
        values += [float("nan"), float("inf"), -float("inf")]
    for v in values:
        for t in (torch.tensor(v).to(dtype), torch.tensor([v]).to(dtype)):
            if dtype.is_floating_point and abs(v) < float("inf"):
                if torch.linalg.vector_norm(t.float()).item() == float("inf"):
                    # torch 2.1's float32 norm of 1e30 overflows: the device path writes
                    # that inf (docs/capture.md, Limitations); CPU reads the value itself.
                    continue
            fast = stat_vector(t)
            assert isinstance(fast, list)
            monkeypatch.setattr(stats_mod, "READ_ON_CPU", False)
            slow = stat_vector(t)
            monkeypatch.setattr(stats_mod, "READ_ON_CPU", True)
            assert isinstance(slow, torch.Tensor)
            want = finish_stats(slow.tolist(), 1, None)
            got = finish_stats(fast, 1, None)
            assert repr(got) == repr(want), (dtype, v, got, want)
