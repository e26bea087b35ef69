#!/usr/bin/env python3
"""Train a small seeded CNN + transformer-block model for a few steps, dumping with probe.

Why: anyone can produce a benchmark/comparison dump pair in seconds, e.g.

    python examples/train_small.py --dump /tmp/bench --mode tensor
    python examples/train_small.py --dump /tmp/cmp --mode tensor --inject Functional.gelu.0
    probe compare -b /tmp/bench -c /tmp/cmp -o /tmp/out

``--inject OP`` multiplies the output of one named op by ``1 + --inject-rel`` (default 5 %;
from step ``--inject-from-step`` on, default the first: a kernel fault that appears late),
so compare must name that op as the first divergent one. OP is an msprobe-style name:
``Functional.gelu`` (every call) or ``Functional.gelu.0`` (one call per step).

``--dropout P`` adds a dropout after the block (0, the default, adds no op); with
``--dropout-seed S`` the masks come from another generator seed while weights and data stay
equal, so compare must report a different random draw, not a faulty dropout.

``--inject-inf OP`` / ``--inject-nan OP`` put +inf / NaN into the first element of that op's
output, and ``--fp16-overflow`` computes the attention scores (the first ``torch.matmul``)
in float16 from inputs scaled so that the product passes 65504: ``probe scan`` must name the
op that produced the first NaN/Inf.

Variants that run other operators for the same mathematics (issue 16: aligning runs whose
code paths differ). Parameter names and initial weights do not depend on them (same seed,
same ``state_dict``; the two RMSNorm variants share theirs), so two runs that differ only by
one of these flags are equal up to rounding:

- ``--attention eager|sdpa``: attention written out (``matmul``, ``/``, ``softmax``,
  ``matmul``; the default) or one ``F.scaled_dot_product_attention`` call.
- ``--layer-norm fused|manual|rms-fused|rms-manual``: every norm is ``nn.LayerNorm``
  (``F.layer_norm``; the default), the same LayerNorm computed by hand (``mean``, ``var``,
  ``rsqrt``, ...; the class is named ``LayerNorm`` too, so module keys stay the same), or an
  RMSNorm by ``F.rms_norm`` or by hand (``x * rsqrt(mean(x^2) + eps) * weight``).
- ``--checkpoint``: the transformer block runs under ``torch.utils.checkpoint`` (non-reentrant),
  so its forward is recomputed during backward (records with ``recompute: true``).

``--compile`` runs the model under ``torch.compile`` (Inductor); the agent records the API
calls inside the compiled graphs with statistics computed by the graphs (docs/capture.md).
``--inductor-fault OP`` (with ``--compile``) makes Inductor's lowering of ``aten.OP`` (e.g.
``gelu``) off by ``--inject-rel``: a compiler bug that only the compiled run has, which
compare of the compiled run against an eager one must name.

``--stop-capture-after N`` (hidden) emulates an agent that switched itself off mid-run (an
internal error, or code it cannot see such as a ``torch.compile``d region): after the N-th op
record of the first captured step, an exception is raised inside the agent's record path, where
the agent's never-fail guard catches it, logs it and turns capture off for the rest of the run.
Training goes on; the dump stays valid, just short (N records in the first captured step, no
later steps).
"""

from __future__ import annotations

import argparse
import contextlib
import math
import sys
import time
from typing import Any, Callable, Optional

import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.utils.checkpoint

import probe

ATTENTION = ("eager", "sdpa")
NORMS = ("fused", "manual", "rms-fused", "rms-manual")


