"""The time a kernel saves per forward pass: export counts, from the capture, the calls of one forward pass each
kernel's guard admits (`KernelEntry.per_forward`), and `kernelforge export`, `cast.report()` and `kernelforge run`
say, in one line per kernel (`kernel_line`), where it is used and what it saves per call and per forward.

The capture is tests/support/fixtures/per_forward_model.py on the CPU: a softmax of x[0] (one call) and of x[1]
(two calls, another storage offset: another variant the same guard admits), a softmax of other shapes, and a bias
add before a GELU twice (one chain variant of two instances). The format-2 package (format2_softmax.cast beside the
support code) was written by the format-2 code, kernelforge at commit a18c7d9."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from kernelforge_tui.build.nvcc import find_nvcc  # noqa: E402
from kernelforge_tui.capture import load_capture  # noqa: E402
from kernelforge_tui.capture.manifest import Variant  # noqa: E402
from kernelforge_tui.capture.run import CaptureRequest, capture_model  # noqa: E402
from kernelforge_tui.cards import load_card  # noqa: E402
from kernelforge_tui.cast import load  # noqa: E402
from kernelforge_tui.cast.manifest import (  # noqa: E402
    Chain,
    PerForward,
    kernel_line,
    read_package,
)
from kernelforge_tui.cast.runtime import Cast  # noqa: E402
from kernelforge_tui.cli.main import main  # noqa: E402
from kernelforge_tui.proposers.templates import TemplateProposer  # noqa: E402
from tests.support.fixtures.cast.cast_support import (  # noqa: E402
    MACHINE,
    HostSoftmax,
    make_run,
    scale_softmax_chain,
    softmax_entry,
    write_cast,
)
from tests.support.nvcc_marks import needs_nvcc  # noqa: E402

pytestmark = pytest.mark.xdist_group(__name__)  # its module fixture is made once, on one worker
MODEL = Path(__file__).parents[1] / "support" / "fixtures" / "per_forward_model.py"
FORMAT_2 = Path(__file__).parents[1] / "support" / "fixtures" / "cast" / "format2_softmax.cast"
HERE = MACHINE.model_copy(update={"torch_version": str(torch.__version__)})


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(the capture, its package): made-up GPU runs of the x[0] softmax (its card's baseline) and of the bias_gelu
    chain (its template's first seed), exported without the GPU checks."""
    if find_nvcc() is None:
        pytest.skip("nvcc is not installed (CI has it)")
    root = tmp_path_factory.mktemp("per_forward")
    capture = root / "model.capture"
    capture_model(CaptureRequest(MODEL, capture, device="cpu", repeats=1, samples=1))
    first, _, _ = _softmaxes(capture)
    chain = _chain(capture)
    assert first.card is not None and chain.card is not None
    card = load_card(capture / first.card)
    assert card.spec.baseline is not None
    make_run(capture / "runs" / "softmax", card.root, card.baseline_source(), card.spec.baseline.plan, 10.0, 100.0)
    seed = TemplateProposer().seeds(load_card(capture / chain.card).spec)[0]
    make_run(capture / "runs" / "bias_gelu", capture / chain.card, seed.source, seed.plan, 10.0, 100.0)
    path = root / "model.cast"
    assert main(["export", str(capture), "-o", str(path), "--no-sanitize", "--arch", "sm_90", "--json"]) == 0
    return capture, path


def _softmaxes(capture: Path) -> list[Variant]:
    """The softmax variants in order of first appearance: x[0], x[1], other."""
    found = [v for v in load_capture(capture).variants if v.op == "aten._softmax.default" and v.card]
    return sorted(found, key=lambda v: v.id)


def _chain(capture: Path) -> Variant:
    (chain,) = [v for v in load_capture(capture).variants if v.op == "bias_gelu"]
    return chain


@needs_nvcc
def test_a_kernel_counts_the_calls_of_every_variant_its_guard_admits(exported: tuple[Path, Path]) -> None:
    capture, path = exported
    first, second, other = _softmaxes(capture)
    assert (first.calls, second.calls, other.calls) == (1, 2, 1)
    assert first.steps[0].args[0].tensor is not None and second.steps[0].args[0].tensor is not None
    assert (first.steps[0].args[0].tensor.storage_offset, second.steps[0].args[0].tensor.storage_offset) == (0, 256)
    manifest = read_package(path).manifest
    assert manifest.format_version == 3
    kernels = {k.guard.overload: k for k in manifest.kernels}
    softmax = kernels["aten::_softmax.default"]
    assert softmax.per_forward == PerForward(calls=3, variants=[first.id, second.id])  # not the [4, 16] softmax's


@needs_nvcc
def test_a_chains_kernel_counts_the_chains_instances(exported: tuple[Path, Path]) -> None:
    capture, path = exported
    chain = _chain(capture)
    kernel = next(k for k in read_package(path).manifest.kernels if k.chain is not None)
    assert chain.calls == 2 and len(chain.instances) == 2
    assert kernel.per_forward == PerForward(calls=2, variants=[chain.id])


