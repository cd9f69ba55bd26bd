"""Fused chains in packages, on a CPU-only torch: a captured chain binds as a chain guard (its calls' wiring from the
card's [chain]); the compile pass replaces a chain where it wires as recorded and the guard proves its inputs, and
says why it leaves one whose intermediate the graph reads elsewhere or whose shape the kernel was not proven for;
the eager path never overrides a chain, and the chain's op falls back to replaying the chain's calls; export lists
a chain's kernel as compile only.

The pass's kernel is the runtime tests' host stand-in (`HostSoftmax`: softmax of its first tensor), packaged as the
chain softmax(x * 2): where the kernel ran, the result is softmax(x), where the calls ran, softmax(2 x)."""

from __future__ import annotations

import ctypes
import shutil
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from kernelforge_tui.capture import load_capture  # noqa: E402
from kernelforge_tui.capture.run import CaptureRequest, capture_model  # noqa: E402
from kernelforge_tui.cards import load_card  # noqa: E402
from kernelforge_tui.cast.bindings import from_variant  # noqa: E402
from kernelforge_tui.cast.compiled import Backend  # noqa: E402
from kernelforge_tui.cast.manifest import AtenArg, Chain, ChainStep, KernelEntry, LaunchArg  # noqa: E402
from kernelforge_tui.cast.ops import NAMESPACE, kernel_op  # noqa: E402
from kernelforge_tui.cast.runtime import Cast, ChainReplay, aten_call, load  # noqa: E402
from tests.cast.conftest import Inductor  # noqa: E402
from tests.cast.test_compile import _ops_in  # noqa: E402
from tests.support.fixtures.cast.cast_support import (  # noqa: E402
    MACHINE,
    HostSoftmax,
    export_seeded,
    scale_softmax_chain,
    softmax_entry,
    write_cast,
)
from tests.support.nvcc_marks import needs_nvcc  # noqa: E402

pytestmark = [pytest.mark.xdist_group(__name__), pytest.mark.usefixtures("fresh_dynamo")]  # module fixture: once
HERE = MACHINE.model_copy(update={"torch_version": str(torch.__version__)})
MODEL = Path(__file__).parents[1] / "support" / "fixtures" / "chains_model.py"


def _chain_entry() -> tuple[KernelEntry, dict[str, bytes]]:
    """softmax(x * 2.0) over [4, 8] float32 as a chain kernel: aten::mul.Tensor(x, 2.0), then aten::_softmax of it."""
    entry, files = softmax_entry("k0-chain", alignment=64)
    chain = scale_softmax_chain()
    guard = entry.guard.model_copy(
        update={"overload": "kernelforge::scale_softmax", "args": [AtenArg(name="x", position=0, tensor="x")]}
    )
    return entry.model_copy(update={"guard": guard, "chain": chain, "variant": "scale_softmax"}), files


def _cast(tmp_path: Path, driver: Any) -> Cast:
    """The chain kernel and a single softmax kernel of the same shape, on runners that take CPU tensors."""
    entries = [_chain_entry(), softmax_entry("k1-softmax", alignment=64)]
    return load(write_cast(tmp_path / "m.cast", entries, machine=HERE), machine=HERE, device_type="cpu", driver=driver)


class Chained(torch.nn.Module):  # type: ignore[misc]
    def forward(self, x: Any, other: Any) -> Any:
        scaled = other * 2.0
        return (
            torch.softmax(x * 2.0, -1),  # the chain: its kernel
            torch.softmax(scaled, -1),  # the scaled logits escape: the single softmax kernel takes the softmax
            scaled,
            torch.softmax(x[:3] * 2.0, -1),  # the chain at another shape: the guard refuses it
            torch.softmax(x * 3.0, -1),  # another scale: no chain at all (the single kernel's softmax)
        )


