"""Fused chains on the compile path: a package kernel that stands for several aten calls (`KernelEntry.chain`, the
card's [chain]) replaces all of them at once on the aten graph `cast.compiled` traces, before Inductor sees it.

A chain matches where a node has its last call's overload and every argument, walked back through the links,
wires as the capture recorded: a card input is a node (one node for every argument that names the input), an
earlier call's result is that call's node (or its getitem, for a call of several results), a scalar is the very
value (type included: True is not 1); a node passing more arguments than the recorded call is no match. Then
nothing outside the chain may read an intermediate (a result that is not the chain's output), or the replaced graph
would lose it; the kernel's guard decides once, from the inputs' FakeTensors, as for a single call; and the kernel
must pay for any Inductor fusion the replacement splits (`cast.fusion_cost`), as a single call's must. The matched
nodes make way for one call of the kernel's op (`cast.ops`), whose result takes the chain output's uses.

The op is inserted before the chain's last call, where every input is defined. A chain's outputs are its last
call's results, and may be an earlier call's too (a residual sum the model reads again, which the kernel writes
beside the norm): then every reader of that result outside the chain must come after the last call, or the chain is
left alone.
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kernelforge_tui.cast.fusion_cost import overload_of, refusal
from kernelforge_tui.cast.manifest import Chain
from kernelforge_tui.cast.ops import kernel_op
from kernelforge_tui.cast.runtime import _PLAIN, KernelRunner, _accept_set, _accepted, _argument, _count, _plain


@dataclass(frozen=True)
class ChainDecision:
    """What the pass did with one structural match of a chain: the kernel took it, or why not."""

    node: str
    """The chain's last call's node."""
    overload: str
    """The kernel's guard's, `kernelforge::<pattern>`."""
    kernel: str | None
    reason: str = ""


def _is_node(value: Any) -> bool:
    import torch

    return isinstance(value, torch.fx.Node)


class _Matcher:
    """One attempt to match a chain backwards from a node: the nodes of its calls and of its inputs."""

    def __init__(self, chain: Chain) -> None:
        self.chain = chain
        self.calls: dict[int, Any] = {}
        self.inputs: dict[str, Any] = {}

    def call(self, k: int, node: Any) -> bool:
        if k in self.calls:
            return self.calls[k] is node
        step = self.chain.steps[k]
        if not _is_node(node) or node.op != "call_function" or overload_of(node.target) != step.overload:
            return False
        positional = 1 + max((a.position for a in step.args if a.position is not None), default=-1)
        keywords = {a.name for a in step.args if a.position is None}
        if len(node.args) > positional or any(key not in keywords for key in node.kwargs):
            return False
        self.calls[k] = node
        for arg in step.args:
            value = _argument(node.args, node.kwargs, arg)
            if arg.link is not None:
                producer, out = arg.link
                if self.chain.steps[producer].results > 1:
                    if not (_is_node(value) and value.target is operator.getitem and value.args[1] == out):
                        return False
                    value = value.args[0]
                if not self.call(producer, value):
                    return False
            elif arg.tensor is not None:
                if not _is_node(value) or self.inputs.setdefault(arg.tensor, value) is not value:
                    return False
            else:
                plain = value if type(value) in _PLAIN else _plain(value)
                if _is_node(value) or not _accepted(plain, _accept_set(arg.accepts), arg.accepts):
                    return False
        return True

    def escape(self) -> str:
        """'' when nothing outside the matched calls reads an intermediate result, else which one is read."""
        matched = set(self.calls.values())
        outputs = set(self.chain.outputs)
        for k, node in self.calls.items():
            step = self.chain.steps[k]
            if step.results == 1:
                if (k, 0) not in outputs and any(user not in matched for user in node.users):
                    return f"{node.name} ({step.overload}) is read outside the chain"
                continue
            for user in node.users:
                if user.target is not operator.getitem:
                    return f"{node.name} ({step.overload}) is read whole outside the chain"
                if (k, user.args[1]) not in outputs and any(reader not in matched for reader in user.users):
                    return f"{user.name} (result {user.args[1]} of {step.overload}) is read outside the chain"
        return ""

    def read_early(self) -> str:
        """'' when no call outside the chain reads an output of an earlier call of it before its last call (where the
        kernel's op goes), else which call does."""
        final = len(self.chain.steps) - 1
        early = {
            _output_value(self.calls[k], self.chain.steps[k].results, i) for k, i in self.chain.outputs if k != final
        } - {None}
        matched = set(self.calls.values())
        node = self.calls[final].prev
        while early and node.op != "root":
            if node not in matched and any(node in value.users for value in early):
                return f"{node.name} reads a result of the chain before its last call, where the kernel would run"
            early.discard(node)
            node = node.prev
        return ""


def _output_value(node: Any, results: int, index: int) -> Any:
    """The node that holds result `index` of `node` (itself for a call of one result), or None when nothing
    reads it."""
    if results == 1:
        return node
    return next((u for u in node.users if u.target is operator.getitem and u.args[1] == index), None)


def _first_asked(runner: KernelRunner) -> tuple[int, int]:
    chain = runner.entry.chain
    return (0, 0) if chain is None else (-len(chain.steps), len(chain.outputs))


def replace_chains(
    graph: Any, runners: list[KernelRunner], unproven: Callable[[list[Any]], str]
) -> list[ChainDecision]:
    """Every match of the runners' chains in the aten `graph` replaced by the kernel's op where its guard proves
    the inputs and `unproven` (the pass's own reasons, on the inputs' FakeTensors) has none; a decision per match.
    Longer chains first, as capture finds them: a chain inside another (the rms_norm of a residual_rms_norm) would
    otherwise take calls the longer one fuses with its neighbours; of equal length, fewer outputs first: a residual
    sum nothing else reads is the plain chain's (a kept sum's kernel would write it for nobody)."""
    decisions: list[ChainDecision] = []
    for runner in sorted(runners, key=_first_asked):
        chain = runner.entry.chain
        assert chain is not None
        last = len(chain.steps) - 1
        names = [spec.name for _, spec, _ in runner.tensor_args]
        for node in list(graph.nodes):
            if getattr(node, "_erased", False) or overload_of(node.target) != chain.steps[last].overload:
                continue  # erased by an earlier replacement, or not the chain's last call
            matcher = _Matcher(chain)
            if not matcher.call(last, node) or set(matcher.inputs) != set(names):
                continue
            inputs = [matcher.inputs[name].meta.get("val") for name in names]
            reason = matcher.escape() or matcher.read_early() or unproven(inputs)
            if not reason:
                admitted = runner.check(inputs, {}, "graph")
                reason = admitted if isinstance(admitted, str) else refusal(runner, matcher.calls.values())
            overload = runner.entry.guard.overload
            if reason:
                _count(runner.graph_refused, reason)
                decisions.append(ChainDecision(node.name, overload, None, reason))
                continue
            _replace(graph, chain, matcher, kernel_op(runner).overload, [matcher.inputs[n] for n in names])
            runner.graph_nodes += 1
            decisions.append(ChainDecision(node.name, overload, runner.entry.id))
    return decisions


def _replace(graph: Any, chain: Chain, matcher: _Matcher, op: Any, inputs: list[Any]) -> None:
    """The matched calls made way for one call of `op` on `inputs`, its result(s) taking the outputs' uses."""
    last = matcher.calls[len(chain.steps) - 1]
    with graph.inserting_before(last):
        replacement = graph.call_function(op, tuple(inputs))
    values = [_output_value(matcher.calls[s], chain.steps[s].results, i) for s, i in chain.outputs]
    if len(values) == 1:
        if values[0] is not None:
            replacement.meta.update(values[0].meta)
            values[0].replace_all_uses_with(replacement)
    else:
        replacement.meta["val"] = tuple(None if value is None else value.meta.get("val") for value in values)
        for index, value in enumerate(values):
            if value is None:
                continue
            with graph.inserting_after(replacement):
                item = graph.call_function(operator.getitem, (replacement, index))
            item.meta.update(value.meta)
            value.replace_all_uses_with(item)
    for k in sorted(matcher.calls, reverse=True):
        node = matcher.calls[k]
        for user in list(node.users):  # its getitems: read by later (erased) calls, or by nothing now
            graph.erase_node(user)
        graph.erase_node(node)
