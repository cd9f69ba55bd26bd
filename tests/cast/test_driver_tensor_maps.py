"""The package driver's launches of a kernel that takes a tensor map: the map travels as its tensor (the runtime
passes its pointer like any tensor's), and each launch encodes it over that pointer into a 64-byte aligned slot of
the argument block, which the kernel parameter points at. The driver's encoder is a stand-in that writes the
address into the map, so what the driver would read is checked without a GPU."""

from __future__ import annotations

import ctypes
import struct
from collections.abc import Iterator
from typing import Any

import pytest

from kernelforge_tui import tensor_maps
from kernelforge_tui.cards.model import LaunchPlan, OperatorCard, TensorMapSpec
from kernelforge_tui.cards.plan import resolve
from kernelforge_tui.cast import driver as drivers
from kernelforge_tui.cast.manifest import CastError, LaunchArg, launch_arg

CARD = OperatorCard.model_validate(
    {
        "name": "copy_bf16",
        "family": "elementwise",
        "sizes": {"n": 4096},
        "inputs": [{"name": "x", "dtype": "bfloat16", "shape": ["n"]}],
        "outputs": [{"name": "y", "dtype": "bfloat16", "shape": ["n"]}],
        "input_sets": [{"name": "seed_1", "seed": 1}],
        "reference": {"kind": "numpy", "function": "reference.py:reference"},
    }
)
PLAN = LaunchPlan(
    entry="k",
    grid=[1],
    block=[128],
    args=["map_x", "n", "y"],
    tensor_maps={"map_x": TensorMapSpec(tensor="x", box=[64])},
)


@pytest.fixture
def encoded(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[int]]:
    addresses: list[int] = []

    def encode_tiled(desc: Any, data_type: int, rank: int, address: Any, *rest: Any) -> int:
        addresses.append(int(address.value))
        ctypes.memmove(desc.value, struct.pack("<Q", address.value), 8)
        return 0

    monkeypatch.setattr(tensor_maps, "_encode_tiled", lambda: encode_tiled)
    tensor_maps.encode.cache_clear()
    yield addresses
    tensor_maps.encode.cache_clear()


def args() -> list[LaunchArg]:
    made = [launch_arg(a) for a in resolve(PLAN, CARD).args]
    assert [(a.kind, a.tensor_map is not None) for a in made] == [
        ("tensor", True),
        ("scalar", False),
        ("tensor", False),
    ]
    return made


def test_each_launch_passes_a_map_of_its_own_pointer_from_an_aligned_slot(encoded: list[int]) -> None:
    seen: list[tuple[int, int, int, int]] = []

    def launch_ex(config: Any, function: Any, params: Any, extra: Any) -> int:
        slots = list((ctypes.c_void_p * 3).from_address(params.value))
        mapped = struct.unpack("<Q", ctypes.string_at(slots[0], 8))[0]
        seen.append((slots[0] % tensor_maps.MAP_ALIGNMENT, mapped, ctypes.c_int32.from_address(slots[1]).value,
                     ctypes.c_uint64.from_address(slots[2]).value))  # fmt: skip
        return 0

    launch = drivers.ctypes_launcher(
        drivers.RawLaunch(launch_ex, True), 0x1000, (1, 1, 1), (128, 1, 1), 0, drivers._Params(args()), print
    )
    launch(0, [0x10000, 0x20000])
    launch(0, [0x30000, 0x40000])
    assert seen == [(0, 0x10000, 4096, 0x20000), (0, 0x30000, 4096, 0x40000)]
    assert encoded == [0x10000, 0x30000]


def test_a_misaligned_tensor_is_a_cast_error_before_the_launch(encoded: list[int]) -> None:
    block = drivers._Params(args()).block()
    with pytest.raises(CastError, match="not on a 16-byte boundary"):
        block.encode_maps([0x10008, 0x20000])
    assert encoded == []


def test_a_package_argument_holds_its_map_and_one_without_serialises_as_before() -> None:
    mapped = args()[0]
    assert LaunchArg.model_validate_json(mapped.model_dump_json()) == mapped
    assert (
        LaunchArg(kind="tensor", name="y").model_dump_json()
        == '{"kind":"tensor","name":"y","scalar_type":"","value":0}'
    )


def test_the_compiled_launcher_leaves_a_map_kernel_to_the_python_path() -> None:
    """The C++ replay passes raw pointers where the kernel wants maps: it must not take the kernel's calls."""
    from types import SimpleNamespace

    from kernelforge_tui.cast.launcher import Replay

    replay = Replay.__new__(Replay)  # no C++ library needed: a map kernel is refused before it is used
    runner = SimpleNamespace(entry=SimpleNamespace(launch=SimpleNamespace(args=args())))
    assert replay.admit(runner, 0x1000, [(0, 256)]) is False  # type: ignore[arg-type]
