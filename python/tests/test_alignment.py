"""Alignment of runs whose code paths differ (issue 16), on real runs of the example.

Each scenario is two runs of ``examples/train_small.py`` that differ by one flag and are
equal up to rounding (``--attention sdpa``, ``--layer-norm manual``, ``--checkpoint``,
bf16 autocast), or that differ by a known fault (``--inject``) or by a capture that switched
itself off early (``--stop-capture-after``); ``probe compare`` must pair what corresponds,
blame no op for a mere difference of operators, still name a real fault, and say so when a
side's capture stopped early. The contract (docs/compare.md, issue 16): ``summary.json``
``counts.matched_by`` = ``{"exact", "aligned", "mapped", "module"}`` row counts, verdict
``incomplete`` with exit status 4 when a side's records end early, and
``counts.unmatched_*`` for what stays unpaired.

The runs are subprocesses (statistics mode, batch 4, one step unless a scenario needs two),
made once per module and in parallel; each scenario's compare reads them.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Optional

import pytest
import warm
import torch

from conftest import EXAMPLE, REPO, load_example, probe_bin, read_ops

MSPROBE = os.path.join(REPO, "testdata", "msprobe")
GELU = "Functional.gelu.0"
EXIT_PASS, EXIT_DIVERGENCE, EXIT_INCOMPLETE = 0, 1, 4
MATCHED_BY = ("exact", "aligned", "mapped", "module")
#: The fused RMSNorm scenarios call F.rms_norm, which came with torch 2.4.
HAS_RMS_NORM = hasattr(torch.nn.functional, "rms_norm")
needs_rms_norm = pytest.mark.skipif(not HAS_RMS_NORM, reason="F.rms_norm needs torch >= 2.4")

#: name -> (steps, extra flags of train_small.py). A scenario compares two of them.
RUNS: dict[str, tuple[int, tuple[str, ...]]] = {
    "fp32": (1, ()),
    "fp32_again": (1, ()),
    "fp32_2steps": (2, ()),
    "bf16_2steps": (2, ("--dtype", "bfloat16")),
    # A fault well past bf16's tolerance (10 %): the gelu's output 50 % too large.
    "bf16_2steps_gelu_fault": (
        2,
        ("--dtype", "bfloat16", "--inject", GELU, "--inject-rel", "0.5"),
    ),
    "sdpa": (1, ("--attention", "sdpa")),
    "eager_mix": (1, ("--level", "mix")),
    "sdpa_mix": (1, ("--level", "mix", "--attention", "sdpa")),
    "ln_manual": (1, ("--layer-norm", "manual")),
    "ln_manual_gelu_fault": (1, ("--layer-norm", "manual", "--inject", GELU)),
    "rms_fused": (1, ("--layer-norm", "rms-fused")),
    "rms_manual": (1, ("--layer-norm", "rms-manual")),
    "rms_manual_gelu_fault": (1, ("--layer-norm", "rms-manual", "--inject", GELU)),
    "checkpoint": (1, ("--checkpoint",)),
    "mish": (1, ("--activation", "mish")),
    "mish_manual": (1, ("--activation", "mish-manual")),
    # A fault inside the composition no rule knows: its tanh 5 % off.
    "mish_manual_fault": (1, ("--activation", "mish-manual", "--inject", "Torch.tanh.0")),
    "stopped": (1, ("--stop-capture-after", "2")),
}


class Runs:
    """The example's dumps, each made on first request; a request's missing runs are made
    in parallel (one subprocess each)."""

    def __init__(self, base: str) -> None:
        self.base = base
        self.made: dict[str, str] = {}
        self.stderr: dict[str, str] = {}

    def get(self, *names: str) -> list[str]:
        todo = [n for n in dict.fromkeys(names) if n not in self.made]
        if todo:
            with ThreadPoolExecutor(max_workers=max(1, min(len(todo), os.cpu_count() or 2))) as ex:
                for name, err in zip(todo, ex.map(self._run, todo)):
                    self.made[name] = os.path.join(self.base, name)
                    self.stderr[name] = err
        return [self.made[n] for n in names]

    def _run(self, name: str) -> str:
        steps, flags = RUNS[name]
        dump = os.path.join(self.base, name)
        cmd = [sys.executable, EXAMPLE, "--dump", dump, "--mode", "statistics"]
        cmd += ["--steps", str(steps), "--batch", "4", "--quiet", *flags]
        env = dict(os.environ, PYTHONPATH=os.path.join(REPO, "python"))
        r = warm.run(cmd[1:], timeout=300, env=env)
        assert r.returncode == 0, f"{name}: exit {r.returncode}\n{r.stderr}"
        return r.stderr


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Runs]:
    yield Runs(str(tmp_path_factory.mktemp("alignment")))


@dataclass
class Compared:
    code: int
    summary: dict[str, Any]
    out: str
    stdout: str
    stderr: str

    def show(self) -> str:
        """What a failing assertion prints: exit, headline, counts, findings, worst ops."""
        s = self.summary
        keep = {
            k: s.get(k)
            for k in ("verdict", "headline", "counts", "first_divergent", "incomplete_units")
        }
        keep["worst_ops"] = [
            f"{w['op']} [{w['verdict']}] {w['reason']}" for w in s.get("worst_ops", [])[:8]
        ]
        return f"exit {self.code}\n{json.dumps(keep, indent=1)}\nstderr: {self.stderr[-2000:]}"

    @property
    def counts(self) -> dict[str, Any]:
        c: dict[str, Any] = self.summary["counts"]
        return c

    def matched_by(self) -> dict[str, int]:
        """``counts.matched_by`` (the issue-16 contract); its absence fails the test."""
        mb = self.counts.get("matched_by")
        assert isinstance(mb, dict), f"summary.json has no counts.matched_by\n{self.show()}"
        return {k: int(v) for k, v in mb.items()}

    def rows(self) -> Optional[list[dict[str, Any]]]:
        """compare.parquet's rows when pyarrow is installed, else None."""
        try:
            import pyarrow.parquet as pq  # type: ignore[import-not-found, unused-ignore]
        except ImportError:
            return None
        table = pq.read_table(os.path.join(self.out, "compare.parquet"))
        rows: list[dict[str, Any]] = table.to_pylist()
        return rows


