"""`probe ckpt-compare` end to end: checkpoints written here in both layouts.

A tiny LLaMA-shaped state dict (GQA, untied head, bf16) is saved as HF safetensors (one
file, and sharded with an index json) and as a torch `.bin`, and converted by this file's
own code into a Megatron-style checkpoint (tensor-parallel ranks, optionally pipeline
stages; fused, group-interleaved QKV; gate/up fused per rank; vocabulary padded). The real
binary compares them; faulty conversions must be named down to the parameter and shard.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from conftest import SCHEMAS, probe_bin

safetensors_torch = pytest.importorskip("safetensors.torch")

HIDDEN, HEADS, KV, HEAD_DIM, FFN, VOCAB = 64, 8, 4, 8, 128, 100
LAYERS = 2
DIVISIBLE = 8  # Megatron's make_vocab_size_divisible_by (times tp)


def hf_state(layers: int = LAYERS, seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)

    def r(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=g).to(torch.bfloat16)

    sd = {"model.embed_tokens.weight": r(VOCAB, HIDDEN)}
    for i in range(layers):
        p = f"model.layers.{i}."
        sd[p + "input_layernorm.weight"] = r(HIDDEN)
        sd[p + "self_attn.q_proj.weight"] = r(HEADS * HEAD_DIM, HIDDEN)
        sd[p + "self_attn.k_proj.weight"] = r(KV * HEAD_DIM, HIDDEN)
        sd[p + "self_attn.v_proj.weight"] = r(KV * HEAD_DIM, HIDDEN)
        sd[p + "self_attn.o_proj.weight"] = r(HIDDEN, HEADS * HEAD_DIM)
        sd[p + "post_attention_layernorm.weight"] = r(HIDDEN)
        sd[p + "mlp.gate_proj.weight"] = r(FFN, HIDDEN)
        sd[p + "mlp.up_proj.weight"] = r(FFN, HIDDEN)
        sd[p + "mlp.down_proj.weight"] = r(HIDDEN, FFN)
    sd["model.norm.weight"] = r(HIDDEN)
    sd["lm_head.weight"] = r(VOCAB, HIDDEN)
    return sd


def hf_config(layers: int = LAYERS) -> dict[str, Any]:
    return {
        "architectures": ["LlamaForCausalLM"],
        "hidden_size": HIDDEN,
        "num_attention_heads": HEADS,
        "num_key_value_heads": KV,
        "head_dim": HEAD_DIM,
        "intermediate_size": FFN,
        "vocab_size": VOCAB,
        "num_hidden_layers": layers,
    }


def save_hf(sd: dict[str, torch.Tensor], folder: Path, shards: int = 1) -> Path:
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(
        json.dumps(hf_config(sum(k.endswith("q_proj.weight") for k in sd)))
    )
    if shards == 1:
        safetensors_torch.save_file(sd, str(folder / "model.safetensors"))
        return folder / "model.safetensors"
    names = list(sd)
    weight_map = {}
    for s in range(shards):
        part = names[s::shards]
        fname = f"model-{s + 1:05d}-of-{shards:05d}.safetensors"
        safetensors_torch.save_file({n: sd[n] for n in part}, str(folder / fname))
        weight_map.update({n: fname for n in part})
    (folder / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {}, "weight_map": weight_map})
    )
    return folder


def fused_qkv(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, tp: int, rank: int
) -> torch.Tensor:
    """Megatron's per-rank QKV: for each of the rank's query groups, its heads' q rows,
    then the group's k rows, then its v rows."""
    qpg = HEADS // KV
    cols = q.shape[1:]
    qg = q.reshape(KV, qpg * HEAD_DIM, *cols)
    kg = k.reshape(KV, HEAD_DIM, *cols)
    vg = v.reshape(KV, HEAD_DIM, *cols)
    fused = torch.cat([qg, kg, vg], dim=1)  # [groups, (qpg + 2) * head_dim, ...]
    per = KV // tp
    return fused[rank * per : (rank + 1) * per].reshape(-1, *cols).contiguous()


