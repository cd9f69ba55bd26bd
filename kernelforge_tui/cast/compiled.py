"""The compile path: `torch.compile(model, backend="kernelforge")` and `kernelforge_tui.cast.compile(model, package)`.
Inductor compiles the model; every node of its graph that a package kernel proves runs the kernel instead, as its
kernelforge op (`cast.ops`), and so does every fused chain of nodes a chain kernel proves (`cast.fused`, asked
first); Inductor keeps fusing everything around them.

Where the pass runs, and why there: Inductor decomposes the very operators the packages cover (softmax, the norms,
the activations: its decomposition table has them) while it traces, so a pass inside Inductor (joint or post-grad)
would see only their pieces. The backend therefore traces dynamo's graph to aten first, on dynamo's own
FakeTensors and without decompositions (`make_fx`): its nodes are the calls the eager runtime overrides
(`aten::_softmax.default`, `aten::native_group_norm.default`). It replaces each node a kernel proves with the
kernel's op and hands the graph to Inductor (`compile_fx`, with the mode's options applied as torch.compile applies
them), which traces it again, decomposes and fuses the rest, and calls the ops as extern kernels. A graph in which
nothing is replaced goes to Inductor as dynamo made it: then the result is Inductor's own, bit for bit.

The proof is the eager runtime's own guard (`_Override.choose`, where="graph"), asked once per node at compile
time, from the node's FakeTensors: shapes, strides, dtypes, devices, storage offsets (a storage starts 512-byte
aligned on CUDA), the scalar arguments, the device's architecture. Nothing is checked per call but the pointers'
alignment, by the op. A recompilation (another shape) traces and asks again; a node no kernel proves, a symbolic
shape (dynamic=True: the kernels are proven for exact shapes), and a graph that needs gradients (the ops are for
inference) stay Inductor's, counted by reason (`Cast.stats`, `report`). So does a node, or a chain, whose kernel
would split an Inductor fusion with its pointwise neighbours that its measured saving does not pay for
(`cast.fusion_cost`): Inductor can fuse nothing into an op.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kernelforge_tui.cast.fused import replace_chains
from kernelforge_tui.cast.fusion_cost import overload_of, refusal
from kernelforge_tui.cast.manifest import CastError
from kernelforge_tui.cast.ops import kernel_op
from kernelforge_tui.cast.runtime import ACTIVE_CASTS, Cast, _argument, _count, load

NAME = "kernelforge"
"""The backend's name: `torch.compile(model, backend="kernelforge")`."""
NEEDS_GRAD = "the graph needs gradients (the kernels' ops are for inference: compile under torch.no_grad())"
MAX_DECISIONS = 4096
SYMBOLIC = "symbolic shapes (the kernels are proven for exact shapes: compile with dynamic=False)"


@dataclass(frozen=True)
class NodeDecision:
    """What the pass did with one node of a covered overload: the kernel it gave the node to, or why not."""

    node: str
    overload: str
    kernel: str | None
    reason: str = ""


def _symbolic(value: Any) -> bool:
    import torch

    if isinstance(value, torch.Tensor):
        sizes = [*value.shape, *value.stride(), value.storage_offset()]
        return any(not isinstance(size, int) for size in sizes)
    return isinstance(value, (torch.SymInt, torch.SymFloat, torch.SymBool))


def rewrite(gm: Any, example_inputs: list[Any], cast: Cast) -> tuple[Any, list[NodeDecision]]:
    """Dynamo's graph `gm` traced to aten with every node a kernel of `cast` proves replaced by the kernel's op, and
    what was decided per node of a covered overload; None for the graph where nothing was replaced."""
    import torch
    from torch._guards import detect_fake_mode
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.proxy_tensor import make_fx
    from torch.utils._pytree import tree_flatten, tree_map

    overrides = {o.overload: o for o in cast.overrides()}
    chains = [r for r in cast.runners if r.entry.chain is not None]
    if not overrides and not chains:
        return None, []
    if torch.is_grad_enabled() and any(isinstance(x, torch.Tensor) and x.requires_grad for x in example_inputs):
        return None, [NodeDecision("", "", None, NEEDS_GRAD)]
    fake_mode = detect_fake_mode(example_inputs) or FakeTensorMode()
    fakes = [fake_mode.from_tensor(x) if isinstance(x, torch.Tensor) else x for x in example_inputs]
    with fake_mode:
        traced = make_fx(gm)(*fakes)
    decisions = [  # chains first: a chain's last call may be a single kernel's overload too
        NodeDecision(d.node, d.overload, d.kernel, d.reason)
        for d in replace_chains(traced.graph, chains, lambda values: SYMBOLIC if any(map(_symbolic, values)) else "")
    ]
    for node in list(traced.graph.nodes):
        if node.op != "call_function" or not isinstance(node.target, torch._ops.OpOverload):
            continue
        overload = str(overload_of(node.target))
        override = overrides.get(overload)
        if override is None:
            continue
        args, kwargs = tree_map(
            lambda n: n.meta["val"] if isinstance(n, torch.fx.Node) else n, (node.args, node.kwargs)
        )
        if any(_symbolic(v) for v in tree_flatten((args, kwargs))[0]):
            _count(override.graph_refused, SYMBOLIC)
            decisions.append(NodeDecision(node.name, overload, None, SYMBOLIC))
            continue
        runner, decided = override.choose(args, kwargs, "graph")
        if isinstance(decided, str):
            reason = decided
        else:
            assert runner is not None  # what the guard admits, it admits with its runner
            reason = refusal(runner, [node])  # the Inductor fusion it would split, against what it saves
        if reason:
            _count(override.graph_refused, reason)
            decisions.append(NodeDecision(node.name, overload, None, reason))
            continue
        assert runner is not None
        op = kernel_op(runner)
        inputs = tuple(_argument(node.args, node.kwargs, arg) for arg, _, _ in runner.tensor_args)
        with traced.graph.inserting_before(node):
            replacement = traced.graph.call_function(op.overload, inputs)
        replacement.meta.update(node.meta)
        node.replace_all_uses_with(replacement)
        traced.graph.erase_node(node)
        runner.graph_nodes += 1
        decisions.append(NodeDecision(node.name, overload, runner.entry.id))
    if not any(d.kernel for d in decisions):
        return None, decisions
    traced.graph.lint()
    traced.recompile()
    return traced, decisions


