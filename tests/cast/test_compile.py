"""The kernelforge ops and the compile path on a CPU-only torch: the ops' fake implementations under FakeTensorMode,
their guarded launch and fallback, the pass's decisions on graphs dynamo traces from small models (which nodes a
kernel proves from their FakeTensors, which it leaves to Inductor and why), recompilation on a new shape, the mode's
options reaching Inductor, registration as `backend="kernelforge"`, and one real Inductor compilation.

The kernels are the host stand-in of the runtime tests (`HostSoftmax`: it reads the pointers a CUDA kernel would get
and writes softmax, or zeros with `wrong`), on a runner that takes CPU tensors (`device_type="cpu"`): so a compiled
graph really runs the op, and the op really launches. Most tests stand Inductor's `compile_fx` in with one that runs
the graph it is handed as it is (`inductor`): the pass, dynamo and torch.compile's mode handling are real, the
C++ build of a CPU graph (about 12-60 s here) is not; `test_inductor_compiles_the_rewritten_graph` builds one."""

from __future__ import annotations

import tomllib
import warnings
from importlib.metadata import EntryPoint
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from kernelforge_tui.cast import compiled  # noqa: E402
from kernelforge_tui.cast.bindings import contiguous_strides  # noqa: E402
from kernelforge_tui.cast.compiled import NEEDS_GRAD, SYMBOLIC, Backend, rewrite  # noqa: E402
from kernelforge_tui.cast.manifest import AtenArg, CastError, TensorGuard  # noqa: E402
from kernelforge_tui.cast.ops import NAMESPACE, kernel_op  # noqa: E402
from kernelforge_tui.cast.runtime import Cast, load  # noqa: E402
from tests.cast.conftest import Inductor  # noqa: E402
from tests.support.fixtures.cast.cast_support import MACHINE, HostSoftmax, softmax_entry, write_cast  # noqa: E402

pytestmark = pytest.mark.usefixtures("fresh_dynamo")

HERE = MACHINE.model_copy(update={"torch_version": str(torch.__version__)})
ROOT = Path(__file__).resolve().parents[2]


def _cast(tmp_path: Path, entries: list[Any] | None = None, driver: Any = None) -> Cast:
    """A package of softmax kernels over [4, 8] float32 (64-byte alignment: the CPU allocator's), its runners taking
    CPU tensors; the eager override stays on the CUDA key (never reached here)."""
    path = write_cast(tmp_path / "m.cast", entries or [softmax_entry(alignment=64)], machine=HERE)
    return load(path, machine=HERE, device_type="cpu", driver=driver or HostSoftmax())


def _group_norm_entry() -> Any:
    """aten::native_group_norm.default over [2, 4, 3, 3] float32, 2 groups: three outputs (y, mean, rstd)."""
    entry, files = softmax_entry(alignment=64)
    shape, stats = (2, 4, 3, 3), (2, 2)

    def tensor(name: str, dims: tuple[int, ...]) -> TensorGuard:
        return TensorGuard(name=name, shape=dims, dtype="float32", strides=contiguous_strides(dims), alignment=64)

    scalars = [("N", 3, 2), ("C", 4, 4), ("HxW", 5, 9), ("group", 6, 2), ("eps", 7, 1e-5)]
    guard = entry.guard.model_copy(
        update={
            "overload": "aten::native_group_norm.default",
            "args": [
                AtenArg(name="input", position=0, tensor="x"),
                AtenArg(name="weight", position=1, tensor="gamma"),
                AtenArg(name="bias", position=2, tensor="beta"),
                *(AtenArg(name=n, position=p, accepts=[v]) for n, p, v in scalars),
            ],
            "inputs": [tensor("x", shape), tensor("gamma", (4,)), tensor("beta", (4,))],
            "outputs": [tensor("y", shape), tensor("mean", stats), tensor("rstd", stats)],
        }
    )
    return entry.model_copy(update={"id": "k0-group-norm", "guard": guard}), files


def _ops_in(gm: Any) -> list[str]:
    return [str(n.target) for n in gm.graph.nodes if n.op == "call_function" and NAMESPACE in str(n.target)]


