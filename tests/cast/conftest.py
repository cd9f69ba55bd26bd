"""Fixtures of the compile path's tests (test_compile, test_chains, test_partial_calls): a fresh dynamo around each
test that asks for one, and Inductor stood in for by a recorder that runs the graph it is given."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest


class Inductor:
    """Stands in for Inductor's compile_fx: records what it is given and runs that graph as it is."""

    def __init__(self) -> None:
        self.graphs: list[Any] = []
        self.patches: list[dict[str, Any]] = []

    def __call__(self, gm: Any, example_inputs: Any, config_patches: Any = None, **_: Any) -> Any:
        self.graphs.append(gm)
        self.patches.append(dict(config_patches or {}))
        return gm.forward


@pytest.fixture
def fresh_dynamo() -> Iterator[None]:
    import torch

    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


@pytest.fixture
def inductor(monkeypatch: pytest.MonkeyPatch) -> Inductor:
    import torch._inductor.compile_fx as compile_fx

    stand_in = Inductor()
    monkeypatch.setattr(compile_fx, "compile_fx", stand_in)
    return stand_in
