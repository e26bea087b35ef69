"""Config packs: a small zip of fingerprints of one training environment.

Why: half of all "the NPU run diverges" reports are a different package, a missing seed,
a shuffled dataset, other initial weights or a stray env var. Each side packs a zip and
``probe config-check gpu.zip npu.zip`` says exactly what differs. Format: docs/config-check.md
and schemas/probe-config-pack.v1.schema.json.

Usage::

    pack = probe.ConfigPack("gpu.zip", steps=3)    # before seeding: seed calls are recorded
    torch.manual_seed(1234)
    model, opt, dl = ...
    pack.capture(model=model, optimizer=opt, dataloader=dl, args=vars(args))
    for batch in dl: ...                           # the first 3 steps are fingerprinted
    # the pack is saved after step 3 (or call pack.save(); or at interpreter exit)

Nothing here may fail the training run: every hook catches its errors, logs the first one
and carries on; a pack that cannot be written is reported and skipped.
"""

from __future__ import annotations

import atexit
import datetime as _dt
import hashlib
import io
import json
import logging
import math
import os
import platform
import random as _random
import sys
import threading
import zipfile
from typing import Any, Callable, Dict, Iterable, List, Optional, Tuple

from ._runtime import current_rank, device_kind

FORMAT = "probe-config-pack"
VERSION = 1

_log = logging.getLogger("probe.config_pack")

#: Parts of an environment variable name that mark its value as a secret (case-insensitive).
SECRET_MARKERS: Tuple[str, ...] = (
    "TOKEN",
    "SECRET",
    "PASSW",
    "CREDENTIAL",
    "ACCESS",
    "AUTH",
    "PRIVATE",
    "COOKIE",
    "SESSION",
    "KEY",
)


def is_secret_name(name: str) -> bool:
    """True when the variable's value must not leave the machine (compared by digest)."""
    upper = name.upper()
    return any(m in upper for m in SECRET_MARKERS)


def redact(value: str) -> str:
    """The digest that replaces a secret value: equal values stay equal."""
    return "sha256:" + hashlib.sha256(value.encode("utf-8", "surrogateescape")).hexdigest()


def jsonable(v: Any, depth: int = 0) -> Any:
    """A JSON-safe copy of ``v``: tuples become lists, tensors scalars or summaries,
    non-finite floats strings, anything else its repr."""
    if depth > 8:
        return repr(v)
    if v is None or isinstance(v, (bool, int, str)):
        return v
    if isinstance(v, float):
        return v if math.isfinite(v) else repr(v)
    if isinstance(v, dict):
        return {str(k): jsonable(x, depth + 1) for k, x in v.items()}
    if isinstance(v, (list, tuple, set, frozenset)):
        items = sorted(v, key=repr) if isinstance(v, (set, frozenset)) else v
        return [jsonable(x, depth + 1) for x in items]
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(v, torch.Tensor):
        if v.numel() == 1:
            return jsonable(v.detach().cpu().item(), depth + 1)
        return {"tensor": list(v.shape), "dtype": _dtype_name(v.dtype)}
    if torch is not None and isinstance(v, torch.dtype):
        return _dtype_name(v)
    if hasattr(v, "__dict__") and type(v).__name__ == "Namespace":
        return jsonable(vars(v), depth + 1)
    item = getattr(v, "item", None)
    if callable(item) and getattr(v, "shape", None) == ():
        try:
            return jsonable(item(), depth + 1)
        except Exception:  # noqa: BLE001 - a repr is good enough
            pass
    return repr(v)


def _dtype_name(dt: Any) -> str:
    s = str(dt)
    return s[len("torch.") :] if s.startswith("torch.") else s


