"""Seeds and random draws: which seeds were set where, and which random functions ran.

A missing ``manual_seed`` or an extra ``random.shuffle`` on one side is a classic cause of
runs that "should" match. While a pack listens, the seed functions of ``random``, numpy and
torch (and its devices) are wrapped to record each call with its value and call site; while
it counts steps, the random-draw functions are wrapped too, to count calls per call site.
The wrappers are installed once per process, through one :class:`~probe._patch.Patches`
group each, and tell every listening pack; they are removed when no pack needs them.
"""

from __future__ import annotations

import hashlib
import os
import random as _random
import sys
import threading
from types import FrameType
from typing import Any, Callable, Optional

from .._guard import Guard
from .._patch import Patches
from ._report import report_failure
from .fingerprint import jsonable


class RandomLog:
    """One pack's ``random`` section: seed calls always, draws while ``counting``, and per
    generator whether it was seeded and whether it was drawn from (its state at save time
    against its state when the pack started listening, or after its last seed call)."""

    def __init__(self) -> None:
        self.seeds: list[dict[str, Any]] = []
        self.draws: dict[str, dict[str, int]] = {}
        self.counting = False
        self.seeded: set[str] = set()
        #: Generator -> state hash when last known untouched (listening began, or seeded).
        self.base: dict[str, str] = {}

    def start(self) -> None:
        """The states the generators start from, for those not known yet."""
        for g, h in rng_state_hashes().items():
            self.base.setdefault(g, h)

    def seed_call(self, name: str, value: Any, site: str) -> None:
        self.seeds.append({"function": name, "value": jsonable(value), "site": site})

    def seeded_now(self, name: str) -> None:
        """After seed function ``name`` returned: its generators are seeded, and their
        states now are where draws are counted from."""
        gens = seeded_generators(name)
        self.seeded.update(gens)
        now = rng_state_hashes(gens)
        for g in gens:
            if g in now:
                self.base[g] = now[g]

    def generators(self, states: dict[str, str]) -> dict[str, dict[str, Any]]:
        """``{generator: {seeded, drawn}}``; ``drawn`` is None where the generator appeared
        after listening began (its starting state is not known)."""
        out: dict[str, dict[str, Any]] = {}
        for g, h in sorted(states.items()):
            base = self.base.get(g)
            out[g] = {"seeded": g in self.seeded, "drawn": None if base is None else base != h}
        return out

    def draw(self, name: str, site: str) -> None:
        if self.counting:
            sites = self.draws.setdefault(name, {})
            sites[site] = sites.get(site, 0) + 1

    def section(self) -> dict[str, Any]:
        """The section as written: seed calls in order, draw counts by function and site,
        and the generators' state hashes now."""
        states = rng_state_hashes()
        return {
            "seed_calls": list(self.seeds),
            "draws": {
                fn: [{"site": s, "count": c} for s, c in sorted(sites.items())]
                for fn, sites in sorted(self.draws.items())
            },
            "state_hashes": states,
            "generators": self.generators(states),
        }


# The listening logs, the wrappers of each kind, and how many logs count draws.
_LISTENING: list[RandomLog] = []
_SEED_HOOKS = Patches()
_DRAW_HOOKS = Patches()
_draw_users = 0
# A wrapper's own bookkeeping (and whatever it calls) must not be recorded again.
_TLS = threading.local()
# Failures inside a wrapper belong to no pack: reported once per process.
_HOOK_GUARD = Guard(report_failure)
_SKIP_DIRS: tuple[str, ...] = ()


def listen(log: RandomLog) -> None:
    """Start recording seed calls into ``log`` (wrapping the seed functions if needed)."""
    _install(_seed_targets(), _SEED_HOOKS, _make_seed_wrapper)
    log.start()
    _LISTENING.append(log)


def is_listening(log: RandomLog) -> bool:
    return log in _LISTENING


def unlisten(log: RandomLog) -> None:
    """Stop recording into ``log``; the seed wrappers go once no log listens."""
    if log in _LISTENING:
        _LISTENING.remove(log)
    if not _LISTENING:
        _SEED_HOOKS.remove_all()


def count_draws(log: RandomLog) -> None:
    """Start counting random draws into ``log`` (wrapping the draw functions if needed)."""
    global _draw_users
    # Modules imported since listening began (numpy after the pack was made): their seed
    # functions are wrapped from now on, their generators' states known from now on.
    _install(_seed_targets(), _SEED_HOOKS, _make_seed_wrapper)
    log.start()
    _install(_draw_targets(), _DRAW_HOOKS, _make_draw_wrapper)
    _draw_users += 1
    log.counting = True


