"""The fused CUDA statistics kernel (capture/fused.py) run by Triton's interpreter on CPU.

Triton executes the same kernels on CPU tensors when ``TRITON_INTERPRET=1``, so the
kernel's arithmetic -- one program, partials and their reduction, the cap on programs,
NaN/Inf, bfloat16/float16 widening, a transposed tensor's memory span -- is checked here
without a GPU, against float64 (``fused_interp_check.py``, in a subprocess: the variable
must be set before Triton is imported and must not reach the other tests of the session).
``test_cuda.py`` runs the compiled kernels on a GPU. Skipped where Triton is not installed,
or is older than 3 (its interpreter did not run CPU tensors).
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

triton = pytest.importorskip("triton")
# Triton 2 (torch 2.1: 2.1.0) has no interpreter for CPU tensors ("Cannot find backend for cpu").
if int(triton.__version__.split(".")[0]) < 3:
    pytest.skip(f"Triton {triton.__version__}: no interpreter for CPU tensors", allow_module_level=True)

HERE = os.path.dirname(os.path.abspath(__file__))


def test_kernel_statistics_match_float64_under_the_interpreter() -> None:
    import probe  # the agent the other tests import: the subprocess imports the same one

    env = dict(os.environ, TRITON_INTERPRET="1")
    env["PYTHONPATH"] = os.pathsep.join(
        [os.path.dirname(os.path.dirname(probe.__file__)), env.get("PYTHONPATH", "")]
    )
    run = subprocess.run(
        [sys.executable, os.path.join(HERE, "fused_interp_check.py")],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-4000:]
    assert "0 errors" in run.stdout and "SKIP" not in run.stdout, run.stdout