# -- the ops -----------------------------------------------------------------------------------------------------


def test_the_fake_implementation_gives_the_guards_outputs_and_the_originals_for_other_calls(tmp_path: Path) -> None:
    from torch._subclasses.fake_tensor import FakeTensorMode

    driver = HostSoftmax()
    cast = _cast(tmp_path, [softmax_entry(alignment=64), _group_norm_entry()], driver)
    softmax, group_norm = (kernel_op(r).overload for r in cast.runners)
    with FakeTensorMode() as mode:
        y = softmax(mode.from_tensor(torch.randn(4, 8)))
        other = softmax(torch.empty(3, 5, dtype=torch.float64))  # not proven: the original's meta
        outs = group_norm(torch.empty(2, 4, 3, 3), torch.empty(4), torch.empty(4))
    assert (tuple(y.shape), y.stride(), y.dtype) == ((4, 8), (8, 1), torch.float32)
    assert (tuple(other.shape), other.dtype) == ((3, 5), torch.float64)
    assert [tuple(t.shape) for t in outs] == [(2, 4, 3, 3), (2, 2), (2, 2)]
    assert driver.launches == []  # a fake runs nothing


def test_the_op_launches_what_its_guard_proves_and_falls_back_on_the_rest(tmp_path: Path) -> None:
    driver = HostSoftmax(wrong=True)  # zeros: which calls ran the kernel shows in the results
    cast = _cast(tmp_path, driver=driver)
    op = kernel_op(cast.runners[0])
    x = torch.randn(4, 8)
    misaligned = torch.randn(4 * 8 + 1)[1:].view(4, 8)
    assert torch.equal(op.overload(x), torch.zeros(4, 8)) and torch.equal(op.overload(x), torch.zeros(4, 8))
    assert torch.allclose(op.overload(misaligned), torch.softmax(misaligned, -1))
    assert torch.allclose(op.overload(x.double()), torch.softmax(x.double(), -1))
    transposed = torch.randn(8, 4).t()
    assert torch.allclose(op.overload(transposed), torch.softmax(transposed, -1))
    (kernel,) = cast.stats().kernels
    assert kernel.compiled_calls == 2 and kernel.hits == 0 and len(driver.launches) == 2
    assert kernel.fallbacks == {
        "self not 64-byte aligned (a view that starts mid-buffer)": 1,
        "dtype self float64 (kernel: float32)": 1,
        "strides self[1, 4] (kernel: contiguous [8, 1])": 1,
    }
    assert kernel.used_in == "compile"
    # The same kernel in a package opened again: the same operator, now launching for the new package.
    again = _cast(tmp_path / "again", driver=HostSoftmax())
    assert kernel_op(again.runners[0]).name == op.name and op.runner is again.runners[0]
    assert torch.allclose(op.overload(x), torch.softmax(x, -1))


# -- the pass ----------------------------------------------------------------------------------------------------


class Calls(torch.nn.Module):  # type: ignore[misc]
    """Softmaxes the [4, 8] float32 kernel proves (x, and x's rows as dim 1) and ones it does not."""

    def forward(self, x: Any, view: Any, wide: Any) -> Any:
        return (
            torch.softmax(x * 2, -1),  # proven
            torch.softmax(x, 1),  # proven: the last axis named as 1
            torch.softmax(x[:3], -1),  # another shape
            torch.softmax(x, 0),  # another axis
            torch.softmax(wide.t(), -1),  # transposed: strides [1, 4]
            torch.softmax(x.double(), -1),  # another dtype
            torch.softmax(view, -1),  # a view 4 bytes into its storage
        )


