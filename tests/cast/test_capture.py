"""Exporting from a capture directory: the decoder block captured on the CPU (torch), a made-up GPU run of its
softmax variant, and the package's guard taken from the captured call; every variant audited.

The softmax the model runs is over the last axis of [2, 4, 16, 16]; its card (and kernel) see the same elements as
[rows, cols] = [128, 16]. The guard, the GPU check's calls, the sanitizer's launch and the runtime must all take the
op's own shapes, and hand the kernel those tensors as the card's row-major view (on the H200 the decoder's
[2, 16, 1024, 1024] softmax was left out: "the guard refuses the very call it was made for: shape arg0[32768, 1024]").
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from kernelforge_tui.build.nvcc import find_nvcc  # noqa: E402
from kernelforge_tui.capture.loader import Entry, build  # noqa: E402
from kernelforge_tui.capture.manifest import load_capture  # noqa: E402
from kernelforge_tui.cards import load_card  # noqa: E402
from kernelforge_tui.cast import load  # noqa: E402
from kernelforge_tui.cast.bindings import from_variant  # noqa: E402
from kernelforge_tui.cast.export import export  # noqa: E402
from kernelforge_tui.cast.manifest import read_package, write_package  # noqa: E402
from kernelforge_tui.cast.probe import FRESH_SEEDS, check_kernel, sanitizer_call  # noqa: E402
from kernelforge_tui.cast.runtime import KernelRunner  # noqa: E402
from kernelforge_tui.cli.main import main  # noqa: E402
from tests.support.fixtures.cast.cast_support import EXAMPLES, MACHINE, HostSoftmax, make_run, stamped  # noqa: E402
from tests.support.nvcc_marks import needs_nvcc  # noqa: E402

MODEL = EXAMPLES / "models" / "decoder_block.py"
HERE = MACHINE.model_copy(update={"torch_version": str(torch.__version__)})


@pytest.fixture(scope="module")
def captured(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("capture") / "decoder"
    assert main(["capture", str(MODEL), "--device", "cpu", "-o", str(out)]) == 0
    return out


def _softmax(capture: Path) -> tuple[object, Path]:
    manifest = load_capture(capture)
    (variant,) = [v for v in manifest.variants if v.op == "aten._softmax.default" and v.card]
    assert variant.card is not None
    return variant, capture / variant.card


def test_a_captured_softmax_binds_to_its_exact_call(captured: Path) -> None:
    variant, card_dir = _softmax(captured)
    binding = from_variant(variant, load_card(card_dir).spec)
    assert not isinstance(binding, str), binding
    assert binding.overload == "aten::_softmax.default"
    (x,) = binding.inputs
    assert x.shape == (2, 4, 16, 16) and x.dtype == "bfloat16" and x.strides == (1024, 256, 16, 1)
    assert x.card_shape == (128, 16)  # the kernel's view of the same elements
    assert 0 < x.alignment <= 256
    assert [(a.position, a.tensor, a.accepts) for a in binding.args] == [
        (0, "x", []),
        (1, None, [-1]),
        (2, None, [False]),
    ]
    assert [(t.name, t.shape, t.card_shape) for t in binding.outputs] == [("y", (2, 4, 16, 16), (128, 16))]


def test_a_fused_pattern_binds_as_a_chain_for_the_compile_path_only(captured: Path) -> None:
    manifest = load_capture(captured)
    pattern = next(v for v in manifest.variants if v.kind == "pattern" and v.op == "silu_mul" and v.card)
    assert pattern.card is not None
    binding = from_variant(pattern, load_card(captured / pattern.card).spec)
    assert not isinstance(binding, str), binding
    assert binding.overload == "kernelforge::silu_mul" and binding.chain is not None
    assert [s.overload for s in binding.chain.steps] == ["aten::silu.default", "aten::mul.Tensor"]


@needs_nvcc
def test_export_from_a_capture_audits_every_variant(captured: Path, tmp_path: Path) -> None:
    capture = tmp_path / "decoder"
    shutil.copytree(captured, capture)
    variant, card_dir = _softmax(capture)
    card = load_card(card_dir)
    assert card.spec.baseline is not None
    make_run(capture / "runs" / "softmax", card_dir, card.baseline_source(), card.spec.baseline.plan, 10.0, 100.0)
    manifest = export(capture, tmp_path / "model.cast", sanitize=False, arch="sm_90")
    (kernel,) = manifest.kernels
    assert kernel.guard.inputs[0].shape == (2, 4, 16, 16) and kernel.guard.overload == "aten::_softmax.default"
    assert kernel.variant.startswith(variant.id)  # type: ignore[attr-defined]
    decisions = {a.variant.split()[0]: (a.decision, a.reason) for a in manifest.audit}
    assert len(decisions) == len(load_capture(capture).variants)
    assert list(decisions) == [v.id for v in load_capture(capture).variants]  # the ranking, the kernel in its place
    assert decisions[variant.id][0] == "kernel"  # type: ignore[attr-defined]
    others = [reason for vid, (decision, reason) in decisions.items() if decision == "fallback"]
    chains = [v.id for v in load_capture(capture).variants if v.kind == "pattern" and v.card]
    assert chains and all("no run of its card" in decisions[vid][1] for vid in chains)  # a chain may have a kernel
    assert any("no run of its card" in r for r in others), others


# -- the op's shapes against the card's -----------------------------------------------------------------------


@pytest.fixture(scope="module")
def package(captured: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The softmax variant's baseline exported from a made-up GPU run (unverified), stamped for this machine."""
    if find_nvcc() is None:
        pytest.skip("nvcc is not installed (CI has it)")
    root = tmp_path_factory.mktemp("exported")
    capture = root / "decoder"
    shutil.copytree(captured, capture)
    _, card_dir = _softmax(capture)
    card = load_card(card_dir)
    assert card.spec.baseline is not None
    make_run(capture / "runs" / "softmax", card_dir, card.baseline_source(), card.spec.baseline.plan, 10.0, 100.0)
    path = root / "model.cast"
    export(capture, path, sanitize=False, arch="sm_90")
    # The capture keeps each pointer's own alignment (on the CPU 64 to 256 bytes, by chance); torch's CPU allocator
    # promises 64, so the guard here takes 64 for the model's call to pass it every time.
    built = read_package(path)
    (kernel,) = built.manifest.kernels
    x = kernel.guard.inputs[0].model_copy(update={"alignment": 64})
    kernel = kernel.model_copy(update={"guard": kernel.guard.model_copy(update={"inputs": [x]})})
    files = built.members
    write_package(path, built.manifest.model_copy(update={"kernels": [kernel]}), files)
    return stamped(path, HERE)


