"""A mixture-of-experts model whose two runs apply their experts differently, as ports do.

``transformers`` gives its MoE models (Mixtral and DeepSeek-V3 here: small ones from a
config, random init, nothing downloaded) three implementations of the same experts:
``eager`` loops over
the experts hit, indexing each one's tokens and its slice of the 3-D weights and calling
the activation module once per expert; ``grouped_mm`` sorts the tokens by expert and runs
one grouped matmul per projection; ``batched_mm`` gathers a weight per token and runs one
``bmm``. A GPU run on grouped kernels against an NPU run on the loop (or on
``npu_grouped_matmul``) is this case. The same weights give the same numbers, so compare
must pass the runs, with the experts compared at their module's boundary and nothing left
unmatched, and must name the experts when one run's activation is faulty.

Found by running it: the activation module's calls (once per expert on one side, once on
the other) were left over, the weights' gradients were compared against the last expert's
share, at mix level the experts' input had lost its link to its producer, and a balanced
router's even shares read as micro-batches.
"""

from __future__ import annotations

import json
import re
from typing import Any

import pytest

from conftest import compare_summary, probe_bin, run_agent_script

pytest.importorskip("transformers")

SCRIPT = """
import json
import sys
import torch
import torch.nn.functional as F
import probe
import transformers

if not hasattr(transformers.PreTrainedModel, "set_experts_implementation"):
    sys.exit(3)  # a transformers without selectable experts implementations
silu = F.silu


def faulty_silu():  # the first activation of each step (layer 0's experts), 5 % too large
    calls = [0]

    def faulty(x, inplace=False):
        calls[0] += 1
        y = silu(x, inplace=inplace)
        return y * 1.05 if calls[0] % 2 == 1 else y

    return faulty


def run(dump, impl, level, fault, arch):
    F.silu = faulty_silu() if fault else silu
    probe.seed_all(0)
    common = dict(
        vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
        num_experts_per_tok=2,
    )
    try:
        if arch == "mixtral":
            model = transformers.MixtralForCausalLM(
                transformers.MixtralConfig(num_local_experts=4, **common)
            )
        else:  # DeepSeek-V3: a dense first layer, a shared expert, grouped top-k routing
            model = transformers.DeepseekV3ForCausalLM(
                transformers.DeepseekV3Config(
                    moe_intermediate_size=48, n_routed_experts=4, n_shared_experts=1,
                    first_k_dense_replace=1, n_group=2, topk_group=1, q_lora_rank=32,
                    kv_lora_rank=16, qk_rope_head_dim=8, qk_nope_head_dim=8, v_head_dim=16,
                    **common,
                )
            )
    except (AttributeError, TypeError, ValueError):
        sys.exit(3)  # this transformers has no such model or configuration
    model.set_experts_implementation(impl)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    ids = torch.randint(0, 128, (2, 16), generator=torch.Generator().manual_seed(1))
    dbg = probe.Debugger(None, dump_path=dump, level=level, mode="statistics")
    for step in range(2):
        dbg.start(model)
        out = model(input_ids=ids, labels=ids)
        out.loss.backward()
        opt.step()
        opt.zero_grad()
        dbg.stop()
        dbg.step()
    dbg.close()
    F.silu = silu


# Every run in this one process: each a new model, seeded alike, and a Debugger of its own
# (importing torch and transformers took most of a run's time).
for args in json.loads(sys.argv[1]):
    run(*args)
"""

#: The runs: name, experts implementation, level, a faulty activation, architecture.
RUNS = (
    ("eager", "eager", "mix", False, "mixtral"),
    ("grouped_mm", "grouped_mm", "mix", False, "mixtral"),
    ("batched_mm", "batched_mm", "mix", False, "mixtral"),
    ("grouped_fault", "grouped_mm", "mix", True, "mixtral"),
    ("eager_api", "eager", "api", False, "mixtral"),
    ("grouped_api", "grouped_mm", "api", False, "mixtral"),
    ("eager_module", "eager", "module", False, "mixtral"),
    ("grouped_module", "grouped_mm", "module", False, "mixtral"),
    ("deepseek_eager", "eager", "mix", False, "deepseek"),
    ("deepseek_grouped_mm", "grouped_mm", "mix", False, "deepseek"),
)


