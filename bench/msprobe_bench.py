#!/usr/bin/env python3
"""Benchmark of `probe compare` on msprobe-format dumps, against `msprobe compare` (not a test).

Generates, once, under --work (default /tmp/probe-msprobe-bench):
  - stats/{bench,cmp}/step0/rank0/: an msprobe statistics dump of --stats-tensors tensors
    (default 100,000) per side;
  - tensor/{bench,cmp}/step0/rank0/: an msprobe tensor dump of --tensor-gb GiB (default 1)
    of float32 `.pt` files per side (written with torch.save, as msprobe does).
Then times `probe compare` (release build) on both and, when msprobe is available (the
`msprobe` command on PATH, or MSPROBE=/path/to/msprobe), `msprobe compare` on the same
input in the same run, and prints the ratio. Page caches are warmed first for both tools.

Usage: python3 bench/msprobe_bench.py [--stats-tensors N] [--tensor-gb G] [--no-build] [--probe BIN]
Needs python3 with torch (to write the .pt files).
"""

import argparse
import json
import os
import random
import shutil
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def write_dump(rank_dir, task, ops):
    """ops: list of (key, {slot: [leaf, ...]}) in execution order."""
    os.makedirs(rank_dir, exist_ok=True)
    with open(os.path.join(rank_dir, "dump.json"), "w") as f:
        f.write(
            '{\n "task": "%s",\n "level": "L1",\n "framework": "pytorch",\n "dump_data_dir": null,\n "data": {\n'
            % task
        )
        for i, (key, entry) in enumerate(ops):
            f.write(
                "  %s: %s%s\n"
                % (json.dumps(key), json.dumps(entry), "," if i + 1 < len(ops) else "")
            )
        f.write(" }\n}\n")
    stacks = {"0": [[k for k, _ in ops], ["File train.py, line 1, in <module>, \n main()"]]}
    with open(os.path.join(rank_dir, "stack.json"), "w") as f:
        json.dump(stacks, f)
    with open(os.path.join(rank_dir, "construct.json"), "w") as f:
        f.write("{}")


def leaf(shape, mx, mn, mean, norm, data_name=None):
    d = {
        "type": "torch.Tensor",
        "dtype": "torch.float32",
        "shape": shape,
        "Max": mx,
        "Min": mn,
        "Mean": mean,
        "Norm": norm,
        "requires_grad": False,
    }
    if data_name:
        d["data_name"] = data_name
    return d


def gen_stats(work, n_tensors):
    root = os.path.join(work, "stats")
    stamp = os.path.join(root, ".n")
    if os.path.exists(stamp) and open(stamp).read() == str(n_tensors):
        return root
    shutil.rmtree(root, ignore_errors=True)
    print(
        f"generating an msprobe statistics dump of {n_tensors} tensors per side ...",
        file=sys.stderr,
    )
    rng = random.Random(1)
    apis = [
        "Functional.linear",
        "Torch.matmul",
        "Tensor.add",
        "Functional.gelu",
        "Functional.layer_norm",
    ]
    counters = {}
    sides = {"bench": [], "cmp": []}
    made = 0
    while made < n_tensors:
        api = apis[rng.randrange(len(apis))]
        c = counters.get(api, 0)
        counters[api] = c + 1
        key = f"{api}.{c}.forward"
        entries = {
            "bench": {"input_args": [], "input_kwargs": {}, "output": []},
            "cmp": {"input_args": [], "input_kwargs": {}, "output": []},
        }
        for slot, k in (("input_args", 2), ("output", 1)):
            for _ in range(k):
                shape = [4, 1024]
                mx, mn, mean = rng.uniform(1, 4), -rng.uniform(1, 4), rng.gauss(0, 0.01)
                norm = rng.uniform(50, 70)
                entries["bench"][slot].append(leaf(shape, mx, mn, mean, norm))
                e = 1 + rng.gauss(0, 1e-4)
                entries["cmp"][slot].append(leaf(shape, mx * e, mn * e, mean * e, norm * e))
                made += 1
        for s in sides:
            sides[s].append((key, entries[s]))
    for s, ops in sides.items():
        write_dump(os.path.join(root, s, "step0", "rank0"), "statistics", ops)
    open(stamp, "w").write(str(n_tensors))
    return root


