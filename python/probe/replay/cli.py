"""``python -m probe.replay``: replay recorded operator calls (issue 50; docs/replay.md).

Why a command of the agent's package rather than of the ``probe`` binary: a replay
re-executes PyTorch, so it runs in the Python that has torch (and torch_npu); ``probe
replay`` delegates here. The interface is fixed with the binary (docs/replay.md,
"Command line"): exit 0 when every replayed op is within tolerance, 1 when one reproduces,
2 on bad input (one line ``probe replay: error: ...``, never a traceback), 3 when nothing
could be replayed. Outputs are all or nothing: written beside ``-o DIR`` and renamed.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
from typing import Any, Callable, NoReturn, Optional

PRELUDE_ENV = "PROBE_REPLAY_PRELUDE"


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        _fail(message)


def _fail(message: str) -> NoReturn:
    from .text import printable

    print(printable(f"probe replay: error: {message}"), file=sys.stderr)
    raise SystemExit(2)


def parser() -> argparse.ArgumentParser:
    ap = _Parser(prog="python -m probe.replay", description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--bench", "-b", required=True, help="benchmark dump (root, step<S> or rank<R>)"
    )
    ap.add_argument("--cmp", "-c", required=True, help="comparison dump")
    ap.add_argument("--op", action="append", required=True, help="op key to replay (repeatable)")
    ap.add_argument("-o", "--out", required=True, help="output folder (replaced)")
    ap.add_argument("--device", default="cpu", help="cpu, cuda or npu (also cuda:1 ...)")
    ap.add_argument(
        "--prelude", default=None, help=f"Python file run before the replay (or ${PRELUDE_ENV})"
    )
    ap.add_argument("--step", type=int, default=None)
    ap.add_argument("--rank", type=int, default=None)
    ap.add_argument("--rtol", type=float, default=None, help="tolerance floor for every dtype")
    ap.add_argument("--atol", type=float, default=0.0, help="absolute slack per element")
    ap.add_argument("-q", "--quiet", action="store_true", help="no progress on stderr")
    return ap


def main(argv: Optional[list[str]] = None) -> int:
    args = parser().parse_args(argv)
    if (args.rtol is not None and not args.rtol >= 0) or not args.atol >= 0:
        _fail("--rtol and --atol must be non-negative numbers")
    if not _replaceable(args.out):
        _fail(
            f"-o {args.out}: holds other files than a replay's output (no replay.json), and a "
            "replay replaces its output folder: name a new or empty one"
        )
    prelude = args.prelude or os.environ.get(PRELUDE_ENV) or None
    if prelude and not os.path.isfile(prelude):
        _fail(f"--prelude {prelude}: no such file")
    try:
        import torch  # noqa: F401
    except ImportError:
        _fail(
            f"PyTorch is not installed in this Python ({sys.executable}): run it with the Python of your training job"
        )
    from .dump import InputError

    say = (lambda _text: None) if args.quiet else _say
    try:
        return _run(args, prelude, say)
    except InputError as e:
        _fail(str(e))
    except Exception as e:  # noqa: BLE001 - exit 1 means "reproduces": nothing else may
        _fail(f"{type(e).__name__}: {e} (a dump the checks let through, or a bug in probe)")


def _replaceable(out: str) -> bool:
    """Whether ``out`` may be replaced by this replay's folder: absent, empty, an earlier
    replay's (it holds replay.json), or only the recapture.json of one that had nothing to
    replay; never a dump or a compare's folder."""
    if not os.path.lexists(out):
        return True
    if os.path.islink(out) or not os.path.isdir(out):
        return False
    names = os.listdir(out)
    return "replay.json" in names or all(n == "recapture.json" for n in names)


def _say(text: str) -> None:
    from .text import printable

    print(printable(f"probe replay: {text}"), file=sys.stderr, flush=True)


def _run(args: argparse.Namespace, prelude: Optional[str], say: Callable[[str], None]) -> int:
    from . import dump, engine, plan, report

    bench = dump.locate(args.bench, args.step, args.rank)
    cmp = dump.locate(args.cmp, args.step, args.rank)
    keys = list(dict.fromkeys(args.op))
    need = set().union(*(plan.keys_needed(k) for k in keys))
    b, c = dump.find_ops(bench, need), dump.find_ops(cmp, need)
    say(f"read {len(b)} records of the benchmark, {len(c)} of the comparison")
    plans = [plan.plan(k, bench, cmp, b, c) for k in keys]
    results = engine.run_all(plans, args.device, prelude, (args.rtol, args.atol), say)
    run = {
        "device": args.device,
        "torch_version": _torch_version(),
        "prelude": prelude,
        "bench": {"path": bench.path, "step": bench.step, "rank": bench.rank},
        "cmp": {"path": cmp.path, "step": cmp.step, "rank": cmp.rank},
        "rtol": args.rtol,
        "atol": args.atol,
    }
    _write(args.out, results, run)
    print(report.headline(results, args.device))
    if len(results) > 1:  # one op: the headline is its line
        for r in results:
            print(report.line(r, args.device))
    return report.exit_code(results)


def _torch_version() -> str:
    import torch

    return str(torch.__version__)


def _write(out: str, results: list[Any], run: dict[str, Any]) -> None:
    """replay.json and the repro folders, into a temporary folder beside ``out``, renamed."""
    from . import folder, report

    parent = os.path.dirname(os.path.abspath(out))
    try:
        os.makedirs(parent, exist_ok=True)
        tmp = tempfile.mkdtemp(prefix=".replay-", dir=parent)
    except OSError as e:
        from .dump import InputError

        raise InputError(f"-o {out}: cannot write there ({e})") from None
    try:
        taken: set[str] = set()
        folders: dict[str, str] = {}
        for r in results:
            if r.judgement is not None and r.plan.spec is not None:
                name = folder.folder_name(r.plan.key, taken)
                folder.write(
                    os.path.join(tmp, name),
                    r.plan.spec,
                    r.plan.tensors,
                    report.readme(r, run["device"]),
                )
                folders[r.plan.key] = name
        doc = report.document(results, run, folders)
        with open(os.path.join(tmp, "replay.json"), "w", encoding="utf-8") as fh:
            json.dump(doc, fh, indent=2, ensure_ascii=False, allow_nan=False)
            fh.write("\n")
        if os.path.isdir(out):
            shutil.rmtree(out)
        os.rename(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
