"""The CPU statistics kernel of the ``probe`` binary (capture/native.py, src/agent_stats.rs).

It must be there wherever the wheel was built on Linux (a silent fallback would hide a
broken build), agree with float64 reductions of the same values within 1e-6, give the same
bits whatever PyTorch's thread count, leave NaN/Inf to PyTorch's reductions (exact
counts), and never stop capture when it cannot be had.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from typing import Any, Callable

import pytest
import torch

from conftest import REPO, probe_bin, read_ops
from probe.capture import native
from probe.capture import stats as stats_mod
from probe.capture.stats import finish_stats, stat_vector


@pytest.fixture
def kernels(monkeypatch: Any) -> Any:
    """The kernels of the installed ``probe``, in use by ``stat_vector``."""
    monkeypatch.setenv("PROBE_BIN", probe_bin())
    found = native.load()
    if found is None:
        pytest.fail("no native statistics kernel: the probe binary should carry one (build.rs)")
    monkeypatch.setattr(stats_mod, "NATIVE", found.plain)
    monkeypatch.setattr(stats_mod, "STRIDED", found.strided)
    monkeypatch.setattr(stats_mod, "_native_tried", True)
    return found.plain


def _reference(t: torch.Tensor) -> dict[str, float]:
    x = t.double()
    return {
        "max": x.max().item(),
        "min": x.min().item(),
        "sum": x.sum().item(),
        "abs": x.abs().sum().item(),
        "norm": torch.linalg.vector_norm(x).item(),
    }


CASES: list[tuple[str, Callable[[torch.Generator], torch.Tensor]]] = [
    ("small", lambda g: torch.randn(7, generator=g)),
    ("odd", lambda g: torch.randn(4099, generator=g) * 100 + 3),
    ("1M+", lambda g: torch.randn((1 << 20) + 77, generator=g)),
    ("transposed", lambda g: torch.randn(64, 1024, generator=g).t()),
    ("channels-last", lambda g: torch.randn(4, 32, 16, 16, generator=g).permute(0, 2, 3, 1)),
    ("bf16", lambda g: torch.randn(3 * 65536 + 5, generator=g).to(torch.bfloat16)),
    ("bf16 2M", lambda g: torch.randn(1 << 21, generator=g).to(torch.bfloat16) - 0.25),
]


@pytest.mark.parametrize("make", [c[1] for c in CASES], ids=[c[0] for c in CASES])
def test_the_kernel_agrees_with_float64_whatever_torch_threads(kernels: Any, make: Any) -> None:
    t = make(torch.Generator().manual_seed(3))
    runs = []
    before = torch.get_num_threads()
    try:
        for threads in (1, 2, 3):
            torch.set_num_threads(threads)
            runs.append(stat_vector(t))
    finally:
        torch.set_num_threads(before)
    # A list of numbers read at once: the kernel's result (PyTorch's path on CPU gives one
    # too, so check it took the kernel: same numbers as calling it directly).
    direct = (stats_mod._RESULT)()
    flat = t if t.is_contiguous() else stats_mod.dense_span(t)
    assert flat is not None
    assert kernels[t.dtype](flat.data_ptr(), t.numel(), direct) == 1
    assert runs[0] == direct[:], "stat_vector did not use the kernel"
    assert runs[1] == runs[0] and runs[2] == runs[0], "torch's thread count changed the bits"
    ref = _reference(t)
    mx, mn, total, norm = runs[0]
    assert (mx, mn) == (ref["max"], ref["min"])
    assert abs(total - ref["sum"]) <= 1e-6 * ref["abs"], (total, ref)
    assert abs(norm - ref["norm"]) <= 1e-6 * ref["norm"], (norm, ref)


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
def test_nan_and_inf_take_the_reductions_that_count_them(kernels: Any, bad: float) -> None:
    t = torch.randn(5000, generator=torch.Generator().manual_seed(1))
    t[17] = bad
    t[4000] = bad
    vec = stat_vector(t)
    assert vec is not None
    got = finish_stats([float(v) for v in vec], t.numel(), t)
    if bad != bad:
        assert (got["nan"], got["inf"], got["max"], got["mean"]) == (2, 0, "nan", "nan")
    else:
        assert (got["nan"], got["inf"]) == (0, 2)
        assert got["max" if bad > 0 else "min"] == ("inf" if bad > 0 else "-inf")


@pytest.mark.parametrize(
    ("values", "dtype"),
    [
        ([1e20, -3e19, 5.0], torch.float32),  # squares past float32: the norm overflowed
        ([3e38] * 10, torch.float32),  # the sum too
        ([1e20] * 5000, torch.bfloat16),  # widened to float32 by the reductions
        ([1e30], torch.float32),  # one element: its value is every statistic
    ],
    ids=["norm", "sum", "bf16", "one"],
)
def test_finite_values_past_float32_accumulators(kernels: Any, values: Any, dtype: Any) -> None:
    """Finite values whose float32 sum or sum of squares overflows (the kernel refuses them,
    PyTorch's float32 reductions give inf): the statistics are float64 numbers, as for any
    other finite tensor, never "inf" with no Inf counted."""
    t = torch.tensor(values, dtype=dtype)
    vec = stat_vector(t)
    assert vec is not None
    got = finish_stats([float(v) for v in vec], t.numel(), t)
    x = [float(v) for v in t.double().tolist()]
    assert (got["nan"], got["inf"]) == (0, 0)
    assert (got["max"], got["min"]) == (max(x), min(x))
    assert got["mean"] == pytest.approx(sum(x) / len(x), rel=1e-12)
    assert got["norm"] == pytest.approx(sum(v * v for v in x) ** 0.5, rel=1e-12)


def test_a_strided_slice_is_read_in_place_with_the_bits_of_its_copy(kernels: Any) -> None:
    """Memory with gaps (every other element: a chunk of a fused projection, a slice of
    channels) is read in place by the kernel, in memory order, with the bits of a copy of it
    in that order (the copy the agent made before), at any size; float64/float16 take
    PyTorch's reductions, exactly as before."""
    g = torch.Generator().manual_seed(2)

    def copied(t: torch.Tensor) -> list[float]:
        # The copy in memory order (dimensions by decreasing stride), read contiguously.
        order = sorted(range(t.dim()), key=lambda d: t.stride(d), reverse=True)
        c = t.permute(order).contiguous()
        out = stats_mod._RESULT()
        assert kernels[t.dtype](c.data_ptr(), c.numel(), out) == 1
        return out[:]

    gappy = torch.randn(10000, generator=g)[::2]
    assert not gappy.is_contiguous() and stats_mod.dense_span(gappy) is None
    assert stat_vector(gappy) == copied(gappy)
    # Read in memory order: a slice and its transpose are the same numbers, bit for bit.
    block = torch.randn(64, 300, generator=g)[:, 7:263]
    assert stat_vector(block) == stat_vector(block.t()) == copied(block)
    assert stat_vector(block) != stat_vector(block.t().contiguous())
    # A slice of channels of a channels-last activation, larger than a gather batch of the
    # kernel; the same in bfloat16; an expanded view (its elements read as often as shown).
    act = torch.randn(8, 96, 24, 24, generator=g).to(memory_format=torch.channels_last)
    for t in (act[:, 16:80], act[:, 16:80].bfloat16()[:, :, ::2], act[0, 0, 0].expand(5, 24)):
        assert stats_mod.dense_span(t) is None
        assert stat_vector(t) == copied(t), t.shape
    # A 5M-element slice (past the old copy limit of 4M) is read too.
    big = torch.randn(5 << 20, 2, generator=g)[:, 0]
    ref = big.double()
    got = stat_vector(big)
    assert got is not None and got[:2] == [ref.max().item(), ref.min().item()]
    assert got[2] == pytest.approx(ref.sum().item(), abs=1e-6 * ref.abs().sum().item())
    for t in (
        torch.randn(999, generator=g, dtype=torch.float64)[::2],
        torch.randn(999, generator=g).half()[::2],
    ):
        vec = stat_vector(t)
        assert vec is not None
        tf = t.double() if t.dtype is torch.float64 else t.float()
        mn, mx = torch.aminmax(tf)
        assert vec[:3] == [mx.item(), mn.item(), torch.sum(tf).item()]
    # A NaN in the view is left to the reductions, which count it; one between its elements
    # is not the view's.
    holed = torch.randn(4000, generator=g)
    holed[2002] = float("nan")
    assert finish_stats(stat_vector(holed[::2]), 2000, None)["nan"] == 1
    assert stat_vector(holed[1::2]) == copied(holed[1::2])
    # A permuted view of dense memory is read in place as one run: the bits of its memory
    # read contiguously. Two tensors of one layout (its arguments made once) read each its
    # own elements.
    for _ in range(2):
        cl = torch.randn(4, 32, 6, 6, generator=g).to(memory_format=torch.channels_last)
        assert not cl.is_contiguous()
        assert stat_vector(cl) == copied(cl) == stat_vector(cl.permute(0, 2, 3, 1))
        assert stat_vector(cl)[:2] == [cl.max().item(), cl.min().item()]


def test_tap_rows_are_blank_apart_and_aligned_past_a_block(kernels: Any) -> None:
    """A compiled graph's CPU taps write into rows handed out a block at a time
    (``tap_ops._row``): past more than one block, every row is its own memory (a write
    into one leaves the others), 64-byte aligned (as Inductor assumes of an operator's
    result), with zero counts and, in a gradient's row, the 1 that says it came."""
    from probe.capture import tap_ops

    x = torch.randn(33, generator=torch.Generator().manual_seed(5))
    want = [float(x.max()), float(x.min())]
    n = 2 * tap_ops._ROWS + 3
    for cols in (tap_ops.COLUMNS, tap_ops.GRAD_COLUMNS):
        rows = [tap_ops.run_row(x, cols) for _ in range(n)]
        assert len({r.data_ptr() for r in rows}) == n
        assert all(r.data_ptr() % 64 == 0 and r.shape == (cols,) for r in rows)
        for r in rows:
            got = r.tolist()
            assert got[:2] == want and got[4:6] == [0.0, 0.0]
            assert got[6:] == ([1.0] if cols > tap_ops.COLUMNS else [])
        rows[0].fill_(9.0)
        assert rows[1].tolist() == rows[2].tolist() and rows[1][0].item() == want[0]


def test_a_tensor_subclass_takes_the_reductions(kernels: Any) -> None:
    """A subclass may wrap other memory (or none): its statistics are PyTorch's, as before."""

    class Wrapped(torch.Tensor):
        pass

    t = torch.randn(3000, generator=torch.Generator().manual_seed(4)).as_subclass(Wrapped)
    vec = stat_vector(t)
    assert vec is not None
    plain = t.as_subclass(torch.Tensor)
    mn, mx = torch.aminmax(plain)
    assert vec[:3] == [mx.item(), mn.item(), torch.sum(plain).item()]
    p = torch.nn.Parameter(plain.clone())
    direct = stats_mod._RESULT()
    assert kernels[torch.float32](p.data_ptr(), p.numel(), direct) == 1
    assert stat_vector(p) == direct[:]  # a Parameter is a plain tensor: the kernel's


def _capture_script(tmp: str) -> str:
    return textwrap.dedent(
        f"""
        import json, logging, sys, torch
        logging.basicConfig(level=logging.INFO, stream=sys.stderr)
        sys.path.insert(0, {os.path.join(REPO, "python")!r})
        import probe
        from probe.capture import stats
        dbg = probe.Debugger(None, dump_path={tmp!r}, level="api", stack=False)
        dbg.start()
        x = torch.arange(12, dtype=torch.float32).reshape(3, 4)
        torch.mul(x, 2.0)
        dbg.stop()
        print(json.dumps(stats.NATIVE is not None))
        """
    )


@pytest.mark.parametrize(
    "env",
    [{"PROBE_NATIVE_STATS": "0"}, {"PROBE_BIN": "/bin/false"}, {"PROBE_CACHE_DIR": "/proc/x"}],
    ids=["switched off", "no kernel from the binary", "unwritable cache"],
)
def test_capture_goes_on_without_the_kernel(tmp_path: Any, env: dict[str, str]) -> None:
    """Off by choice, a binary that cannot give the kernel, a cache folder that cannot be
    written: PyTorch's reductions, the same statistics, one line in the log (not a
    warning: capture is complete)."""
    dump = str(tmp_path / "dump")
    run_env = {**os.environ, "PROBE_BIN": probe_bin(), **env}
    done = subprocess.run(
        [sys.executable, "-c", _capture_script(dump)],
        env=run_env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) is False
    if env.get("PROBE_NATIVE_STATS") != "0":
        assert "no native kernel" in done.stderr
    assert "Warning" not in done.stderr
    ops = read_ops(os.path.join(dump, "step0", "rank0"))
    out = next(
        t["stats"]
        for op in ops
        for t in op["tensors"]
        if t["name"] == "Torch.mul.0.forward.output.0"
    )
    # 0, 2, ..., 22: exact whichever path.
    assert (out["max"], out["min"], out["mean"]) == (22.0, 0.0, 11.0)
    assert out["norm"] == pytest.approx(sum((2.0 * i) ** 2 for i in range(12)) ** 0.5, rel=1e-7)


def test_the_kernel_is_used_by_a_capture(tmp_path: Any) -> None:
    dump = str(tmp_path / "dump")
    done = subprocess.run(
        [sys.executable, "-c", _capture_script(dump)],
        env={**os.environ, "PROBE_BIN": probe_bin()},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) is True, done.stderr
    files = os.listdir(os.environ["PROBE_CACHE_DIR"])
    assert any(f.startswith("agent-stats-") and f.endswith(".so") for f in files), files
