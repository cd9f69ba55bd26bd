"""What a built cubin reaches that its source text may hide: device-heap calls and the size of its globals.

Why the cubin and not the source: `__nv_aligned_device_malloc`, `__builtin_malloc` and `operator new` all end
as calls to the driver's `malloc`/`free` (undefined function symbols the driver resolves at load), and a
`__device__ float big[1 << 30]` is NOBITS (.bss-like) data that adds nothing to the cubin's file size. The
cubin's ELF symbol table says both, read here in Python: no cuobjdump and no second nvcc run per candidate.
"""

from __future__ import annotations

import re
import struct
from dataclasses import dataclass

_HEADER = struct.Struct("<16sHHIQQQIHHHHHH")
_SECTION = struct.Struct("<IIQQQQIIQQ")
_SYMBOL = struct.Struct("<IBBHQQ")
_SHT_SYMTAB = 2
_STT_OBJECT, _STT_FUNC = 1, 2
_SHN_UNDEF = 0
_HEAP = re.compile(r"alloc|^free$")
"""The driver's heap entry points: malloc, free, __cuda_syscall_aligned_malloc (and any other allocator)."""
GLOBAL_SECTIONS = ".nv.global"
"""Device globals live in `.nv.global` (zeroed, NOBITS) and `.nv.global.init` (initialised)."""


class CubinError(ValueError):
    """The file is not a 64-bit little-endian ELF this reader understands."""


@dataclass(frozen=True)
class CubinUse:
    """What the cubin asks of the device beyond its launch: heap calls by name, and global memory in bytes."""

    heap_calls: tuple[str, ...]
    global_bytes: int


def cubin_use(data: bytes) -> CubinUse:
    """Heap calls (undefined function symbols that allocate) and the extent of every `.nv.global*` section.

    A section's extent is the larger of its size and its symbols' ends: nvcc writes a 32-bit-wrapped size
    for a NOBITS section over 4 GiB while the symbol keeps its true size.
    """
    try:
        header = _HEADER.unpack_from(data)
        if header[0][:6] != b"\x7fELF\x02\x01":
            raise CubinError("not a 64-bit little-endian ELF file")
        shoff, shnum, shstrndx = header[6], header[12], header[13]
        sections = [_SECTION.unpack_from(data, shoff + i * _SECTION.size) for i in range(shnum)]
        names = sections[shstrndx]
        section_names = [_string(data, names[4] + s[0]) for s in sections]
        extents = {i: s[5] for i, s in enumerate(sections) if section_names[i].startswith(GLOBAL_SECTIONS)}
        heap: list[str] = []
        for symtab in (s for s in sections if s[1] == _SHT_SYMTAB):
            strings = sections[symtab[6]][4]
            for offset in range(symtab[4], symtab[4] + symtab[5], _SYMBOL.size):
                name_at, info, _, shndx, value, size = _SYMBOL.unpack_from(data, offset)
                kind = info & 0xF
                if kind == _STT_FUNC and shndx == _SHN_UNDEF:
                    name = _string(data, strings + name_at)
                    if _HEAP.search(name):
                        heap.append(name)
                elif kind == _STT_OBJECT and shndx in extents:
                    extents[shndx] = max(extents[shndx], value + size)
    except (struct.error, IndexError) as exc:
        raise CubinError(f"a truncated or damaged ELF file ({exc})") from None
    return CubinUse(heap_calls=tuple(sorted(set(heap))), global_bytes=sum(extents.values()))


def _string(data: bytes, offset: int) -> str:
    end = data.find(b"\0", offset)
    if end < 0 or offset >= len(data):
        raise IndexError(f"string at {offset} runs past the end")
    return data[offset:end].decode("utf-8", "replace")