class LayerNorm(nn.LayerNorm):
    """``nn.LayerNorm`` computed by hand with torch ops, as a model without a fused kernel
    would (``--layer-norm manual``). Same parameters (``weight``, ``bias``), same class name
    (so module records keep their keys: ``Module.block.norm1.LayerNorm``)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dims = tuple(range(-len(self.normalized_shape), 0))
        mean = x.mean(dim=dims, keepdim=True)
        var = x.var(dim=dims, unbiased=False, keepdim=True)
        y = (x - mean) * torch.rsqrt(var + self.eps)
        if self.weight is not None:
            y = y * self.weight
        if self.bias is not None:
            y = y + self.bias
        return y


class RMSNorm(nn.Module):
    """RMSNorm over the last dimension, by ``F.rms_norm`` (``fused``) or by hand. One class for
    both, so parameter names, initial weights and module keys are the same."""

    def __init__(self, dim: int, fused: bool, eps: float = 1e-6) -> None:
        super().__init__()
        self.dim = dim
        self.fused = fused
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.fused:
            return F.rms_norm(x, (self.dim,), self.weight, self.eps)
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def make_norm(kind: str, dim: int) -> nn.Module:
    """The normalisation layer of ``--layer-norm kind``."""
    if kind == "fused":
        return nn.LayerNorm(dim)
    if kind == "manual":
        return LayerNorm(dim)
    if kind in ("rms-fused", "rms-manual"):
        if kind == "rms-fused" and not hasattr(F, "rms_norm"):
            raise SystemExit("--layer-norm rms-fused needs torch>=2.4 (F.rms_norm)")
        return RMSNorm(dim, fused=kind == "rms-fused")
    raise ValueError(f"unknown norm {kind!r}")


def _mish_manual(x: torch.Tensor) -> torch.Tensor:
    return x * torch.tanh(F.softplus(x))


_ACTIVATIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "gelu": lambda x: F.gelu(x),
    "mish": lambda x: F.mish(x),
    "mish-manual": _mish_manual,
}


class Block(nn.Module):
    """A pre-norm transformer block: attention written out so its ops are visible (or, with
    ``attention="sdpa"``, one ``F.scaled_dot_product_attention`` call)."""

    def __init__(
        self,
        dim: int,
        heads: int,
        attention: str = "eager",
        norm: str = "fused",
        activation: str = "gelu",
    ) -> None:
        super().__init__()
        self.heads = heads
        #: The MLP's activation: ``gelu``, ``mish`` (F.mish) or ``mish-manual``
        #: (x * tanh(softplus(x)): a composition no mapping rule knows, so compare falls
        #: back to comparing it at its boundary).
        self.activation = activation
        #: ``eager`` (matmul, divide, softmax, matmul) or ``sdpa`` (one fused call).
        self.attention = attention
        #: Set (e.g. 300.0): the attention scores are an fp16 matmul of q and k scaled by
        #: it, which overflows to inf, as an fp16 model with large activations would.
        self.fp16_overflow_scale: Optional[float] = None
        self.norm1 = make_norm(norm, dim)
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.norm2 = make_norm(norm, dim)
        self.fc1 = nn.Linear(dim, 4 * dim)
        self.fc2 = nn.Linear(4 * dim, dim)

    def act(self, x: torch.Tensor) -> torch.Tensor:
        return _ACTIVATIONS[self.activation](x)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, n, d = x.shape
        h = self.heads
        q, k, v = self.qkv(self.norm1(x)).reshape(b, n, 3, h, d // h).permute(2, 0, 3, 1, 4)
        s = self.fp16_overflow_scale
        if self.attention == "sdpa":
            # The same scale (1/sqrt(head dim)) as the eager path, in one call.
            y = F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(b, n, d)
        else:
            if s is None:
                att = torch.matmul(q, k.transpose(-2, -1))
            else:
                # Real float16 arithmetic (also on CPU): |q.k| passes 65504, the matmul gives inf.
                att = torch.matmul((q * s).half(), (k * s).transpose(-2, -1).half()).float()
            att = att / (d // h) ** 0.5
            att = F.softmax(att, dim=-1)
            y = torch.matmul(att, v).transpose(1, 2).reshape(b, n, d)
        x = x + self.proj(y)
        x = x + self.fc2(self.act(self.fc1(self.norm2(x))))
        return x


class SmallNet(nn.Module):
    """Conv stem -> tokens -> one transformer block -> classifier."""

    #: Dropout after the block (``--dropout``); 0 adds no op, so dumps stay as they were.
    dropout: float = 0.0

    def __init__(
        self,
        channels: int = 32,
        dim: int = 64,
        classes: int = 10,
        attention: str = "eager",
        norm: str = "fused",
        activation: str = "gelu",
        checkpoint: bool = False,
    ) -> None:
        super().__init__()
        #: Run the block under activation checkpointing (recomputed in backward).
        self.checkpoint = checkpoint
        self.conv1 = nn.Conv2d(3, channels, 3, padding=1)
        self.bn1 = nn.BatchNorm2d(channels)
        self.conv2 = nn.Conv2d(channels, dim, 3, padding=1)
        self.block = Block(dim, heads=4, attention=attention, norm=norm, activation=activation)
        self.norm = make_norm(norm, dim)
        self.head = nn.Linear(dim, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.max_pool2d(F.relu(self.bn1(self.conv1(x))), 2)
        x = F.relu(self.conv2(x))
        x = F.adaptive_avg_pool2d(x, 4)  # (b, dim, 4, 4)
        x = x.flatten(2).transpose(1, 2)  # (b, 16 tokens, dim)
        if self.checkpoint:
            x = torch.utils.checkpoint.checkpoint(self.block, x, use_reentrant=False)
        else:
            x = self.block(x)
        if self.dropout:
            x = F.dropout(x, self.dropout, self.training)
        x = self.norm(x).mean(dim=1)
        return self.head(x)


_OWNERS: dict[str, Callable[[], Any]] = {
    "Functional": lambda: F,
    "Torch": lambda: torch,
    "Tensor": lambda: torch.Tensor,
}


class Fault:
    """Perturb one API's output, for a known-answer comparison or scan.

    ``value`` None: multiply the output by ``1 + rel``; else put ``value`` (inf, nan) into
    its first element. Installed before the probe agent so the agent records the perturbed
    output as the op's own output (exactly what a real kernel bug looks like).
    """

    def __init__(self, spec: str, rel: float, value: Optional[float] = None) -> None:
        parts = spec.split(".")
        if len(parts) < 2 or parts[0] not in _OWNERS:
            raise SystemExit(
                f"--inject: expected e.g. Functional.gelu or Functional.gelu.0, got {spec!r}"
            )
        self.owner = _OWNERS[parts[0]]()
        self.name = parts[1]
        self.index: Optional[int] = int(parts[2]) if len(parts) > 2 and parts[2].isdigit() else None
        self.rel = rel
        self.value = value
        self.calls = 0
        #: Whether the fault acts in this step (``new_step``: from ``--inject-from-step``).
        self.active = True
        self.orig = getattr(self.owner, self.name)
        fault = self

        def perturbed(*args: Any, **kwargs: Any) -> Any:
            out = fault.orig(*args, **kwargs)
            hit = fault.active and (fault.index is None or fault.calls == fault.index)
            fault.calls += 1
            if hit and isinstance(out, torch.Tensor) and out.is_floating_point():
                if fault.value is None:
                    out = out * (1.0 + fault.rel)
                else:
                    # Out of place, so autograd differentiates through it unchanged.
                    bump = torch.zeros(out.shape, dtype=out.dtype, device=out.device)
                    bump.view(-1)[0] = fault.value
                    out = out + bump
            return out

        setattr(self.owner, self.name, perturbed)

    def new_step(self, active: bool = True) -> None:
        self.calls = 0
        self.active = active


def install_crash(after_ops: Optional[int], after_bytes: Optional[int]) -> None:
    """Make the process kill itself (SIGKILL) at a deterministic point of the capture."""
    import os
    import signal

    from probe.capture.writer import RankFolder, _encode_record

    real = RankFolder.write_op
    seen = {"ops": 0, "bytes": 0}

    def write_op(self: RankFolder, record: dict[str, Any]) -> None:
        if after_bytes is not None and self._ops is not None:
            line = _encode_record({**record, "seq": self.seq})  # the bytes it would write
            if seen["bytes"] + len(line) > after_bytes:
                self._ops.write(line[: max(0, after_bytes - seen["bytes"])])
                self._ops.flush()
                os.kill(os.getpid(), signal.SIGKILL)
            seen["bytes"] += len(line)
        real(self, record)
        seen["ops"] += 1
        if after_ops is not None and seen["ops"] >= after_ops:
            os.kill(os.getpid(), signal.SIGKILL)

    RankFolder.write_op = write_op  # type: ignore[method-assign]


class CaptureStopped(RuntimeError):
    """Raised inside the agent by ``--stop-capture-after``: its guard switches capture off."""


def install_capture_stop(after_records: int) -> None:
    """Make the agent switch itself off once ``after_records`` op records are written.

    The exception is raised inside the agent's own record path (after the record reached the
    op log), so the agent's never-fail guard handles it exactly as any internal failure:
    reported once, every hook removed, capture off for the rest of the run, training goes on.
    The step's op log is closed normally at ``step()``, so the dump is valid, just short.
    """
    from probe.capture.writer import RankFolder

    real = RankFolder.write_op
    seen = {"ops": 0}

    def write_op(self: RankFolder, record: dict[str, Any]) -> None:
        real(self, record)
        seen["ops"] += 1
        if seen["ops"] == after_records:
            raise CaptureStopped(
                f"--stop-capture-after {after_records}: capture switched off (emulated)"
            )

    RankFolder.write_op = write_op  # type: ignore[method-assign]


def make_data(
    steps: int, batch: int, device: torch.device, seed: int = 1234
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Generated data: seeded, so both runs of a comparison see the same batches."""
    g = torch.Generator().manual_seed(seed)
    data = []
    for _ in range(steps):
        x = torch.randn(batch, 3, 32, 32, generator=g)
        y = torch.randint(0, 10, (batch,), generator=g)
        data.append((x.to(device), y.to(device)))
    return data


