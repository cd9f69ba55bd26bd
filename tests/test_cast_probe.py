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

from .fixtures.cast.cast_support import EXAMPLES, HostSoftmax, softmax_entry, write_cast  # noqa: E402

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
    files = {n: d for n, d in package.members.items() if n != "manifest.json"}
    write_package(
        path, package.manifest.model_copy(update={"kernels": [entry.model_copy(update={"guard": guard})]}), files
    )
    package = read_package(path)
    runner = KernelRunner(package, package.manifest.kernels[0], device_type="cpu", driver=driver)
    result = check_kernel(package, runner, timing=False, fresh=FRESH_SEEDS, device=torch.device("cpu"))
    assert result.ok, result.reason
    assert len(driver.launches) == len(result.sets) > 5
