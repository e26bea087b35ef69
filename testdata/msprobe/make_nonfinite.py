"""Writes msprobe statistics dumps with non-finite statistics, the way msprobe writes them.

msprobe writes dump.json with Python's json module, so a NaN or infinite statistic is a
bare ``NaN`` / ``Infinity`` / ``-Infinity`` token; some of its code paths write the strings
``"nan"`` / ``"inf"`` / ``"-inf"`` instead. Both are used here, from the real statistics dump
``stats_bench/step0`` (standard library only; deterministic):

- ``nonfinite_bench/step0/proc1/``: the attention scores entering softmax hold -inf (a
  causal mask), as in every HF transformer dump; everything else finite.
- ``nonfinite_cmp/step0/proc2/``: the same, and ``Functional.gelu.0.forward`` produces NaN
  from finite inputs; the NaN flows through every later float tensor, backward included.

Run from the repository root: ``python3 testdata/msprobe/make_nonfinite.py``.
"""

from __future__ import annotations

import json
import os
import shutil
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
SRC = os.path.join(HERE, "stats_bench", "step0", "proc24241")
NAN = float("nan")
INF = float("inf")


def tensors(entry: Any) -> list[dict[str, Any]]:
    """Every tensor leaf of an op entry, in file order."""
    out: list[dict[str, Any]] = []

    def walk(v: Any) -> None:
        if isinstance(v, dict):
            if "dtype" in v and "shape" in v and "Tensor" in str(v.get("type", "")):
                out.append(v)
            else:
                for x in v.values():
                    walk(x)
        elif isinstance(v, list):
            for x in v:
                walk(x)

    walk(entry)
    return out


def slot(entry: dict[str, Any], name: str) -> list[dict[str, Any]]:
    return tensors(entry.get(name, []))


def write(folder: str, dump: dict[str, Any]) -> None:
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, "dump.json"), "w", encoding="utf-8") as fh:
        json.dump(dump, fh, indent=1)  # allow_nan: bare NaN / Infinity tokens
    for name in ("stack.json", "construct.json"):
        shutil.copy(os.path.join(SRC, name), os.path.join(folder, name))


def main() -> None:
    with open(os.path.join(SRC, "dump.json"), encoding="utf-8") as fh:
        base = json.load(fh)
    # The masked attention scores: softmax's input holds -inf; its output stays finite.
    softmax = base["data"]["Functional.softmax.0.forward"]
    score = slot(softmax, "input_args")[0]
    score["Min"], score["Mean"], score["Norm"] = -INF, -INF, INF
    truediv = base["data"]["Tensor.__truediv__.0.forward"]
    out = slot(truediv, "output")[0]
    out["Min"], out["Mean"], out["Norm"] = -INF, -INF, INF
    for root in ("nonfinite_bench", "nonfinite_cmp"):
        shutil.rmtree(os.path.join(HERE, root), ignore_errors=True)
    write(os.path.join(HERE, "nonfinite_bench", "step0", "proc1"), base)

    cmp = json.loads(json.dumps(base))
    keys = list(cmp["data"])
    start = keys.index("Functional.gelu.0.forward")
    for i, key in enumerate(keys[start:]):
        entry = cmp["data"][key]
        is_forward = key.endswith(".forward")
        names = ["output"] if i == 0 else ["input_args", "input_kwargs", "input", "output"]
        if not is_forward:
            names = ["input", "output"]
        for name in names:
            for t in slot(entry, name):
                if t.get("Max") is None or "float" not in str(t.get("dtype")):
                    continue
                # Half the tensors in msprobe's string spelling, half as bare tokens.
                nan: Any = "nan" if i % 2 else NAN
                t["Max"], t["Min"], t["Mean"], t["Norm"] = nan, nan, nan, nan
    write(os.path.join(HERE, "nonfinite_cmp", "step0", "proc2"), cmp)


if __name__ == "__main__":
    main()
