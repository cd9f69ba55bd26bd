"""A plan's tensor maps through the GPU worker's own code (over the host-memory pycuda stand-in): each launch gets
a map encoded over the buffer it runs on, packed by value at a 64-byte aligned offset of the parameter buffer.

The driver's encoder is replaced by one that writes the tensor's address and extent into the map's first words, so
the stand-in kernel reads `a` through its map as a TMA would: a map encoded once, for the first set's buffer, would
make every later set read the first set's `a`, and the checks would fail."""

from __future__ import annotations

import ctypes
import struct
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from kernelforge_tui import tensor_maps
from kernelforge_tui.cards.directory import Card
from kernelforge_tui.cards.model import LaunchPlan, TensorMapSpec
from kernelforge_tui.cards.plan import resolve
from kernelforge_tui.config import EvalSettings
from kernelforge_tui.gpu.protocol import Evaluate, KernelRef, LoadCard
from kernelforge_tui.gpu.worker import Worker
from tests.gpu.test_worker_fake_gpu import N, card, fake_cuda, ref, vectors
from tests.support.fakes import cuda

__all__ = ["card", "fake_cuda"]  # the fixtures, used by name
MAPPED = LaunchPlan(
    entry="kf_add",
    grid=["cdiv(n, 256)"],
    block=[256],
    args=["n", "map_a", "b", "c"],
    tensor_maps={"map_a": TensorMapSpec(tensor="a", box=[64])},
)


@pytest.fixture
def encoded(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[int]]:
    """The addresses the worker encoded maps over; each map's first words are its address and its extent."""
    addresses: list[int] = []

    def encode_tiled(desc: Any, data_type: int, rank: int, address: Any, dims: Any, *rest: Any) -> int:
        addresses.append(int(address.value))
        ctypes.memmove(desc.value, struct.pack("<QQ", address.value, dims[0]), 16)
        return 0

    monkeypatch.setattr(tensor_maps, "_encode_tiled", lambda: encode_tiled)
    tensor_maps.encode.cache_clear()
    yield addresses
    tensor_maps.encode.cache_clear()


def through_map() -> cuda.Kernel:
    """c = a + b, `a` read through its map (as a TMA does: the map's address and extent, nothing else)."""

    def run(n: np.int32, map_a: bytes, b: int, c: int) -> None:
        address, extent = struct.unpack_from("<QQ", map_a)
        assert len(map_a) == tensor_maps.MAP_BYTES and extent == int(n)
        _, y, out = vectors(b, b, c, int(n))
        out[:] = cuda.view(address, np.float32, int(extent)) + y

    return run


def test_every_set_is_launched_with_a_map_of_its_own_buffer(
    fake_cuda: None, card: Card, encoded: list[int], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(cuda.KERNELS, "through_map", through_map)
    worker = Worker()
    settings = EvalSettings(fresh_seeds=2).model_copy(update={"flush_bytes": 4096})
    worker.load_card(
        LoadCard(card_dir=card.root, helpers_cubin=Path("/cubins/helpers.cubin"), settings=settings, fresh_seed=9)
    )
    launch = resolve(MAPPED, card.spec)
    assert [a.kind for a in launch.args] == ["scalar", "tensor_map", "tensor", "tensor"]
    candidate = KernelRef(cubin=Path("/cubins/through_map.cubin"), launch=launch)
    result = worker.evaluate(Evaluate(candidate=candidate, baseline=ref(card, "baseline"), bytes_moved=12 * N))
    assert result.ok, result.reason
    state = worker.state
    assert state is not None
    assert set(encoded) == {s.inputs["a"].ptr for s in state.sets}  # one map per set's buffer, no other
    assert len(encoded) == len(state.sets)  # a buffer's map is encoded once, however often it is launched


def test_a_map_sits_at_a_64_byte_offset_of_the_parameter_buffer() -> None:
    layout = tensor_maps.struct_format(["i", "map", "P", "map", "q"])
    assert layout == "i60x128sP56x128sq"
    offsets = [struct.calcsize(layout[: layout.index(end) + len(end)]) - 128 for end in ("60x128s", "56x128s")]
    assert offsets == [64, 256]


def test_a_map_over_a_misaligned_or_short_buffer_is_refused_before_the_driver(card: Card) -> None:
    spec = resolve(MAPPED, card.spec).args[1].tensor_map
    assert spec is not None
    with pytest.raises(tensor_maps.TensorMapError, match="not on a 16-byte boundary"):
        tensor_maps.encode(spec, 0x1008, 4 * N)
    with pytest.raises(tensor_maps.TensorMapError, match=f"spans {4 * N} bytes, its buffer holds {4 * N - 4}"):
        tensor_maps.encode(spec, 0x1000, 4 * N - 4)