def stop_counting(log: RandomLog) -> None:
    """Stop counting draws into ``log``; the draw wrappers go once no log counts."""
    global _draw_users
    log.counting = False
    _draw_users = max(0, _draw_users - 1)
    if _draw_users == 0:
        _DRAW_HOOKS.remove_all()


def _skip_dirs() -> tuple[str, ...]:
    global _SKIP_DIRS
    if not _SKIP_DIRS:
        probe_dir = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        dirs = [probe_dir, os.path.abspath(_random.__file__)]
        for mod in ("torch", "numpy"):
            m = sys.modules.get(mod)
            f = getattr(m, "__file__", None)
            if f:
                dirs.append(os.path.dirname(os.path.abspath(f)))
        _SKIP_DIRS = tuple(dirs)
    return _SKIP_DIRS


def call_site(depth: int = 2) -> str:
    """``path:line in function`` of the innermost frame outside probe, torch, numpy and
    the ``random`` module (the user's line), else the immediate caller."""
    try:
        first = sys._getframe(depth)
    except ValueError:
        return "?"
    f: Optional[FrameType] = first
    skip = _skip_dirs()
    while f is not None:
        fn = os.path.abspath(f.f_code.co_filename)
        if not fn.startswith(skip) and "<frozen" not in fn:
            return f"{fn}:{f.f_lineno} in {f.f_code.co_name}"
        f = f.f_back
    return f"{first.f_code.co_filename}:{first.f_lineno} in {first.f_code.co_name}"


def _make_wrapper(
    name: str,
    orig: Callable[..., Any],
    what: str,
    record: Callable[[RandomLog, str, Any, Any, str], None],
    after: Optional[Callable[[RandomLog, str], None]] = None,
) -> Callable[..., Any]:
    """Wraps a seed or random-draw function: tells every listening log, calls through, then
    (``after``) tells them it returned. Recording never fails the call."""

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if getattr(_TLS, "depth", 0) > 0 or not _LISTENING:
            return orig(*args, **kwargs)
        _TLS.depth = 1
        try:
            try:
                site = call_site()
                for log in list(_LISTENING):
                    record(log, name, args, kwargs, site)
            except Exception as e:  # noqa: BLE001 - must never fail the training run
                _HOOK_GUARD.fail(e, what)
            result = orig(*args, **kwargs)
            if after is not None:
                try:
                    for log in list(_LISTENING):
                        after(log, name)
                except Exception as e:  # noqa: BLE001 - must never fail the training run
                    _HOOK_GUARD.fail(e, what)
            return result
        finally:
            _TLS.depth = 0

    wrapper.__wrapped__ = orig  # type: ignore[attr-defined]
    wrapper.__name__ = getattr(orig, "__name__", name.rsplit(".", 1)[-1])
    wrapper.__doc__ = getattr(orig, "__doc__", None)
    wrapper._probe_wrapper = True  # type: ignore[attr-defined]
    return wrapper


def _make_seed_wrapper(name: str, orig: Callable[..., Any]) -> Callable[..., Any]:
    def record(log: RandomLog, n: str, args: Any, kwargs: Any, site: str) -> None:
        value = args[0] if args else kwargs.get("seed", kwargs.get("a"))
        log.seed_call(n, value, site)

    def after(log: RandomLog, n: str) -> None:
        log.seeded_now(n)

    return _make_wrapper(name, orig, "seed hook", record, after)


def _make_draw_wrapper(name: str, orig: Callable[..., Any]) -> Callable[..., Any]:
    def record(log: RandomLog, n: str, args: Any, kwargs: Any, site: str) -> None:
        log.draw(n, site)

    return _make_wrapper(name, orig, "draw hook", record)


def _install(
    targets: list[tuple[Any, str, str]],
    hooks: Patches,
    make: Callable[[str, Callable[..., Any]], Callable[..., Any]],
) -> None:
    """Wrap each target not wrapped yet; one that cannot be set (read-only) is skipped."""
    for owner, attr, name in targets:
        if (owner, attr) in hooks:
            continue
        orig = getattr(owner, attr, None)
        if orig is None or getattr(orig, "_probe_wrapper", False):
            continue
        try:
            hooks.replace(owner, attr, make(name, orig))
        except (AttributeError, TypeError):
            pass