def gen_tensor(work, gib):
    import torch

    root = os.path.join(work, "tensor")
    stamp = os.path.join(root, ".gib")
    if os.path.exists(stamp) and open(stamp).read() == str(gib):
        return root
    shutil.rmtree(root, ignore_errors=True)
    elems = 1 << 20  # 4 MiB per float32 tensor
    n = max(2, int(gib * (1 << 30)) // (elems * 4))
    print(
        f"generating an msprobe tensor dump of {n} x 4 MiB .pt files per side ...", file=sys.stderr
    )
    g = torch.Generator().manual_seed(1)
    sides = {"bench": [], "cmp": []}
    dirs = {s: os.path.join(root, s, "step0", "rank0") for s in sides}
    for d in dirs.values():
        os.makedirs(os.path.join(d, "dump_tensor_data"), exist_ok=True)
    for i in range(0, n, 2):
        key = f"Functional.gelu.{i // 2}.forward"
        entry = {s: {"input_args": [], "input_kwargs": {}, "output": []} for s in sides}
        for slot, name in (("input_args", "input.0"), ("output", "output.0")):
            b = torch.randn(elems, generator=g)
            c = b * (1 + 1e-6 * torch.randn(elems, generator=g))
            for s, t in (("bench", b), ("cmp", c)):
                fname = f"{key}.{name}.pt"
                torch.save(t, os.path.join(dirs[s], "dump_tensor_data", fname))
                entry[s][slot].append(
                    leaf(
                        [elems],
                        t.max().item(),
                        t.min().item(),
                        t.mean().item(),
                        t.norm().item(),
                        fname,
                    )
                )
        for s in sides:
            sides[s].append((key, entry[s]))
    for s, ops in sides.items():
        write_dump(dirs[s], "tensor", ops)
    open(stamp, "w").write(str(gib))
    return root


def du(path):
    total = 0
    for dp, _, fs in os.walk(path):
        for f in fs:
            total += os.path.getsize(os.path.join(dp, f))
    return total


def warm(path):
    for dp, _, fs in os.walk(path):
        for f in fs:
            with open(os.path.join(dp, f), "rb") as fh:
                while fh.read(1 << 24):
                    pass


def timed(cmd, log):
    t0 = time.perf_counter()
    with open(log, "w") as f:
        rc = subprocess.call(cmd, stdout=f, stderr=subprocess.STDOUT)
    return time.perf_counter() - t0, rc


def find_msprobe():
    exe = os.environ.get("MSPROBE") or shutil.which("msprobe")
    return [exe] if exe else None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--work", default=os.environ.get("BENCH_DIR", "/tmp/probe-msprobe-bench"))
    ap.add_argument("--stats-tensors", type=int, default=100_000)
    ap.add_argument("--tensor-gb", type=float, default=1.0)
    ap.add_argument("--no-build", action="store_true")
    ap.add_argument(
        "--probe",
        default=os.environ.get("PROBE"),
        help="probe binary (default: build and use target/release/probe)",
    )
    ap.add_argument("--msprobe-timeout", type=int, default=3600)
    a = ap.parse_args()
    os.makedirs(a.work, exist_ok=True)
    if not a.no_build and not a.probe:
        subprocess.check_call(["cargo", "build", "--release", "--quiet", "-j", "2"], cwd=ROOT)
    probe = a.probe or os.path.join(ROOT, "target", "release", "probe")
    msprobe = find_msprobe()
    results = []
    for kind, root in (
        ("statistics", gen_stats(a.work, a.stats_tensors)),
        ("tensor", gen_tensor(a.work, a.tensor_gb)),
    ):
        b, c = os.path.join(root, "bench"), os.path.join(root, "cmp")
        size = du(b) + du(c)
        warm(b)
        warm(c)
        out = os.path.join(a.work, "out-probe-" + kind)
        shutil.rmtree(out, ignore_errors=True)
        timed(
            [probe, "compare", "-q", "-b", b, "-c", c, "-o", out, "--format", "json"], out + ".log"
        )  # warm-up
        t_json, rc = timed(
            [probe, "compare", "-q", "-b", b, "-c", c, "-o", out, "--format", "json"], out + ".log"
        )
        t_all, _ = timed([probe, "compare", "-q", "-b", b, "-c", c, "-o", out], out + ".log")
        row = {
            "kind": kind,
            "bytes": size,
            "probe_json_s": t_json,
            "probe_all_reports_s": t_all,
            "probe_exit": rc,
        }
        if msprobe:
            mout = os.path.join(a.work, "out-msprobe-" + kind)
            shutil.rmtree(mout, ignore_errors=True)
            os.makedirs(mout)
            cmd = msprobe + [
                "compare",
                "-tp",
                os.path.join(c, "step0"),
                "-gp",
                os.path.join(b, "step0"),
                "-o",
                mout,
            ]
            try:
                t0 = time.perf_counter()
                with open(mout + ".log", "w") as f:
                    rc = subprocess.call(
                        cmd, stdout=f, stderr=subprocess.STDOUT, timeout=a.msprobe_timeout
                    )
                row["msprobe_s"] = time.perf_counter() - t0
                row["msprobe_exit"] = rc
                row["ratio_vs_probe_all_reports"] = row["msprobe_s"] / t_all
                row["ratio_vs_probe_json"] = row["msprobe_s"] / t_json
            except subprocess.TimeoutExpired:
                row["msprobe_s"] = None
                row["msprobe_note"] = f"timed out after {a.msprobe_timeout} s"
        results.append(row)
        line = f"{kind:10s} {size / 1e9:7.3f} GB   probe {t_all:8.2f} s (json only {t_json:7.2f} s)"
        if row.get("msprobe_s"):
            line += f"   msprobe {row['msprobe_s']:8.2f} s   ratio {row['ratio_vs_probe_all_reports']:6.1f}x"
        elif not msprobe:
            line += "   msprobe: not installed (set MSPROBE=/path/to/msprobe)"
        print(line)
    print(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