def compare(bench: str, cmp_: str, out: str, *extra: str) -> Compared:
    r = subprocess.run(
        [probe_bin(), "compare", "-b", bench, "-c", cmp_, "-o", out, *extra],
        capture_output=True,
        text=True,
        timeout=300,
    )
    path = os.path.join(out, "summary.json")
    assert os.path.isfile(path), f"no summary.json: exit {r.returncode}\n{r.stdout}\n{r.stderr}"
    with open(path, encoding="utf-8") as fh:
        summary = json.load(fh)
    return Compared(r.returncode, summary, out, r.stdout, r.stderr)


def findings(c: Compared) -> list[dict[str, Any]]:
    """Every finding of summary.json (first divergent, earliest failing, outside source,
    first NaN/Inf), both directions."""
    out = []
    for key in ("first_divergent", "earliest_failing", "external_source", "first_nonfinite"):
        by_dir = c.summary.get(key) or {}
        for d in ("forward", "backward"):
            f = by_dir.get(d)
            if f:
                out.append(f)
    return out


def shape_mismatches(c: Compared) -> list[str]:
    """Findings and worst ops that rest on a shape mismatch: between two runs of the same
    model, that is always a mis-pairing."""
    bad = []
    for f in findings(c):
        texts = [f.get("reason", ""), *f.get("evidence", [])]
        bad += [f"{f['op']}: {t}" for t in texts if "shape" in t]
    for w in c.summary.get("worst_ops", []):
        if "shape" in w.get("reason", ""):
            bad.append(f"{w['op']}: {w['reason']}")
    return bad


def culprits(c: Compared) -> dict[str, Optional[str]]:
    fd = c.summary["first_divergent"]
    return {d: (fd[d] or {}).get("op") for d in ("forward", "backward")}


def _out(tmp_path: Any, name: str = "out") -> str:
    return str(tmp_path / name)


# ---------------------------------------------------------------- the variants themselves


