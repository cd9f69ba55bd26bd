"""Jacobi stencils: 2D 5-point and 3D 7-point, math in fp32.

Convention: stencil2d u [ny, nx] -> v, stencil3d u [nz, ny, nx] -> v (sizes ny, nx and nz), one dtype
(fp32/bf16/fp16). Interior points get the mean of their 4 (2D) or 6 (3D) neighbours; boundary points copy u.

2D strategies (`strategy`):
- `strip`: each thread owns a column strip of `ypt` rows and `vec` columns: it issues the loads of the strip's rows
  and the two beside it at once (every load in flight before any row is computed), holds them in registers, and
  computes row after row, so a row is loaded once per strip (the two halo rows again, mostly from cache); its
  x-neighbours come from the neighbouring lanes by warp shuffles, a warp's edge lanes load the one element beside
  the warp. `bx` threads side by side (a warp spans 32 * vec columns), `by` strips stacked per block; `minb` blocks
  per SM bound the registers (__launch_bounds__); `hint` stream: rows no other strip reads are loaded evict-first
  (__ldcs), halo rows through the read-only cache (__ldg), stores evict-first (__stcs).
- `point`: a thread per point, `ypt` rows apart per thread, neighbours straight from global memory through L1 or,
  with `smem`, from a shared tile with a one-point halo.
3D: a thread per (y, x) marching through `zpt` planes, keeping the plane below in a register, `smem` as above.
The kernels are cuda/stencil_strip.cu, cuda/stencil2d.cu and cuda/stencil3d.cu.
"""

from __future__ import annotations

from typing import ClassVar, Literal

from kernelforge_tui.cards.model import LaunchPlan, OperatorCard
from kernelforge_tui.proposers.templates.common import (
    ELEMENT_BYTES,
    THREADS_PER_SM,
    Lever,
    Levers,
    Params,
    Space,
    Template,
    TemplateParams,
    dtype_of,
    naming_problem,
    prelude_values,
    vec_widths,
)
from kernelforge_tui.proposers.templates.source import Value, render

MAX_GRID_YZ = 65535
WORD = {2: "unsigned short", 4: "unsigned int", 8: "uint2", 16: "uint4"}
"""The unsigned type of a strip's access of vec elements, by its bytes: __ldg, __ldcs and __stcs take these."""
BITS = {
    "float32": ("unsigned int", "__uint_as_float", "__float_as_uint"),
    "bfloat16": ("unsigned short", "__ushort_as_bfloat16", "__bfloat16_as_ushort"),
    "float16": ("unsigned short", "__ushort_as_half", "__half_as_ushort"),
}
"""dtype -> (its bits as an unsigned type, bits to T, T to bits)."""


def _neighbours(at: str) -> dict[str, Value]:
    """The expressions reading the centre and its four lateral neighbours, from `at` (a format over dy, dx): from
    the shared tile or from u, as the render chose."""
    offsets = {"north": (-1, 0), "south": (1, 0), "west": (0, -1), "east": (0, 1), "centre": (0, 0)}
    return {name: at.format(dy=dy, dx=dx) for name, (dy, dx) in offsets.items()}


def _is_3d(card: OperatorCard) -> bool:
    return "nz" in card.sizes


class Stencil2dParams(TemplateParams):
    strategy: Literal["strip", "point"]
    bx: int
    by: int
    smem: int
    ypt: int
    vec: int
    minb: int
    hint: Literal["stream", "plain"]


class Stencil3dParams(TemplateParams):
    bx: int
    by: int
    smem: int
    zpt: int