def test_the_pass_replaces_the_nodes_the_guard_proves_and_says_why_it_leaves_the_others(
    tmp_path: Path, inductor: Inductor
) -> None:
    driver = HostSoftmax()
    cast = _cast(tmp_path, driver=driver)
    backend = Backend(cast)
    x, wide = torch.randn(4, 8), torch.randn(8, 4)
    view = torch.randn(33)[1:].view(4, 8)
    with torch.no_grad():
        outs = torch.compile(Calls(), backend=backend, dynamic=False)(x, view, wide)
    eager = Calls()(x, view, wide)
    assert all(torch.allclose(o, e) for o, e in zip(outs, eager, strict=True))
    (graph,) = inductor.graphs
    assert len(_ops_in(graph)) == 2 and len(driver.launches) == 2
    decided = [(d.kernel, d.reason) for d in backend.decisions]
    assert decided == [
        ("k0-softmax", ""),
        ("k0-softmax", ""),
        (None, "shape [3, 8] float32"),
        (None, "dim=0 (kernel: -1 or 1)"),
        (None, "strides self[1, 4] (kernel: contiguous [8, 1])"),
        (None, "dtype self float64 (kernel: float32)"),
        (None, "self not 64-byte aligned (a view that starts mid-buffer)"),
    ]
    stats = cast.stats()
    (kernel,) = stats.kernels
    assert kernel.graph_nodes == 2 and kernel.compiled_calls == 2 and kernel.used_in == "compile"
    assert sum(stats.overloads[0].graph_refused.values()) == 5
    assert "2 graph nodes" in cast.report() and "compile" in cast.report()


def test_a_node_with_several_outputs_hands_each_of_them_on(tmp_path: Path) -> None:
    # native_group_norm returns (y, mean, rstd): the op returns the same three, and each getitem reads the op's.
    cast = _cast(tmp_path, [_group_norm_entry()])

    def norm(x: Any, gamma: Any, beta: Any) -> Any:
        y, mean, rstd = torch.ops.aten.native_group_norm.default(x, gamma, beta, 2, 4, 9, 2, 1e-5)
        return y + 1, mean * rstd

    gm = torch.fx.symbolic_trace(norm)
    graph, decisions = rewrite(gm, [torch.randn(2, 4, 3, 3), torch.randn(4), torch.randn(4)], cast)
    assert [d.kernel for d in decisions] == ["k0-group-norm"]
    (op,) = [n for n in graph.graph.nodes if NAMESPACE in str(n.target)]
    assert sorted(u.args[1] for u in op.users) == [0, 1, 2]
    assert not any(n.target is torch.ops.aten.native_group_norm.default for n in graph.graph.nodes)


def test_a_graph_that_needs_gradients_stays_inductors(tmp_path: Path, inductor: Inductor) -> None:
    cast = _cast(tmp_path)
    backend = Backend(cast)
    x = torch.randn(4, 8, requires_grad=True)
    with pytest.warns(RuntimeWarning, match="Inductor compiles it alone"):
        y = torch.compile(lambda t: torch.softmax(t, -1), backend=backend)(x)
    y.sum().backward()
    assert x.grad is not None and [d.reason for d in backend.decisions] == [NEEDS_GRAD]
    assert _ops_in(inductor.graphs[0]) == []


def test_symbolic_shapes_stay_inductors(tmp_path: Path, inductor: Inductor) -> None:
    cast = _cast(tmp_path)
    backend = Backend(cast)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.compile(lambda t: torch.softmax(t, -1), backend=backend, dynamic=True)(torch.randn(4, 8))
    assert [d.reason for d in backend.decisions] == [SYMBOLIC] and _ops_in(inductor.graphs[0]) == []


def test_a_recompilation_on_a_new_shape_asks_the_guard_again(tmp_path: Path, inductor: Inductor) -> None:
    cast = _cast(tmp_path, [softmax_entry(alignment=64), softmax_entry("k1-softmax", shape=(3, 8), alignment=64)])
    backend = Backend(cast)
    model = torch.compile(lambda t: torch.softmax(t * 2, -1), backend=backend, dynamic=False)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the third shape: "no kernel proves a node of this graph"
        for rows in (4, 3, 5, 4):
            x = torch.randn(rows, 8)
            assert torch.allclose(model(x), torch.softmax(x * 2, -1))
    assert len(inductor.graphs) == 3  # the fourth call found the first graph
    assert [(d.kernel, d.reason) for d in backend.decisions] == [
        ("k0-softmax", ""),
        ("k1-softmax", ""),
        (None, "shape [5, 8] float32"),
    ]
    assert [k.compiled_calls for k in cast.stats().kernels] == [2, 1]