class Backend:
    """A torch.compile backend: Inductor with the package's kernels in the graph (module docstring). Bound to a
    package (`cast.compile`), or, as `backend="kernelforge"`, to the one `options={"package": ...}` names, else
    the innermost package in force (`with cast.load(...)`, `kernelforge run`)."""

    def __init__(self, cast: Cast | None = None) -> None:
        self.cast = cast
        self.decisions: list[NodeDecision] = []
        """The node decisions of the graphs compiled, in order (the last MAX_DECISIONS)."""
        self.inductor: Any = None

    def __call__(self, gm: Any, example_inputs: list[Any], *, mode: str | None = None, options: Any = None) -> Any:
        import torch

        given = dict(options or {})
        package = given.pop("package", None)
        inductor: Callable[..., Any] = torch._TorchCompileInductorWrapper  # torch.compile's own mode handling
        self.inductor = inductor(mode, given, None)
        cast = self.cast or _resolve(package)
        if cast is None:
            return self.inductor(gm, example_inputs)
        try:
            graph, decisions = rewrite(gm, example_inputs, cast)
        except Exception as exc:  # a graph make_fx cannot trace: Inductor's alone, never a failed compilation
            _say_once(
                cast,
                f"kernelforge: the pass could not trace a graph ({type(exc).__name__}: {exc}): Inductor "
                "compiles it alone",
            )
            return self.inductor(gm, example_inputs)
        self.decisions = [*self.decisions, *decisions][-MAX_DECISIONS:]
        if graph is None and decisions:
            _say_once(
                cast,
                f"kernelforge: no kernel of {cast.path} replaces a node of this graph ({decisions[0].reason}): "
                "Inductor compiles it alone (cast.report() says why, per node)",
            )
        return self.inductor(graph if graph is not None else gm, example_inputs)

    def reset(self) -> None:
        """What torch._dynamo.reset() asks of a backend: Inductor's CUDA graph trees let go (reduce-overhead)."""
        if self.inductor is not None:
            self.inductor.reset()


_LOADED: dict[Path, Cast | None] = {}
_SAID: set[int] = set()


def _say_once(about: object, text: str) -> None:
    if id(about) not in _SAID:
        _SAID.add(id(about))
        warnings.warn(text, RuntimeWarning, stacklevel=3)


def _resolve(package: Any) -> Cast | None:
    """The package for `backend="kernelforge"`: a Cast, a path (loaded once per process; one this machine refuses
    is said once, and Inductor compiles alone), else the innermost in force; None with a warning when there is none."""
    if isinstance(package, Cast):
        return package
    if package is None:
        if ACTIVE_CASTS:
            return ACTIVE_CASTS[-1]
        _say_once(
            _resolve,
            'kernelforge: torch.compile(backend="kernelforge") was given no package: pass options={"package": '
            '"model.cast"}, or compile inside `with kernelforge_tui.cast.load(...)`. Inductor compiles alone.',
        )
        return None
    path = Path(package).resolve()
    if path not in _LOADED:
        try:
            _LOADED[path] = load(path)
        except CastError as exc:
            _LOADED[path] = None
            _say_once(path, f"kernelforge: {exc}. Inductor compiles alone.")
    return _LOADED[path]


kernelforge_backend = Backend()
"""`backend="kernelforge"`: what the `torch_dynamo_backends` entry point names, and what `register()` registers."""


def register() -> None:
    """Make `backend="kernelforge"` known to torch (where the installed entry point has not already)."""
    from torch._dynamo.backends.registry import lookup_backend, register_backend
    from torch._dynamo.exc import InvalidBackend

    try:
        lookup_backend(NAME)
    except InvalidBackend:
        register_backend(compiler_fn=kernelforge_backend, name=NAME)


def compile(
    model: Callable[..., Any],
    package: Cast | Path | str,
    *,
    mode: str | None = None,
    options: dict[str, Any] | None = None,
    dynamic: bool = False,
    fullgraph: bool = False,
) -> Any:
    """`torch.compile(model, mode=mode)` with the package's kernels in its graphs (Backend). `dynamic=False` by
    default: every new shape recompiles, and the pass asks the guard again (a symbolic shape is proven by no
    kernel). A package this machine refuses is said once, and the model compiles with Inductor alone."""
    import torch

    if isinstance(package, Cast):
        cast: Cast | None = package
    else:
        cast = _resolve(package)
    if cast is None:
        return torch.compile(model, mode=mode, options=options, dynamic=dynamic, fullgraph=fullgraph)
    register()
    backend = Backend(cast)
    return torch.compile(model, backend=backend, mode=mode, options=options, dynamic=dynamic, fullgraph=fullgraph)