def tensor_fingerprint(t: Any) -> Dict[str, Any]:
    """sha256 of the tensor's raw bytes (contiguous, little-endian) plus dtype, shape and
    statistics in float64 (max, min, mean, L2 norm; null when empty or not real)."""
    import torch

    x = t.detach()
    if x.device.type != "cpu":
        x = x.cpu()
    x = x.contiguous()
    flat = x.reshape(-1)
    try:
        raw = flat.view(torch.uint8).numpy().tobytes()
    except Exception:  # noqa: BLE001 - dtypes numpy cannot view (e.g. some fp8)
        raw = bytes(flat.untyped_storage())[: flat.numel() * flat.element_size()]
    fp: Dict[str, Any] = {
        "sha256": hashlib.sha256(raw).hexdigest(),
        "dtype": _dtype_name(x.dtype),
        "shape": list(x.shape),
        "numel": int(flat.numel()),
        "max": None,
        "min": None,
        "mean": None,
        "norm": None,
    }
    if flat.numel() > 0 and not x.is_complex():
        try:
            d = flat.to(torch.float64)
            for k, v in (
                ("max", d.max()),
                ("min", d.min()),
                ("mean", d.mean()),
                ("norm", torch.linalg.vector_norm(d)),
            ):
                f = float(v)
                fp[k] = f if math.isfinite(f) else repr(f)
        except Exception:  # noqa: BLE001 - statistics are optional
            pass
    return fp


def _walk_tensors(obj: Any, prefix: str, out: List[Tuple[str, Any]], depth: int = 0) -> None:
    torch = sys.modules.get("torch")
    if depth > 6 or torch is None:
        return
    if isinstance(obj, torch.Tensor):
        out.append((prefix, obj))
    elif isinstance(obj, dict):
        for k, v in obj.items():
            _walk_tensors(v, f"{prefix}.{k}", out, depth + 1)
    elif isinstance(obj, (list, tuple)):
        for i, v in enumerate(obj):
            _walk_tensors(v, f"{prefix}.{i}", out, depth + 1)


# --------------------------------------------------------------------------------------
# Call sites and the seed/draw wrappers (installed once, dispatching to the active packs)

_ACTIVE: List["ConfigPack"] = []
_TLS = threading.local()
_SKIP_DIRS: Tuple[str, ...] = ()
_INSTALLED_SEEDS: Dict[Tuple[Any, str], Callable[..., Any]] = {}
_INSTALLED_DRAWS: Dict[Tuple[Any, str], Callable[..., Any]] = {}
_DRAW_USERS = 0


def _skip_dirs() -> Tuple[str, ...]:
    global _SKIP_DIRS
    if not _SKIP_DIRS:
        dirs = [os.path.dirname(os.path.abspath(__file__)), os.path.abspath(_random.__file__)]
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
        f = sys._getframe(depth)
    except ValueError:
        return "?"
    first = f
    skip = _skip_dirs()
    while f is not None:
        fn = os.path.abspath(f.f_code.co_filename)
        if not fn.startswith(skip) and "<frozen" not in fn:
            return f"{fn}:{f.f_lineno} in {f.f_code.co_name}"
        f = f.f_back
    return f"{first.f_code.co_filename}:{first.f_lineno} in {first.f_code.co_name}"


def _busy() -> bool:
    return getattr(_TLS, "depth", 0) > 0


def _make_wrapper(
    name: str,
    orig: Callable[..., Any],
    what: str,
    record: Callable[["ConfigPack", str, Any, Any, str], None],
) -> Callable[..., Any]:
    """Wraps a seed or random-draw function: tells every active pack, then calls through.
    Recording never fails the call (errors are logged once)."""

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if _busy() or not _ACTIVE:
            return orig(*args, **kwargs)
        _TLS.depth = 1
        try:
            try:
                site = call_site()
                for p in list(_ACTIVE):
                    record(p, name, args, kwargs, site)
            except Exception as e:  # noqa: BLE001
                _warn_once(None, what, e)
            return orig(*args, **kwargs)
        finally:
            _TLS.depth = 0

    wrapper.__wrapped__ = orig  # type: ignore[attr-defined]
    wrapper.__name__ = getattr(orig, "__name__", name.rsplit(".", 1)[-1])
    wrapper.__doc__ = getattr(orig, "__doc__", None)
    return wrapper


def _make_seed_wrapper(name: str, orig: Callable[..., Any]) -> Callable[..., Any]:
    def record(p: "ConfigPack", n: str, args: Any, kwargs: Any, site: str) -> None:
        value = args[0] if args else kwargs.get("seed", kwargs.get("a"))
        p._seed_call(n, value, site)

    return _make_wrapper(name, orig, "seed hook", record)


def _make_draw_wrapper(name: str, orig: Callable[..., Any]) -> Callable[..., Any]:
    def record(p: "ConfigPack", n: str, args: Any, kwargs: Any, site: str) -> None:
        p._draw(n, site)

    return _make_wrapper(name, orig, "draw hook", record)