@pytest.mark.parametrize(
    ("mode", "expected"),
    [
        (None, {}),
        ("reduce-overhead", {"triton.cudagraphs": True}),
        ("max-autotune", {"max_autotune": True, "triton.cudagraphs": True}),
    ],
)
def test_the_mode_reaches_inductor_as_torch_compile_applies_it(
    tmp_path: Path, inductor: Inductor, mode: str | None, expected: dict[str, Any]
) -> None:
    cast = _cast(tmp_path)
    with torch.no_grad():
        model = compiled.compile(lambda t: torch.softmax(t, -1), cast, mode=mode)
        model(torch.randn(4, 8))
    (patches,) = inductor.patches
    assert {k: patches[k] for k in expected} == expected
    assert ("triton.cudagraphs" in patches) is bool(expected) and _ops_in(inductor.graphs[0])


def test_backend_kernelforge_is_registered_and_takes_the_package_in_force(tmp_path: Path, inductor: Inductor) -> None:
    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["entry-points"]
    value = declared["torch_dynamo_backends"][compiled.NAME]
    assert EntryPoint(compiled.NAME, value, "torch_dynamo_backends").load() is compiled.kernelforge_backend
    compiled.register()
    compiled.register()  # once is enough, twice is harmless
    from torch._dynamo.backends.registry import lookup_backend

    assert lookup_backend(compiled.NAME) is compiled.kernelforge_backend
    cast = _cast(tmp_path)
    with cast, torch.no_grad():
        torch.compile(lambda t: torch.softmax(t, -1), backend="kernelforge", mode="reduce-overhead")(torch.randn(4, 8))
    assert _ops_in(inductor.graphs[-1]) and inductor.patches[-1]["triton.cudagraphs"] is True


def test_a_package_this_machine_refuses_compiles_with_inductor_alone_said_once(
    tmp_path: Path, inductor: Inductor
) -> None:
    unverified = write_cast(tmp_path / "unverified.cast", [softmax_entry(alignment=64)], machine=None)
    backend = Backend()
    x = torch.randn(4, 8)
    with torch.no_grad(), pytest.warns(RuntimeWarning, match="Inductor compiles alone") as caught:
        for rows in (4, 3):
            fn = torch.compile(lambda t: torch.softmax(t, -1), backend=backend, options={"package": str(unverified)})
            assert torch.allclose(fn(x[:rows]), torch.softmax(x[:rows], -1))
    assert len([w for w in caught if str(unverified) in str(w.message)]) == 1
    assert len(inductor.graphs) == 2 and not any(_ops_in(g) for g in inductor.graphs)


def test_inductor_compiles_the_rewritten_graph(tmp_path: Path) -> None:
    # The real Inductor (a C++ build of the CPU graph): the op is an extern kernel of the compiled code, the
    # multiply before it and the add after it are Inductor's.
    driver = HostSoftmax(wrong=True)
    cast = _cast(tmp_path, driver=driver)
    x = torch.randn(4, 8)
    with torch.no_grad(), torch._inductor.config.patch(fx_graph_cache=False):  # traced and built, not looked up
        model = compiled.compile(lambda t: torch.softmax(t * 2, -1) + 1, cast, mode="reduce-overhead")
        assert torch.equal(model(x), torch.ones(4, 8)) and torch.equal(model(x), torch.ones(4, 8))
    (kernel,) = cast.stats().kernels
    assert kernel.graph_nodes == 1 and kernel.compiled_calls == 2 and len(driver.launches) == 2


def test_graph_says_what_it_needs_without_a_cuda_device(tmp_path: Path) -> None:
    import kernelforge_tui.cast as cast_api

    if torch.cuda.is_available():
        pytest.skip("a CUDA device is here: tests/gpu/test_cast_compile.py captures graphs")
    with pytest.raises(CastError, match="it needs a CUDA device"):
        cast_api.graph(lambda t: torch.softmax(t, -1), [torch.randn(4, 8)], _cast(tmp_path))