@pytest.mark.parametrize(
    ("base", "variant"),
    [
        ({}, {"attention": "sdpa"}),
        ({}, {"norm": "manual"}),
        ({}, {"checkpoint": True}),
        pytest.param({"norm": "rms-fused"}, {"norm": "rms-manual"}, marks=needs_rms_norm),
        pytest.param(
            {"norm": "rms-fused"},
            {"norm": "rms-manual", "attention": "sdpa", "checkpoint": True},
            marks=needs_rms_norm,
        ),
    ],
    ids=["sdpa", "manual-ln", "checkpoint", "rms-manual", "rms-manual-sdpa-checkpoint"],
)
def test_variants_share_weights_and_agree(base: dict[str, Any], variant: dict[str, Any]) -> None:
    """Same seed, same state_dict (names and values); outputs and gradients equal up to
    float32 rounding: a scenario's two runs differ only in the operators they run."""
    ex = load_example()
    models = []
    for kwargs in (base, variant):
        torch.manual_seed(0)
        models.append(ex.SmallNet(**kwargs))
    sd0, sd1 = (m.state_dict() for m in models)
    assert list(sd0) == list(sd1)
    for k in sd0:
        assert torch.equal(sd0[k], sd1[k]), k
    x = torch.randn(4, 3, 32, 32, generator=torch.Generator().manual_seed(1))
    outs = []
    for m in models:
        y = m(x)
        y.square().sum().backward()
        outs.append((y.detach(), {n: p.grad for n, p in m.named_parameters()}))
    (y0, g0), (y1, g1) = outs
    torch.testing.assert_close(y1, y0, rtol=1e-5, atol=1e-5)
    for n in g0:
        torch.testing.assert_close(g1[n], g0[n], rtol=1e-4, atol=1e-5, msg=n)


def test_variant_dumps_record_other_operators(runs: Runs) -> None:
    """The premise of each scenario, read from the dumps: the variant runs other operators,
    recomputes under checkpointing, and reaches the same loss up to rounding."""
    names = ("fp32", "sdpa", "ln_manual", "checkpoint", "sdpa_mix")
    names += ("rms_fused", "rms_manual") if HAS_RMS_NORM else ()
    dumps = dict(zip(names, runs.get(*names)))
    ops = {n: read_ops(os.path.join(d, "step0", "rank0")) for n, d in dumps.items()}
    apis = {n: {o["op"].rsplit(".", 2)[0] for o in v} for n, v in ops.items()}
    assert "Functional.scaled_dot_product_attention" in apis["sdpa"]
    assert "Functional.softmax" in apis["fp32"] and "Functional.softmax" not in apis["sdpa"]
    assert "Functional.layer_norm" not in apis["ln_manual"]
    assert {"Torch.rsqrt", "Tensor.var"} <= apis["ln_manual"]
    if HAS_RMS_NORM:
        assert "Functional.rms_norm" in apis["rms_fused"]
        assert "Functional.rms_norm" not in apis["rms_manual"]
        assert "Torch.rsqrt" in apis["rms_manual"]
    recomputed = [o for o in ops["checkpoint"] if o.get("recompute")]
    assert recomputed and all(o["direction"] == "forward" for o in recomputed)
    assert not any(o.get("recompute") for o in ops["fp32"])
    # The recompute ends early (by an exception in the block): later calls are outside it.
    assert all(o["module"].startswith("block") for o in recomputed)
    for name in ("fp32", "checkpoint"):
        adam = [o for o in ops[name] if o["op"].startswith("Tensor.addcdiv_.")]
        assert adam and {o["module"] for o in adam} == {None}, name
    block = [o for o in ops["sdpa_mix"] if o["op"].startswith("Module.block.Block.")]
    assert [o["direction"] for o in block] == ["forward", "backward"]

    def loss(name: str) -> float:
        (rec,) = [o for o in ops[name] if o["op"] == "Functional.cross_entropy.0.forward"]
        (out,) = [t for t in rec["tensors"] if t["role"] == "output"]
        return float(out["stats"]["mean"])

    for name, base in (("sdpa", "fp32"), ("ln_manual", "fp32"), ("checkpoint", "fp32")):
        assert loss(name) == pytest.approx(loss(base), rel=1e-5), name
    if HAS_RMS_NORM:
        assert loss("rms_manual") == pytest.approx(loss("rms_fused"), rel=1e-5)


