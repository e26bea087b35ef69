"""The op-key builder (python/probe/_op_key.py) against the golden keys that the Rust parser
reads too (testdata/op_keys.json; tests/op_key_golden.rs parses each one).

Why: the key is what two dumps are paired by. The agent and ``probe compare`` must agree on
its grammar; this file and the Rust test hold both to the same examples."""

from __future__ import annotations

import json
import os
from typing import Any, Callable

import pytest

from conftest import REPO
from probe import _op_key as k

GOLDEN = os.path.join(REPO, "testdata", "op_keys.json")

BUILDERS: dict[str, Callable[..., str]] = {
    # What the agent builds at each kind of record (api.py, modules.py, backward.py, ddp.py).
    "api": lambda api_type, name, call: k.api_key(k.api_name(api_type, name), call),
    "api_backward": lambda forward_key: k.api_backward(forward_key),
    "module": lambda path, cls, direction, call: k.module_key(
        k.module_base(path, cls), direction, call
    ),
    "parameters_grad": lambda path, cls: k.parameters_grad_key(k.module_base(path, cls)),
}


def _cases() -> list[dict[str, Any]]:
    with open(GOLDEN, encoding="utf-8") as fh:
        cases: list[dict[str, Any]] = json.load(fh)["cases"]
    return cases


@pytest.mark.parametrize("case", _cases(), ids=lambda c: c["key"])
def test_the_builder_makes_each_golden_key(case: dict[str, Any]) -> None:
    assert BUILDERS[case["build"]](**case["args"]) == case["key"]
    for slot, name in case["tensors"].items():
        assert name == f"{case['key']}.{slot}"  # how every hook names a tensor


def test_the_golden_file_covers_every_builder_and_kind() -> None:
    cases = _cases()
    assert {c["build"] for c in cases} == set(BUILDERS)
    assert {c["parsed"]["kind"] for c in cases} == {"api", "module", "parameters_grad"}
    assert {c["parsed"]["direction"] for c in cases} == {"forward", "backward"}
    assert len({c["key"] for c in cases}) == len(cases)


def test_an_api_backward_key_pairs_with_its_forward_key() -> None:
    fwd = k.api_key("Torch.linalg.vector_norm", 4)
    assert k.api_backward(fwd) == "Torch.linalg.vector_norm.4.backward"
    assert k.api_key("Torch.linalg.vector_norm", 4, k.BACKWARD) == k.api_backward(fwd)


def test_pattern_candidates_are_built_from_the_same_keys() -> None:
    """include/exclude patterns match the keys the records get (config.py)."""
    from probe.config import module_candidates, op_candidates

    assert k.api_key("Functional.gelu", 2) in op_candidates("Functional.gelu", 2)
    base = k.module_base("layers.0", "Linear")
    assert k.module_key(base, k.FORWARD, 1) in module_candidates("layers.0", "Linear", 1)
