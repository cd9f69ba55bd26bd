"""GPU detection reads nvidia-smi and respects CUDA_VISIBLE_DEVICES as CUDA does, keeping nvidia-smi's indices."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from kernelforge_tui.gpu.detect import GpuInfo, detect_gpus, visible

SMI_LINES = [
    "0, NVIDIA H200, GPU-aaaa1111, 9.0, 580.1, 143771",
    "1, NVIDIA H200, GPU-bbbb2222, 9.0, 580.1, 143771",
    "2, NVIDIA L4, GPU-cccc3333, 8.9, 580.1, 23034",
]


def _gpus() -> list[GpuInfo]:
    return [
        GpuInfo(index=i, name="g", uuid=f"GPU-{c * 4}{i}", capability="9.0", driver="580", memory_mib=1)
        for i, c in enumerate("abc")
    ]


@pytest.mark.parametrize(
    ("mask", "indices"),
    [
        (None, [0, 1, 2]),
        ("", []),
        ("1", [1]),
        ("2,0", [2, 0]),
        ("1, 2", [1, 2]),
        ("GPU-bbbb", [1]),
        ("GPU-cccc2,0", [2, 0]),
        ("0,7,1", [0]),  # CUDA stops at the first entry naming no GPU
        ("GPU-", []),  # a prefix naming several GPUs names none
        ("1,1", [1]),
        ("MIG-x", []),
    ],
)
def test_visible_reads_the_mask_as_cuda_does(mask: str | None, indices: list[int]) -> None:
    assert [g.index for g in visible(_gpus(), mask)] == indices


def test_detect_keeps_nvidia_smi_indices_of_the_visible_gpus(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    smi = tmp_path / "nvidia-smi"
    smi.write_text("#!/bin/sh\n" + "".join(f"echo '{line}'\n" for line in SMI_LINES))
    smi.chmod(smi.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert [(g.index, g.name) for g in detect_gpus()] == [(0, "NVIDIA H200"), (1, "NVIDIA H200"), (2, "NVIDIA L4")]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,1")
    chosen = detect_gpus()
    assert [(g.index, g.uuid, g.arch) for g in chosen] == [(2, "GPU-cccc3333", "sm_89"), (1, "GPU-bbbb2222", "sm_90")]
