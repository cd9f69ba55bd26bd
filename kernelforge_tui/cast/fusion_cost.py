"""What replacing graph nodes by a package kernel costs Inductor, and whether the kernel pays for it.

A kernelforge op is an extern kernel to Inductor: nothing fuses into it. Where Inductor would have fused the
replaced nodes with their pointwise neighbours (a scale and a mask into a softmax's loads, an activation into a
norm's stores), each such neighbour now runs as a kernel of its own, and the tensor between it and the op makes a
round trip through memory that the fused kernel never made. The pass replaces nodes only when the kernel's measured
saving per call (the package's `eager_us - kernel_us`) exceeds the time of that extra traffic.

A neighbour counts when Inductor would fuse it: an aten op tagged pointwise (`torch.Tag.pointwise`), or a dtype
conversion (`_to_copy` on the same device, untagged), seen through views (a reshape between costs nothing and
hides nothing). A producer counts when the replaced nodes are its only readers (else its result is in memory
anyway); its result is written and read back. A consumer of a replaced node's result counts: the result is read
back, and written too unless something else (a matrix product, the graph's output) needed it in memory anyway.
Matrix products, convolutions, custom ops (the package's own), reductions, placeholders and outputs are kernels or
buffers of their own in Inductor as well: next to them a replacement splits nothing.

The traffic is timed at SPLIT_SHARE of the copy ceiling the export's GPU check measured on the machine the package
was verified on (`Machine.copy_gbps`): a split's kernels do not move their round trip at the ceiling. A package
without one (unverified, or exported before it was measured) takes ASSUMED_COPY_GBPS, an H200's ceiling: on a GPU
with less bandwidth the estimate errs toward splitting. A split also costs a kernel launch, which the estimate leaves
out.
"""

from __future__ import annotations

import operator
from collections.abc import Collection, Iterator
from dataclasses import dataclass
from typing import Any

from kernelforge_tui.cast.runtime import KernelRunner

ASSUMED_COPY_GBPS = 4000.0
"""The copy ceiling (bytes read plus written per second, GB/s) of a package that measured none: an H200's (3735-4209
GB/s measured)."""
SPLIT_SHARE = 0.5
"""The share of the copy ceiling a split's extra round trip runs at. Measured on an H100 (docs/results.md, the
2026-12-07 section): splitting scale + mask + softmax after its producer cost 83.5 us for 134 MB more traffic, half
its 3191 GB/s ceiling; splitting group norm + SiLU before its consumer cost 7x its traffic's time, most of it not
traffic (Inductor compiles the norm otherwise alone), which no traffic model sees."""


def overload_of(target: Any) -> str | None:
    """`aten::add.Tensor` for an OpOverload, else None."""
    schema = getattr(target, "_schema", None)
    return None if schema is None else f"{schema.name}.{target._overloadname}"


@dataclass(frozen=True)
class SplitFusion:
    """The fusion a replacement splits: the neighbours Inductor would have fused with the replaced nodes, and the
    memory traffic their intermediates add."""

    neighbours: tuple[str, ...]
    """Their overloads (`aten::add.Tensor`), the producers first."""
    extra_bytes: int

    def us(self, gbps: float) -> float:
        """The extra traffic's time at `gbps` (bytes read plus written per second)."""
        return self.extra_bytes / (gbps * 1e3)


def _is_view(node: Any) -> bool:
    import torch

    target = node.target
    return node.op == "call_function" and (
        getattr(target, "is_view", False) or target is torch.ops.aten._unsafe_view.default
    )


def _fusible(node: Any) -> bool:
    """Inductor would fuse it with a neighbouring kernel: pointwise, or a dtype conversion on one device."""
    import torch

    target = node.target
    if node.op != "call_function" or not isinstance(target, torch._ops.OpOverload):
        return False
    if torch.Tag.pointwise in target.tags:
        return True
    if target is torch.ops.aten._to_copy.default and node.args and isinstance(node.args[0], torch.fx.Node):
        before, after = node.args[0].meta.get("val"), node.meta.get("val")
        return isinstance(before, torch.Tensor) and isinstance(after, torch.Tensor) and before.device == after.device
    return False


def _readers(value: Any) -> Iterator[Any]:
    """The nodes that read `value`, seen through views and a tuple's getitems."""
    for user in value.users:
        if _is_view(user) or user.target is operator.getitem:
            yield from _readers(user)
        else:
            yield user


def _nbytes(node: Any) -> int:
    import torch

    value = node.meta.get("val")
    return int(value.numel()) * value.element_size() if isinstance(value, torch.Tensor) else 0


def split_fusion(nodes: Collection[Any]) -> SplitFusion:
    """The fusion that replacing `nodes` (one node, or a chain's calls) by one extern kernel splits (module
    docstring: which neighbours count, and what each costs)."""
    import torch

    replaced = set(nodes)
    neighbours: dict[Any, None] = {}
    extra = 0
    producers: dict[Any, None] = {}
    for node in nodes:
        for arg in node.all_input_nodes:
            while _is_view(arg) and isinstance(arg.args[0], torch.fx.Node):
                arg = arg.args[0]
            if arg not in replaced:
                producers[arg] = None
    for producer in producers:
        if _fusible(producer) and all(reader in replaced for reader in _readers(producer)):
            neighbours[producer] = None
            extra += 2 * _nbytes(producer)  # written by its own kernel, read back by ours
    for node in nodes:
        results = [node] if isinstance(node.meta.get("val"), torch.Tensor) else node.users
        for result in results:
            outside = [reader for reader in _readers(result) if reader not in replaced]
            fused = [reader for reader in outside if _fusible(reader)]
            if fused:
                neighbours.update(dict.fromkeys(fused))
                extra += _nbytes(result) * (2 if len(fused) == len(outside) else 1)
    names = dict.fromkeys(str(overload_of(n.target)) for n in neighbours)
    return SplitFusion(tuple(names), extra)


def refusal(runner: KernelRunner, nodes: Collection[Any]) -> str:
    """'' where `runner`'s kernel may replace `nodes`: it splits no fusion, or its measured saving per call pays
    for the one it splits; else why not, in words."""
    split = split_fusion(nodes)
    if not split.extra_bytes:
        return ""
    latency = runner.entry.latency
    stamp = runner.package.manifest.stamp
    measured = stamp.machine.copy_gbps if stamp is not None else None
    gbps = measured or ASSUMED_COPY_GBPS
    ceiling = f"the measured {gbps:.0f} GB/s" if measured else f"an assumed {gbps:.0f} GB/s"
    split_us = split.us(SPLIT_SHARE * gbps)
    cost = (
        f"would split Inductor's fusion with {', '.join(split.neighbours)}: {split.extra_bytes / 1e6:.1f} MB more "
        f"memory traffic, ~{split_us:.1f} us at {SPLIT_SHARE:g} of {ceiling}"
    )
    if latency.kernel_us is None or latency.eager_us is None:
        return f"{cost}, and the package measured no saving to pay for it"
    saved = latency.eager_us - latency.kernel_us
    return "" if saved > split_us else f"{cost}, more than the {saved:.1f} us the kernel saves per call"
