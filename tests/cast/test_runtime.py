"""The .cast runtime on a CPU-only torch: which packages it refuses, that CPU tensors and uncovered calls fall back
(and the counters say why), that the guard admits exactly the proven call, that the env var turns it off, and
shadow mode. The hit path runs through a stand-in driver (a host softmax) with the kernels registered for the CPU
dispatch key; the real launch is tested on the GPU (tests/gpu/test_cast.py)."""

from __future__ import annotations

import ctypes
import json
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from kernelforge_tui.cast import driver as drivers  # noqa: E402
from kernelforge_tui.cast import load  # noqa: E402
from kernelforge_tui.cast.manifest import (  # noqa: E402
    CastError,
    KernelEntry,
    LaunchArg,
    Package,
    ReadLimits,
    read_package,
    write_package,
)
from kernelforge_tui.cast.runtime import KernelRunner  # noqa: E402
from tests.support.fixtures.cast.cast_support import (  # noqa: E402
    MACHINE,
    HostSoftmax,
    members_of,
    rezip,
    softmax_entry,
    write_cast,
)

HERE = MACHINE.model_copy(update={"torch_version": str(torch.__version__)})


def _package(tmp_path: Path) -> Path:
    # 64-byte alignment: what torch's CPU allocator gives (CUDA's gives 512, and the packages say 256).
    return write_cast(tmp_path / "model.cast", [softmax_entry(alignment=64)], machine=HERE)


def _eager(x: Any, dim: int = -1) -> Any:
    return torch.softmax(x, dim)


@pytest.mark.parametrize(
    ("change", "says"),
    [
        ({"capability": (8, 0)}, "GPU architecture sm_90 there, sm_80 here"),
        ({"driver_version": "535.1"}, "driver major 570 there, 535 here"),
        ({"cuda_version": "12.4"}, "CUDA 12.8 there, 12.4 here"),
        ({"torch_version": "2.1.0"}, f"torch {torch.__version__} there, 2.1.0 here"),
    ],
)
def test_a_package_from_another_machine_is_refused_with_what_differs(
    tmp_path: Path, change: dict[str, object], says: str
) -> None:
    path = _package(tmp_path)
    with pytest.raises(CastError) as caught:
        load(path, machine=HERE.model_copy(update=change))
    message = str(caught.value)
    assert says in message
    assert f"kernelforge verify {path}" in message and "NVIDIA H200" in message


def test_a_package_not_checked_on_a_gpu_is_refused(tmp_path: Path) -> None:
    path = write_cast(tmp_path / "m.cast", [softmax_entry()], machine=None)
    with pytest.raises(CastError, match=r"is not checked on a GPU yet.*kernelforge verify"):
        load(path, machine=HERE)


def test_a_changed_cubin_is_refused_at_load_not_at_the_first_call(tmp_path: Path) -> None:
    path = _package(tmp_path)
    package = read_package(path)
    cubin = package.manifest.kernels[0].files.cubin
    files = package.members
    write_package(path, package.manifest, {**files, cubin: b"\x7fELF another kernel"})  # the stamp follows
    with pytest.raises(CastError, match=f"{cubin} does not match its sha256 in the manifest"):
        load(path, machine=HERE, dispatch_key="CPU", device_type="cpu", driver=HostSoftmax())


def test_a_stamp_typed_into_the_json_is_refused_at_load(tmp_path: Path) -> None:
    path = write_cast(tmp_path / "m.cast", [softmax_entry(alignment=64)], machine=None)
    members = members_of(path)
    manifest = json.loads(members["manifest.json"])
    manifest["stamp"] = {"machine": HERE.model_dump(mode="json"), "at": 0.0, "by": "verify", "sanitizer": True}
    rezip(path, {**members, "manifest.json": json.dumps(manifest).encode()})
    with pytest.raises(CastError, match="its stamp does not match its contents"):
        load(path, machine=HERE)