def _seed_targets() -> List[Tuple[Any, str, str]]:
    """(owner, attribute, reported name) of every seed function we wrap."""
    t: List[Tuple[Any, str, str]] = [(_random, "seed", "random.seed")]
    np = sys.modules.get("numpy")
    if np is not None:
        t.append((np.random, "seed", "numpy.random.seed"))
    torch = sys.modules.get("torch")
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


def _draw_targets() -> List[Tuple[Any, str, str]]:
    t: List[Tuple[Any, str, str]] = []
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
    np = sys.modules.get("numpy")
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
    torch = sys.modules.get("torch")
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


def _install(
    targets: List[Tuple[Any, str, str]],
    registry: Dict[Tuple[Any, str], Callable[..., Any]],
    make: Callable[[str, Callable[..., Any]], Callable[..., Any]],
) -> None:
    for owner, attr, name in targets:
        key = (owner, attr)
        if key in registry:
            continue
        orig = getattr(owner, attr, None)
        if orig is None or getattr(orig, "_probe_wrapper", False):
            continue
        w = make(name, orig)
        w._probe_wrapper = True  # type: ignore[attr-defined]
        try:
            setattr(owner, attr, w)
            registry[key] = orig
        except (AttributeError, TypeError):
            pass


def _uninstall(registry: Dict[Tuple[Any, str], Callable[..., Any]]) -> None:
    for (owner, attr), orig in list(registry.items()):
        try:
            setattr(owner, attr, orig)
        except (AttributeError, TypeError):
            pass
    registry.clear()


_WARNED: Dict[int, bool] = {}


def _warn_once(pack: Optional["ConfigPack"], what: str, e: BaseException) -> None:
    key = id(pack)
    if _WARNED.get(key):
        return
    _WARNED[key] = True
    _log.warning("probe: config pack: %s failed: %s (further errors not shown)", what, e)
    print(f"probe: config pack: {what} failed: {e!r}", file=sys.stderr)


