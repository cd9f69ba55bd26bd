"""What a candidate's source may include, name and use as a directive: the lists the token guard applies.

Why apart: these lists are the policy, reviewed on their own when a kernel needs a new header or a new
family of calls turns up; `token_guard` is the mechanism that applies them (a `Builder` may be given other
headers than `DEFAULT_ALLOWED_INCLUDES`).
"""

from __future__ import annotations

MAX_SOURCE_BYTES = 1 << 20
"""Sources over this many UTF-8 bytes are refused before anything parses them (hand-written kernels are KBs)."""

DEFAULT_ALLOWED_INCLUDES: frozenset[str] = frozenset(
    {
        # Numeric types and intrinsics.
        "cuda_fp16.h",
        "cuda_bf16.h",
        "cuda_fp8.h",
        "math_constants.h",
        "mma.h",
        "cuda_pipeline.h",
        # Block and warp cooperation.
        "cooperative_groups.h",
        "cooperative_groups/reduce.h",
        "cooperative_groups/memcpy_async.h",
        "cuda/barrier",
        "cuda/pipeline",
        "cuda/atomic",
        "cuda/std/*",
        "cub/block/*",
        "cub/warp/*",
        "cub/thread/*",
        # Plain C/C++ headers with no host side effects.
        "stdint.h",
        "cstdint",
        "float.h",
        "cfloat",
        "limits.h",
        "climits",
        "stddef.h",
        "cstddef",
    }
)
"""Device-side headers a candidate may include; an entry with `*` is an `fnmatch` pattern.

Host runtime headers (cuda_runtime.h, cstdio, cstdlib, ...) are left out on purpose: a candidate has
no host code, and cub's device-wide algorithms (cub/device/*) launch kernels of their own.
"""

FORBIDDEN_NAMES: frozenset[str] = frozenset(
    {
        # Memory.
        "malloc",
        "calloc",
        "realloc",
        "free",
        "aligned_alloc",
        "posix_memalign",
        "__nv_aligned_device_malloc",
        "__builtin_malloc",
        "__builtin_calloc",
        "__builtin_realloc",
        "__builtin_free",
        "__builtin_operator_new",
        "__builtin_operator_delete",
        # Files and streams.
        "fopen",
        "fclose",
        "fread",
        "fwrite",
        "fprintf",
        "fputs",
        "fflush",
        "remove",
        "rename",
        # System calls.
        "open",
        "close",
        "read",
        "write",
        "mmap",
        "munmap",
        # Processes, libraries and the environment.
        "system",
        "popen",
        "fork",
        "execv",
        "execve",
        "execvp",
        "execl",
        "execlp",
        "dlopen",
        "getenv",
        # Ending the process.
        "exit",
        "abort",
    }
)
"""C library calls that allocate, do I/O, or reach the operating system (the device heap in every spelling nvcc
knows; the build's cubin check refuses any heap call a spelling not listed here reaches)."""

FORBIDDEN_PREFIXES: tuple[str, ...] = (
    # Runtime API: streams and memory.
    "cudaStream",
    "cudaMalloc",
    "cudaFree",
    "cudaMemcpy",
    "cudaMemset",
    "cudaMemPrefetch",
    "cudaMemPool",
    # Runtime API: launches, graphs, events, host and device management.
    "cudaLaunch",
    "cudaGraph",
    "cudaEvent",
    "cudaHost",
    "cudaDevice",
    "cudaSetDevice",
    "cudaGetParameterBuffer",
    # Driver API.
    "cuLaunch",
    "cuMem",
    "cuStream",
    "cuGraph",
    "cuCtx",
)
"""CUDA runtime and driver API families that create work, memory or streams outside the launch.

Device-side helpers such as `cudaGridDependencySynchronize` (programmatic dependent launch) stay allowed.
"""

ALLOWED_DIRECTIVES: frozenset[str] = frozenset(
    {"include", "define", "undef", "if", "ifdef", "ifndef", "elif", "else", "endif", "pragma", "error", "warning"}
)
ALLOWED_PRAGMAS: frozenset[str] = frozenset({"unroll", "nounroll"})
FILE_AND_PRAGMA_OPERATORS: frozenset[str] = frozenset(
    {
        # File-existence probes.
        "__has_include",
        "__has_include_next",
        "__has_include__",
        "__has_include_next__",
        "__has_embed",
        # Pragmas made from macros.
        "_Pragma",
        "__pragma",
    }
)
"""Refused wherever they appear: file-existence probes (gcc before 10 spells them with trailing `__` too)
and pragmas made from macros."""

DIRECTIVES_HELP = (
    "allowed: #include <allowed header>, #define, #undef, #if, #ifdef, #ifndef, #elif, #else, #endif, "
    "#pragma unroll, #pragma nounroll, #error, #warning"
)
