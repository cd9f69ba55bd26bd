"""A CPU stand-in for CUDA launches, for the template tests that check a kernel's logic without a GPU: every CUDA
thread of a block a fiber, __syncthreads and warp shuffles barriers (so a missing barrier, a divergent shuffle or a
share summed twice shows; the C++ runtime is tests/support/cuda_emulator.h). A test renders its kernels from the
package's CUDA files, gives each a runner (its launch, reading the case's inputs from a directory and writing the
outputs there), and `build` compiles them into one program per name with g++.

Thread block clusters (a kernel with __cluster_dims__, launched with `emu_cluster_blocks`): the fibers of all the
cluster's blocks run together, cluster.sync() a barrier over them, each block with shared memory of its own
(`kernel_namespace` declares the kernel's __shared__ arrays in a per-block arena), map_shared_rank the same address
in another block's. A block's shared memory starts as NaN bytes and turns to NaN again when its last thread leaves
(read after release), and the cluster's blocks run one at a time till each finishes or waits at cluster.sync(), in
rank order between even-numbered cluster barriers and in reverse between odd ones (`emu::order` 1: the other way
round), so a missing cluster.sync() shows, and an output two blocks write differs between the two orders.

The helpers the kernels write in PTX (EMULATED_HELPERS) are the emulator's own: the tensor-core kernels' cp.async,
ldmatrix and mma.sync (warp collectives over the PTX ISA's fragment layouts, bf16 in and fp32 sums), and the sm_90
mbarrier helpers (bulk copies, and the cluster exchanges that store into other blocks' shared memory): a store
into a block whose barrier is not yet initialised, or that has left, fails; a wait lets the other blocks run till
the phase it waits for completes.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path

import pytest

from kernelforge_tui.cards.plan import ResolvedLaunch

EMULATOR = "\n" + (Path(__file__).parent / "cuda_emulator.h").read_text()
"""The runtime the emulated kernels run on (tests/support/cuda_emulator.h): fibers, barriers, shuffles, clusters."""


C_LINKAGE = 'extern "C" '
FLAGS = ["-std=c++17", "-O1", "-fno-strict-aliasing", "-Wno-unknown-pragmas", "-U_FORTIFY_SOURCE"]


DYNAMIC_SHARED = re.compile(r"extern __shared__ (?:__align__\(\d+\) )?(\w+(?: \w+)*) (\w+)\[\];")
STATIC_SHARED = re.compile(r"__shared__ ([^;\[=]+?) (\w+)((?:\[[^\];]+\])*);")
"""A static __shared__ declaration: its type, name and dimensions."""


def per_block_shared(source: str, shared_bytes: int) -> str:
    """A clustered kernel's __shared__ arrays as references into the running block's arena (emu::shared), at
    offsets reserved once per declaration (a dynamic one `shared_bytes` long), so each block of a cluster has its
    own; map_shared_rank then finds the same array in another block's arena."""

    def declare(m: re.Match[str]) -> str:
        kind, name = f"{m[1]}{m[3]}", m[2]
        at = f"static const size_t {name}_at = emu::reserve(sizeof({kind}));"
        return f"{at} auto& {name} = emu::shared<{kind}>({name}_at);"

    def declare_dynamic(m: re.Match[str]) -> str:
        at = f"static const size_t {m[2]}_at = emu::reserve({max(shared_bytes, 16)});"
        return f"{at}\n{m[1]}* const {m[2]} = &emu::shared<{m[1]}>({m[2]}_at);"

    source = STATIC_SHARED.sub(declare, DYNAMIC_SHARED.sub(declare_dynamic, source))
    if "__shared__" in source:
        raise ValueError("a clustered kernel's __shared__ declaration the emulator cannot give each block")
    return source


EMULATED_HELPERS = (
    "smem_addr",
    "mbarrier_init",
    "mbarrier_init_fence",
    "mbarrier_expect",
    "mbarrier_wait",
    "mbarrier_wait_cluster",
    "bulk_load",
    "cluster_rank",
    "cluster_arrive_relaxed",
    "cluster_wait",
    "send_word",
    "copy16",
    "copies_commit",
    "copies_wait_but_one",
    "copies_wait_all",
    "ldsm_x4",
    "ldsm_x4_trans",
    "mma_bf16",
)
"""The device helpers written in PTX that the emulator defines instead (a kernel's own definitions are dropped)."""
HELPER = re.compile(r"^__device__ __forceinline__ [\w\s*]+? (\w+)\(", re.MULTILINE)