class StencilTemplate(Template[Stencil2dParams | Stencil3dParams]):
    name = "stencil"
    families = ("stencil",)
    levers: ClassVar[Levers] = {
        "memory_bandwidth": (
            Lever("vec", "up", "16-byte accesses"),
            Lever("ypt", "up", "fewer halo rows re-read per strip"),
            Lever("smem", "up", "neighbours from a shared tile, not re-read"),
            Lever("zpt", "up", "the plane below kept in a register"),
            Lever("hint", "down", "read-once rows streamed, halo rows cached"),
            Lever("bx", "up", "wider rows per warp: whole cache lines"),
        ),
        "memory_latency": (
            Lever("minb", "up", "more resident blocks"),
            Lever("ypt", "up", "more rows in flight per thread"),
            Lever("by", "any", "block shape"),
            Lever("bx", "any", "block shape"),
        ),
        "compute": (
            Lever("vec", "up", "fewer instructions per element"),
            Lever("ypt", "up", "index math shared by more rows"),
            Lever("zpt", "up", "index math shared by more planes"),
        ),
    }

    def unsupported(self, card: OperatorCard) -> str | None:
        return naming_problem(card, ["u"], ["v"], ["nz", "ny", "nx"] if _is_3d(card) else ["ny", "nx"])

    def space(self, card: OperatorCard) -> Space:
        shape: Space = {"bx": (32, 64, 128), "by": (1, 2, 4, 8, 16), "smem": (0, 1)}
        if _is_3d(card):
            return {**shape, "zpt": (1, 4, 16, 64)}
        strip: Space = {"vec": vec_widths(dtype_of(card)), "minb": (1, 2, 4, 8), "hint": ("stream", "plain")}
        return {"strategy": ("strip", "point"), **shape, "ypt": (1, 2, 4, 8, 16), **strip}

    def params_type(self, card: OperatorCard) -> type[Stencil2dParams | Stencil3dParams]:
        return Stencil3dParams if _is_3d(card) else Stencil2dParams

    def canonical(
        self, card: OperatorCard, params: Stencil2dParams | Stencil3dParams
    ) -> Stencil2dParams | Stencil3dParams:
        """A strip has no shared tile; a point kernel loads scalars, plainly, with one block per SM assured."""
        if isinstance(params, Stencil3dParams):
            return params
        if params.strategy == "strip":
            return params.but(smem=0)
        return params.but(vec=1, minb=1, hint="plain")

    def problem(self, card: OperatorCard, params: Stencil2dParams | Stencil3dParams) -> str | None:
        threads = params.bx * params.by
        if not 64 <= threads <= 1024:
            return f"bx*by = {threads} outside 64..1024"
        tall = params.by * (params.ypt if isinstance(params, Stencil2dParams) else 1)
        if -(-card.sizes["ny"] // tall) > MAX_GRID_YZ:
            return "grid y exceeds 65535"
        if isinstance(params, Stencil3dParams):
            return "grid z exceeds 65535" if -(-card.sizes["nz"] // params.zpt) > MAX_GRID_YZ else None
        if card.sizes["nx"] % params.vec:
            return f"vec {params.vec} does not divide nx: rows would start misaligned for vector accesses"
        if params.minb * threads > THREADS_PER_SM:
            return f"minb x bx x by exceeds {THREADS_PER_SM} threads per SM"
        return None

    def render(self, card: OperatorCard, params: Stencil2dParams | Stencil3dParams) -> tuple[str, LaunchPlan]:
        if isinstance(params, Stencil3dParams):
            return self._render3d(dtype_of(card), params)
        if params.strategy == "strip":
            return self._render_strip(dtype_of(card), params)
        return self._render2d(dtype_of(card), params)

    def _render_strip(self, dtype: str, params: Stencil2dParams) -> tuple[str, LaunchPlan]:
        bx, by, ypt, vec = params.bx, params.by, params.ypt, params.vec
        bits, as_t, as_bits = BITS[dtype]
        stream = params.hint == "stream"
        source = render(
            "stencil_strip.cu",
            **prelude_values(dtype, vec),
            dtype=dtype,
            bx=bx,
            by=by,
            ypt=ypt,
            minb=params.minb,
            hint=params.hint,
            stream=stream,
            load_once="__ldcs" if stream else "__ldg",
            word=WORD[vec * ELEMENT_BYTES[dtype]],
            bits=bits,
            as_t=as_t,
            as_bits=as_bits,
            threads=bx * by,
        )
        plan = LaunchPlan(
            entry="kf_stencil2d",
            grid=[f"cdiv(nx, {bx * vec})", f"cdiv(ny, {by * ypt})"],
            block=[bx * by],
            args=["u", "v", "ny", "nx"],
        )
        return source, plan

    def _render2d(self, dtype: str, params: Stencil2dParams) -> tuple[str, LaunchPlan]:
        bx, by, ypt = params.bx, params.by, params.ypt
        if params.smem:
            at = "tile[threadIdx.y + r * BY + 1 + ({dy})][threadIdx.x + 1 + ({dx})]"
        else:
            at = "to_f(u[(long long)(y + ({dy})) * nx + x + ({dx})])"
        source = render(
            "stencil2d.cu",
            **prelude_values(dtype, 1),
            **_neighbours(at),
            dtype=dtype,
            bx=bx,
            by=by,
            ypt=ypt,
            smem=params.smem,
            threads=bx * by,
        )
        plan = LaunchPlan(
            entry="kf_stencil2d",
            grid=[f"cdiv(nx, {bx})", f"cdiv(ny, {by * ypt})"],
            block=[bx, by],
            args=["u", "v", "ny", "nx"],
        )
        return source, plan

    def _render3d(self, dtype: str, params: Stencil3dParams) -> tuple[str, LaunchPlan]:
        bx, by, zpt = params.bx, params.by, params.zpt
        if params.smem:
            lateral = "tile[threadIdx.y + 1 + ({dy})][threadIdx.x + 1 + ({dx})]"
        else:
            lateral = "to_f(u[at + ({dy}) * (long long)nx + ({dx})])"
        source = render(
            "stencil3d.cu",
            **prelude_values(dtype, 1),
            **_neighbours(lateral),
            dtype=dtype,
            bx=bx,
            by=by,
            zpt=zpt,
            smem=params.smem,
            threads=bx * by,
        )
        plan = LaunchPlan(
            entry="kf_stencil3d",
            grid=[f"cdiv(nx, {bx})", f"cdiv(ny, {by})", f"cdiv(nz, {zpt})"],
            block=[bx, by],
            args=["u", "v", "nz", "ny", "nx"],
        )
        return source, plan

    def seed_params(self, card: OperatorCard) -> list[Params]:
        """Strips first, 16-byte accesses where nx allows (the 8192^2 fp32 card's expected fastest: 256 threads, 8
        rows a thread, 4 blocks an SM; a 16-bit dtype's 8-wide rows spill under 4 blocks' 64 registers, so 2), then
        the point kernels."""
        if _is_3d(card):
            return [
                {"bx": 32, "by": 8, "smem": 0, "zpt": 16},
                {"bx": 64, "by": 4, "smem": 1, "zpt": 16},
                {"bx": 128, "by": 4, "smem": 0, "zpt": 16},
                {"bx": 32, "by": 16, "smem": 1, "zpt": 1},
            ]
        wide = max(v for v in vec_widths(dtype_of(card)) if card.sizes["nx"] % v == 0)
        strip: Params = {"strategy": "strip", "smem": 0, "vec": wide, "hint": "stream"}
        point: Params = {"strategy": "point", "vec": 1, "minb": 1, "hint": "plain"}
        return [
            {**strip, "bx": 32, "by": 8, "ypt": 8, "minb": 4 if ELEMENT_BYTES[dtype_of(card)] == 4 else 2},
            {**strip, "bx": 64, "by": 4, "ypt": 16, "minb": 2},
            {**strip, "bx": 32, "by": 4, "ypt": 4, "minb": 8},
            {**point, "bx": 32, "by": 8, "smem": 0, "ypt": 2},
            {**point, "bx": 64, "by": 4, "smem": 1, "ypt": 2},
            {**point, "bx": 128, "by": 4, "smem": 0, "ypt": 2},
            {**point, "bx": 32, "by": 16, "smem": 1, "ypt": 1},
        ]
