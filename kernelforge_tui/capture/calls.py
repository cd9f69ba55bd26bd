"""Recorded aten calls and their grouping into variants, without torch.

Why apart from the recorder: grouping, pattern matching and card planning work on what was recorded (overloads,
tensor metadata, scalar arguments, which call produced which tensor), so they are plain Python that tests and the
manifest's readers use on any machine; only `recorder.py` touches torch.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, field

from kernelforge_tui.capture.manifest import ArgSpec, Step, TensorMeta


@dataclass
class Call:
    """One aten call of the recorded forward pass."""

    index: int
    op: str
    args: list[ArgSpec]
    """Tensor arguments carry `source`: (call index, output index) of the call in this forward pass that produced
    them, or (-k, 0) for the k-th distinct tensor that came from outside (the model's inputs, parameters, buffers),
    so that two reads of one tensor are known as such."""
    outputs: list[TensorMeta | None]
    inplace: bool = False
    view: bool = False
    consumers: list[int] = field(default_factory=list)
    """Per output: how many later calls read it (filled by `link`)."""
    model_outputs: set[int] = field(default_factory=set)
    """Outputs that are (part of) what the model returned."""

    def used(self) -> set[int]:
        """The outputs the model uses: read by a later call, or returned."""
        return {k for k, count in enumerate(self.consumers) if count} | self.model_outputs

    def tensor_args(self) -> list[ArgSpec]:
        return [a for a in self.args if a.kind == "tensor"]

    def arg(self, path: str) -> ArgSpec | None:
        for a in self.args:
            if a.path == path:
                return a
        return None


def link(calls: list[Call]) -> None:
    """Count each output's readers among the later calls."""
    for call in calls:
        call.consumers = [0] * len(call.outputs)
    for call in calls:
        for a in call.args:
            if a.source is not None and a.source[0] >= 0:
                producer, out = a.source
                calls[producer].consumers[out] += 1


def signature(op: str, args: list[ArgSpec]) -> str:
    """The variant key of a call: the overload and every argument but where its tensors came from (shapes, strides,
    dtypes, devices, storage offsets, scalar values). Alignment differs between calls and is not part of it."""
    parts = []
    for a in args:
        tensor = a.tensor.model_dump(exclude={"alignment"}) if a.tensor is not None else None
        parts.append({"path": a.path, "kind": a.kind, "value": a.value, "tensor": tensor})
    return op + json.dumps(parts, sort_keys=True)


@dataclass
class Group:
    """Calls (or pattern instances) with one signature: a variant before it is measured and ranked."""

    kind: str
    """`op` or `pattern`."""
    op: str
    key: str
    instances: list[list[int]]
    """Call indices of each instance (one for an op), in the order they ran."""
    steps: list[Step]
    """The steps of the first instance, pattern-internal sources made relative to the instance (step, output)."""
    read: list[set[int]] = field(default_factory=list)
    """Per step, the outputs the model uses in some instance (a later call reads them, or the model returns them): a
    card need not compute the others (attention's logsumexp in inference)."""

    def sampled(self, count: int) -> list[int]:
        """Which instances to store as card sets: the first, then a seeded random choice among the others (a few
        calls, never the whole activation history)."""
        if count <= 0 or not self.instances:
            return []
        rest = list(range(1, len(self.instances)))
        rng = random.Random(self.key)
        return [0, *sorted(rng.sample(rest, min(count - 1, len(rest))))]


def steps_of(calls: list[Call], indices: list[int]) -> list[Step]:
    """The calls at `indices` as steps: a tensor produced by an earlier call of the same instance is linked by its
    step number; anything else is external (None)."""
    position = {index: k for k, index in enumerate(indices)}
    steps: list[Step] = []
    for index in indices:
        call = calls[index]
        args = []
        for a in call.args:
            source = None
            if a.source is not None and a.source[0] in position:
                source = (position[a.source[0]], a.source[1])
            args.append(a.model_copy(update={"source": source}))
        steps.append(Step(op=call.op, args=args, outputs=call.outputs, inplace=call.inplace, view=call.view))
    return steps


def group_calls(calls: list[Call], matches: list[tuple[str, list[int]]]) -> tuple[list[Group], list[int]]:
    """Variants of the forward pass: every call groups by its own signature, and pattern instances (name, call
    indices) with one signature form one more group, listed after the group of the instance's first call (eager
    PyTorch replaces single calls, so each call of a chain stays a variant of its own). Returns the groups in order of
    first appearance and, per call, its own group's index (the trace)."""
    groups: list[Group] = []
    by_key: dict[str, int] = {}
    trace = [-1] * len(calls)

    def add(kind: str, op: str, indices: list[int]) -> int:
        steps = steps_of(calls, indices)
        named = f"{op}:" if kind == "pattern" else ""  # one chain's calls, whether its kernel writes the sum or not
        key = f"{kind}:{named}" + "|".join(signature(s.op, s.args) + repr(_links(s)) for s in steps)
        position = by_key.get(key)
        if position is None:
            position = by_key[key] = len(groups)
            groups.append(Group(kind=kind, op=op, key=key, instances=[], steps=steps))
        group = groups[position]
        if group.instances:
            group.steps = _least_alignment(group.steps, steps)
        read = [calls[i].used() for i in indices]
        group.read = [mine | theirs for mine, theirs in zip(group.read, read, strict=True)] if group.read else read
        group.instances.append(indices)
        return position

    starting: dict[int, list[tuple[str, list[int]]]] = {}
    for name, indices in matches:
        starting.setdefault(indices[0], []).append((name, indices))
    for call in calls:
        trace[call.index] = add("op", call.op, [call.index])
        for name, indices in starting.get(call.index, []):
            add("pattern", name, indices)
    return groups, trace


def _least_alignment(ours: list[Step], theirs: list[Step]) -> list[Step]:
    """`ours` with each tensor's alignment the smaller of the two (the guard must hold for every call)."""
    merged: list[Step] = []
    for mine, other in zip(ours, theirs, strict=True):
        args = []
        for a, b in zip(mine.args, other.args, strict=True):
            if a.tensor is not None and b.tensor is not None and b.tensor.alignment < a.tensor.alignment:
                a = a.model_copy(update={"tensor": a.tensor.model_copy(update={"alignment": b.tensor.alignment})})
            args.append(a)
        merged.append(mine.model_copy(update={"args": args}))
    return merged


def _links(step: Step) -> list[tuple[int, int] | None]:
    return [a.source for a in step.args]