def resolve_device(name: str) -> torch.device:
    if name == "npu":
        import torch_npu  # noqa: F401  (registers the npu device)
    if name == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda: no CUDA device available")
    return torch.device(name)


def has_half_matmul(device: torch.device) -> bool:
    """Whether ``device`` multiplies float16 batches (``--fp16-overflow``): CPU kernels for it
    came after torch 2.1."""
    a = torch.ones(1, 2, 2, dtype=torch.float16, device=device)
    try:
        torch.matmul(a, a)
    except RuntimeError:
        return False
    return True


def mixed_precision(dtype: str, device: torch.device) -> tuple[Any, Optional[Any]]:
    """``--dtype``: the autocast context (none for float32) and, for float16, AMP's
    GradScaler (the loss scale), as a port to an accelerator without bfloat16 trains."""
    if dtype == "float32":
        return contextlib.nullcontext(), None
    amp = torch.autocast(device_type=device.type, dtype=getattr(torch, dtype))
    return amp, torch.amp.GradScaler(device.type) if dtype == "float16" else None


def update(loss: torch.Tensor, opt: torch.optim.Optimizer, scaler: Optional[Any]) -> None:
    """The backward and the optimizer step, through the loss scaler when there is one."""
    if scaler is None:
        loss.backward()
        opt.step()
        return
    scaler.scale(loss).backward()
    scaler.step(opt)
    scaler.update()


