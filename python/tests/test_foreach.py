"""The multi-tensor ops (``torch._foreach_*``) are hooked as API calls.

``clip_grad_norm_`` scales every gradient with one ``_foreach_mul_`` and the multi-tensor
optimizers (PyTorch's default on CUDA) update with ``_foreach_lerp_``, ``_foreach_addcdiv_``
and the like. Unhooked, the clipped gradients and the updated weights had no captured
producer, and a port that leaves the clipping out was misdiagnosed. These runs check what
is recorded of them (against values computed here), that training is unchanged, and what
``probe compare`` says of runs that differ in them.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from typing import Any, Optional

import pytest
import warm
import torch
import torch.nn.functional as F

import probe
from conftest import EXAMPLE, Tiny, compare_summary, probe_bin, read_ops, run_agent_script

#: The clipping threshold: well under the gradients' total norm, so the clipping scales.
MAX_NORM = 0.1


def _train_clipped(dump: Optional[str]) -> dict[str, Any]:
    """Two steps of Tiny with ``clip_grad_norm_`` and the multi-tensor AdamW, captured at mix
    level in statistics mode (``dump``) or bare (None). Returns the losses, the final weights
    and, of step 0, the gradients before and after the clipping and the weights after it."""
    torch.manual_seed(0)
    model = Tiny()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, foreach=True)
    g = torch.Generator().manual_seed(1)
    batches = [
        (torch.randn(4, 8, generator=g), torch.randint(0, 4, (4,), generator=g)) for _ in range(2)
    ]
    dbg = probe.Debugger(None, dump_path=dump, level="mix", mode="statistics") if dump else None
    seen: dict[str, Any] = {"losses": []}
    for step, (x, y) in enumerate(batches):
        if dbg is not None:
            dbg.start(model)
        opt.zero_grad()
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        before = [p.grad.detach().clone() for p in model.parameters() if p.grad is not None]
        total = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=MAX_NORM)
        after = [p.grad.detach().clone() for p in model.parameters() if p.grad is not None]
        opt.step()
        if dbg is not None:
            dbg.stop()
            dbg.step()
        if step == 0:
            seen.update(before=before, after=after, total=float(total))
            seen["weights0"] = [p.detach().clone() for p in model.parameters()]
        seen["losses"].append(loss.item())
    if dbg is not None:
        dbg.close()
    seen["weights"] = [p.detach().clone() for p in model.parameters()]
    return seen


def _by_slot(op: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """An op's tensor records by slot (``input.0.3``, ``output.1``)."""
    return {t["name"].split(".forward.", 1)[1]: t for t in op["tensors"]}


def _norm(t: torch.Tensor) -> float:
    return float(t.double().norm())


def test_clipping_and_a_multi_tensor_adamw_are_recorded_and_training_is_unchanged(
    tmp_path: Any,
) -> None:
    """The clipping's ``_foreach_norm`` and ``_foreach_mul_`` are recorded with the
    gradients' norms before and after the scaling, the optimizer reads the clipped gradients
    as ``_foreach_mul_``'s outputs (``src``: they have a producer now), and its last
    ``_foreach_addcdiv_`` writes the weights the step left. Losses and weights are
    bit-identical to an uncaptured run."""
    bare = _train_clipped(None)
    dump = str(tmp_path / "dump")
    got = _train_clipped(dump)
    assert got["losses"] == bare["losses"]
    assert all(torch.equal(a, b) for a, b in zip(got["weights"], bare["weights"]))

    before, after, total = bare["before"], bare["after"], bare["total"]
    n = len(before)
    coef = MAX_NORM / (total + 1e-6)
    assert coef < 1.0  # the clipping scales (the test's premise)
    ops = {o["op"]: o for o in read_ops(os.path.join(dump, "step0", "rank0"))}

    norms = _by_slot(ops["Torch._foreach_norm.0.forward"])
    for i, g in enumerate(before):
        assert math.isclose(norms[f"input.0.{i}"]["stats"]["norm"], _norm(g), rel_tol=1e-6)
        assert math.isclose(norms[f"output.{i}"]["stats"]["max"], _norm(g), rel_tol=1e-6)

    # The scaling: the gradients as it read them, the factor, the gradients it wrote.
    mul = _by_slot(ops["Torch._foreach_mul_.0.forward"])
    assert math.isclose(mul["input.1"]["stats"]["max"], coef, rel_tol=1e-6), mul["input.1"]
    for i in range(n):
        assert math.isclose(mul[f"input.0.{i}"]["stats"]["norm"], _norm(before[i]), rel_tol=1e-6)
        out = mul[f"output.{i}"]["stats"]
        assert math.isclose(out["norm"], _norm(after[i]), rel_tol=1e-6), (i, out)
        assert math.isclose(out["norm"], coef * _norm(before[i]), rel_tol=1e-5), (i, out)
        assert (out["max"], out["min"]) == (float(after[i].max()), float(after[i].min()))

    # AdamW's first moment update reads the clipped gradients: their producer is the scaling.
    lerp = _by_slot(ops["Torch._foreach_lerp_.0.forward"])
    for i in range(n):
        assert lerp[f"input.1.{i}"].get("src") == mul[f"output.{i}"]["id"], i

    # The last write of the weights is the update's addcdiv_: the weights after step 0.
    addcdiv = _by_slot(ops["Torch._foreach_addcdiv_.0.forward"])
    for i, w in enumerate(bare["weights0"]):
        out = addcdiv[f"output.{i}"]["stats"]
        assert (out["max"], out["min"]) == (float(w.max()), float(w.min())), i
        assert math.isclose(out["norm"], _norm(w), rel_tol=1e-6), i


