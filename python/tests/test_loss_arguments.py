"""A loss called with other arguments on one side (issue 47): a small LLaMA from a
``transformers`` config (random init, nothing downloaded) with one step under capture, its
loss ``F.cross_entropy`` over the vocabulary, one run with ``label_smoothing=0.1`` (after a
few identical steps uncaptured: a model that fits its targets a little).

The loss's inputs are equal on both sides (the logits, the int64 token targets), its output
differs: ``probe compare`` must name the ``cross_entropy`` call as the first divergent op,
called with another ``label_smoothing``, not say accumulated drift. The targets' scale (up to
the vocabulary size) is no rounding of the logits: counted in the bound on rounding noise it
made the loss itself look like noise. Two sizes of model, vocabulary and batch: the rule, not
one case.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Callable

import pytest

from conftest import compare_summary, probe_bin, run_agent_script
from msprobe_like import to_msprobe

pytest.importorskip("transformers")

SCRIPT = """
import sys
import torch
import torch.nn.functional as F
import probe
from transformers import LlamaConfig, LlamaForCausalLM

dump, vocab, hidden, batch, seq = sys.argv[1], *map(int, sys.argv[2:6])
smoothing = float(sys.argv[6])
probe.seed_all(0)
cfg = LlamaConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden,
                  num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                  max_position_embeddings=seq, attn_implementation="eager")
model = LlamaForCausalLM(cfg)
opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
g = torch.Generator().manual_seed(1)
ids = torch.randint(0, vocab, (batch, seq), generator=g)
ids[0, -1] = vocab - 1  # the largest token in the targets: their max is the vocabulary's


def loss_of(smoothing):
    logits = model(input_ids=ids).logits
    return F.cross_entropy(logits[:, :-1].reshape(-1, vocab), ids[:, 1:].reshape(-1),
                           label_smoothing=smoothing)


# A few steps uncaptured, the same on both sides: the model starts to fit its targets, so that
# smoothing the labels changes the loss by more than the rounding of a random model's.
for _ in range(4):
    loss_of(0.0).backward()
    opt.step()
    opt.zero_grad()
dbg = probe.Debugger(None, dump_path=dump, level="mix", mode="statistics")
dbg.start(model)
loss = loss_of(smoothing)
loss.backward()
opt.step()
opt.zero_grad()
dbg.stop()
dbg.step()
"""


def _run(dump: str, size: tuple[int, int, int, int], smoothing: float) -> None:
    r = run_agent_script(SCRIPT, dump, *map(str, size), repr(smoothing))
    assert r.returncode == 0, r.stderr[-4000:]


# (vocabulary, hidden size, batch, sequence): int64 targets up to 511 and 1023.
SIZES = [(512, 64, 3, 129), (1024, 32, 2, 65)]


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Callable[[tuple[int, ...]], Path]:
    """The two runs of a size (``bench``, ``cmp`` under the folder returned), made once."""
    made: dict[tuple[int, ...], Path] = {}

    def of(size: tuple[int, ...]) -> Path:
        if size not in made:
            root = tmp_path_factory.mktemp(f"vocab{size[0]}")
            _run(str(root / "bench"), size, 0.0)
            _run(str(root / "cmp"), size, 0.1)
            made[size] = root
        return made[size]

    return of


@pytest.mark.parametrize("msprobe", [False, True], ids=["probe", "msprobe"])
@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"vocab{s[0]}")
def test_a_loss_called_with_label_smoothing_is_named_not_drift(
    size: tuple[int, int, int, int],
    msprobe: bool,
    runs: Callable[[tuple[int, ...]], Path],
    tmp_path: Path,
) -> None:
    """Also on the same runs written as msprobe dumps them (``msprobe_like.to_msprobe``:
    its ``input_kwargs``, no module records, no dataflow ids)."""
    probe_bin()  # skip before the runs when there is no binary
    root = runs(size)
    bench, cmp_ = str(root / "bench"), str(root / "cmp")
    if msprobe:
        bench = str(to_msprobe(root / "bench", tmp_path / "ms_bench"))
        cmp_ = str(to_msprobe(root / "cmp", tmp_path / "ms_cmp"))
    code, s = compare_summary(bench, cmp_, os.path.join(tmp_path, "out"))
    assert code == 1, s["headline"]
    f = s["first_divergent"]["forward"]
    assert f is not None, s["headline"]
    assert f["op"] == "Functional.cross_entropy.0.forward", s["headline"]
    assert any("label_smoothing" in str(a) for a in f["args"]), f["args"]
    assert "label_smoothing" in s["headline"], s["headline"]
    assert "drift" not in s["headline"], s["headline"]
    assert s["pairs"][0]["findings"].get("drift") in (None, []), s["pairs"][0]["findings"]
    # Its inputs are equal (the logits, the token targets): only the call differs.
    ins = [e for e in f["evidence"] if e.startswith("in ")]
    assert len(ins) == 2 and all("[pass]" in e for e in ins), f["evidence"]
