"""Bench of `probe ckpt-compare`: a LLaMA-1B-shaped checkpoint in bf16 as HF safetensors
(sharded with an index json) against the same weights as a 2-way tensor-parallel
Megatron-style checkpoint (fused QKV, gate/up), the time against `cat` of both sides and
the peak RSS against the largest tensor.

    python bench/ckpt_bench.py --probe target/release/probe [--scale 0.25] [--dir /tmp]

Tensors are generated one at a time from a seed per name, so the writer never holds more
than one rank's state dict. Everything is written under a temporary folder of --dir and
removed afterwards. --scale shrinks the hidden and MLP sizes (and layers) together.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import zlib
from pathlib import Path

import torch


def shape_of(scale: float) -> dict[str, int]:
    s = max(scale, 1 / 16)
    heads = 32
    head_dim = 64
    hidden = heads * head_dim
    layers = max(1, round(16 * s))
    return {
        "hidden": hidden,
        "heads": heads,
        "kv": 8,
        "head_dim": head_dim,
        "ffn": int(8192 * min(1.0, s * 2)) // 256 * 256 or 256,
        "vocab": 32000,
        "layers": layers,
    }


def names(m: dict[str, int]) -> list[tuple[str, tuple[int, ...]]]:
    h, hd = m["hidden"], m["head_dim"]
    out: list[tuple[str, tuple[int, ...]]] = [("model.embed_tokens.weight", (m["vocab"], h))]
    for i in range(m["layers"]):
        p = f"model.layers.{i}."
        out += [
            (p + "input_layernorm.weight", (h,)),
            (p + "self_attn.q_proj.weight", (m["heads"] * hd, h)),
            (p + "self_attn.k_proj.weight", (m["kv"] * hd, h)),
            (p + "self_attn.v_proj.weight", (m["kv"] * hd, h)),
            (p + "self_attn.o_proj.weight", (h, m["heads"] * hd)),
            (p + "post_attention_layernorm.weight", (h,)),
            (p + "mlp.gate_proj.weight", (m["ffn"], h)),
            (p + "mlp.up_proj.weight", (m["ffn"], h)),
            (p + "mlp.down_proj.weight", (h, m["ffn"])),
        ]
    out += [("model.norm.weight", (h,)), ("lm_head.weight", (m["vocab"], h))]
    return out


def tensor(name: str, shape: tuple[int, ...]) -> torch.Tensor:
    g = torch.Generator().manual_seed(zlib.crc32(name.encode()))
    return torch.randn(*shape, generator=g, dtype=torch.float32).to(torch.bfloat16)


def write_hf(root: Path, m: dict[str, int]) -> None:
    from safetensors.torch import save_file

    root.mkdir(parents=True)
    weight_map: dict[str, str] = {}
    batch: dict[str, torch.Tensor] = {}
    shard = 0

    def flush() -> None:
        nonlocal shard, batch
        if batch:
            fname = f"model-{shard:05d}.safetensors"
            save_file(batch, str(root / fname))
            weight_map.update({n: fname for n in batch})
            shard += 1
            batch = {}

    for name, shape in names(m):
        batch[name] = tensor(name, shape)
        if sum(t.numel() for t in batch.values()) > 200_000_000:
            flush()
    flush()
    (root / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    cfg = {
        "hidden_size": m["hidden"],
        "num_attention_heads": m["heads"],
        "num_key_value_heads": m["kv"],
        "head_dim": m["head_dim"],
        "vocab_size": m["vocab"],
    }
    (root / "config.json").write_text(json.dumps(cfg))


def write_megatron(root: Path, m: dict[str, int], tp: int = 2) -> None:
    qpg, kv, hd = m["heads"] // m["kv"], m["kv"], m["head_dim"]
    padded = -(-m["vocab"] // (128 * tp)) * 128 * tp
    for t in range(tp):
        enc: dict[str, torch.Tensor] = {}
        lm: dict[str, object] = {"encoder": enc}
        for name, shape in names(m):
            x = tensor(name, shape)
            lay = re.match(r"model\.layers\.(\d+)\.(.*)", name)
            if name in ("model.embed_tokens.weight", "lm_head.weight"):
                x = (
                    torch.cat([x, torch.zeros(padded - m["vocab"], m["hidden"], dtype=x.dtype)])
                    .chunk(tp)[t]
                    .clone()
                )
                if name == "lm_head.weight":
                    lm["output_layer"] = {"weight": x}
                else:
                    lm["embedding"] = {"word_embeddings": {"weight": x}}
                continue
            if name == "model.norm.weight":
                enc["final_norm.weight"] = x
                continue
            assert lay is not None
            i, rest = lay.group(1), lay.group(2)
            p = f"layers.{i}."
            if rest == "self_attn.q_proj.weight":
                q = x.reshape(kv, qpg * hd, -1)
                k = tensor(name.replace("q_proj", "k_proj"), (kv * hd, m["hidden"])).reshape(
                    kv, hd, -1
                )
                v = tensor(name.replace("q_proj", "v_proj"), (kv * hd, m["hidden"])).reshape(
                    kv, hd, -1
                )
                fused = torch.cat([q, k, v], dim=1).chunk(tp)[t]
                enc[p + "self_attention.query_key_value.weight"] = fused.reshape(
                    -1, m["hidden"]
                ).clone()
            elif rest == "self_attn.o_proj.weight":
                enc[p + "self_attention.dense.weight"] = x.chunk(tp, dim=1)[t].clone()
            elif rest == "mlp.gate_proj.weight":
                up = tensor(name.replace("gate_proj", "up_proj"), shape)
                enc[p + "mlp.dense_h_to_4h.weight"] = torch.cat(
                    [x.chunk(tp)[t], up.chunk(tp)[t]]
                ).clone()
            elif rest == "mlp.down_proj.weight":
                enc[p + "mlp.dense_4h_to_h.weight"] = x.chunk(tp, dim=1)[t].clone()
            elif rest == "input_layernorm.weight":
                enc[p + "input_norm.weight"] = x
            elif rest == "post_attention_layernorm.weight":
                enc[p + "post_attention_norm.weight"] = x
        d = root / "iter_0000001" / f"mp_rank_{t:02d}"
        d.mkdir(parents=True)
        torch.save({"model": {"language_model": lm}, "iteration": 1}, d / "model_optim_rng.pt")
        del enc, lm
    (root / "latest_checkpointed_iteration.txt").write_text("1")


def timed(cmd: list[str]) -> tuple[float, int, str]:
    """Wall seconds, peak RSS (KiB, /usr/bin/time) and stdout of a command."""
    t0 = time.perf_counter()
    p = subprocess.run(["/usr/bin/time", "-f", "RSS %M", *cmd], capture_output=True, text=True)
    dt = time.perf_counter() - t0
    rss = int(re.findall(r"RSS (\d+)", p.stderr)[-1])
    if p.returncode not in (0, 1):
        sys.exit(f"{cmd[0]} failed ({p.returncode}): {p.stderr}")
    return dt, rss, p.stdout


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--probe", default="target/release/probe")
    ap.add_argument("--scale", type=float, default=1.0)
    ap.add_argument("--dir", default=tempfile.gettempdir())
    ap.add_argument("--repeat", type=int, default=3)
    a = ap.parse_args()
    m = shape_of(a.scale)
    params = sum(int(torch.Size(s).numel()) for _, s in names(m))
    largest = max(int(torch.Size(s).numel()) for _, s in names(m)) * 2
    root = Path(tempfile.mkdtemp(prefix="ckpt-bench-", dir=a.dir))
    try:
        t0 = time.perf_counter()
        write_hf(root / "hf", m)
        write_megatron(root / "mg", m)
        print(
            f"wrote {params / 1e9:.2f}B bf16 parameters a side in {time.perf_counter() - t0:.0f} s",
            flush=True,
        )
        files = [str(p) for p in sorted(root.rglob("*")) if p.is_file()]
        size = sum(os.path.getsize(f) for f in files)
        cat, probe = [], []
        for _ in range(a.repeat):
            cat.append(timed(["sh", "-c", 'cat "$@" > /dev/null', "cat", *files])[0:2])
            dt, rss, out = timed(
                [
                    a.probe,
                    "ckpt-compare",
                    str(root / "hf"),
                    str(root / "mg"),
                    "-o",
                    str(root / "out"),
                ]
            )
            probe.append((dt, rss))
            assert out.startswith("pass"), out
        c = min(x[0] for x in cat)
        p = min(x[0] for x in probe)
        rss = max(x[1] for x in probe) * 1024
        print(
            f"ckpt-compare {params / 1e9:.2f}B bf16 (HF sharded safetensors vs Megatron TP=2, {size / 2**30:.2f} GiB read): "
            f"{p:.2f} s vs cat {c:.2f} s ({p / c:.2f}x, goal <= 2x); peak RSS {rss / 2**20:.0f} MiB vs largest tensor "
            f"{largest / 2**20:.0f} MiB ({rss / largest:.2f}x, goal <= 4x)"
        )
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
