"""Writes the small .pt / .npy files under testdata/msprobe/pt/ that tests/msprobe.rs reads.

Run from the repository root: python3 testdata/msprobe/make_pt.py (needs torch and numpy).
expected.json lists, per file, what the reader must find: dtype, shape and the values
(as float64), or "error" for files it must refuse with a clear message.
"""
import json
import os

import numpy as np
import torch

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "pt")
os.makedirs(OUT, exist_ok=True)
torch.manual_seed(0)
expected = {}


def save(name, t, error=None):
    path = os.path.join(OUT, name + ".pt")
    torch.save(t, path)
    if error:
        expected[name + ".pt"] = {"error": error}
        return
    flat = t.detach().reshape(-1).to(torch.float64).tolist()
    expected[name + ".pt"] = {
        "dtype": str(t.dtype).replace("torch.", ""),
        "shape": list(t.shape),
        "values": flat,
    }


base = torch.randn(3, 5)
for dt in [torch.float32, torch.float64, torch.float16, torch.bfloat16]:
    save("rand_" + str(dt).replace("torch.", ""), base.to(dt))
for dt in [torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8]:
    save("int_" + str(dt).replace("torch.", ""), torch.arange(-6, 6).clamp(min=0 if dt == torch.uint8 else -6).to(dt).reshape(3, 4))
save("bool", torch.tensor([True, False, True, True]))
save("scalar", torch.tensor(2.5))
save("empty", torch.zeros(0, 4))
# A contiguous view into a bigger storage: torch.save keeps the whole storage and an offset.
big = torch.arange(20, dtype=torch.float32).reshape(4, 5)
save("offset_view", big[1:3])
save("parameter", torch.nn.Parameter(torch.ones(2, 2)))
save("transposed", base.t(), error="non-contiguous")
# An object that is not a tensor.
torch.save({"a": torch.ones(2)}, os.path.join(OUT, "dict.pt"))
expected["dict.pt"] = {"error": "not a single tensor"}

for name, arr in [
    ("npy_f32", np.arange(6, dtype=np.float32).reshape(2, 3) / 7),
    ("npy_f16", (np.arange(4, dtype=np.float16) - 1.5)),
    ("npy_i64", np.array([[1, -2], [3, 4]], dtype=np.int64)),
    ("npy_bool", np.array([True, False])),
]:
    np.save(os.path.join(OUT, name + ".npy"), arr)
    expected[name + ".npy"] = {
        "dtype": {"float32": "float32", "float16": "float16", "int64": "int64", "bool": "bool"}[str(arr.dtype)],
        "shape": list(arr.shape),
        "values": arr.reshape(-1).astype(np.float64).tolist(),
    }

with open(os.path.join(OUT, "expected.json"), "w") as f:
    json.dump(expected, f, indent=1, sort_keys=True)
print("wrote", len(expected), "files to", OUT)