def test_the_pass_replaces_a_proven_chain_and_says_why_it_leaves_the_others(tmp_path: Path, inductor: Inductor) -> None:
    driver = HostSoftmax()
    cast = _cast(tmp_path, driver)
    backend = Backend(cast)
    x, other = torch.randn(4, 8), torch.randn(4, 8)
    with torch.no_grad():
        chained, escaped, scaled, short, tripled = torch.compile(Chained(), backend=backend, dynamic=False)(x, other)
    assert torch.allclose(chained, torch.softmax(x, -1))  # the kernel ran: the stand-in does not scale
    assert not torch.allclose(chained, torch.softmax(x * 2, -1))
    assert torch.allclose(escaped, torch.softmax(other * 2, -1)) and torch.equal(scaled, other * 2)
    assert torch.allclose(short, torch.softmax(x[:3] * 2, -1)) and torch.allclose(tripled, torch.softmax(x * 3, -1))
    decided = [(d.overload, d.kernel, d.reason) for d in backend.decisions]
    assert decided[:3] == [
        ("kernelforge::scale_softmax", "k0-chain", ""),
        ("kernelforge::scale_softmax", None, decided[1][2]),
        ("kernelforge::scale_softmax", None, "shape x[3, 8] (kernel: [4, 8])"),
    ]
    assert decided[1][2].endswith("(aten::mul.Tensor) is read outside the chain")
    assert [(k, r) for o, k, r in decided[3:] if k] == [("k1-softmax", ""), ("k1-softmax", "")]
    (graph,) = inductor.graphs
    ops = _ops_in(graph)
    assert len(ops) == 3 and sum("scale_softmax" in op for op in ops) == 1
    doubled = [n for n in graph.graph.nodes if n.target is torch.ops.aten.mul.Tensor and n.args[1] == 2.0]
    assert len(doubled) == 2  # the escaping one and the refused one: the chain's own went with it
    chain, single = cast.stats().kernels
    assert (chain.graph_nodes, chain.compiled_calls, chain.used_in, chain.serves) == (1, 1, "compile", ["compile"])
    assert single.graph_nodes == 2 and "a fused chain: compile only" in cast.report()
    # the chains it matched and left, counted with their reasons for the report (not only the backend's decisions)
    assert chain.graph_refused == {decided[1][2]: 1, "shape x[3, 8] (kernel: [4, 8])": 1}
    assert "      1 x left to Inductor: shape x[3, 8] (kernel: [4, 8])" in cast.report().splitlines()


class HostKept(HostSoftmax):
    """The stand-in for a chain kernel that writes an earlier call's result too: softmax(x) into y (pointer 1), as
    HostSoftmax, and x itself into s (pointer 2), both without the chain's scale (what the calls give is 2 x)."""

    def launch(self, function: Any, grid: Any, block: Any, shared_bytes: int, stream: int, pointers: Any) -> None:
        super().launch(function, grid, block, shared_bytes, stream, pointers)
        count = int(function["rows"]) * int(function["cols"])
        ctypes.memmove(pointers[2], pointers[0], 4 * count)


def _kept_entry() -> tuple[KernelEntry, dict[str, bytes]]:
    """The chain softmax(x * 2.0) that also writes s = x * 2.0 (its first call's result), as a residual norm that
    writes its sum: outputs y, then s."""
    entry, files = _chain_entry()
    assert entry.chain is not None
    s = entry.guard.outputs[0].model_copy(update={"name": "s"})
    guard = entry.guard.model_copy(
        update={"overload": "kernelforge::scale_softmax_kept", "outputs": [*entry.guard.outputs, s]}
    )
    rows, cols = entry.launch.args[2:]
    launch = entry.launch.model_copy(
        update={"args": [*entry.launch.args[:2], LaunchArg(kind="tensor", name="s"), rows, cols]}
    )
    chain = entry.chain.model_copy(update={"pattern": "scale_softmax_kept", "outputs": [(1, 0), (0, 0)]})
    update = {
        "id": "k2-kept",
        "guard": guard,
        "launch": launch,
        "chain": chain,
        "tolerances": {**entry.tolerances, "s": entry.tolerances["y"]},
    }
    return entry.model_copy(update=update), files


class Kept(torch.nn.Module):  # type: ignore[misc]
    def forward(self, x: Any, other: Any) -> Any:
        scaled = x * 2.0
        probabilities = torch.softmax(scaled, -1)
        read_late = scaled + 1.0  # after the chain's last call: the kernel's s
        early = other * 2.0
        read_early = early + 1.0  # before the softmax: where the kernel would run, s is not made yet
        return probabilities, read_late, torch.softmax(early, -1), read_early


def test_a_chain_that_writes_an_earlier_result_gives_it_to_the_readers_after_it(
    tmp_path: Path, inductor: Inductor
) -> None:
    """A residual sum the model reads again is an output of its chain: the kernel's s takes the sum's later readers;
    a reader before the chain's last call (where the op goes) leaves the chain to its calls."""
    cast = load(
        write_cast(tmp_path / "m.cast", [_kept_entry()], machine=HERE),
        machine=HERE,
        device_type="cpu",
        driver=HostKept(),
    )
    backend = Backend(cast)
    x, other = torch.randn(4, 8), torch.randn(4, 8)
    with torch.no_grad():
        probabilities, read_late, other_probabilities, read_early = torch.compile(
            Kept(), backend=backend, dynamic=False
        )(x, other)
    assert torch.allclose(probabilities, torch.softmax(x, -1)) and torch.equal(read_late, x + 1.0)  # the kernel's
    assert torch.allclose(other_probabilities, torch.softmax(other * 2, -1)) and torch.equal(read_early, other * 2 + 1)
    decided = [(d.kernel, d.reason) for d in backend.decisions]
    assert decided[0] == ("k2-kept", "") and decided[1][0] is None
    assert decided[1][1].endswith("reads a result of the chain before its last call, where the kernel would run")
    (graph,) = inductor.graphs
    graph.graph.lint()
    assert sum("scale_softmax_kept" in op for op in _ops_in(graph)) == 1


