"""A call that also returns what its card does not compute (attention's logsumexp, kept for backward), on a CPU-only
torch: it binds as a chain of one call whose outputs are the card's, so eager never overrides it (an override must
return every result) and the compile pass replaces it where nothing reads the other results, and says why where
something does; export lists its kernel as compile only.

The pass's kernel is the runtime tests' host stand-in (`HostSoftmax`, bfloat16: softmax over the rows of its first
pointer into its second), launched on q and y: where the kernel ran, the result is softmax(q) over the head dim,
where the call ran, attention."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from kernelforge_tui.capture import load_capture  # noqa: E402
from kernelforge_tui.capture.manifest import Variant  # noqa: E402
from kernelforge_tui.capture.run import CaptureRequest, capture_model  # noqa: E402
from kernelforge_tui.cards import load_card  # noqa: E402
from kernelforge_tui.cast.bindings import CallBinding, from_variant  # noqa: E402
from kernelforge_tui.cast.compiled import Backend  # noqa: E402
from kernelforge_tui.cast.manifest import Guard, LaunchArg  # noqa: E402
from kernelforge_tui.cast.runtime import load  # noqa: E402
from tests.cast.conftest import Inductor  # noqa: E402
from tests.cast.test_compile import _ops_in  # noqa: E402
from tests.support.fixtures.cast.cast_support import (  # noqa: E402
    MACHINE,
    HostSoftmax,
    export_seeded,
    softmax_entry,
    write_cast,
)

pytestmark = [pytest.mark.xdist_group(__name__), pytest.mark.usefixtures("fresh_dynamo")]  # module fixture: once
HERE = MACHINE.model_copy(update={"torch_version": str(torch.__version__)})
SHAPE = (2, 3, 16, 64)
ATTENTION = "aten::_scaled_dot_product_flash_attention_for_cpu.default"
MODEL = """
import torch
import torch.nn.functional as F
from torch import nn


class Attends(nn.Module):
    def forward(self, q, k, v):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)


def build(device="cpu"):
    torch.manual_seed(0)
    make = lambda: torch.randn(2, 3, 16, 64, device=device, dtype=torch.bfloat16)
    return Attends().eval(), (make(), make(), make())
"""


@pytest.fixture(scope="module")
def captured(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("partial")
    (root / "attends.py").write_text(MODEL)
    out = root / "attends.capture"
    capture_model(CaptureRequest(root / "attends.py", out, device="cpu", repeats=1, samples=1))
    return out


def _attention(capture: Path) -> tuple[Variant, CallBinding]:
    (variant,) = [v for v in load_capture(capture).variants if v.family == "attention"]
    assert variant.card is not None, variant.reason
    binding = from_variant(variant, load_card(capture / variant.card).spec)
    assert not isinstance(binding, str), binding
    return variant, binding


def test_an_attention_call_binds_as_a_chain_of_one_whose_outputs_are_the_cards(captured: Path) -> None:
    variant, binding = _attention(captured)
    assert len(variant.steps[0].outputs) == 2  # the output and the logsumexp
    assert binding.overload == "kernelforge::scaled_dot_product_flash_attention_for_cpu_0"
    assert binding.chain is not None and binding.chain.kind == "part of one call's results"
    (step,) = binding.chain.steps
    assert (step.overload, step.results, binding.chain.outputs) == (ATTENTION, 2, [(0, 0)])
    assert [a.tensor for a in step.args[:3]] == ["q", "k", "v"]
    assert [a.accepts for a in step.args if a.position == 4] == [[True]]  # is_causal
    assert [(a.name, a.position, a.tensor) for a in binding.args] == [("q", 0, "q"), ("k", 1, "k"), ("v", 2, "v")]
    assert [t.name for t in binding.outputs] == ["y"] and tuple(binding.outputs[0].shape) == SHAPE


def _cast(tmp_path: Path, binding: CallBinding) -> Any:
    """The captured binding's guard and chain on the host stand-in, launched as (q, y, k, v, rows, cols)."""
    rows = SHAPE[0] * SHAPE[1] * SHAPE[2]
    entry, files = softmax_entry("k0-attention", shape=(rows, SHAPE[3]), dtype="bfloat16", alignment=64)
    # the CPU allocator promises 64-byte alignment, not the capture's (which saw 128 or more: a test tensor then
    # falls back now and then)
    inputs = [t.model_copy(update={"alignment": 64}) for t in binding.inputs]
    guard = Guard(
        overload=binding.overload, args=binding.args, inputs=inputs, outputs=binding.outputs, capability=(9, 0)
    )
    tensors = [LaunchArg(kind="tensor", name=name) for name in "qykv"]  # the softmax's x and y, then k and v
    launch = entry.launch.model_copy(update={"args": tensors + entry.launch.args[2:]})
    entry = entry.model_copy(update={"guard": guard, "launch": launch, "chain": binding.chain})
    path = write_cast(tmp_path / "m.cast", [(entry, files)], machine=HERE)
    return load(path, machine=HERE, device_type="cpu", driver=HostSoftmax(dtype="bfloat16"))


class Attends(torch.nn.Module):  # type: ignore[misc]
    def forward(self, q: Any, k: Any, v: Any) -> Any:
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)


class ReadsLogsumexp(torch.nn.Module):  # type: ignore[misc]
    def forward(self, q: Any, k: Any, v: Any) -> Any:
        return torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default(q, k, v, 0.0, True)


def test_the_pass_replaces_the_call_where_only_its_output_is_read(
    captured: Path, tmp_path: Path, inductor: Inductor
) -> None:
    _, binding = _attention(captured)
    cast = _cast(tmp_path, binding)
    assert cast.overrides() == []  # eager would have to return the logsumexp too: no override
    backend = Backend(cast)
    q, k, v = (torch.randn(*SHAPE, dtype=torch.bfloat16) for _ in range(3))
    with torch.no_grad():
        out = torch.compile(Attends(), backend=backend, dynamic=False)(q, k, v)
        out_read, lse = torch.compile(ReadsLogsumexp(), backend=backend, dynamic=False)(q, k, v)
        attention = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
    assert torch.allclose(out.float(), torch.softmax(q.float(), -1), atol=4e-3)  # the kernel (the stand-in) ran
    assert not torch.allclose(out, attention, atol=0.1)
    assert torch.allclose(out_read, attention, atol=2e-2) and lse.shape == SHAPE[:3]
    (taken, refused) = [(d.overload, d.kernel, d.reason) for d in backend.decisions]
    assert taken == (binding.overload, "k0-attention", "")
    assert refused[1] is None and refused[2].endswith(f"(result 1 of {ATTENTION}) is read outside the chain")
    first, second = inductor.graphs
    assert len(_ops_in(first)) == 1 and _ops_in(second) == []
    assert "part of one call's results: compile only" in cast.report()


def test_export_lists_the_kernel_as_compile_only(captured: Path, tmp_path: Path) -> None:
    capture = tmp_path / "attends"
    shutil.copytree(captured, capture)
    variant, _ = _attention(capture)
    assert variant.card is not None
    manifest = export_seeded(capture, capture / variant.card, tmp_path / "model.cast")
    (kernel,) = manifest.kernels
    assert kernel.chain is not None and kernel.serves == ["compile"] and kernel.guard.overload.startswith("kernelforge")
    (audit,) = [a for a in manifest.audit if a.decision == "kernel"]
    assert f"compile only: {ATTENTION.removeprefix('aten::')} also returns results the card does not compute" in (
        audit.reason
    )