def test_load_caps_what_it_inflates(tmp_path: Path) -> None:
    path = _package(tmp_path)
    rezip(path, {**members_of(path), "reports/bomb.txt": bytes(1 << 20)})
    with pytest.raises(CastError, match=f"{path}: reports/bomb.txt: 1048576 bytes, more than the 65536"):
        load(path, machine=HERE, limits=ReadLimits(member_bytes=64 << 10))


def test_cpu_tensors_fall_back_and_the_counters_say_so(tmp_path: Path) -> None:
    # Registered for CPU calls, guarding as in production (CUDA tensors only): every CPU call falls back.
    x = torch.randn(4, 8)
    with load(_package(tmp_path), machine=HERE, dispatch_key="CPU", driver=HostSoftmax()) as cast:
        y = torch.softmax(x, -1)
        torch.softmax(torch.randn(3, 8), -1)
    assert torch.equal(y, _eager(x))
    stats = cast.stats()
    (kernel,) = stats.kernels
    assert kernel.hits == 0 and kernel.fallbacks == {"self on cpu, not a CUDA device": 1}
    assert stats.overloads[0].uncovered == {"shape [3, 8] float32": 1}
    assert stats.hits == 0 and stats.fallbacks == 2
    report = cast.report()
    assert "0 hits, 1 fallbacks" in report and "1 x self on cpu, not a CUDA device" in report
    assert "1 calls no kernel covers" in report


def test_by_default_cpu_calls_never_reach_the_kernels(tmp_path: Path) -> None:
    # The production registration (CUDA key): a CPU call goes straight to the original operator.
    x = torch.randn(4, 8)
    with load(_package(tmp_path), machine=HERE, driver=HostSoftmax()) as cast:
        assert cast.active
        y = torch.softmax(x, -1)
    assert torch.equal(y, _eager(x))
    assert cast.stats().hits == 0 and cast.stats().fallbacks == 0


def test_the_guard_admits_exactly_the_proven_call(tmp_path: Path) -> None:
    driver = HostSoftmax()
    cast = load(_package(tmp_path), machine=HERE, dispatch_key="CPU", device_type="cpu", driver=driver)
    x = torch.randn(4, 8)
    misaligned = torch.randn(4 * 8 + 1)[1:].view(4, 8)  # contiguous, 4 bytes past a 64-byte boundary
    with cast:
        hit = torch.softmax(x, -1)
        also = torch.softmax(x, 1)  # the same axis, written as 1
        results = {
            "dtype": torch.softmax(x.double(), -1),
            "strides": torch.softmax(torch.randn(8, 4).t(), -1),
            "aligned": torch.softmax(misaligned, -1),
            "dim": torch.softmax(x, 0),
            "keyword": torch.ops.aten._softmax.default(x, -1, half_to_float=False),
        }
    assert torch.allclose(hit, _eager(x)) and torch.allclose(also, _eager(x))
    assert torch.allclose(results["dim"], _eager(x, 0)) and torch.allclose(results["aligned"], _eager(misaligned))
    (kernel,) = cast.stats().kernels
    assert torch.allclose(results["keyword"], _eager(x))
    assert kernel.hits == 3
    assert kernel.fallbacks == {
        "dtype self float64 (kernel: float32)": 1,
        "strides self[1, 4] (kernel: contiguous [8, 1])": 1,
        "self not 64-byte aligned (a view that starts mid-buffer)": 1,
        "dim=0 (kernel: -1 or 1)": 1,
    }
    # The launch: the cubin loaded once, the plan's grid and block, the input then a fresh output of torch's.
    assert [entry for _, _, entry in driver.loaded] == ["softmax_rows"]
    grid, block, stream, pointers = driver.launches[0]
    assert grid == (4, 1, 1) and block == (32, 1, 1) and stream == 0
    assert pointers[0] == x.data_ptr() and pointers[1] not in (x.data_ptr(), 0)


def test_leaving_the_block_restores_the_operator(tmp_path: Path) -> None:
    driver = HostSoftmax(wrong=True)
    x = torch.randn(4, 8)
    with load(_package(tmp_path), machine=HERE, dispatch_key="CPU", device_type="cpu", driver=driver):
        inside = torch.softmax(x, -1)
    after = torch.softmax(x, -1)
    assert torch.equal(inside, torch.zeros(4, 8))  # the stand-in kernel ran
    assert torch.equal(after, _eager(x)) and len(driver.launches) == 1