def _runner(path: Path, driver: HostSoftmax) -> KernelRunner:
    package = read_package(path)
    (entry,) = package.manifest.kernels
    return KernelRunner(package, entry, device_type="cpu", driver=driver)


def test_the_package_guards_the_ops_shapes_and_launches_the_cards(package: Path) -> None:
    (kernel,) = read_package(package).manifest.kernels
    (x,), (y,) = kernel.guard.inputs, kernel.guard.outputs
    assert (x.shape, x.card_shape, y.shape, y.card_shape) == ((2, 4, 16, 16), (128, 16), (2, 4, 16, 16), (128, 16))
    assert kernel.launch.grid == (128, 1, 1)
    assert [(a.name, a.value) for a in kernel.launch.args if a.kind == "scalar"] == [("rows", 128), ("cols", 16)]


def test_the_gpu_check_calls_the_op_with_its_own_shapes(package: Path) -> None:
    driver = HostSoftmax(dtype="bfloat16")
    runner = _runner(package, driver)
    result = check_kernel(read_package(package), runner, timing=False, fresh=FRESH_SEEDS, device=torch.device("cpu"))
    assert result.ok, result.reason
    names = [s.name for s in result.sets]
    assert names[0] == "captured_0" and [n for n in names if n.startswith("fresh:")] == [
        f"fresh:{s}" for s in FRESH_SEEDS
    ]
    assert any(n.startswith("stress:") for n in names)
    assert len(driver.launches) == len(names)
    alignment = runner.entry.guard.inputs[0].alignment
    assert all(pointers[0] % alignment == 0 for _, _, _, pointers in driver.launches)


def test_a_wrong_kernel_is_still_caught_through_the_cards_view(package: Path) -> None:
    runner = _runner(package, HostSoftmax(wrong=True, dtype="bfloat16"))
    result = check_kernel(read_package(package), runner, timing=False, fresh=FRESH_SEEDS, device=torch.device("cpu"))
    assert not result.ok and result.reason.startswith("set captured_0: disagrees with eager PyTorch: y: ")


def test_the_sanitizer_launch_places_the_ops_tensors_at_their_allocations_end(package: Path) -> None:
    driver = HostSoftmax(dtype="bfloat16")
    runner = _runner(package, driver)
    admitted = sanitizer_call(read_package(package), runner, torch.device("cpu"))
    assert not isinstance(admitted, str), admitted
    (x,) = admitted
    guard = runner.entry.guard.inputs[0]
    assert tuple(x.shape) == (2, 4, 16, 16) and x.is_contiguous()
    assert x.data_ptr() % guard.alignment == 0 and x.data_ptr() % 256 == guard.alignment % 256  # the weakest
    storage = x.untyped_storage()
    slack = storage.data_ptr() + storage.nbytes() - (x.data_ptr() + x.numel() * x.element_size())
    # Nothing after it where the allocator starts buffers 256-aligned (CUDA's); up to 256 bytes where it does not.
    assert slack == 0 or (storage.data_ptr() % 256 and 0 <= slack <= 256)
    out = runner.launch(admitted)
    assert isinstance(out, torch.Tensor) and tuple(out.shape) == (2, 4, 16, 16)
    assert torch.allclose(out.float(), torch.softmax(x.float(), -1), rtol=0.016, atol=1e-6)


def test_the_model_runs_the_kernel_in_place_of_its_softmax(captured: Path, package: Path) -> None:
    manifest = load_capture(captured)
    built = build(Path(manifest.model_file), Entry.parse(manifest.entry), {"device": "cpu", **manifest.entry_kwargs})
    assert callable(built.model)
    with torch.no_grad():
        eager = built.model(*built.args, **built.kwargs)
        driver = HostSoftmax(dtype="bfloat16")
        with load(package, machine=HERE, dispatch_key="CPU", device_type="cpu", driver=driver) as cast:
            ours = built.model(*built.args, **built.kwargs)
    stats = cast.stats()
    (kernel,) = stats.kernels
    assert (kernel.hits, kernel.fallbacks, stats.fallbacks) == (1, {}, 0), cast.report()
    grid, _, _, _ = driver.launches[0]
    assert grid == (128, 1, 1)
    assert isinstance(eager, torch.Tensor) and isinstance(ours, torch.Tensor) and ours.shape == eager.shape
    scale = float(eager.float().abs().max())
    assert float((ours.float() - eager.float()).abs().max()) <= 0.02 * scale