def compare_json(bench: str, cmp_: str, out: str) -> tuple[int, dict[str, Any]]:
    return compare_summary(bench, cmp_, out, "--format", "json")


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    probe_bin()  # skip before the runs when there is no binary
    root = tmp_path_factory.mktemp("mixtral")
    out = {name: str(root / name) for name, *_ in RUNS}
    todo = [[out[name], *rest] for name, *rest in RUNS]
    r = run_agent_script(SCRIPT, json.dumps(todo), timeout=900)
    if r.returncode == 3:
        pytest.skip("this transformers has no selectable experts implementations")
    assert r.returncode == 0, r.stderr[-4000:]
    return out


def _agree(s: dict[str, Any], layers: tuple[int, ...] = (0, 1)) -> None:
    c = s["counts"]
    assert c["error"] == 0 and c["warning"] == 0, s["headline"]
    assert c["unmatched_bench"] == 0 and c["unmatched_cmp"] == 0, s["headline"]
    assert c["matched_by"]["module"] > 0, c
    assert s["first_divergent"] == {"forward": None, "backward": None}, s["headline"]
    for layer in layers:
        assert f"inside `model.layers.{layer}.mlp.experts`" in s["headline"], s["headline"]
    # Experts looping over a balanced router's shares are no micro-batches.
    assert "micro-batches" not in s["headline"], s["headline"]
    assert all("micro_batches" not in p for p in s["pairs"]), s["pairs"]


@pytest.mark.parametrize("impl", ["grouped_mm", "batched_mm"])
def test_other_experts_implementations_agree(
    runs: dict[str, str], tmp_path: Any, impl: str
) -> None:
    code, s = compare_json(runs["eager"], runs[impl], str(tmp_path / "out"))
    assert code == 0, s["headline"]
    _agree(s)


def test_deepseek_v3_experts_agree(runs: dict[str, str], tmp_path: Any) -> None:
    """A dense first layer, a shared expert beside the routed ones, and grouped top-k
    routing. Its router spreads step 1's tokens evenly (16 a routed expert): the eager loop
    then calls each op 4 times on a quarter of the grouped call's input."""
    code, s = compare_json(
        runs["deepseek_eager"], runs["deepseek_grouped_mm"], str(tmp_path / "out")
    )
    assert code == 0, s["headline"]
    _agree(s, layers=(1,))


def test_they_agree_at_api_level_too(runs: dict[str, str], tmp_path: Any) -> None:
    code, s = compare_json(runs["eager_api"], runs["grouped_api"], str(tmp_path / "out"))
    assert code == 0, s["headline"]
    _agree(s)


def test_they_agree_with_module_records_only(runs: dict[str, str], tmp_path: Any) -> None:
    """``level="module"`` (msprobe's L0): no API calls, so nothing else differs in the
    experts' own module; their activation module's calls (one per expert against one) are
    inside the experts' records, which pair and are compared."""
    code, s = compare_json(runs["eager_module"], runs["grouped_module"], str(tmp_path / "out"))
    assert code == 0, s["headline"]
    c = s["counts"]
    assert c["error"] == 0 and c["unmatched_bench"] == c["unmatched_cmp"] == 0, s["headline"]
    assert c["inside"] > 0, c
    for layer in (0, 1):
        # (the region holds the activation module's records: module calls, not API calls)
        experts = rf"inside `model\.layers\.{layer}\.mlp\.experts`"
        said = re.search(experts + r" \((\d+) vs 1 module calls", s["headline"])
        assert said is not None and int(said.group(1)) > 1, s["headline"]


def test_a_fault_in_the_grouped_experts_is_named(runs: dict[str, str], tmp_path: Any) -> None:
    code, s = compare_json(runs["eager"], runs["grouped_fault"], str(tmp_path / "out"))
    assert code == 1, s["headline"]
    assert s["headline"].startswith(
        "DIVERGENCE: code paths differ inside `model.layers.0.mlp.experts`"
    ), s["headline"]
    assert "first divergent region" in s["headline"], s["headline"]
    first = s["first_divergent"]["forward"]
    assert first is not None and first["step"] == "step0", s["first_divergent"]
    assert "local to this op" in first["explanation"], first