def inductor_fault(op: str, rel: float) -> Callable[[], None]:
    """Inductor's decomposition of ``aten.<op>`` scaled by ``1 + rel``: a fault in compiled
    code only (the eager kernel, and the compiled backward, are untouched). Returns its
    undo (tests put the decomposition and the compile caches back)."""
    import torch._functorch.config as aot_config
    import torch._inductor.config as inductor_config
    from torch._inductor.decomposition import decompositions, fast_random_decomps

    overload = getattr(getattr(torch.ops.aten, op, None), "default", None)
    orig = decompositions.get(overload) if overload is not None else None
    if orig is None:
        raise SystemExit(f"--inductor-fault: Inductor has no decomposition of aten.{op}")

    def faulty(*args: Any, **kwargs: Any) -> Any:
        return orig(*args, **kwargs) * (1.0 + rel)

    decompositions[overload] = faulty
    fast_random_decomps.cache_clear()  # Inductor's copy of the table, made once
    # The compile caches do not key on the decomposition table: a cached graph has no fault.
    caches = inductor_config.fx_graph_cache, aot_config.enable_autograd_cache
    inductor_config.fx_graph_cache = aot_config.enable_autograd_cache = False

    def undo() -> None:
        decompositions[overload] = orig
        fast_random_decomps.cache_clear()
        inductor_config.fx_graph_cache, aot_config.enable_autograd_cache = caches

    return undo