@needs_nvcc
def test_export_prints_the_lines_the_report_prints(
    exported: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    capture, _ = exported
    path = tmp_path / "again.cast"
    assert main(["export", str(capture), "-o", str(path), "--no-sanitize", "--arch", "sm_90"]) == 0
    printed = " ".join(capsys.readouterr().out.split())  # rich wraps long lines
    manifest = read_package(path).manifest
    for kernel in manifest.kernels:
        assert " ".join(kernel_line(manifest, kernel).split()) in printed
    assert "3 calls per forward" in printed and "2 chains per forward" in printed
    assert "not timed against eager yet (10.00x the card's baseline in the search)" in printed
    main(["export", str(capture), "-o", str(path), "--no-sanitize", "--arch", "sm_90", "--json"])
    (softmax, chain) = sorted(json.loads(capsys.readouterr().out)["kernels"], key=lambda k: k["serves"] == ["compile"])
    assert softmax["per_forward"]["calls"] == 3 and chain["per_forward"]["calls"] == 2
    assert softmax["saved_per_forward_us"] is None  # nothing timed against eager on a GPU yet


def _cast(tmp_path: Path, per_forward: PerForward | None, chain: Chain | None = None) -> Cast:
    """A stamped package of the tests' softmax kernel (1.0 us against eager's 2.0 at verification), loaded for CPU
    calls through the host stand-in."""
    entry, files = softmax_entry(alignment=64)  # torch's CPU allocator promises 64 bytes
    entry = entry.model_copy(update={"per_forward": per_forward, "chain": chain})
    path = write_cast(tmp_path / "m.cast", [(entry, files)], machine=HERE)
    return load(path, machine=HERE, dispatch_key="CPU", device_type="cpu", driver=HostSoftmax())


def test_the_report_says_eager_and_the_time_saved_per_forward(tmp_path: Path) -> None:
    with _cast(tmp_path, PerForward(calls=3, variants=["v02", "v04"])) as cast:
        torch.softmax(torch.randn(4, 8), -1)
        torch.softmax(torch.randn(4, 8), -1)
    (line,) = [line for line in cast.report().splitlines() if "k0-softmax" in line]
    assert line == (
        "  k0-softmax: aten::_softmax.default(x[4x8] float32): 2 hits, 0 fallbacks; used in: eager; 1.0 us saved per "
        "call (1.0 vs eager 2.0 us at verification on NVIDIA H200); 3 calls per forward (v02, v04): 3.0 us saved per "
        "forward"
    )


def test_the_report_says_compile_or_both_from_the_counters(tmp_path: Path) -> None:
    cast = _cast(tmp_path, PerForward(calls=1, variants=["v02"]))
    (runner,) = cast.runners
    runner.graph_nodes, runner.compiled_calls = 1, 4
    assert "compiled: 1 graph nodes, 4 op calls; used in: compile; 1.0 us saved per call" in cast.report()
    runner.hits = 5
    assert "5 hits, 0 fallbacks; compiled: 1 graph nodes, 4 op calls; used in: both;" in cast.report()
    assert "1 call per forward (v02): 1.0 us saved per forward" in cast.report()


def test_the_report_divides_the_calls_by_the_forwards_the_caller_counted(tmp_path: Path) -> None:
    with _cast(tmp_path, PerForward(calls=3, variants=["v02", "v04"])) as cast:
        for _ in range(4):
            torch.softmax(torch.randn(4, 8), -1)
    cast.runners[0].compiled_calls = 2  # and two calls of its op in compiled graphs
    assert "observed" not in cast.report()  # the runtime alone does not know the forwards
    assert (
        "4 hits, 0 fallbacks; compiled: 0 graph nodes, 2 op calls; observed 3.00 calls per forward over 2 forwards "
        "(a CUDA graph's replays call nothing: not counted); used in: both;"
    ) in cast.report(forwards=2)
    assert "3 calls per forward (v02, v04): 3.0 us saved per forward" in cast.report(forwards=2)


def test_a_chains_kernel_is_compile_only_its_eager_time_all_its_calls(tmp_path: Path) -> None:
    chain = scale_softmax_chain()
    cast = _cast(tmp_path, PerForward(calls=4, variants=["v11"]), chain)
    (runner,) = cast.runners
    runner.graph_nodes = 2
    assert (
        "0 hits, 0 fallbacks; compiled: 2 graph nodes, 0 op calls; used in: compile (a fused chain: compile only); "
        "1.0 us saved per call (1.0 vs eager 2.0 us for its 2 calls at verification on NVIDIA H200); 4 chains per "
        "forward (v11): 4.0 us saved per forward"
    ) in cast.report()
    manifest = cast.runners[0].package.manifest
    assert ": serves: compile only (a fused chain); 1.0 us saved per call" in kernel_line(manifest, manifest.kernels[0])


def test_a_kernel_exported_from_a_run_has_no_calls_per_forward(tmp_path: Path) -> None:
    cast = _cast(tmp_path, None)
    assert "; calls per forward unknown (exported from a run, not a capture)" in cast.report()


def test_a_package_from_an_older_export_loads_and_reports(tmp_path: Path) -> None:
    package = read_package(FORMAT_2)
    assert package.manifest.format_version == 2 and package.manifest.kernels[0].per_forward is None
    stamp = package.manifest.stamp
    assert stamp is not None
    with load(FORMAT_2, machine=stamp.machine, dispatch_key="CPU", device_type="cpu", driver=HostSoftmax()) as cast:
        torch.softmax(torch.randn(4, 8), -1)
    assert (
        "1 hits, 0 fallbacks; used in: eager; 1.0 us saved per call (1.0 vs eager 2.0 us at verification on NVIDIA "
        "H200); calls per forward unknown (package from an older export)"
    ) in cast.report()
    shutil.copy(FORMAT_2, tmp_path / "copy.cast")  # written again (as verify does), it stays format 2, stamp matching
    from kernelforge_tui.cast.manifest import write_package

    write_package(tmp_path / "copy.cast", package.manifest, package.members)
    assert (tmp_path / "copy.cast").read_bytes() == FORMAT_2.read_bytes()