def test_eager_keeps_single_calls_and_the_chain_op_falls_back_to_its_calls(tmp_path: Path) -> None:
    cast = _cast(tmp_path, HostSoftmax())
    assert [o.overload for o in cast.overrides()] == ["aten::_softmax.default"]  # no override for the chain
    runner = cast.runners[0]
    op, args, kwargs = aten_call(runner.entry, {"x": torch.ones(4, 8)})
    x = torch.randn(4, 8)
    assert torch.allclose(op(x), torch.softmax(x * 2, -1)) and kwargs == {} and len(args) == 1
    misaligned = torch.randn(4 * 8 + 1)[1:].view(4, 8)
    assert torch.allclose(kernel_op(runner).overload(misaligned), torch.softmax(misaligned * 2, -1))
    assert kernel_op(runner).name.startswith("scale_softmax_") and NAMESPACE == "kernelforge"
    assert runner.fallbacks == {"x not 64-byte aligned (a view that starts mid-buffer)": 1}


def test_a_chains_replay_hands_torch_a_recorded_dtype_as_a_dtype() -> None:
    """A chain records a dtype by its name (`_to_copy(x, dtype=float32)`: the casts of a decomposed rms_norm on CUDA);
    its replay, the fallback and the checks' reference, must pass torch.float32, though the schema's JIT type for a
    ScalarType is int."""
    chain = Chain(
        pattern="cast_softmax",
        steps=[
            ChainStep(
                overload="aten::_to_copy.default",
                args=[
                    AtenArg(name="self", position=0, tensor="x"),
                    AtenArg(name="dtype", position=None, accepts=["float32"]),
                ],
            ),
            ChainStep(
                overload="aten::_softmax.default",
                args=[
                    AtenArg(name="self", position=0, link=(0, 0)),
                    AtenArg(name="dim", position=1, accepts=[-1]),
                    AtenArg(name="half_to_float", position=2, accepts=[False]),
                ],
            ),
        ],
        outputs=[(1, 0)],
    )
    x = torch.randn(4, 8, dtype=torch.bfloat16)
    y = ChainReplay(chain, ["x"])(x)
    assert y.dtype == torch.float32 and torch.allclose(y, torch.softmax(x.float(), -1))