def _seed_targets() -> list[tuple[Any, str, str]]:
    """(owner, attribute, reported name) of every seed function we wrap."""
    t: list[tuple[Any, str, str]] = [(_random, "seed", "random.seed")]
    np: Any = sys.modules.get("numpy")
    if np is not None:
        t.append((np.random, "seed", "numpy.random.seed"))
    torch: Any = sys.modules.get("torch")
    if torch is not None:
        t.append((torch, "manual_seed", "torch.manual_seed"))
        t.append((torch.random, "manual_seed", "torch.manual_seed"))
        t.append((torch, "seed", "torch.seed"))
        for dev in ("cuda", "npu"):
            mod = getattr(torch, dev, None)
            if mod is not None:
                for fn in ("manual_seed", "manual_seed_all", "seed", "seed_all"):
                    if hasattr(mod, fn):
                        t.append((mod, fn, f"torch.{dev}.{fn}"))
    return t


def _draw_targets() -> list[tuple[Any, str, str]]:
    """(owner, attribute, reported name) of every random-draw function we wrap."""
    t: list[tuple[Any, str, str]] = []
    for fn in (
        "random",
        "uniform",
        "randint",
        "randrange",
        "choice",
        "choices",
        "shuffle",
        "sample",
        "gauss",
        "normalvariate",
        "getrandbits",
    ):
        t.append((_random, fn, f"random.{fn}"))
    np: Any = sys.modules.get("numpy")
    if np is not None:
        for fn in (
            "rand",
            "randn",
            "randint",
            "random",
            "random_sample",
            "choice",
            "shuffle",
            "permutation",
            "normal",
            "uniform",
        ):
            if hasattr(np.random, fn):
                t.append((np.random, fn, f"numpy.random.{fn}"))
    torch: Any = sys.modules.get("torch")
    if torch is not None:
        for fn in (
            "rand",
            "randn",
            "randint",
            "randperm",
            "normal",
            "bernoulli",
            "multinomial",
            "poisson",
            "rand_like",
            "randn_like",
            "randint_like",
        ):
            if hasattr(torch, fn):
                t.append((torch, fn, f"torch.{fn}"))
        for fn in (
            "uniform_",
            "normal_",
            "random_",
            "bernoulli_",
            "exponential_",
            "geometric_",
            "cauchy_",
            "log_normal_",
        ):
            if hasattr(torch.Tensor, fn):
                t.append((torch.Tensor, fn, f"torch.Tensor.{fn}"))
        F = torch.nn.functional
        for fn in ("dropout", "dropout1d", "dropout2d", "dropout3d", "alpha_dropout"):
            if hasattr(F, fn):
                t.append((F, fn, f"torch.nn.functional.{fn}"))
    return t


def seeded_generators(function: str) -> tuple[str, ...]:
    """The generators a seed function seeds: ``torch.manual_seed`` (and ``torch.seed``)
    seed the CPU generator and every device's."""
    if function.startswith("random."):
        return ("python",)
    if function.startswith("numpy.random."):
        return ("numpy",)
    if function.startswith("torch.cuda."):
        return ("cuda",)
    if function.startswith("torch.npu."):
        return ("npu",)
    if function.startswith("torch."):
        return ("torch", "cuda", "npu")
    return ()


def rng_state_hashes(only: Optional[tuple[str, ...]] = None) -> dict[str, str]:
    """sha256 of each generator's current state (python, numpy, torch, cuda, npu; ``only``
    these). A device generator is hashed only once its device is initialised."""
    out: dict[str, str] = {}

    def h(b: bytes) -> str:
        return hashlib.sha256(b).hexdigest()

    def want(g: str) -> bool:
        return only is None or g in only

    if want("python"):
        out["python"] = h(repr(_random.getstate()).encode())
    np: Any = sys.modules.get("numpy")
    if np is not None and want("numpy"):
        try:
            st = np.random.get_state()
            out["numpy"] = h(st[1].tobytes() + repr(st[2:]).encode())
        except Exception:  # noqa: BLE001
            pass
    torch: Any = sys.modules.get("torch")
    if torch is not None:
        try:
            if want("torch"):
                out["torch"] = h(torch.get_rng_state().numpy().tobytes())
        except Exception:  # noqa: BLE001
            pass
        for dev in ("cuda", "npu"):
            mod = getattr(torch, dev, None)
            try:
                if not want(dev):
                    continue
                if mod is not None and mod.is_available() and mod.is_initialized():
                    states = mod.get_rng_state_all()
                    out[dev] = h(b"".join(s.cpu().numpy().tobytes() for s in states))
            except Exception:  # noqa: BLE001
                pass
    return out