def test_stopped_capture_leaves_a_valid_short_dump(runs: Runs) -> None:
    """``--stop-capture-after 2``: the agent switched itself off (one report, training went
    on): a manifest, a complete op log of exactly 2 records, nothing cut short."""
    (dump,) = runs.get("stopped")
    with open(os.path.join(dump, "manifest.json"), encoding="utf-8") as fh:
        assert json.load(fh)["format"] == "probe-dump"
    path = os.path.join(dump, "step0", "rank0", "ops.jsonl")
    with open(path, encoding="utf-8") as fh:
        text = fh.read()
    assert text.endswith("\n")
    ops = [json.loads(line) for line in text.splitlines()]
    assert [o["seq"] for o in ops] == [0, 1]
    assert all(o["direction"] == "forward" for o in ops)
    assert "CaptureStopped" in runs.stderr["stopped"]  # the agent reported it, once
    assert not [p for p in os.listdir(os.path.join(dump, "step0", "rank0")) if ".tmp" in p]


# ---------------------------------------------------------------- the scenarios


def test_identical_runs_are_all_exact(runs: Runs, tmp_path: Any) -> None:
    """Control: two identical runs pass, every row paired by name."""
    bench, cmp_ = runs.get("fp32", "fp32_again")
    c = compare(bench, cmp_, _out(tmp_path))
    assert c.code == EXIT_PASS, c.show()
    assert c.counts["error"] == c.counts["warning"] == 0, c.show()
    assert c.counts["unmatched_bench"] == c.counts["unmatched_cmp"] == 0, c.show()
    mb = c.matched_by()
    assert set(mb) == set(MATCHED_BY), mb
    assert mb["exact"] == c.counts["tensors"] > 0, mb
    assert mb["aligned"] == mb["mapped"] == mb["module"] == 0, mb


def test_bf16_autocast_vs_fp32_pairs_without_shape_mismatch(runs: Runs, tmp_path: Any) -> None:
    """bf16 autocast against fp32, no fault, two steps: the verdict is the tolerances' to
    decide (exit 0 or 1), but no finding may rest on a mis-pairing (a shape mismatch), and
    every tensor is paired. A cast that is an identity in float32 (``x.float()`` on float)
    and a copy in bfloat16 records its gradient both ways, so its backward pairs too."""
    bench, cmp_ = runs.get("fp32_2steps", "bf16_2steps")
    c = compare(bench, cmp_, _out(tmp_path))
    assert c.code in (EXIT_PASS, EXIT_DIVERGENCE), c.show()
    assert not shape_mismatches(c), f"{shape_mismatches(c)}\n{c.show()}"
    assert c.counts["unmatched_bench"] == c.counts["unmatched_cmp"] == 0, c.show()


def test_bf16_autocast_with_a_fault_names_the_faulted_op(runs: Runs, tmp_path: Any) -> None:
    """bf16 autocast plus a gelu 50 % off, against fp32: the gelu is the culprit."""
    bench, cmp_ = runs.get("fp32_2steps", "bf16_2steps_gelu_fault")
    c = compare(bench, cmp_, _out(tmp_path))
    assert c.code == EXIT_DIVERGENCE, c.show()
    assert culprits(c)["forward"] == f"{GELU}.forward", c.show()
    assert GELU in c.summary["headline"], c.show()
    assert not shape_mismatches(c), f"{shape_mismatches(c)}\n{c.show()}"