def test_kernelforge_cast_off_turns_it_all_off(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KERNELFORGE_CAST", "off")
    driver = HostSoftmax(wrong=True)
    x = torch.randn(4, 8)
    (tmp_path / "model.cast").write_text("not even read")
    with load(tmp_path / "model.cast", dispatch_key="CPU", device_type="cpu", driver=driver) as cast:
        y = torch.softmax(x, -1)
    assert torch.equal(y, _eager(x)) and driver.launches == []
    assert not cast.active and "KERNELFORGE_CAST=off" in cast.report()


def test_shadow_mode_disables_a_kernel_that_disagrees(tmp_path: Path) -> None:
    x = torch.randn(4, 8)
    cast = load(
        _package(tmp_path),
        machine=HERE,
        dispatch_key="CPU",
        device_type="cpu",
        driver=HostSoftmax(wrong=True),
        shadow_every=2,
    )
    with cast, pytest.warns(RuntimeWarning, match="disagreed with eager PyTorch in shadow mode"):
        first = torch.softmax(x, -1)  # hit 1: not shadowed, wrong
        second = torch.softmax(x, -1)  # hit 2: shadowed, caught: eager's answer comes back
        third = torch.softmax(x, -1)  # disabled: eager
    assert torch.equal(first, torch.zeros(4, 8))
    assert torch.equal(second, _eager(x)) and torch.equal(third, _eager(x))
    (kernel,) = cast.stats().kernels
    assert kernel.hits == 2 and kernel.shadow_checks == 1 and kernel.disabled.startswith("at hit 2: output y:")
    assert kernel.fallbacks == {"disabled: disagreed with eager in shadow mode": 1}


def test_shadow_mode_keeps_a_kernel_that_agrees(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KERNELFORGE_CAST_SHADOW", "1")
    x = torch.randn(4, 8)
    with load(_package(tmp_path), machine=HERE, dispatch_key="CPU", device_type="cpu", driver=HostSoftmax()) as cast:
        ys = [torch.softmax(x, -1) for _ in range(3)]
    assert all(torch.allclose(y, _eager(x)) for y in ys)
    (kernel,) = cast.stats().kernels
    assert kernel.hits == 3 and kernel.shadow_checks == 3 and not kernel.disabled


def test_two_packages_over_one_operator_are_refused(tmp_path: Path) -> None:
    first = load(_package(tmp_path), machine=HERE, dispatch_key="CPU", driver=HostSoftmax())
    second_path = write_cast(tmp_path / "other.cast", [softmax_entry()], machine=HERE)
    second = load(second_path, machine=HERE, dispatch_key="CPU", driver=HostSoftmax())
    with first, pytest.raises(CastError, match=r"already overrides aten::_softmax\.default"):
        second.activate()
    with second:  # free again once the first left
        assert second.active


def test_a_wrapped_number_falls_back_with_its_promotion_intact(tmp_path: Path) -> None:
    # aten::add.Tensor receives `x + 1.5` with 1.5 as a Python number; the original needs a tensor back.
    from kernelforge_tui.cast.manifest import AtenArg, Guard, TensorGuard

    entry, files = softmax_entry()
    guard = Guard(
        overload="aten::add.Tensor",
        args=[
            AtenArg(name="self", position=0, tensor="x"),
            AtenArg(name="other", position=1, tensor="w"),
            AtenArg(name="alpha", position=None, accepts=[1], default=1, has_default=True),
        ],
        inputs=[entry.guard.inputs[0], TensorGuard(name="w", shape=(4, 8), dtype="float32", strides=(8, 1))],
        outputs=entry.guard.outputs,
        capability=(9, 0),
    )
    path = write_cast(tmp_path / "add.cast", [(entry.model_copy(update={"guard": guard}), files)], machine=HERE)
    ints = torch.ones(3, dtype=torch.int32)
    with load(path, machine=HERE, dispatch_key="CPU", driver=HostSoftmax()) as cast:
        assert (ints + 1.5).dtype == torch.float32 and (ints + 2).dtype == torch.int32
        assert torch.equal(torch.ones(2, dtype=torch.bfloat16) + 1.5, torch.full((2,), 2.5, dtype=torch.bfloat16))
    assert sum(cast.stats().overloads[0].uncovered.values()) == 3


@pytest.mark.parametrize(
    ("change", "says"),
    [
        ({"strides": (1, 4)}, "x has strides [1, 4] for shape [4, 8], not row-major"),
        ({"card_shape": (4, 4)}, "x's card shape [4, 4] does not hold the call's [4, 8]"),
    ],
)
def test_a_guard_the_kernel_cannot_read_in_place_is_refused(
    tmp_path: Path, change: dict[str, object], says: str
) -> None:
    # The launch hands the kernel the call's own pointer as the card's row-major view: only a row-major tensor of
    # the card's element count can be read that way.
    entry, files = softmax_entry()
    x = entry.guard.inputs[0].model_copy(update=change)
    entry = entry.model_copy(update={"guard": entry.guard.model_copy(update={"inputs": [x]})})
    path = write_cast(tmp_path / "m.cast", [(entry, files)], machine=HERE)
    with pytest.raises(CastError, match=rf"kernel k0-softmax: {re.escape(says)}: export it again"):
        load(path, machine=HERE, dispatch_key="CPU", driver=HostSoftmax())


def test_a_call_of_another_shape_reaches_the_kernel_as_its_cards_view(tmp_path: Path) -> None:
    # A softmax over the last axis of [2, 2, 8] is the card's [4, 8]: the guard takes [2, 2, 8], the kernel gets the
    # same pointer and reads [rows, cols] = [4, 8], the output comes back in the call's shape.
    from kernelforge_tui.cast.bindings import contiguous_strides

    entry, files = softmax_entry(alignment=64)
    x, y = entry.guard.inputs[0], entry.guard.outputs[0]
    view = {"shape": (2, 2, 8), "strides": contiguous_strides((2, 2, 8)), "card_shape": (4, 8)}
    guard = entry.guard.model_copy(
        update={"inputs": [x.model_copy(update=view)], "outputs": [y.model_copy(update=view)]}
    )
    path = write_cast(tmp_path / "m.cast", [(entry.model_copy(update={"guard": guard}), files)], machine=HERE)
    driver = HostSoftmax()
    x3 = torch.randn(2, 2, 8)
    with load(path, machine=HERE, dispatch_key="CPU", device_type="cpu", driver=driver) as cast:
        y3 = torch.softmax(x3, -1)
        flat = torch.softmax(x3.view(4, 8), -1)  # the card's shape is not the call the guard was made for
    assert y3.shape == (2, 2, 8) and torch.allclose(y3, _eager(x3))
    assert torch.equal(flat, _eager(x3.view(4, 8)))
    (kernel,) = cast.stats().kernels
    assert kernel.hits == 1 and kernel.call == "aten::_softmax.default(x[2x2x8] float32 as [4x8])"
    assert cast.stats().overloads[0].uncovered == {"shape [4, 8] float32": 1}
    assert driver.launches[0][3][0] == x3.data_ptr()


# -- the hot path ------------------------------------------------------------------------------------------------


def _runner(entry: KernelEntry, driver: Any = None) -> KernelRunner:
    """A runner on the CPU stand-in device, its package holding the stand-in entry's files."""
    _, files = softmax_entry()
    return KernelRunner(Package(Path("m.cast"), None, files), entry, device_type="cpu", driver=driver or HostSoftmax())  # type: ignore[arg-type]


def _with_scalar(accepts: list[Any]) -> KernelEntry:
    """The softmax entry with one more positional scalar argument accepting `accepts`."""
    from kernelforge_tui.cast.manifest import AtenArg

    entry, _ = softmax_entry(alignment=64)
    extra = AtenArg(name="extra", position=3, accepts=accepts)
    return entry.model_copy(update={"guard": entry.guard.model_copy(update={"args": [*entry.guard.args, extra]})})


def test_a_signature_holds_everything_the_guard_decides_on() -> None:
    # The hot path keeps the guard's decision per call signature (`signature_of`): two calls with one signature must
    # get one decision from the full guard, pointers aside (the hot path checks those per call). The calls are
    # those the dispatcher hands over: an int argument as an int, a bool one as a bool.
    from kernelforge_tui.cast.runtime import signature_of

    entry, _ = softmax_entry(alignment=64)
    runner = _runner(entry)
    signature = signature_of(torch.ops.aten._softmax.default._schema)
    x = torch.randn(4, 8)
    calls: list[tuple[object, ...]] = [
        (x, -1, False),
        (torch.randn(4, 8), -1, False),  # another tensor of the same signature
        (x, 1, False),
        (x, 0, False),
        (x, -1, True),
        (x, -1),
        (x, -1, False, None),
        (x.double(), -1, False),
        (torch.randn(8, 4).t(), -1, False),
        (torch.randn(3, 8), -1, False),
    ]
    decided: dict[tuple[object, ...], object] = {}
    for call in calls:
        verdict = runner.check(list(call), {}, "signature")
        verdict = verdict if isinstance(verdict, str) else "admitted"
        assert decided.setdefault(signature(call), verdict) == verdict, call
    assert len(decided) == len(calls) - 1  # only the two calls on equal tensors share a signature
    assert [v for v in decided.values() if v == "admitted"] == ["admitted"] * 2  # dim -1 and dim 1
    # A Scalar reaches the kernel as the caller gave it, so its type is part of the signature (True == 1 == 1.0).
    scalar = signature_of(torch.ops.aten.add.Scalar._schema)
    assert len({scalar((x, True)), scalar((x, 1)), scalar((x, 1.0))}) == 3
    # What the full guard decides every time: a number where a tensor goes (a wrapped scalar), a list.
    with pytest.raises(AttributeError):
        signature((1.5, -1, False))
    with pytest.raises(TypeError):
        hash(signature((x, [-1], False)))


def test_the_hot_path_takes_a_decided_signature_and_checks_each_calls_pointers(tmp_path: Path) -> None:
    driver = HostSoftmax()
    x = torch.randn(4, 8)
    misaligned = torch.randn(4 * 8 + 1)[1:].view(4, 8)  # the signature of x, 4 bytes past a 64-byte boundary
    with load(_package(tmp_path), machine=HERE, dispatch_key="CPU", device_type="cpu", driver=driver) as cast:
        (override,) = cast.overrides()
        (runner,) = cast.runners
        checks: list[str] = []
        full_guard = runner.check
        runner.check = lambda args, kwargs, where="call": checks.append(where) or full_guard(args, kwargs, where)  # type: ignore[method-assign]
        ys = [torch.softmax(x, -1) for _ in range(3)]
        refused = [torch.softmax(x.double(), -1) for _ in range(2)]
        uncovered = [torch.softmax(torch.randn(3, 8), -1) for _ in range(2)]
        assert len(override.decisions) == 3
        off = torch.softmax(misaligned, -1)
    # Once per signature (the first call: its signature, then its pointers), and for the misaligned call again.
    assert checks == ["signature", "call", "signature", "signature", "call"]
    assert all(torch.allclose(y, _eager(x)) for y in ys) and torch.allclose(off, _eager(misaligned))
    assert all(torch.equal(r, _eager(x.double())) for r in refused) and len(uncovered) == 2
    (kernel,) = cast.stats().kernels
    assert kernel.hits == 3 and len(driver.launches) == 3
    assert kernel.fallbacks == {
        "dtype self float64 (kernel: float32)": 2,
        "self not 64-byte aligned (a view that starts mid-buffer)": 1,
    }
    assert cast.stats().overloads[0].uncovered == {"shape [3, 8] float32": 2}


def test_scalars_are_admitted_as_the_full_guard_names_them() -> None:
    # A dtype named in the manifest ("float32") is admitted as torch's object and as the name; a list as a list,
    # and a tuple where the guard has a list.
    x = torch.randn(4, 8)
    cases: list[tuple[list[Any], list[Any], list[Any]]] = [
        (["float32"], [torch.float32, "float32"], [torch.float64, "float64", 1]),
        ([[1, 2]], [[1, 2], (1, 2)], [[2, 1], [1], 3]),
        ([None], [None], [0, False]),
    ]
    for accepts, good, bad in cases:
        runner = _runner(_with_scalar(accepts))
        for value in good:
            assert runner.check([x, -1, False, value], {}) == [x], (accepts, value)
        for value in bad:
            assert isinstance(runner.check([x, -1, False, value], {}), str), (accepts, value)


def test_a_left_out_default_is_decided_once_and_a_keyword_takes_the_full_guard(tmp_path: Path) -> None:
    # aten::add.Tensor(self, other, *, alpha=1): the dispatcher leaves alpha out when it is 1 and passes it as a
    # keyword otherwise.
    from kernelforge_tui.cast.manifest import AtenArg, TensorGuard

    entry, files = softmax_entry()
    w = TensorGuard(name="w", shape=(4, 8), dtype="float32", strides=(8, 1), alignment=64)
    guard = entry.guard.model_copy(
        update={
            "overload": "aten::add.Tensor",
            "args": [
                AtenArg(name="self", position=0, tensor="x"),
                AtenArg(name="other", position=1, tensor="w"),
                AtenArg(name="alpha", position=None, accepts=[1], default=1, has_default=True),
            ],
            "inputs": [entry.guard.inputs[0].model_copy(update={"alignment": 64}), w],
        }
    )
    entry = entry.model_copy(update={"guard": guard})
    runner = _runner(entry)
    a, b = torch.randn(4, 8), torch.randn(4, 8)
    assert runner.check([a, b], {}) == [a, b]
    assert runner.check([a, b, 1], {}) == "more arguments than the captured call passed"
    assert runner.check([a, b], {"alpha": 2}) == "alpha=2 (kernel: 1)"
    path = write_cast(tmp_path / "add.cast", [(entry, files)], machine=HERE)
    driver = HostSoftmax()
    with load(path, machine=HERE, dispatch_key="CPU", device_type="cpu", driver=driver) as cast:
        torch.add(a, b)
        torch.add(a, b)  # the hot path: alpha left out
        torch.add(a, b, alpha=2)  # a keyword: the full guard, which refuses it
        assert len(cast.overrides()[0].decisions) == 1  # a call with a keyword is not kept
    (kernel,) = cast.stats().kernels
    assert kernel.hits == 2 and kernel.fallbacks == {"alpha=2 (kernel: 1)": 1}
    assert [p[0] for *_, p in driver.launches] == [a.data_ptr()] * 2


def test_a_disabled_kernel_leaves_the_hot_path(tmp_path: Path) -> None:
    driver = HostSoftmax()
    x = torch.randn(4, 8)
    with load(_package(tmp_path), machine=HERE, dispatch_key="CPU", device_type="cpu", driver=driver) as cast:
        torch.softmax(x, -1)
        torch.softmax(x, -1)  # decided: the hot path
        cast.runners[0].disable("at hit 2: test")
        after = torch.softmax(x, -1)
    assert torch.equal(after, _eager(x)) and len(driver.launches) == 2
    (kernel,) = cast.stats().kernels
    assert kernel.hits == 2 and kernel.fallbacks == {"disabled: disagreed with eager in shadow mode": 1}


def test_outputs_are_allocated_in_the_guards_shapes_and_strides() -> None:
    from kernelforge_tui.cast.bindings import contiguous_strides

    entry, _ = softmax_entry(alignment=64)
    runner = _runner(entry)
    x = torch.randn(4, 8)
    assert runner.alloc == [(0, (4, 8), torch.float32)]  # like its input: torch.empty_like
    out = runner.launch([x])
    assert isinstance(out, torch.Tensor) and out.stride() == (8, 1) and torch.allclose(out, _eager(x))
    parameter = torch.nn.Parameter(x.clone())  # a subclass: allocated by torch.empty, a plain tensor comes back
    assert type(runner.launch([parameter])) is torch.Tensor
    # [21, 1, 1003] taken with strides [1003, 1, 1] (a size-1 dim's stride is free), returned contiguous.
    view = {"shape": (21, 1, 1003), "card_shape": (21, 1003)}
    x_guard = entry.guard.inputs[0].model_copy(update={**view, "strides": (1003, 1, 1)})
    y_guard = entry.guard.outputs[0].model_copy(update={**view, "strides": contiguous_strides((21, 1, 1003))})
    guard = entry.guard.model_copy(update={"inputs": [x_guard], "outputs": [y_guard]})
    rows, cols = (a.model_copy(update={"value": v}) for a, v in zip(entry.launch.args[2:], (21, 1003), strict=True))
    launch = entry.launch.model_copy(update={"grid": (21, 1, 1), "args": [*entry.launch.args[:2], rows, cols]})
    runner = _runner(entry.model_copy(update={"guard": guard, "launch": launch}))
    assert runner.alloc == [(-1, (21, 1, 1003), torch.float32)]
    x = torch.randn(21 * 1003).as_strided((21, 1, 1003), (1003, 1, 1))
    out = runner.launch([x])
    assert not isinstance(out, tuple) and out.stride() == (1003, 1003, 1)
    assert torch.allclose(out, _eager(x))


class CtypesHostSoftmax(HostSoftmax):
    """The runtime's real launch path (`driver.ctypes_launcher`: the argument block, the stream's launch config,
    one call of the driver's function with prepared objects) into a host softmax that reads what a kernel would."""

    def load(self, device: int, image: bytes, entry: str, shared_bytes: int, args: Sequence[LaunchArg]) -> Any:
        self.loaded.append((device, image, entry))
        return drivers._Function(0x7F00_0000_3000, None, None, drivers._Params(args))

    def launcher(self, function: Any, grid: Any, block: Any, shared_bytes: int) -> Any:
        def raw(config: Any, handle: Any, params: Any, extra: Any) -> int:
            c = config.contents
            slots = list((ctypes.c_void_p * 4).from_address(params.value))
            x, y = (ctypes.c_uint64.from_address(s).value for s in slots[:2])
            rows, cols = (ctypes.c_int32.from_address(s).value for s in slots[2:])
            assert handle.value == 0x7F00_0000_3000 and extra is None
            grid_, block_ = (c.grid_x, c.grid_y, c.grid_z), (c.block_x, c.block_y, c.block_z)
            self.launch({"rows": rows, "cols": cols}, grid_, block_, c.shared_bytes, c.stream or 0, [x, y])
            return 0

        def on_error(error: int, stream: int, pointers: Any) -> None:
            raise AssertionError(error)

        raw_launch = drivers.RawLaunch(raw, extended=True)
        return drivers.ctypes_launcher(
            raw_launch, function.handle, grid, block, shared_bytes, function.params, on_error
        )


def test_the_prepared_launch_runs_the_kernel_through_the_dispatcher(tmp_path: Path) -> None:
    driver = CtypesHostSoftmax()
    x = torch.randn(4, 8)
    with load(_package(tmp_path), machine=HERE, dispatch_key="CPU", device_type="cpu", driver=driver) as cast:
        ys = [torch.softmax(x, -1) for _ in range(3)]
    assert all(torch.allclose(y, _eager(x)) for y in ys)
    assert cast.stats().kernels[0].hits == 3 and len(driver.launches) == 3
    assert all(
        grid == (4, 1, 1) and block == (32, 1, 1) and p[0] == x.data_ptr() for grid, block, _, p in driver.launches
    )
    assert len({p[1] for *_, p in driver.launches}) >= 1 and driver.loaded == [(0, b"\x7fELF stand-in", "softmax_rows")]