def main(argv: Optional[list[str]] = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--device", choices=["cpu", "cuda", "npu"], default="cpu")
    ap.add_argument(
        "--dtype",
        choices=["float32", "bfloat16", "float16"],
        default="float32",
        help="bfloat16 runs forward under autocast; float16 too, with AMP's GradScaler "
        "(the loss scale), as a port to an accelerator without bfloat16 trains",
    )
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--dump", default="./probe_dump", help="dump folder")
    ap.add_argument(
        "--monitor",
        default=None,
        metavar="DIR",
        help="also monitor every step into DIR (probe.Monitor; docs/monitor.md)",
    )
    ap.add_argument("--no-dump", action="store_true", help="train without the agent")
    ap.add_argument("--level", choices=["api", "module", "mix"], default="api")
    ap.add_argument(
        "--mode",
        choices=["statistics", "tensor", "checksum", "overflow"],
        default="statistics",
    )
    ap.add_argument(
        "--config",
        default=None,
        help="probe, msprobe or migration-tutorial JSON config (overrides flags)",
    )
    ap.add_argument("--inject", default=None, help="op to perturb, e.g. Functional.gelu.0")
    ap.add_argument("--inject-rel", type=float, default=0.05, help="relative perturbation")
    ap.add_argument(
        "--inject-from-step",
        type=int,
        default=0,
        metavar="N",
        help="the injected faults act from step N on (a fault that appears late: docs/monitor.md)",
    )
    ap.add_argument("--inject-inf", default=None, help="op whose output gets one +inf element")
    ap.add_argument("--inject-nan", default=None, help="op whose output gets one NaN element")
    ap.add_argument(
        "--fp16-overflow",
        action="store_true",
        help="compute the attention scores (Torch.matmul.0) in float16 so that they overflow",
    )
    ap.add_argument(
        "--overflow-nums",
        type=int,
        default=1,
        help="--mode overflow: ops producing NaN/Inf to record (-1: no limit)",
    )
    ap.add_argument(
        "--attention",
        choices=ATTENTION,
        default="eager",
        help="eager: matmul/div/softmax/matmul; sdpa: F.scaled_dot_product_attention",
    )
    ap.add_argument(
        "--layer-norm",
        choices=NORMS,
        default="fused",
        help="every norm: nn.LayerNorm (fused), LayerNorm by hand (manual), RMSNorm by "
        "F.rms_norm (rms-fused) or by hand (rms-manual)",
    )
    ap.add_argument(
        "--activation",
        choices=sorted(_ACTIVATIONS),
        default="gelu",
        help="the MLP's activation: gelu, mish (F.mish) or mish-manual (x*tanh(softplus(x)), "
        "a composition no mapping rule knows: compare falls back to its boundary)",
    )
    ap.add_argument(
        "--checkpoint",
        action="store_true",
        help="run the transformer block under activation checkpointing (non-reentrant)",
    )
    ap.add_argument(
        "--optimizer",
        choices=["loop", "foreach", "fused"],
        default="loop",
        help="Adam per parameter (loop, PyTorch's default on CPU), multi-tensor (foreach, its "
        "default on GPUs: its _foreach_ ops are hooked) or one fused kernel (fused: not hooked, "
        "so the update is not in the dump)",
    )
    ap.add_argument("--data-seed", type=int, default=1234, help="seed of the generated batches")
    ap.add_argument(
        "--dropout",
        type=float,
        default=0.0,
        help="dropout probability after the block (0: none)",
    )
    ap.add_argument(
        "--dropout-seed",
        type=int,
        default=None,
        help="reseed torch after the model is built: the dropout masks differ, the weights do not",
    )
    ap.add_argument(
        "--config-pack",
        default=None,
        help="also write a config-check pack (zip) of this run: env, packages, seeds, data, weights",
    )
    ap.add_argument(
        "--tensor-writer",
        choices=["auto", "thread", "inline"],
        default="auto",
        help="tensor mode: who writes the data (docs/capture.md, tensor_writer)",
    )
    ap.add_argument("--compile", action="store_true", help="run the model under torch.compile")
    ap.add_argument(
        "--inductor-fault",
        default=None,
        metavar="OP",
        help="with --compile: Inductor computes aten.OP off by --inject-rel (e.g. gelu)",
    )
    ap.add_argument(
        "--forward-only",
        action="store_true",
        help="capture forward calls only (compiled graphs' backward is not captured)",
    )
    ap.add_argument("--quiet", action="store_true")
    # Hidden, for the crash tests: die by SIGKILL (no cleanup, as a killed job) after N
    # captured op records, or once the op log reaches N bytes (the bytes that fit are
    # written and flushed first: a buffer spill cut mid-record, then the kill).
    ap.add_argument("--crash-after-ops", type=int, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--crash-after-bytes", type=int, default=None, help=argparse.SUPPRESS)
    # Hidden, for the alignment tests: the agent switches itself off after N op records
    # (see the module docstring).
    ap.add_argument("--stop-capture-after", type=int, default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.inductor_fault and not args.compile:
        ap.error("--inductor-fault needs --compile")
    if args.fp16_overflow and args.attention != "eager":
        ap.error("--fp16-overflow needs --attention eager (it overflows the explicit matmul)")
    if args.stop_capture_after is not None:
        if args.stop_capture_after < 1:
            ap.error("--stop-capture-after: expected N >= 1")
        install_capture_stop(args.stop_capture_after)
    if args.crash_after_ops is not None or args.crash_after_bytes is not None:
        install_crash(args.crash_after_ops, args.crash_after_bytes)

    # The pack is created before seeding, so that it records the seed calls.
    pack = probe.ConfigPack(args.config_pack, steps=args.steps) if args.config_pack else None
    probe.seed_all(args.seed)
    device = resolve_device(args.device)
    if args.fp16_overflow and not has_half_matmul(device):
        raise SystemExit(f"--fp16-overflow: this torch has no float16 matmul on {device}")
    net = SmallNet(
        attention=args.attention,
        norm=args.layer_norm,
        checkpoint=args.checkpoint,
        activation=args.activation,
    )
    model = net.to(device)
    model.dropout = args.dropout
    if args.dropout_seed is not None:
        torch.manual_seed(args.dropout_seed)
    if args.fp16_overflow:
        model.block.fp16_overflow_scale = 300.0
    opt = torch.optim.Adam(
        model.parameters(),
        lr=1e-3,
        foreach=args.optimizer == "foreach",
        fused=args.optimizer == "fused" or None,
    )
    data = make_data(args.steps, args.batch, device, args.data_seed)
    if pack is not None:
        # Output paths differ between runs by design: they are not hyperparameters.
        hyper = {
            k: v
            for k, v in vars(args).items()
            if k not in ("dump", "config_pack", "quiet", "monitor")
        }
        pack.capture(model=model, optimizer=opt, args=hyper)
    faults = [
        Fault(spec, args.inject_rel, value)
        for spec, value in (
            (args.inject, None),
            (args.inject_inf, math.inf),
            (args.inject_nan, math.nan),
        )
        if spec
    ]

    dbg: Optional[probe.Debugger] = None
    if not args.no_dump:
        if args.config:
            dbg = probe.Debugger(args.config)
        else:
            extra: dict[str, Any] = (
                {"overflow_nums": args.overflow_nums} if args.mode == "overflow" else {}
            )
            if args.tensor_writer != "auto":
                extra["tensor_writer"] = args.tensor_writer
            if args.forward_only:
                extra["directions"] = ["forward"]
            dbg = probe.Debugger(
                None, dump_path=args.dump, level=args.level, mode=args.mode, **extra
            )

    if args.inductor_fault:
        inductor_fault(args.inductor_fault, args.inject_rel)
    run: Callable[[torch.Tensor], torch.Tensor] = torch.compile(model) if args.compile else model
    amp, scaler = mixed_precision(args.dtype, device)
    mon = probe.Monitor(args.monitor, model, opt, scaler=scaler) if args.monitor else None
    t0 = time.perf_counter()
    for step, (x, y) in enumerate(data):
        for fault in faults:
            fault.new_step(active=step >= args.inject_from_step)
        if dbg is not None:
            dbg.start(model)
        opt.zero_grad(set_to_none=True)
        with amp:
            logits = run(x)
            loss = F.cross_entropy(logits.float(), y)
        update(loss, opt, scaler)
        if dbg is not None:
            dbg.stop()
            dbg.step()
        if mon is not None:
            mon.step(loss)
        if not args.quiet:
            print(f"step {step}: loss {loss.item():.6f}")
    if mon is not None:
        mon.close()
    if dbg is not None:
        dbg.close()
    if pack is not None:
        pack.save()
    if not args.quiet:
        dt = (time.perf_counter() - t0) / max(1, args.steps)
        where = "no dump" if dbg is None else f"dump in {args.dump}"
        print(f"{args.steps} steps, {dt * 1e3:.1f} ms/step, {where}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