@pytest.mark.parametrize(
    ("bench_run", "cmp_run", "level"),
    [("fp32", "sdpa", "api"), ("eager_mix", "sdpa_mix", "mix")],
)
def test_sdpa_vs_eager_attention_blames_nothing(
    runs: Runs, tmp_path: Any, bench_run: str, cmp_run: str, level: str
) -> None:
    """One fused attention call against matmul/div/softmax/matmul: the same numbers, so no
    op is blamed and the run passes; the differing ops are paired by something other than
    their names (aligned, mapped, or through their module)."""
    bench, cmp_ = runs.get(bench_run, cmp_run)
    c = compare(bench, cmp_, _out(tmp_path))
    assert culprits(c) == {"forward": None, "backward": None}, c.show()
    assert c.code == EXIT_PASS, c.show()
    assert not shape_mismatches(c), f"{shape_mismatches(c)}\n{c.show()}"
    mb = c.matched_by()
    assert mb["mapped"] > 0, mb
    # The headline says where the code paths differ and how that place was compared.
    assert "inside `block`" in c.summary["headline"], c.show()
    assert "mapped as attention" in c.summary["headline"], c.show()
    regions = c.summary["pairs"][0]["regions"]
    assert {r["direction"] for r in regions} == {"forward", "backward"}, regions
    assert all(r["rule"] == "attention" for r in regions), regions
    if level != "mix":
        return
    rows = c.rows()
    if rows is not None:
        block = [r for r in rows if r["op"].startswith("Module.block.Block.")]
        assert block and all(r["verdict"] == "pass" for r in block), block
    else:
        # Without pyarrow: the run passed as a whole, and no block row is among the worst.
        bad = [
            w
            for w in c.summary["worst_ops"]
            if w["op"].startswith("Module.block.Block.") and w["verdict"] != "pass"
        ]
        assert not bad, bad


@pytest.mark.parametrize(
    ("bench_run", "cmp_run"),
    [("fp32", "ln_manual"), pytest.param("rms_fused", "rms_manual", marks=needs_rms_norm)],
)
def test_manual_norm_vs_fused_blames_nothing(
    runs: Runs, tmp_path: Any, bench_run: str, cmp_run: str
) -> None:
    """A norm computed by hand (mean, var, rsqrt, ...) against the fused kernel: passes."""
    bench, cmp_ = runs.get(bench_run, cmp_run)
    c = compare(bench, cmp_, _out(tmp_path))
    assert culprits(c) == {"forward": None, "backward": None}, c.show()
    assert c.code == EXIT_PASS, c.show()
    assert not shape_mismatches(c), f"{shape_mismatches(c)}\n{c.show()}"


@pytest.mark.parametrize(
    ("bench_run", "cmp_run"),
    [
        ("fp32", "ln_manual_gelu_fault"),
        pytest.param("rms_fused", "rms_manual_gelu_fault", marks=needs_rms_norm),
    ],
)
def test_manual_norm_with_a_fault_names_the_faulted_op(
    runs: Runs, tmp_path: Any, bench_run: str, cmp_run: str
) -> None:
    """The norms differ in operators and the gelu after them is 5 % off: the gelu is named,
    by the finding and by the headline (not a mis-paired norm op before it)."""
    bench, cmp_ = runs.get(bench_run, cmp_run)
    c = compare(bench, cmp_, _out(tmp_path))
    assert c.code == EXIT_DIVERGENCE, c.show()
    assert culprits(c)["forward"] == f"{GELU}.forward", c.show()
    assert GELU in c.summary["headline"], c.show()
    assert not shape_mismatches(c), f"{shape_mismatches(c)}\n{c.show()}"


def test_unknown_composition_falls_back_to_the_module(runs: Runs, tmp_path: Any) -> None:
    """Mish by hand (mul, tanh, softplus) against F.mish: no mapping rule knows the pair, so
    the stretch between the agreed fc1 and fc2 calls is compared at its boundary (module
    fallback); the numbers agree, so nothing is blamed and the headline says where the code
    paths differ."""
    bench, cmp_ = runs.get("mish", "mish_manual")
    c = compare(bench, cmp_, _out(tmp_path))
    assert c.code == EXIT_PASS, c.show()
    assert culprits(c) == {"forward": None, "backward": None}, c.show()
    assert c.matched_by()["module"] > 0, c.show()
    assert c.counts["unmatched_bench"] == c.counts["unmatched_cmp"] == 0, c.show()
    head = c.summary["headline"]
    assert "inside `block` (1 vs 3 API calls, compared at the module's boundary)" in head, head