def _safe(what: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Decorator: the method never raises; its first failure is logged."""

    def deco(fn: Callable[..., Any]) -> Callable[..., Any]:
        def inner(self: "ConfigPack", *a: Any, **k: Any) -> Any:
            try:
                return fn(self, *a, **k)
            except Exception as e:  # noqa: BLE001 - must never fail the training run
                self.errors.append(f"{what}: {e!r}")
                _warn_once(self, what, e)
                return None

        inner.__name__ = fn.__name__
        inner.__doc__ = fn.__doc__
        return inner

    return deco


# --------------------------------------------------------------------------------------
# Collectors


def collect_env(environ: Optional[Dict[str, str]] = None) -> Dict[str, Any]:
    env = dict(os.environ if environ is None else environ)
    out: Dict[str, str] = {}
    redacted: List[str] = []
    for k in sorted(env):
        if is_secret_name(k):
            out[k] = redact(env[k])
            redacted.append(k)
        else:
            out[k] = env[k]
    return {"vars": out, "redacted": redacted}


def _read_first(paths: Iterable[str], key: Optional[str] = None) -> Optional[str]:
    """First line of the first readable file, or the value of ``key=...`` in it."""
    for p in paths:
        try:
            with open(p, encoding="utf-8", errors="replace") as f:
                text = f.read(65536)
        except OSError:
            continue
        if key is None:
            line = text.strip().splitlines()
            return line[0].strip() if line else None
        for line in text.splitlines():
            k, sep, v = line.partition("=")
            if sep and k.strip().lower() == key.lower():
                return v.strip().strip('"')
    return None


def cann_version() -> Optional[str]:
    """CANN version from the Ascend toolkit's version info, when installed."""
    roots = [
        os.environ.get("ASCEND_TOOLKIT_HOME", ""),
        os.environ.get("ASCEND_HOME_PATH", ""),
        "/usr/local/Ascend/ascend-toolkit/latest",
        "/usr/local/Ascend/cann",
    ]
    files = []
    for r in roots:
        if r:
            files += [os.path.join(r, "version.cfg"), os.path.join(r, "version.info")]
            arch = platform.machine()
            files.append(os.path.join(r, f"{arch}-linux", "ascend_toolkit_install.info"))
    for key in ("version", "Version", "toolkit_installed_version"):
        v = _read_first(files, key)
        if v:
            return v
    return None


def collect_packages() -> Dict[str, Any]:
    import importlib.metadata as md

    dists: Dict[str, str] = {}
    for d in md.distributions():
        try:
            name = d.metadata["Name"]
        except Exception:  # noqa: BLE001
            name = None
        if name and name not in dists:
            dists[name] = d.version
    cpu_model = _read_first(["/proc/cpuinfo"], "model name") or platform.processor() or None
    if cpu_model is None:
        cpu_model = None
    acc: Dict[str, Any] = {
        "torch": None,
        "torch_npu": None,
        "cann": cann_version(),
        "cuda": None,
        "cudnn": None,
        "hip": None,
        "driver": None,
        "device_name": None,
        "device_count": 0,
    }
    torch = sys.modules.get("torch")
    if torch is not None:
        acc["torch"] = torch.__version__
        acc["cuda"] = getattr(torch.version, "cuda", None)
        acc["hip"] = getattr(torch.version, "hip", None)
        try:
            v = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
            acc["cudnn"] = str(v) if v is not None else None
        except Exception:  # noqa: BLE001
            pass
        try:
            if torch.cuda.is_available():
                acc["device_name"] = torch.cuda.get_device_name(0)
                acc["device_count"] = torch.cuda.device_count()
        except Exception:  # noqa: BLE001
            pass
    tnpu = sys.modules.get("torch_npu")
    if tnpu is not None:
        acc["torch_npu"] = getattr(tnpu, "__version__", None)
        try:
            if torch is not None and torch.npu.is_available():
                acc["device_name"] = torch.npu.get_device_name(0)
                acc["device_count"] = torch.npu.device_count()
        except Exception:  # noqa: BLE001
            pass
    acc["driver"] = _read_first(["/usr/local/Ascend/driver/version.info"], "Version") or (
        _read_first(["/proc/driver/nvidia/version"])
    )
    return {
        "python": {
            "version": platform.python_version(),
            "implementation": platform.python_implementation(),
        },
        "os": {
            "system": platform.system(),
            "release": platform.release(),
            "machine": platform.machine(),
            "libc": "-".join(platform.libc_ver()) or None,
        },
        "cpu": {"model": cpu_model, "count": os.cpu_count()},
        "distributions": dict(sorted(dists.items(), key=lambda kv: kv[0].lower())),
        "accelerator": acc,
    }


def collect_determinism() -> Dict[str, Any]:
    import torch

    flags: Dict[str, Any] = {}

    def put(name: str, fn: Callable[[], Any]) -> None:
        try:
            flags[name] = jsonable(fn())
        except Exception:  # noqa: BLE001 - a flag this torch does not have
            pass

    put("torch.are_deterministic_algorithms_enabled", torch.are_deterministic_algorithms_enabled)
    put(
        "torch.is_deterministic_algorithms_warn_only_enabled",
        torch.is_deterministic_algorithms_warn_only_enabled,
    )
    put("torch.backends.cudnn.enabled", lambda: torch.backends.cudnn.enabled)
    put("torch.backends.cudnn.deterministic", lambda: torch.backends.cudnn.deterministic)
    put("torch.backends.cudnn.benchmark", lambda: torch.backends.cudnn.benchmark)
    put("torch.backends.cudnn.allow_tf32", lambda: torch.backends.cudnn.allow_tf32)
    put("torch.backends.cuda.matmul.allow_tf32", lambda: torch.backends.cuda.matmul.allow_tf32)
    put(
        "torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction",
        lambda: torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction,
    )
    put(
        "torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction",
        lambda: torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction,
    )
    put("torch.get_float32_matmul_precision", torch.get_float32_matmul_precision)
    put("torch.get_default_dtype", torch.get_default_dtype)
    put("torch.backends.mkldnn.enabled", lambda: torch.backends.mkldnn.enabled)
    put("torch.get_num_threads", torch.get_num_threads)
    for dev in ("cpu", "cuda"):
        put(f"autocast.{dev}.enabled", lambda d=dev: torch.is_autocast_enabled(d))
        put(f"autocast.{dev}.dtype", lambda d=dev: torch.get_autocast_dtype(d))
    if "torch_npu" in sys.modules:
        put("torch.npu.matmul.allow_hf32", lambda: torch.npu.matmul.allow_hf32)
        put("torch.npu.conv.allow_hf32", lambda: torch.npu.conv.allow_hf32)
        put("autocast.npu.enabled", lambda: torch.is_autocast_enabled("npu"))
    return {"flags": flags}


def rng_state_hashes() -> Dict[str, str]:
    out: Dict[str, str] = {}

    def h(b: bytes) -> str:
        return hashlib.sha256(b).hexdigest()

    out["python"] = h(repr(_random.getstate()).encode())
    np = sys.modules.get("numpy")
    if np is not None:
        try:
            st = np.random.get_state()
            out["numpy"] = h(st[1].tobytes() + repr(st[2:]).encode())
        except Exception:  # noqa: BLE001
            pass
    torch = sys.modules.get("torch")
    if torch is not None:
        try:
            out["torch"] = h(torch.get_rng_state().numpy().tobytes())
        except Exception:  # noqa: BLE001
            pass
        for dev in ("cuda", "npu"):
            mod = getattr(torch, dev, None)
            try:
                if mod is not None and mod.is_available() and mod.is_initialized():
                    states = mod.get_rng_state_all()
                    out[dev] = h(b"".join(s.cpu().numpy().tobytes() for s in states))
            except Exception:  # noqa: BLE001
                pass
    return out


def _optimizer_info(opt: Any) -> Dict[str, Any]:
    groups = []
    for g in getattr(opt, "param_groups", []):
        d = {k: jsonable(v) for k, v in g.items() if k != "params"}
        d["num_params"] = len(g.get("params", []))
        d["num_elements"] = int(sum(int(p.numel()) for p in g.get("params", [])))
        groups.append(d)
    cls = type(opt)
    return {
        "class": f"{cls.__module__}.{cls.__qualname__}",
        "defaults": jsonable(getattr(opt, "defaults", {})),
        "param_groups": groups,
    }


def _scheduler_info(s: Any) -> Dict[str, Any]:
    cls = type(s)
    state = {}
    try:
        state = {k: jsonable(v) for k, v in s.state_dict().items() if k != "optimizer"}
    except Exception:  # noqa: BLE001
        pass
    return {"class": f"{cls.__module__}.{cls.__qualname__}", "state": state}


def _scaler_info(s: Any) -> Dict[str, Any]:
    d: Dict[str, Any] = {"class": f"{type(s).__module__}.{type(s).__qualname__}"}
    for k in ("is_enabled", "get_scale", "get_growth_factor", "get_backoff_factor"):
        try:
            d[k.replace("get_", "").replace("is_", "")] = jsonable(getattr(s, k)())
        except Exception:  # noqa: BLE001
            pass
    try:
        d["growth_interval"] = jsonable(s.get_growth_interval())
    except Exception:  # noqa: BLE001
        pass
    return d


def _dataloader_info(dl: Any) -> Dict[str, Any]:
    d: Dict[str, Any] = {"class": f"{type(dl).__module__}.{type(dl).__qualname__}"}
    for k in ("batch_size", "drop_last", "num_workers", "pin_memory"):
        if hasattr(dl, k):
            d[k] = jsonable(getattr(dl, k))
    for k in ("sampler", "batch_sampler", "dataset"):
        v = getattr(dl, k, None)
        if v is not None:
            d[k] = type(v).__qualname__
    try:
        d["dataset_len"] = len(dl.dataset)
    except Exception:  # noqa: BLE001
        pass
    return d


# --------------------------------------------------------------------------------------


class ConfigPack:
    """Collects one environment's fingerprints and writes them as a config pack zip.

    Create it before the seed calls you want recorded, call :meth:`capture` once the model
    and optimizer exist, train; the pack is saved after ``steps`` optimizer steps (or by
    :meth:`save`, or at interpreter exit). With ``world_size > 1`` write one pack per rank
    (``path`` may contain ``{rank}``).
    """

    def __init__(
        self,
        path: str,
        steps: int = 3,
        weights_after: bool = False,
        autosave: bool = True,
    ) -> None:
        self.path = str(path)
        self.steps = max(0, int(steps))
        self.weights_after = weights_after
        self.autosave = autosave
        self.errors: List[str] = []
        self.saved: Optional[str] = None
        self._step = 0
        self._calls_in_step = 0
        self._seeds: List[Dict[str, Any]] = []
        self._draws: Dict[str, Dict[str, int]] = {}
        self._counting = False
        self._sections: Dict[str, Any] = {}
        self._dataset: List[Dict[str, Any]] = []
        self._weights: List[Dict[str, Any]] = []
        self._handles: List[Any] = []
        self._model: Any = None
        self._rank = 0
        try:
            _install(_seed_targets(), _INSTALLED_SEEDS, _make_seed_wrapper)
            _ACTIVE.append(self)
            atexit.register(self._at_exit)
        except Exception as e:  # noqa: BLE001
            self.errors.append(f"init: {e!r}")
            _warn_once(self, "init", e)

    # ---- hooks called by the wrappers
    def _seed_call(self, name: str, value: Any, site: str) -> None:
        self._seeds.append({"function": name, "value": jsonable(value), "site": site})

    def _draw(self, name: str, site: str) -> None:
        if self._counting:
            sites = self._draws.setdefault(name, {})
            sites[site] = sites.get(site, 0) + 1

    # ---- public API
    @_safe("capture")
    def capture(
        self,
        model: Any = None,
        optimizer: Any = None,
        dataloader: Any = None,
        args: Any = None,
        scheduler: Any = None,
        scaler: Any = None,
        steps: Optional[int] = None,
        extra: Optional[Dict[str, Any]] = None,
    ) -> "ConfigPack":
        """Records env, packages, determinism, hyperparameters and the initial weights now,
        then fingerprints the model inputs and counts random draws for ``steps`` steps."""
        global _DRAW_USERS
        if steps is not None:
            self.steps = max(0, int(steps))
        self._rank = current_rank()
        self._model = model
        for name, fn in (
            ("env", collect_env),
            ("packages", collect_packages),
            ("determinism", collect_determinism),
        ):
            try:
                self._sections[name] = fn()
            except Exception as e:  # noqa: BLE001
                self.errors.append(f"{name}: {e!r}")
                _warn_once(self, name, e)
        hp: Dict[str, Any] = {"argv": list(sys.argv)}
        if args is not None:
            hp["args"] = jsonable(vars(args) if hasattr(args, "__dict__") else args)
        if optimizer is not None:
            hp["optimizer"] = _optimizer_info(optimizer)
        if scheduler is not None:
            hp["scheduler"] = _scheduler_info(scheduler)
        if scaler is not None:
            hp["scaler"] = _scaler_info(scaler)
        if dataloader is not None:
            hp["dataloader"] = _dataloader_info(dataloader)
        if extra:
            hp["extra"] = jsonable(extra)
        self._sections["hyperparameters"] = hp
        if model is not None:
            try:
                self._record_weights(0)
            except Exception as e:  # noqa: BLE001 - go on without initial weights
                self.errors.append(f"weights: {e!r}")
                _warn_once(self, "weights", e)
        if self.steps > 0:
            if model is not None:
                self._handles.append(
                    model.register_forward_pre_hook(self._on_forward, with_kwargs=True)
                )
            if optimizer is not None and hasattr(optimizer, "register_step_post_hook"):
                self._handles.append(optimizer.register_step_post_hook(self._on_opt_step))
            self._by_forward = optimizer is None
            _install(_draw_targets(), _INSTALLED_DRAWS, _make_draw_wrapper)
            _DRAW_USERS += 1
            self._counting = True
        elif self.autosave:
            self.save()
        return self

    @_safe("record_batch")
    def record_batch(self, batch: Any, name: str = "batch") -> None:
        """Fingerprints an arbitrary (nested) batch, e.g. with its labels, for this step."""
        if self._counting:
            self._record_inputs(batch, name)

    @_safe("step")
    def step(self) -> None:
        """Ends a step by hand (when no optimizer was given to :meth:`capture`)."""
        self._end_step()

    def _on_forward(self, module: Any, args: Any, kwargs: Any) -> None:
        try:
            if not self._counting:
                return
            if getattr(self, "_by_forward", False) and self._calls_in_step > 0:
                self._end_step()
                if not self._counting:
                    return
            prefix = "" if self._calls_in_step == 0 else f"call{self._calls_in_step}."
            self._record_inputs(list(args), prefix + "args")
            if kwargs:
                self._record_inputs(dict(kwargs), prefix + "kwargs")
            self._calls_in_step += 1
        except Exception as e:  # noqa: BLE001
            self.errors.append(f"forward hook: {e!r}")
            _warn_once(self, "forward hook", e)

    def _on_opt_step(self, *_: Any, **__: Any) -> None:
        try:
            self._end_step()
        except Exception as e:  # noqa: BLE001
            self.errors.append(f"optimizer hook: {e!r}")
            _warn_once(self, "optimizer hook", e)

    def _record_inputs(self, obj: Any, prefix: str) -> None:
        found: List[Tuple[str, Any]] = []
        _walk_tensors(obj, prefix, found)
        for name, t in found:
            self._dataset.append(
                {
                    "step": self._step,
                    "rank": self._rank,
                    "name": name,
                    "fingerprint": tensor_fingerprint(t),
                }
            )

    def _record_weights(self, step: int) -> None:
        if self._model is None:
            return
        for name, p in self._model.named_parameters():
            self._weights.append(
                {
                    "step": step,
                    "rank": self._rank,
                    "name": name,
                    "fingerprint": tensor_fingerprint(p),
                }
            )

    def _end_step(self) -> None:
        if not self._counting:
            return
        self._step += 1
        self._calls_in_step = 0
        if self._step >= self.steps:
            self._stop_counting()
            if self.weights_after:
                self._record_weights(self._step)
            if self.autosave:
                self.save()

    def _stop_counting(self) -> None:
        global _DRAW_USERS
        if not self._counting:
            return
        self._counting = False
        for h in self._handles:
            try:
                h.remove()
            except Exception:  # noqa: BLE001
                pass
        self._handles = []
        _DRAW_USERS = max(0, _DRAW_USERS - 1)
        if _DRAW_USERS == 0:
            _uninstall(_INSTALLED_DRAWS)

    def contents(self) -> Dict[str, Any]:
        """The pack's JSON documents by entry name (without the ``.json`` suffix)."""
        random_section = {
            "seed_calls": list(self._seeds),
            "draws": {
                fn: [{"site": s, "count": c} for s, c in sorted(sites.items())]
                for fn, sites in sorted(self._draws.items())
            },
            "state_hashes": rng_state_hashes(),
        }
        docs: Dict[str, Any] = {
            "manifest": {
                "format": FORMAT,
                "version": VERSION,
                "producer": "probe-agent (python)",
                "created": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
                "device": device_kind(),
                "rank": self._rank,
                "steps": min(self._step, self.steps) if self._model is not None else 0,
                "errors": list(self.errors),
            },
            **self._sections,
            "random": random_section,
        }
        if self._model is not None or self._dataset:
            docs["dataset"] = {"records": list(self._dataset)}
        if self._weights:
            docs["weights"] = {"records": list(self._weights)}
        return docs

    @_safe("save")
    def save(self, path: Optional[str] = None) -> Optional[str]:
        """Writes the zip (atomically); returns its path, or None when it could not."""
        try:
            return self._write(path)
        finally:
            if self in _ACTIVE:
                _ACTIVE.remove(self)
            if not _ACTIVE:
                _uninstall(_INSTALLED_SEEDS)

    def _write(self, path: Optional[str]) -> str:
        self._stop_counting()
        target = (path or self.path).replace("{rank}", str(self._rank))
        docs = self.contents()
        docs["manifest"]["entries"] = sorted(f"{k}.json" for k in docs)
        buf = io.BytesIO()
        with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as z:
            for name in sorted(docs):
                data = json.dumps(docs[name], indent=1, sort_keys=True, allow_nan=False)
                info = zipfile.ZipInfo(f"{name}.json", date_time=(1980, 1, 1, 0, 0, 0))
                info.compress_type = zipfile.ZIP_DEFLATED
                info.external_attr = 0o644 << 16
                z.writestr(info, data)
        d = os.path.dirname(os.path.abspath(target))
        os.makedirs(d, exist_ok=True)
        tmp = os.path.join(d, f".{os.path.basename(target)}.tmp-{os.getpid()}")
        try:
            with open(tmp, "wb") as f:
                f.write(buf.getvalue())
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, target)
        finally:
            if os.path.exists(tmp):
                os.remove(tmp)
        self.saved = target
        return target

    def _at_exit(self) -> None:
        if self.saved is None and self in _ACTIVE:
            self.save()