@pytest.fixture(scope="module")
def captured(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("chains") / "chains.capture"
    capture_model(CaptureRequest(MODEL, out, device="cpu", repeats=1, samples=1))
    return out


def test_a_captured_chain_binds_as_a_chain_guard(captured: Path) -> None:
    variants = {v.op: v for v in load_capture(captured).variants if v.kind == "pattern"}
    variant = variants["residual_layer_norm"]
    assert variant.card is not None
    binding = from_variant(variant, load_card(captured / variant.card).spec)
    assert not isinstance(binding, str), binding
    assert binding.overload == "kernelforge::residual_layer_norm" and binding.chain is not None
    assert [(a.name, a.position, a.tensor) for a in binding.args] == [
        ("x", 0, "x"),
        ("r", 1, "r"),
        ("w", 2, "w"),
        ("b", 3, "b"),
    ]
    assert [(t.name, t.shape, t.card_shape) for t in binding.inputs[:2]] == [
        ("x", (2, 8, 32), (16, 32)),
        ("r", (2, 8, 32), (16, 32)),
    ]
    add, norm = binding.chain.steps
    assert add.overload == "aten::add.Tensor" and [a.tensor for a in add.args] == ["x", "r"]
    assert (norm.results, norm.args[0].link, norm.args[1].accepts, norm.args[4].accepts) == (3, (0, 0), [[32]], [1e-5])
    assert binding.chain.outputs == [(1, 0)] and "native_layer_norm" in binding.call


FIXTURES = Path(__file__).parents[1] / "support" / "fixtures"


@pytest.mark.parametrize(
    ("model", "kwargs"),
    [
        ("stream_model.py", {"dtype": "bfloat16"}),
        ("bottleneck_model.py", {}),
        ("bottleneck_model.py", {"channels_last": True}),
    ],
)
def test_the_real_models_chains_match_the_graph_the_compile_pass_traces(
    tmp_path: Path, model: str, kwargs: dict[str, Any]
) -> None:
    """Llama's and ViT's residual streams (the sums the next add reads again among them) and ResNet's batch norms
    with their in-place add and ReLU, captured, bound as chain guards and matched on the aten graph `rewrite` traces
    (make_fx on FakeTensors, no decompositions): every captured instance is found, wired as recorded, with nothing
    outside reading an intermediate and every reader of a kept sum after the chain (a plain residual chain also wires
    where a kept sum's does, and is refused there: the sum is read outside it). Channels-last tensors bind with
    their own strides, which the kernel reads as the card's [n, hw, c]."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.proxy_tensor import make_fx

    from kernelforge_tui.capture.loader import Entry, build
    from kernelforge_tui.cast.fused import _Matcher, overload_of
    from kernelforge_tui.cast.runtime import view_problem

    out = tmp_path / "model.capture"
    capture_model(CaptureRequest(FIXTURES / model, out, device="cpu", repeats=1, samples=1, kwargs=kwargs))
    chains = [v for v in load_capture(out).variants if v.kind == "pattern" and v.card is not None]
    built = build(FIXTURES / model, Entry.parse("build"), {"device": "cpu", **kwargs})
    with torch.no_grad(), FakeTensorMode(allow_non_fake_inputs=True) as fake:
        graph = make_fx(lambda *x: built.model(*x))(*[fake.from_tensor(x) for x in built.args]).graph
    taken: set[Any] = set()  # the nodes an earlier chain took, in the pass's order (`replace_chains`)
    for variant in sorted(chains, key=lambda v: (-len(v.steps), len([b for b in v.bindings if b.role == "output"]))):
        binding = from_variant(variant, load_card(out / str(variant.card)).spec)
        assert not isinstance(binding, str) and binding.chain is not None, binding
        if kwargs.get("channels_last"):  # the guards hold the call's channels-last strides, read as the card's memory
            x, y = binding.inputs[0], binding.outputs[0]
            assert (
                x.strides == y.strides == (x.shape[1] * x.shape[2] * x.shape[3], 1, x.shape[1] * x.shape[3], x.shape[1])
            )
            assert (view_problem(x), view_problem(y)) == ("", "")
        found = 0
        for node in graph.nodes:
            matcher = _Matcher(binding.chain)
            if overload_of(node.target) != binding.chain.steps[-1].overload or not matcher.call(
                len(variant.steps) - 1, node
            ):
                continue
            if (matcher.escape(), matcher.read_early()) == ("", "") and not taken & set(matcher.calls.values()):
                taken |= set(matcher.calls.values())
                found += 1
        assert found == variant.calls, (variant.op, found, variant.calls)


def test_a_channels_last_guard_is_read_as_its_memory_and_nothing_else() -> None:
    """A channels-last [n, c, h, w] lies in memory as [n, h, w, c]: the card's [n, h * w, c] reads it in place, its
    [n, c, h * w] would read it wrongly and is refused."""
    from kernelforge_tui.cast.manifest import TensorGuard
    from kernelforge_tui.cast.runtime import view_problem

    x = TensorGuard(name="x", shape=(2, 8, 4, 4), dtype="bfloat16", strides=(128, 1, 32, 8), card_shape=(2, 16, 8))
    assert view_problem(x) == ""
    nchw = view_problem(x.model_copy(update={"card_shape": (2, 8, 16)}))
    assert nchw == "x has strides [128, 1, 32, 8] for shape [2, 8, 4, 4], not row-major"


def test_a_refused_call_returns_its_outputs_as_the_fake_lays_them_out() -> None:
    """The op's fake gives the guard's strides for its proven signature: a call it refuses there (a misaligned
    view) must return the original's outputs in those strides too, channels-last ones included."""
    from kernelforge_tui.cast.ops import KernelOp

    x = torch.randn(2, 8, 4, 4)
    channels_last = ((2, 8, 4, 4), (128, 1, 32, 8), torch.float32)
    kept = KernelOp._laid_out(x.contiguous(memory_format=torch.channels_last), channels_last)
    made = KernelOp._laid_out(x, channels_last)
    assert kept.stride() == made.stride() == (128, 1, 32, 8) and torch.equal(made, x)
    assert KernelOp._laid_out(x[:1], channels_last).is_contiguous()  # another signature: as before, contiguous


@needs_nvcc
def test_export_lists_a_chains_kernel_as_compile_only(captured: Path, tmp_path: Path) -> None:
    capture = tmp_path / "chains"
    shutil.copytree(captured, capture)
    variant = next(v for v in load_capture(capture).variants if v.op == "bias_gelu")
    assert variant.card is not None
    manifest = export_seeded(capture, capture / variant.card, tmp_path / "model.cast")
    (kernel,) = manifest.kernels
    assert kernel.chain is not None and kernel.serves == ["compile"]
    assert kernel.guard.overload == "kernelforge::bias_gelu" and [s.overload for s in kernel.chain.steps] == [
        "aten::add.Tensor",
        "aten::gelu.default",
    ]
    (audit,) = [a for a in manifest.audit if a.decision == "kernel"]
    assert "compile only: a fused chain of 2 calls (add.Tensor -> gelu.default)" in audit.reason