def test_a_user_mapping_rule_turns_the_fallback_into_a_mapped_region(
    runs: Runs, tmp_path: Any
) -> None:
    """A mapping file (probe's TOML) that declares F.mish equivalent to its composition:
    the same stretch is now ``mapped`` under the user's rule name, not a module fallback."""
    bench, cmp_ = runs.get("mish", "mish_manual")
    rules = tmp_path / "mish.toml"
    rules.write_text(
        '[[rule]]\nname = "mish"\nfused = ["Functional.mish"]\n'
        'composition = ["Functional.softplus", "Torch.tanh", "Tensor.__mul__"]\n',
        encoding="utf-8",
    )
    c = compare(bench, cmp_, _out(tmp_path), "--mapping", str(rules))
    assert c.code == EXIT_PASS, c.show()
    mb = c.matched_by()
    assert mb["module"] == 0 and mb["mapped"] > 0, mb
    assert all(r["rule"] == "mish" for r in c.summary["pairs"][0]["regions"]), c.show()
    assert "mapped as mish" in c.summary["headline"], c.show()


def test_a_fault_inside_an_unknown_composition_names_the_region(runs: Runs, tmp_path: Any) -> None:
    """The same, with the hand-written mish's tanh 5 % off: the region's outputs diverge
    while its inputs agree, so the region is the first divergent place, and the headline
    says the code paths differ there."""
    bench, cmp_ = runs.get("mish", "mish_manual_fault")
    c = compare(bench, cmp_, _out(tmp_path))
    assert c.code == EXIT_DIVERGENCE, c.show()
    head = c.summary["headline"]
    assert "code paths differ inside `block`" in head and "outputs diverge" in head, head
    fwd = c.summary["first_divergent"]["forward"]
    assert fwd is not None and fwd["op"].startswith("Tensor.__mul__."), c.show()


def test_activation_checkpointing_leaves_nothing_unmatched(runs: Runs, tmp_path: Any) -> None:
    """The checkpointed block's forward runs again in backward (records with
    ``recompute: true``): those are paired with the first forward or reported as recompute,
    never as unmatched, and nothing shifts (the optimizer's calls of ``Tensor.__truediv__``
    come after one more of them in the checkpointed run)."""
    bench, cmp_ = runs.get("fp32", "checkpoint")
    c = compare(bench, cmp_, _out(tmp_path))
    assert c.code == EXIT_PASS, c.show()
    assert culprits(c) == {"forward": None, "backward": None}, c.show()
    assert c.counts["unmatched_bench"] == c.counts["unmatched_cmp"] == 0, c.show()
    assert not shape_mismatches(c), f"{shape_mismatches(c)}\n{c.show()}"


def test_capture_stopped_early_is_incomplete(runs: Runs, tmp_path: Any) -> None:
    """The comparison run's agent switched itself off after 2 records (its op log is
    complete, just short): not a divergence, not a pass: verdict ``incomplete``, exit 4, and
    the headline says that the comparison run's capture stopped early."""
    bench, cmp_ = runs.get("fp32", "stopped")
    c = compare(bench, cmp_, _out(tmp_path))
    assert c.code == EXIT_INCOMPLETE, c.show()
    assert c.summary["verdict"] == "incomplete", c.show()
    assert c.summary["partial"] is True, c.show()
    head = c.summary["headline"].lower()
    assert re.search(r"\bcmp\b|comparison", head), c.show()
    assert re.search(r"stop|early|short|switched off|ended", head), c.show()
    assert culprits(c) == {"forward": None, "backward": None}, c.show()


def test_msprobe_bf16_vs_fp32_pairs_everything(tmp_path: Any) -> None:
    """msprobe's own dumps (L1 statistics, a float32 run against a bf16-autocast run of the
    same model, testdata/msprobe): every tensor paired, no finding on a shape mismatch."""
    bench, cmp_ = (os.path.join(MSPROBE, d) for d in ("stats_bench", "stats_bf16"))
    if not (os.path.isdir(bench) and os.path.isdir(cmp_)):
        pytest.skip("msprobe fixtures not present (testdata/msprobe/stats_*)")
    c = compare(bench, cmp_, _out(tmp_path))
    assert c.code in (EXIT_PASS, EXIT_DIVERGENCE), c.show()
    assert c.counts["unmatched_bench"] == c.counts["unmatched_cmp"] == 0, c.show()
    assert not shape_mismatches(c), f"{shape_mismatches(c)}\n{c.show()}"
