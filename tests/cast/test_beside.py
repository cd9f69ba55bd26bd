"""`cast.beside`: a searched kernel and its task's vendor timed in one process on the same torch tensors.

On the GPU (`pytest -m gpu`): the sparse template's first seed for spmv_csr and cuSPARSE, through the real program
(`python -m kernelforge_tui.cast.beside` in the bench's `VendorTimer`): both checked against the card's reference,
then timed interleaved. A kernel that leaves rows unwritten is caught by the check and nothing is timed. Off the
GPU: a request without a GPU device is refused in words.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import pytest

from kernelforge_tui.build.nvcc import Builder
from kernelforge_tui.cards.plan import resolve
from kernelforge_tui.cast.beside import BesideReply, BesideRequest, time_beside
from kernelforge_tui.engine.vendor_timer import VendorTimer
from kernelforge_tui.gpu.detect import require_gpu
from kernelforge_tui.proposers.templates import TemplateProposer
from kernelforge_tui.suite import cards
from kernelforge_tui.suite.registry import task

pytest.importorskip("torch", reason="the side-by-side timing runs in torch's process (CI installs it: .ci/run)")

BESIDE = [sys.executable, "-m", "kernelforge_tui.cast.beside"]
HALF_ROWS = """extern "C" __global__ void kf_spmv_csr(const float* values, const int* col_idx, const int* row_ptr,
    const float* x, float* y, int nrows) {
    const int row = blockIdx.x * blockDim.x + threadIdx.x;
    if (row < nrows / 2) {  // the later half of the rows is never written
        float sum = 0.0f;
        for (int p = row_ptr[row]; p < row_ptr[row + 1]; ++p) {
            sum += values[p] * x[col_idx[p]];
        }
        y[row] = sum;
    }
}
"""


def test_a_request_for_the_cpu_is_refused_in_words(tmp_path: Path) -> None:
    card = cards.write(task("spmv_csr"), "float32", 2**10, tmp_path)
    seed = TemplateProposer().seeds(card)[0]
    request = BesideRequest(
        card_dir=card.root, device="cpu", cubin=tmp_path / "k.cubin", launch=resolve(seed.plan, card.spec)
    )
    reply = time_beside(request)
    assert reply.error == "a kernel runs on a GPU: device 'cpu' cannot time one"
    assert reply.samples_us == reply.kernel_samples_us == []


@pytest.mark.gpu
def test_the_first_csr_seed_and_cusparse_are_checked_and_timed_side_by_side(tmp_path: Path, cubin_cache: Path) -> None:
    require_gpu()
    card = cards.write(task("spmv_csr"), "float32", 2**22, tmp_path)
    seed = TemplateProposer().seeds(card)[0]
    builder = Builder(arch="sm_90", cache_dir=cubin_cache, work_dir=tmp_path)

    async def beside(source: str) -> BesideReply:
        built = await builder.build(source, seed.plan.entry)
        assert built.ok and built.cubin_path is not None, built.log
        request = BesideRequest(
            card_dir=card.root, reps=20, cubin=built.cubin_path, launch=resolve(seed.plan, card.spec)
        )
        timer = VendorTimer(argv=BESIDE)
        try:
            return await timer.time_as(request, BesideReply)
        finally:
            await timer.close()

    reply = asyncio.run(beside(seed.source))
    assert reply.error == "" and reply.agrees is True and reply.kernel_agrees is True, reply
    assert len(reply.samples_us) == len(reply.kernel_samples_us) == 20
    assert all(t > 0 for t in reply.samples_us + reply.kernel_samples_us)
    print(f"cuSPARSE {sorted(reply.samples_us)[10]:.1f} us, ours {sorted(reply.kernel_samples_us)[10]:.1f} us")

    wrong = asyncio.run(beside(HALF_ROWS))
    assert wrong.agrees is True and wrong.kernel_agrees is False
    assert wrong.kernel_check.startswith("y: ") and wrong.samples_us == wrong.kernel_samples_us == []