def without_ptx_helpers(source: str) -> str:
    """The source less its definitions of EMULATED_HELPERS (each from its signature to its closing brace)."""
    kept, at = [], 0
    for m in HELPER.finditer(source):
        if m[1] not in EMULATED_HELPERS or m.start() < at:
            continue
        depth, end = 0, source.index("{", m.end())
        while True:
            depth += {"{": 1, "}": -1}.get(source[end], 0)
            end += 1
            if depth == 0:
                break
        kept.append(source[at : m.start()])
        at = end
    return "".join(kept) + source[at:]


def kernel_namespace(index: int, source: str, runner: str, shared_bytes: int = 0) -> str:
    """The kernel and its runner in a namespace of their own (`kernel_<index>`): its #includes dropped (the
    emulator stands in for them), its C linkage dropped (a namespace could not hold it), its macros undefined after
    it (the next kernel may define them again), its dynamic shared memory `shared_bytes` of static storage (what the
    launch would size; static in the kernel, so the block's fibers share it). A clustered kernel's shared memory,
    static and dynamic, is each block's own (`per_block_shared`)."""
    source = without_ptx_helpers(source)
    if "__cluster_dims__" in source:
        source = per_block_shared(source, shared_bytes)
    macros = sorted({line.split()[1].split("(")[0] for line in source.splitlines() if line.startswith("#define ")})
    source = DYNAMIC_SHARED.sub(
        lambda m: (
            f"alignas(16) static unsigned char {m[2]}_bytes[{max(shared_bytes, 16)}];\n"
            f"{m[1]}* const {m[2]} = reinterpret_cast<{m[1]}*>({m[2]}_bytes);"
        ),
        source,
    )
    body = "\n".join(line for line in source.splitlines() if not line.startswith("#include"))
    undefs = "".join(f"#undef {name}\n" for name in macros)
    return f"namespace kernel_{index} {{\n{body.replace(C_LINKAGE, '')}\n{runner}}}\n{undefs}"


def launch_call(entry: str, launch: ResolvedLaunch) -> str:
    """The kernel's call with the launch's arguments: tensors by their names (the runner's variables), scalars as
    64-bit literals (converted to the kernel's parameter types as a call converts them)."""
    args = ", ".join(a.name if a.kind == "tensor" else f"{a.value}LL" for a in launch.args)
    return f"{entry}({args})"


def emulation_source(namespaces: Sequence[str], arguments: Sequence[str] = (), prelude: str = "") -> str:
    """One program running any of the kernels (`kernel_namespace`s): argv[1] picks one, the next arguments are its
    runner's (of the C++ types in `arguments`), the rest case directories, run in turn. `prelude` adds what these
    kernels use beyond the emulator."""
    parameters = ", ".join([*arguments, "const std::string&"])
    parsed = "".join(f"{kind}(std::atoi(argv[{2 + i}])), " for i, kind in enumerate(arguments))
    runs = ", ".join(f"kernel_{i}::run" for i in range(len(namespaces)))
    main = f"""
int main(int argc, char** argv) {{
    void (*runs[])({parameters}) = {{{runs}}};
    for (int i = {2 + len(arguments)}; i < argc; ++i) {{
        runs[std::atoi(argv[1])]({parsed}argv[i]);
    }}
    return 0;
}}
"""
    return EMULATOR + prelude + "".join(namespaces) + main


def build(work: Path, programs: Mapping[str, str]) -> None:
    """Compile each program (name: source) into `work`/name, one g++ each, all at once; the test is skipped where
    g++ is missing."""
    if shutil.which("g++") is None:
        pytest.skip("g++ not installed")
    compiling = []
    for name, source in programs.items():
        program = work / f"{name}.cpp"
        program.write_text(source)
        command = ["g++", *FLAGS, str(program), "-o", str(work / name)]
        compiling.append(subprocess.Popen(command, stderr=subprocess.PIPE, text=True))
    for process in compiling:
        _, errors = process.communicate()
        assert process.returncode == 0, errors[-3000:]