def test_multi_tensor_ops_under_autograd_keep_gradients_and_get_backward_records(
    tmp_path: Any,
) -> None:
    """Outside an optimizer a multi-tensor op may run with grad: out-of-place, and in place
    on tensors that require grad. The gradients are bit-identical to an uncaptured run, and
    the in-place call's written tensors keep their objects (not aliases, which took the write
    before and left it without a backward record): its backward record holds the gradient
    of each tensor it wrote."""

    def run(dump: Optional[str]) -> tuple[float, list[torch.Tensor]]:
        torch.manual_seed(0)
        ws = [torch.randn(3, requires_grad=True) for _ in range(3)]
        dbg = probe.Debugger(None, dump_path=dump, level="api", mode="statistics") if dump else None
        if dbg is not None:
            dbg.start()
        xs = [w * 2 for w in ws]
        ys = torch._foreach_mul(xs, 3.0)
        torch._foreach_add_(ys, xs)
        zs = [x + 1 for x in xs]
        torch._foreach_mul_(zs, 0.5)
        loss = sum(t.sum() for t in ys) + sum(t.sum() for t in zs) + sum(torch._foreach_norm(ys))
        loss.backward()
        if dbg is not None:
            dbg.stop()
            dbg.step()
            dbg.close()
        return loss.item(), [w.grad for w in ws if w.grad is not None]

    dump = str(tmp_path / "dump")
    bare, got = run(None), run(dump)
    assert got[0] == bare[0] and all(torch.equal(a, b) for a, b in zip(got[1], bare[1]))
    ops = {o["op"]: o for o in read_ops(os.path.join(dump, "step0", "rank0"))}
    for key in ("_foreach_mul", "_foreach_add_", "_foreach_mul_", "_foreach_norm"):
        assert f"Torch.{key}.0.backward" in ops, key
    # d loss / d zs is 1 everywhere: the gradient the in-place scaling's outputs received.
    grads = {
        t["name"].rsplit(".backward.", 1)[1]: t
        for t in ops["Torch._foreach_mul_.0.backward"]["tensors"]
    }
    assert sorted(grads) == ["input.0", "input.1", "input.2"], sorted(grads)
    for t in grads.values():
        assert (t["stats"]["max"], t["stats"]["min"]) == (1.0, 1.0), t


