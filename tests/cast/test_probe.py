"""The GPU check's own logic on the CPU: the card's stored, fresh and stress sets, inputs placed at the guard's
alignment, the exact captured call rebuilt for eager, the runtime's guard and launch (a host stand-in for the CUDA
binding), and the verdict against eager with the card's tolerance."""

from __future__ import annotations

from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from kernelforge_tui.cards import load_card  # noqa: E402
from kernelforge_tui.cast.manifest import KernelFiles, Tolerance, read_package, sha256, write_package  # noqa: E402
from kernelforge_tui.cast.probe import FRESH_SEEDS, check_kernel  # noqa: E402
from kernelforge_tui.cast.runtime import KernelRunner  # noqa: E402
from tests.support.fixtures.cast.cast_support import EXAMPLES, HostSoftmax, softmax_entry, write_cast  # noqa: E402

CARD = EXAMPLES / "cards" / "softmax_f32_small"


def _package(tmp_path: Path, wrong: bool = False) -> tuple[Path, HostSoftmax]:
    card = load_card(CARD)
    entry, files = softmax_entry(shape=(21, 1003), alignment=64)
    base = f"kernels/{entry.id}"
    files[f"{base}/card.json"] = card.spec.model_dump_json().encode()
    sets = []
    for which in card.spec.input_sets:
        if which.file is not None:
            name = f"{base}/sets/{which.name}.npz"
            files[name] = (CARD / which.file).read_bytes()
            sets.append(name)
    tol = card.spec.outputs[0].effective_tolerance()
    entry = entry.model_copy(
        update={
            "tolerances": {"y": Tolerance(rtol=tol.rtol, atol=tol.atol)},
            "files": KernelFiles(
                cubin=entry.files.cubin,
                ptx=entry.files.ptx,
                source=entry.files.source,
                card=entry.files.card,
                sets=sets,
                sha256={n: sha256(d) for n, d in files.items()},
            ),
        }
    )
    return write_cast(tmp_path / "m.cast", [(entry, files)]), HostSoftmax(wrong=wrong)


def test_an_honest_kernel_agrees_on_every_set(tmp_path: Path) -> None:
    path, driver = _package(tmp_path)
    package = read_package(path)
    runner = KernelRunner(package, package.manifest.kernels[0], device_type="cpu", driver=driver)
    result = check_kernel(package, runner, timing=False, fresh=FRESH_SEEDS, device=torch.device("cpu"))
    assert result.ok, result.reason
    names = [s.name for s in result.sets]
    assert names[:2] == ["captured_0", "captured_1"]
    assert [n for n in names if n.startswith("fresh:")] == [f"fresh:{s}" for s in FRESH_SEEDS]
    assert {"stress:large-logits", "stress:fully-masked", "stress:nan-inf"} <= set(names)
    assert len(driver.launches) == len(names)
    # Every input placed 64 bytes into its buffer (torch's CUDA buffers start 512-aligned, its CPU ones 64-aligned).
    assert all(pointers[0] % 64 == 0 for _, _, _, pointers in driver.launches)


def test_a_wrong_kernel_is_caught_on_the_first_set(tmp_path: Path) -> None:
    path, driver = _package(tmp_path, wrong=True)
    package = read_package(path)
    runner = KernelRunner(package, package.manifest.kernels[0], device_type="cpu", driver=driver)
    result = check_kernel(package, runner, timing=False, fresh=FRESH_SEEDS, device=torch.device("cpu"))
    assert not result.ok
    assert result.reason.startswith("set captured_0: disagrees with eager PyTorch: y: 21063 of 21063 elements")


def test_the_call_is_rebuilt_with_the_captured_strides_of_size_one_dims(tmp_path: Path) -> None:
    # A call captured as [21, 1, 1003] with strides [1003, 1, 1] (contiguous: the stride of a size-1 dim is free,
    # and torch's own view would give 1003 there), its card [21, 1003]: the check builds the call the guard admits.
    path, driver = _package(tmp_path)
    package = read_package(path)
    entry = package.manifest.kernels[0]
    view = {"shape": (21, 1, 1003), "strides": (1003, 1, 1), "card_shape": (21, 1003)}
    x, y = entry.guard.inputs[0], entry.guard.outputs[0]
    out = y.model_copy(update={**view, "strides": (1003, 1003, 1)})
    guard = entry.guard.model_copy(update={"inputs": [x.model_copy(update=view)], "outputs": [out]})
    files = package.members
    write_package(
        path, package.manifest.model_copy(update={"kernels": [entry.model_copy(update={"guard": guard})]}), files
    )
    package = read_package(path)
    runner = KernelRunner(package, package.manifest.kernels[0], device_type="cpu", driver=driver)
    result = check_kernel(package, runner, timing=False, fresh=FRESH_SEEDS, device=torch.device("cpu"))
    assert result.ok, result.reason
    assert len(driver.launches) == len(result.sets) > 5


def _eager_off_by(monkeypatch: pytest.MonkeyPatch, shift: float) -> None:
    """Eager in the call's own dtype made wrong by `shift` (as CUDA's bf16 group norm is on large-mean groups, by its
    statistics' rounding); the op in float64 left exact."""
    from kernelforge_tui.cast import probe

    real = probe.aten_call

    def call(entry: object, tensors: dict[str, torch.Tensor]) -> tuple[object, list[object], dict[str, object]]:
        op, args, kwargs = real(entry, tensors)  # type: ignore[arg-type]

        def rounded_badly(*a: object, **k: object) -> torch.Tensor:
            out = op(*a, **k)
            return out if out.dtype == torch.float64 else out + shift

        return rounded_badly, args, kwargs

    monkeypatch.setattr(probe, "aten_call", call)


def test_where_eager_is_off_by_its_own_rounding_the_op_in_float64_decides(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _eager_off_by(monkeypatch, 0.5)
    path, driver = _package(tmp_path)
    package = read_package(path)
    runner = KernelRunner(package, package.manifest.kernels[0], device_type="cpu", driver=driver)
    result = check_kernel(package, runner, timing=False, fresh=FRESH_SEEDS, device=torch.device("cpu"))
    assert result.ok, result.reason
    assert result.sets[0].detail.startswith("agrees with the op in float64 where eager in its dtype does not (y: ")
    path, driver = _package(tmp_path / "wrong", wrong=True)
    package = read_package(path)
    runner = KernelRunner(package, package.manifest.kernels[0], device_type="cpu", driver=driver)
    result = check_kernel(package, runner, timing=False, fresh=FRESH_SEEDS, device=torch.device("cpu"))
    assert not result.ok and result.reason.startswith("set captured_0: disagrees with eager PyTorch: y: ")
