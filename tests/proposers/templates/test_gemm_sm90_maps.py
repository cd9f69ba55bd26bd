"""The gemm_sm90 template's TMA maps against CUTLASS's own: for a render, the maps the harness encodes from the plan
(`operand_maps`, resolved over the card's tensors) must ask cuTensorMapEncodeTiled for exactly what CUTLASS's host
make_tma_copy asks for the same collective, or the mainloop would read tiles laid out otherwise than its wgmma
expects. CUTLASS's side comes from a small host program (tests/support/cuda/tma_maps_host.cu) that includes the
rendered candidates up to their entry and records the driver call instead of making it: no GPU needed. The program
takes ~30 s of nvcc; it is kept in the session's cache, by the hash of what it is built from."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from kernelforge_tui.build.cutlass_headers import find_cutlass
from kernelforge_tui.build.nvcc import CUTLASS_FLAGS
from kernelforge_tui.cards.model import OperatorCard
from kernelforge_tui.cards.plan import resolve
from kernelforge_tui.proposers.templates.gemm_sm90 import GemmParams
from tests.proposers.templates.test_gemm_sm90 import TEMPLATE, TMA, gemm_card
from tests.support.cutlass_marks import needs_cutlass

pytestmark = [needs_cutlass, pytest.mark.xdist_group("gemm_sm90_maps")]  # one worker builds the programs
HOST_PROGRAM = Path(__file__).parents[2] / "support" / "cuda" / "tma_maps_host.cu"
CUTLASS_UINT16 = 1
"""CU_TENSOR_MAP_DATA_TYPE_UINT16: CUTLASS copies a 16-bit element as its bits; the harness names the tensor's own
type (bfloat16, 9), which a copy moves bit for bit the same."""
SIZES = {"M": 2000, "N": 1032, "K": 1000}
CASES: list[tuple[str, OperatorCard, GemmParams]] = [
    # K-major a and b (x @ W^T), b multicast over a 2x1 cluster
    ("k_major", gemm_card(["M", "K"], ["N", "K"], SIZES), TMA.but(tile_n=256, cluster_m=2)),
    # MN-major a and b (transposed views), batched, a multicast over a 1x2 cluster, a 32-wide K tile
    (
        "mn_major",
        gemm_card(["K", "M"], ["K", "N"], {**SIZES, "batch": 3}),
        TMA.but(tile_m=64, tile_k=32, schedule="pingpong", cluster_n=2),
    ),
    # K-major a with a 32-wide K tile: a 64-byte swizzle
    ("k32", gemm_card(["M", "K"], ["K", "N"], SIZES), TMA.but(tile_m=256, tile_k=32, cluster_n=2)),
]


def cutlass_maps(cases: list[tuple[str, OperatorCard, GemmParams]], cache: Path) -> dict[str, list[dict[str, Any]]]:
    """What CUTLASS's host code asks of the driver for a's and b's maps of each case's render, in that order: one host
    program for them all (CUTLASS's headers parsed once)."""
    headers = find_cutlass()
    nvcc = shutil.which("nvcc")
    assert headers is not None and nvcc is not None
    includes: set[str] = set()
    bodies: list[str] = []
    defines = [f"-DKF_CASES={len(cases)}"]
    for number, (_, card, params) in enumerate(cases):
        render, _ = TEMPLATE.render(card, params)
        # the host program needs the collective's types, not the kernel: its device code is most of nvcc's time (the
        # render's types and asserts stay, word for word)
        lines = render[: render.index('\nextern "C"')].splitlines()
        includes |= {line for line in lines if line.startswith("#include <")}
        bodies.append("\n".join(line for line in lines if not line.startswith("#include <")) + "\n")
        sizes = {name: card.sizes.get(name, 1) for name in "MNK"} | {"L": card.sizes.get("batch", 1)}
        defines += [f"-DKF_{name}_{number}={size}" for name, size in sizes.items()]  # nvcc splits values at commas
    header_text = "\n".join(sorted(includes)) + "\n"
    built_from = [header_text, *bodies, HOST_PROGRAM.read_text(), *defines, headers.tree_hash]
    key = hashlib.sha256("\0".join(built_from).encode())
    folder = cache / f"tma_maps_{key.hexdigest()[:16]}"
    program = folder / "maps"
    if not program.exists():
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "headers.cuh").write_text(header_text)
        for number, body in enumerate(bodies):
            (folder / f"case_{number}.cu").write_text(body)
        target = ["-gencode=arch=compute_90a,code=sm_90a"]  # one device pass (-arch=sm_90a makes two: ~20% more)
        command = [nvcc, "-std=c++17", *target, *CUTLASS_FLAGS, f"-I{folder}", f"-I{headers.root}", *defines]
        made = folder / f"maps.{os.getpid()}"  # renamed into place whole: another process may build it too
        command += ["-UNDEBUG", "-o", str(made), str(HOST_PROGRAM)]
        built = subprocess.run(command, capture_output=True, text=True, timeout=600)
        assert built.returncode == 0, built.stderr[-3000:]
        made.replace(program)
    ran = subprocess.run([str(program)], capture_output=True, text=True, timeout=60, check=True)
    *printed, rest = ran.stdout.split("--\n")
    assert len(printed) == len(cases) and rest == "", ran.stdout
    return {
        name: [json.loads(line) for line in text.splitlines()]
        for (name, _, _), text in zip(cases, printed, strict=True)
    }


@pytest.fixture(scope="module")
def recorded(cubin_cache: Path) -> dict[str, list[dict[str, Any]]]:
    """CUTLASS's maps for every case (~30 s of nvcc, where a program per case took ~25 s each)."""
    return cutlass_maps(CASES, cubin_cache.parent)


@pytest.mark.parametrize(("name", "card", "params"), CASES, ids=[name for name, _, _ in CASES])
def test_the_harness_encodes_the_maps_cutlass_builds_for_the_collective(
    recorded: dict[str, list[dict[str, Any]]], name: str, card: OperatorCard, params: GemmParams
) -> None:
    _, plan = TEMPLATE.render(card, params)
    launch = resolve(plan, card)
    ours = [a.tensor_map for a in launch.args if a.tensor_map is not None]
    assert [m.tensor for m in ours] == ["a", "b"]
    theirs = recorded[name]
    assert len(theirs) == 2
    for mine, cutlass in zip(ours, theirs, strict=True):
        assert cutlass["data_type"] == CUTLASS_UINT16 and mine.element_bytes == 2
        assert (cutlass["interleave"], cutlass["oob_fill"], cutlass["element_strides"]) == (0, 0, [1, 1, 1])
        got = {"dims": list(mine.dims), "strides": list(mine.strides), "box": list(mine.box)}
        got |= {"swizzle": mine.swizzle, "l2_promotion": mine.l2_promotion}
        assert got == {k: cutlass[k] for k in got}, f"map of {mine.tensor}"