def test_an_in_place_multi_tensor_op_that_overflows_is_named_with_the_inputs_it_read(
    tmp_path: Any,
) -> None:
    """Overflow mode: ``_foreach_div_`` divides one tensor of its list by zero. Its record
    holds the list as the op read it (finite), not as it left it, so ``probe scan`` names it
    as producing the Inf from finite inputs."""
    dump = str(tmp_path / "dump")
    torch.manual_seed(0)
    xs = [torch.randn(3) + 5.0 for _ in range(2)]  # no zero: x / 0 is +-inf
    dbg = probe.Debugger(None, dump_path=dump, level="api", mode="overflow")
    dbg.start()
    with torch.no_grad():
        ys = [x * 2 for x in xs]
        torch._foreach_div_(ys, [0.0, 1.0])
    dbg.stop()
    dbg.step()
    dbg.close()
    (op,) = read_ops(os.path.join(dump, "step0", "rank0"))
    assert op["op"] == "Torch._foreach_div_.0.forward"
    t = _by_slot(op)
    assert t["input.0.0"]["stats"]["inf"] == 0 and t["input.0.0"]["stats"]["nan"] == 0, t
    assert math.isclose(t["input.0.0"]["stats"]["norm"], _norm(xs[0] * 2), rel_tol=1e-6)
    assert t["output.0"]["stats"]["inf"] == 3, t["output.0"]

    r = subprocess.run(
        [probe_bin(), "scan", dump, "-o", str(tmp_path / "scan")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert "first produced by Torch._foreach_div_.0.forward from finite inputs" in r.stdout, (
        r.stdout
    )


def _train_small(dump: str, *extra: str) -> None:
    cmd = [sys.executable, EXAMPLE, "--dump", dump, "--quiet", "--steps", "2", *extra]
    r = warm.run(cmd[1:], timeout=300)
    assert r.returncode == 0, r.stderr


def test_a_multi_tensor_adam_against_the_per_parameter_loop_pairs_as_adam(tmp_path: Any) -> None:
    """The GPU run's multi-tensor Adam (now in its dump) against the port's per-parameter
    loop: the built-in ``adam`` rule pairs the two updates, every tensor finds its
    counterpart and passes."""
    loop, foreach = str(tmp_path / "loop"), str(tmp_path / "foreach")
    _train_small(loop)
    _train_small(foreach, "--optimizer", "foreach")
    ops = read_ops(os.path.join(foreach, "step0", "rank0"))
    assert any(o["op"].startswith("Torch._foreach_addcdiv_.") for o in ops)
    code, s = compare_summary(loop, foreach, str(tmp_path / "out"))
    c = s["counts"]
    assert code == 0, s["headline"]
    assert c["error"] == 0 and c["unmatched_bench"] == 0 and c["unmatched_cmp"] == 0, c
    assert c["matched_by"]["mapped"] > 0 and "mapped as adam" in s["headline"], s["headline"]


PHI = """
import json, sys
import torch
import probe
from transformers import PhiConfig, PhiForCausalLM

dump, clip = sys.argv[1], sys.argv[2] == "1"
torch.set_num_threads(1)
probe.seed_all(0)
cfg = PhiConfig(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                num_attention_heads=4, max_position_embeddings=64, resid_pdrop=0.0,
                embd_pdrop=0.0, attention_dropout=0.0)
model = PhiForCausalLM(cfg)
opt = torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=True)
ids = torch.randint(0, 128, (2, 16), generator=torch.Generator().manual_seed(1))
dbg = probe.Debugger(None, dump_path=dump, level="mix", mode="statistics")
norms = []
for step in range(2):
    dbg.start(model)
    out = model(input_ids=ids, labels=ids)
    out.loss.backward()
    if clip:
        norms.append(float(torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)))
    opt.step()
    opt.zero_grad()
    dbg.stop()
    dbg.step()
dbg.close()
print(json.dumps({"norms": norms}))
"""


def test_a_phi_port_without_the_clipping_is_told_as_clipping_on_one_side(tmp_path: Any) -> None:
    """A tiny Phi (random init, nothing downloaded) trained with ``clip_grad_norm_`` (the
    benchmark) and without it (the port), both with the multi-tensor AdamW. The clipping's
    calls are the benchmark's only: the divergence is said to enter through gradient
    clipping only the benchmark runs (its ``_foreach_mul_`` scales the gradients by a
    coefficient from their ``_foreach_norm``), and the port's update (in its dump) is not
    said to be missing."""
    pytest.importorskip("transformers")
    bench, cmp_ = str(tmp_path / "clip"), str(tmp_path / "noclip")
    for dump, clip in ((bench, "1"), (cmp_, "0")):
        r = run_agent_script(PHI, dump, clip)
        assert r.returncode == 0, r.stderr[-4000:]
        if clip == "1":
            norms = json.loads(r.stdout.strip().splitlines()[-1])["norms"]
            assert min(norms) > 1.0, norms  # the clipping scales (the test's premise)
    names = {
        side: {o["op"] for o in read_ops(os.path.join(side, "step0", "rank0"))}
        for side in (bench, cmp_)
    }
    assert "Torch._foreach_norm.0.forward" in names[bench] - names[cmp_]
    code, s = compare_summary(bench, cmp_, str(tmp_path / "out"))
    head = s["headline"]
    assert code == 1, head
    assert "no optimizer update" not in head, head
    assert all("no optimizer update" not in u["reason"] for u in s["incomplete_units"]), s
    assert s["counts"]["unmatched_bench"] > 0 and s["counts"]["unmatched_cmp"] == 0, s["counts"]
    assert head.startswith(
        "DIVERGENCE enters through gradient clipping only the benchmark runs "
        "(Torch._foreach_mul_.0.forward"
    ), head
    one = s["external_source"]["backward"]["one_sided_source"]
    assert one["computes"] == "gradient clipping" and one["side"] == "bench", one