def to_megatron(
    sd: dict[str, torch.Tensor], folder: Path, tp: int = 2, pp: int = 1, fault: str | None = None
) -> Path:
    """Writes `sd` as a Megatron-style checkpoint: `iter_0000010/mp_rank_TT[_PPP]/
    model_optim_rng.pt` with the legacy `language_model` nesting. `fault`: `qkv` (rank 1 of
    layer 1 with q, k and v concatenated instead of interleaved per group) or `swap` (the
    two TP shards of layer 0's down projection exchanged)."""
    layers = sum(k.endswith("q_proj.weight") for k in sd)
    per_stage = layers // pp
    padded = -(-VOCAB // (DIVISIBLE * tp)) * DIVISIBLE * tp
    it = folder / "iter_0000010"
    for p in range(pp):
        for t in range(tp):

            def split(x: torch.Tensor, dim: int, t: int = t) -> torch.Tensor:
                return x.chunk(tp, dim=dim)[t].clone()

            def vocab_shard(x: torch.Tensor, t: int = t) -> torch.Tensor:
                pad = torch.zeros(padded - VOCAB, HIDDEN, dtype=x.dtype)
                return split(torch.cat([x, pad]), 0, t)

            enc: dict[str, Any] = {}
            for local in range(per_stage):
                i = p * per_stage + local
                h = f"model.layers.{i}."
                m = f"layers.{local}."
                q, k, v = (sd[h + f"self_attn.{n}_proj.weight"] for n in "qkv")
                qkv = fused_qkv(q, k, v, tp, t)
                if fault == "qkv" and i == 1 and t == 1:
                    per = KV // tp
                    qpg = HEADS // KV
                    qkv = torch.cat(
                        [
                            q.reshape(KV, qpg * HEAD_DIM, HIDDEN)[per:].reshape(-1, HIDDEN),
                            k.reshape(KV, HEAD_DIM, HIDDEN)[per:].reshape(-1, HIDDEN),
                            v.reshape(KV, HEAD_DIM, HIDDEN)[per:].reshape(-1, HIDDEN),
                        ]
                    ).contiguous()
                enc[m + "input_norm.weight"] = sd[h + "input_layernorm.weight"].clone()
                enc[m + "self_attention.query_key_value.weight"] = qkv
                enc[m + "self_attention.dense.weight"] = split(sd[h + "self_attn.o_proj.weight"], 1)
                enc[m + "post_attention_norm.weight"] = sd[
                    h + "post_attention_layernorm.weight"
                ].clone()
                gate, up = (split(sd[h + f"mlp.{n}_proj.weight"], 0) for n in ("gate", "up"))
                enc[m + "mlp.dense_h_to_4h.weight"] = torch.cat([gate, up]).contiguous()
                down_rank = 1 - t if (fault == "swap" and i == 0) else t
                enc[m + "mlp.dense_4h_to_h.weight"] = (
                    sd[h + "mlp.down_proj.weight"].chunk(tp, dim=1)[down_rank].clone()
                )
                enc[m + "self_attention.core_attention._extra_state"] = None
            lm: dict[str, Any] = {"encoder": enc}
            if p == 0:
                lm["embedding"] = {
                    "word_embeddings": {"weight": vocab_shard(sd["model.embed_tokens.weight"])}
                }
            if p == pp - 1:
                enc["final_norm.weight"] = sd["model.norm.weight"].clone()
                lm["output_layer"] = {"weight": vocab_shard(sd["lm_head.weight"])}
            args = argparse.Namespace(
                hidden_size=HIDDEN,
                num_attention_heads=HEADS,
                num_query_groups=KV,
                group_query_attention=True,
                kv_channels=HEAD_DIM,
                ffn_hidden_size=FFN,
                num_layers=layers,
                padded_vocab_size=padded,
                tensor_model_parallel_size=tp,
                pipeline_model_parallel_size=pp,
                params_dtype=torch.bfloat16,
                swiglu=True,
            )
            rank_dir = it / (f"mp_rank_{t:02d}" if pp == 1 else f"mp_rank_{t:02d}_{p:03d}")
            rank_dir.mkdir(parents=True)
            state = {
                "args": args,
                "checkpoint_version": 3.0,
                "iteration": 10,
                "model": {"language_model": lm},
                "rng_state": [
                    {
                        "random_rng_state": (3, (1, 2), None),
                        "torch_rng_state": torch.zeros(8, dtype=torch.uint8),
                    }
                ],
            }
            torch.save(state, rank_dir / "model_optim_rng.pt")
    (folder / "latest_checkpointed_iteration.txt").write_text("10")
    return folder


def run(a: Path, b: Path, out: Path, *extra: str) -> tuple[int, str, str, dict[str, Any] | None]:
    p = subprocess.run(
        [probe_bin(), "ckpt-compare", str(a), str(b), "-o", str(out), *extra],
        capture_output=True,
        text=True,
        timeout=120,
    )
    summary = out / "ckpt_compare.json"
    data = json.loads(summary.read_text()) if p.returncode in (0, 1) and summary.exists() else None
    if data is not None:
        jsonschema = pytest.importorskip("jsonschema")
        with open(os.path.join(SCHEMAS, "probe-ckpt-compare.v1.schema.json")) as f:
            jsonschema.validate(data, json.load(f))
    return p.returncode, p.stdout, p.stderr, data


def test_hf_against_tp2_megatron_passes(tmp_path: Path) -> None:
    sd = hf_state()
    hf = save_hf(sd, tmp_path / "hf")
    mg = to_megatron(sd, tmp_path / "mg")
    code, out, err, s = run(hf, mg, tmp_path / "out")
    assert code == 0, out + err
    assert s is not None and s["verdict"] == "pass"
    assert (
        s["counts"]["compared"] == 3 + 9 * LAYERS
        and s["counts"]["exact"] == s["counts"]["compared"]
    )
    assert s["cmp"]["layout"] == {"kind": "megatron", "tp": 2, "pp": 1}
    assert s["model"] == {"heads": HEADS, "kv_heads": KV, "head_dim": HEAD_DIM, "vocab": VOCAB}
    emb = next(p for p in s["params"] if p["name"] == "model.embed_tokens.weight")
    assert "padding" in emb["note"]


def test_sharded_hf_and_torch_bin_against_megatron_pp(tmp_path: Path) -> None:
    sd = hf_state(layers=4)
    hf = save_hf(sd, tmp_path / "hf", shards=3)
    mg = to_megatron(sd, tmp_path / "mg", tp=2, pp=2)
    code, out, err, s = run(hf, mg, tmp_path / "o1")
    assert code == 0, out + err
    assert s is not None and s["counts"]["compared"] == 3 + 9 * 4
    (tmp_path / "bin").mkdir()
    torch.save(sd, tmp_path / "bin" / "pytorch_model.bin")
    code, out, err, s = run(tmp_path / "bin" / "pytorch_model.bin", hf, tmp_path / "o2")
    assert code == 0, out + err
    assert s is not None and s["bench"]["layout"] == {"kind": "torch"}


def test_wrongly_interleaved_qkv_is_named_with_its_shard(tmp_path: Path) -> None:
    sd = hf_state()
    hf = save_hf(sd, tmp_path / "hf")
    mg = to_megatron(sd, tmp_path / "mg", fault="qkv")
    code, out, err, s = run(hf, mg, tmp_path / "out")
    assert code == 1, out + err
    assert s is not None
    bad = [p for p in s["params"] if p["status"] == "differs"]
    assert [p["name"] for p in bad][0] == "model.layers.1.self_attn.q_proj.weight"
    assert {p["name"] for p in bad} <= {f"model.layers.1.self_attn.{n}_proj.weight" for n in "qkv"}
    shard = bad[0]["shards"][0]
    assert shard["side"] == "cmp" and shard["tp"] == 1
    assert (
        "mp_rank_01" in shard["tensor"]
        and "layers.1.self_attention.query_key_value" in shard["tensor"]
    )
    assert "model.layers.1.self_attn.q_proj.weight" in out and "tp rank 1" in out


def test_swapped_tp_shard_is_named(tmp_path: Path) -> None:
    sd = hf_state()
    hf = save_hf(sd, tmp_path / "hf")
    mg = to_megatron(sd, tmp_path / "mg", fault="swap")
    code, out, err, s = run(hf, mg, tmp_path / "out")
    assert code == 1, out + err
    assert s is not None
    assert s["headline"].startswith(
        "first differing parameter: model.layers.0.mlp.down_proj.weight"
    )
    bad = [p for p in s["params"] if p["status"] == "differs"]
    assert [p["name"] for p in bad] == ["model.layers.0.mlp.down_proj.weight"]
    assert {sh["tp"] for sh in bad[0]["shards"]} == {0, 1}
    assert bad[0]["cosine"] < 0.5


def test_missing_shard_is_bad_input(tmp_path: Path) -> None:
    sd = hf_state()
    hf = save_hf(sd, tmp_path / "hf")
    mg = to_megatron(sd, tmp_path / "mg", tp=2, pp=2)
    shutil.rmtree(mg / "iter_0000010" / "mp_rank_01_000")
    code, out, err, _ = run(hf, mg, tmp_path / "out")
    assert code == 2, out + err
    assert "mp_rank_01_000" in err and err.count("\n") == 1
    mg2 = to_megatron(sd, tmp_path / "mg2", tp=2)
    shutil.rmtree(mg2 / "iter_0000010" / "mp_rank_01")
    code, out, err, _ = run(hf, mg2, tmp_path / "out")
    assert code == 2 and "shard is missing" in err, err


def test_missing_model_shape_is_asked_for(tmp_path: Path) -> None:
    sd = hf_state()
    hf = tmp_path / "hf.safetensors"
    safetensors_torch.save_file(sd, str(hf))
    mg = to_megatron(sd, tmp_path / "mg")
    for f in (mg / "iter_0000010").glob("*/model_optim_rng.pt"):
        st = torch.load(f, weights_only=False)
        del st["args"]
        torch.save(st, f)
    code, out, err, _ = run(hf, mg, tmp_path / "out")
    assert code == 2 and "--mapping" in err, err
    mapping = tmp_path / "m.toml"
    mapping.write_text(f"[model]\nheads = {HEADS}\nkv_heads = {KV}\nhead_dim = {HEAD_DIM}\n")
    code, out, err, s = run(hf, mg, tmp_path / "out", "--mapping", str(mapping))
    assert code == 0, out + err
    assert s is not None and s["model_from"]["heads"] == "--mapping"


def test_hostile_pickle_is_refused(tmp_path: Path) -> None:
    class Evil:
        def __reduce__(self) -> tuple[Any, tuple[str]]:
            return (os.system, ("echo pwned > " + str(tmp_path / "pwned"),))

    torch.save({"model.norm.weight": torch.zeros(4), "x": Evil()}, tmp_path / "evil.pt")
    torch.save({"model.norm.weight": torch.zeros(4)}, tmp_path / "ok.pt")
    code, out, err, _ = run(tmp_path / "ok.pt", tmp_path / "evil.pt", tmp_path / "out")
    assert code == 2, out + err
    assert "system" in err and err.count("\n") == 1
    assert not (tmp_path / "pwned").exists()


dcp = pytest.importorskip("torch.distributed.checkpoint")

DCP_SHARDED = """
import sys
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.tensor import Shard, distribute_tensor, init_device_mesh

rank, init, src, out = int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4]
dist.init_process_group("gloo", init_method=init, rank=rank, world_size=2)
mesh = init_device_mesh("cpu", (2,))
sd = torch.load(src, weights_only=True)
# Rows on dim 0, columns on dim 1 for the row-parallel projections, the 3-D tensor on dim 2.
dim = {n: 2 if t.dim() == 3 else 1 if ("o_proj" in n or "down_proj" in n) else 0 for n, t in sd.items()}
sh = {n: distribute_tensor(t, mesh, [Shard(dim[n])]) for n, t in sd.items()}
dcp.save(sh, checkpoint_id=out)
dist.destroy_process_group()
"""


def save_dcp(sd: dict[str, torch.Tensor], folder: Path) -> Path:
    dcp.save(sd, checkpoint_id=str(folder))
    return folder


def test_dcp_against_hf(tmp_path: Path) -> None:
    sd = hf_state()
    hf = save_hf(sd, tmp_path / "hf")
    d = save_dcp(sd, tmp_path / "dcp")
    assert (d / ".metadata").is_file() and list(d.glob("*.distcp"))
    code, out, err, s = run(hf, d, tmp_path / "o1")
    assert code == 0, out + err
    assert s is not None and s["cmp"]["layout"] == {"kind": "dcp"}
    assert (
        s["counts"]["compared"] == 3 + 9 * LAYERS
        and s["counts"]["exact"] == s["counts"]["compared"]
    )
    bad = dict(sd)
    bad["model.layers.1.mlp.up_proj.weight"] = sd["model.layers.1.mlp.up_proj.weight"] * 2
    d2 = save_dcp(bad, tmp_path / "dcp2")
    code, out, err, s = run(hf, d2, tmp_path / "o2")
    assert code == 1, out + err
    assert s is not None
    assert [p["name"] for p in s["params"] if p["status"] == "differs"] == [
        "model.layers.1.mlp.up_proj.weight"
    ]


def save_dcp_2ranks(sd: dict[str, torch.Tensor], tmp: Path, name: str) -> Path:
    """`sd` saved as a DCP by two gloo ranks, each tensor sharded (see DCP_SHARDED)."""
    torch.save(sd, tmp / f"{name}.pt")
    script = tmp / "save.py"
    script.write_text(DCP_SHARDED)
    init = "file://" + str(tmp / f"{name}.store")
    out_dir = tmp / name
    env = {
        k: v for k, v in os.environ.items() if not k.startswith(("RANK", "WORLD_SIZE", "MASTER_"))
    }
    cmd = [sys.executable, str(script), "R", init, str(tmp / f"{name}.pt"), str(out_dir)]
    procs = [
        subprocess.Popen(
            [str(r) if c == "R" else c for c in cmd],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
        for r in range(2)
    ]
    outs = [p.communicate(timeout=180)[0].decode() for p in procs]
    if any(p.returncode != 0 for p in procs):
        pytest.skip("2-rank gloo DCP save failed here: " + outs[0][-500:])
    return out_dir


def test_dcp_sharded_over_two_ranks(tmp_path: Path) -> None:
    sd = hf_state()
    sd["extra.w3"] = torch.randn(4, 6, 8).to(torch.bfloat16)
    hf = save_hf(sd, tmp_path / "hf")
    d = save_dcp_2ranks(sd, tmp_path, "dcp")
    assert len(list(d.glob("*.distcp"))) == 2
    md = dcp.FileSystemReader(str(d)).read_metadata().state_dict_metadata
    assert len(md["model.layers.0.self_attn.o_proj.weight"].chunks) == 2
    assert md["extra.w3"].chunks[1].offsets == torch.Size([0, 0, 4])
    code, out, err, s = run(hf, d, tmp_path / "o1")
    assert code == 0, out + err
    assert s is not None and s["counts"]["exact"] == 4 + 9 * LAYERS
    bad = dict(sd)
    w = sd["model.layers.0.mlp.down_proj.weight"].clone()
    w[:, FFN // 2 :] += 1  # the second rank's columns
    bad["model.layers.0.mlp.down_proj.weight"] = w
    d2 = save_dcp_2ranks(bad, tmp_path, "dcp2")
    code, out, err, s = run(hf, d2, tmp_path / "o2")
    assert code == 1, out + err
    assert s is not None
    diff = [p for p in s["params"] if p["status"] == "differs"]
    assert [p["name"] for p in diff] == ["model.layers.0.mlp.down_proj.weight"]
    assert [sh["tensor"] for sh in diff[0]["shards"]] == [
        f"__1_0.distcp: model.layers.0.mlp.down_proj.weight chunk [0, {FFN // 2}]"
    ]


def test_dcp_missing_file_and_cut_chunk_are_bad_input(tmp_path: Path) -> None:
    sd = hf_state()
    hf = save_hf(sd, tmp_path / "hf")
    d = save_dcp(sd, tmp_path / "dcp")
    f = next(d.glob("*.distcp"))
    data = f.read_bytes()
    f.write_bytes(data[: len(data) // 2])
    code, out, err, _ = run(hf, d, tmp_path / "o1")
    assert code == 2 and "past the end" in err and err.count("\n") == 1, err
    f.unlink()
    code, out, err, _ = run(hf, d, tmp_path / "o2")
    assert code == 2 and f.name in err and err.count("\n") == 1, err
