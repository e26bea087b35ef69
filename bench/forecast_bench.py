"""How good is the capture's forecast (issue 51)? The agent forecasts a run's cost from its
first captured step; this measures the next ten captured steps and prints forecast / measured
for time and bytes, on three models: the example (``examples/train_small.py``'s SmallNet),
the 4-layer transformer of ``bench/capture_overhead.py`` and a small ``transformers`` LLaMA
built from a config (random weights, no download).

Steps 0 and 1 run uncaptured (the model's own first-step warm-up, then the bare time the
forecast's overhead divides by); steps 2-12 are captured: 2 gives the forecast, 3-12 are
measured, each from ``start()`` to the end of ``stop()``, the window the forecast times.
Measured time is the median of the ten steps (a shared machine's outliers, a step another
process took the cores from, would move a mean by more than the capture does; the mean is
printed too). The goal is every ratio within 0.75-1.25 (docs/performance.md, "The
capture's forecast").

    PYTHONPATH=python python bench/forecast_bench.py [--models small,transformer,llama]
        [--mode statistics|tensor] [--level api|module|mix] [--steps 10] [--threads N]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from typing import Any, Callable

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples"))

import probe  # noqa: E402

Batch = tuple[torch.Tensor, torch.Tensor]


def small() -> tuple[torch.nn.Module, Callable[[int], Batch], Callable[..., Any]]:
    from train_small import SmallNet  # noqa: PLC0415 - examples/ on the path above

    torch.manual_seed(0)
    g = torch.Generator().manual_seed(1)
    data = [(torch.randn(16, 3, 32, 32, generator=g), torch.randint(0, 10, (16,), generator=g))]
    return SmallNet(), lambda i: data[0], torch.nn.functional.cross_entropy


def transformer() -> tuple[torch.nn.Module, Callable[[int], Batch], Callable[..., Any]]:
    from capture_overhead import Transformer, transformer_data  # noqa: PLC0415 - bench/

    torch.manual_seed(0)
    data = transformer_data(2, torch.device("cpu"), seq=64)

    def loss(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.cross_entropy(out.flatten(0, 1), y.flatten())

    return Transformer(), lambda i: data[i % 2], loss


def llama() -> tuple[torch.nn.Module, Callable[[int], Batch], Callable[..., Any]]:
    from transformers import LlamaConfig, LlamaForCausalLM  # noqa: PLC0415 - optional

    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=256,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=4,
        max_position_embeddings=64,
    )
    model = LlamaForCausalLM(cfg)
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, 256, (4, 32), generator=g)

    def loss(out: Any, y: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.cross_entropy(out.logits.flatten(0, 1), y.flatten())

    return model, lambda i: (ids, ids), loss


MODELS = {"small": small, "transformer": transformer, "llama": llama}


def step_bytes(dump: str, step: int) -> int:
    total = 0
    for root, _, files in os.walk(os.path.join(dump, f"step{step}")):
        total += sum(os.path.getsize(os.path.join(root, f)) for f in files)
    return total


def measure(name: str, mode: str, level: str, steps: int, dump: str) -> dict[str, Any]:
    """Train ``name`` for 2 + 1 + ``steps`` steps (bare, forecast, measured); returns the
    forecast, the measured steps and the ratios."""
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    model, batch, loss_fn = MODELS[name]()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    dbg = probe.Debugger(
        None, dump_path=dump, mode=mode, level=level, steps=f"2-{steps + 2}", stack=True
    )
    times: list[float] = []
    for i in range(steps + 3):
        t0 = time.perf_counter()
        dbg.start(model)
        x, y = batch(i)
        loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        dbg.stop()
        times.append(time.perf_counter() - t0)
        dbg.step()
    dbg.close()
    f = dbg.forecast
    assert f is not None, "no forecast was made"
    measured_t = statistics.median(times[3:])
    measured_b = sum(step_bytes(dump, s) for s in range(3, steps + 3)) / steps
    with open(os.path.join(dump, "manifest.json"), encoding="utf-8") as fh:
        manifest = json.load(fh)
    return {
        "model": name,
        "forecast": f,
        "manifest_has_forecast": "forecast" in manifest,
        "measured_time_s": measured_t,
        "measured_mean_s": sum(times[3:]) / steps,
        "measured_bytes": measured_b,
        "measured_bare_s": times[1],
        "time_ratio": f["time_per_step_s"] / measured_t,
        "bytes_ratio": f["bytes_per_step"] / measured_b if measured_b else float("nan"),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="small,transformer,llama")
    ap.add_argument("--mode", default="statistics")
    ap.add_argument("--level", default="mix")
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--json", action="store_true", help="one JSON object per model")
    ap.add_argument("--dir", default=None, help="where the dumps go (default: the temp folder)")
    ap.add_argument(
        "--threads",
        type=int,
        default=0,
        help="torch threads (default: torch's); 1 on a machine shared with other jobs, "
        "whose threads otherwise make every step wait on a busy core",
    )
    args = ap.parse_args()
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    ok = True
    for name in args.models.split(","):
        with tempfile.TemporaryDirectory(prefix="probe-forecast-", dir=args.dir) as dump:
            r = measure(name, args.mode, args.level, args.steps, dump)
        if args.json:
            print(json.dumps(r))
        else:
            f = r["forecast"]
            print(
                f"{name:12s} {args.mode}/{args.level}: time {f['time_per_step_s']:.4f} s "
                f"forecast / {r['measured_time_s']:.4f} s measured (median; mean "
                f"{r['measured_mean_s']:.4f}) = {r['time_ratio']:.2f}; "
                f"bytes {f['bytes_per_step']} / {r['measured_bytes']:.0f} = "
                f"{r['bytes_ratio']:.3f}; overhead {f['overhead']:.2f}x "
                f"(bare {f['bare_step_s']:.4f} s from {f['bare_from']})"
            )
        ok = ok and 0.75 <= r["time_ratio"] <= 1.25 and 0.75 <= r["bytes_ratio"] <= 1.25
    print("goal (every ratio within 0.75-1.25):", "met" if ok else "NOT met")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
