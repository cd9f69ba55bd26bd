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
"""

from __future__ import annotations

from typing import ClassVar

from kernelforge_tui.cards.model import LaunchPlan, OperatorCard
from kernelforge_tui.proposers.templates.common import (
    ELEMENT_BYTES,
    THREADS_PER_SM,
    Lever,
    Levers,
    Params,
    Space,
    Template,
    dtype_of,
    launch_bounds,
    naming_problem,
    prelude,
    vec_widths,
)

MAX_GRID_YZ = 65535
WORD = {2: "unsigned short", 4: "unsigned int", 8: "uint2", 16: "uint4"}
"""The unsigned type of a strip's access of vec elements, by its bytes: __ldg, __ldcs and __stcs take these."""
BITS = {
    "float32": ("unsigned int", "__uint_as_float", "__float_as_uint"),
    "bfloat16": ("unsigned short", "__ushort_as_bfloat16", "__bfloat16_as_ushort"),
    "float16": ("unsigned short", "__ushort_as_half", "__half_as_ushort"),
}
"""dtype -> (its bits as an unsigned type, bits to T, T to bits)."""


def _is_3d(card: OperatorCard) -> bool:
    return "nz" in card.sizes


class StencilTemplate(Template):
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

    def canonical(self, card: OperatorCard, params: Params) -> Params:
        """A strip has no shared tile; a point kernel loads scalars, plainly, with one block per SM assured."""
        if params.get("strategy") == "strip":
            return {**params, "smem": 0}
        if params.get("strategy") == "point":
            return {**params, "vec": 1, "minb": 1, "hint": "plain"}
        return dict(params)

    def problem(self, card: OperatorCard, params: Params) -> str | None:
        threads = int(params["bx"]) * int(params["by"])
        if not 64 <= threads <= 1024:
            return f"bx*by = {threads} outside 64..1024"
        tall = int(params["by"]) * int(params.get("ypt", 1))
        if -(-card.sizes["ny"] // tall) > MAX_GRID_YZ:
            return "grid y exceeds 65535"
        if _is_3d(card):
            return "grid z exceeds 65535" if -(-card.sizes["nz"] // int(params["zpt"])) > MAX_GRID_YZ else None
        if card.sizes["nx"] % int(params["vec"]):
            return f"vec {params['vec']} does not divide nx: rows would start misaligned for vector accesses"
        if int(params["minb"]) * threads > THREADS_PER_SM:
            return f"minb x bx x by exceeds {THREADS_PER_SM} threads per SM"
        return None

    def render(self, card: OperatorCard, params: Params) -> tuple[str, LaunchPlan]:
        if _is_3d(card):
            return self._render3d(dtype_of(card), params)
        if params["strategy"] == "strip":
            return self._render_strip(dtype_of(card), params)
        return self._render2d(dtype_of(card), params)

    def _render_strip(self, dtype: str, params: Params) -> tuple[str, LaunchPlan]:
        bx, by, ypt, vec = int(params["bx"]), int(params["by"]), int(params["ypt"]), int(params["vec"])
        bits, as_t, as_bits = BITS[dtype]
        stream = params["hint"] == "stream"
        source = f"""// 5-point Jacobi stencil ({dtype}, fp32 math) in column strips: {bx}x{by} threads,
// {vec} column(s) and {ypt} row(s) a thread, the strip's rows in registers, x-neighbours by warp shuffles,
// minb {params["minb"]}, hint {params["hint"]}.
// Generated by the template proposer.
{prelude(dtype, vec)}#define BX {bx}
#define BY {by}
#define ROWS {ypt}
#define FULL_MASK 0xffffffffu
#define LOAD_ONCE {"__ldcs" if stream else "__ldg"}

typedef {WORD[vec * ELEMENT_BYTES[dtype]]} Word;  // VEC elements: one access
typedef {bits} Bits;
union Pack {{
    Word w;
    Bits b[VEC];
}};

__device__ __forceinline__ float bits_to_f(Bits b) {{ return to_f({as_t}(b)); }}
__device__ __forceinline__ Bits f_to_bits(float f) {{ return {as_bits}(from_f(f)); }}

extern "C" __global__ void {launch_bounds(bx * by, int(params["minb"]))} kf_stencil2d(const T* __restrict__ u,
                                                                   T* __restrict__ v, int ny, int nx) {{
    const int lane = threadIdx.x & 31;
    const int x0 = (blockIdx.x * BX + threadIdx.x % BX) * VEC;  // VEC divides nx: whole vectors in or out
    const int y0 = (blockIdx.y * BY + threadIdx.x / BX) * ROWS;  // a warp's strip: BX is a multiple of 32
    // Rows y0 - 1 .. y0 + ROWS, every load issued before any row is computed. Rows and columns past the grid are
    // clamped onto it: their values reach no output (the rows beside the grid neighbour boundary rows only, a
    // thread past nx only lanes past nx or the one whose last column is the boundary).
    const int xc = min(x0, nx - VEC);
    const int beside_x = lane == 0 ? max(x0 - 1, 0) : min(x0 + VEC, nx - 1);
    Pack rows[ROWS + 2];  // as loaded: a 16-bit dtype's rows take half the registers of their fp32 values
    float beside[ROWS];  // lane 0: the element left of the warp's columns, lane 31: right of them
#pragma unroll
    for (int k = 0; k < ROWS + 2; ++k) {{
        const T* row = u + (long long)min(max(y0 + k - 1, 0), ny - 1) * nx;
        const Word* at = reinterpret_cast<const Word*>(row + xc);
        rows[k].w = k >= 2 && k < ROWS ? LOAD_ONCE(at) : __ldg(at);  // the strips above and below read the others
        if (k >= 1 && k <= ROWS) {{
            const bool edge_lane = lane == 0 || lane == 31;
            beside[k - 1] = edge_lane ? bits_to_f(__ldg(reinterpret_cast<const Bits*>(row) + beside_x)) : 0.0f;
        }}
    }}
#pragma unroll
    for (int r = 0; r < ROWS; ++r) {{
        float up[VEC], mid[VEC], down[VEC];
#pragma unroll
        for (int j = 0; j < VEC; ++j) {{
            up[j] = bits_to_f(rows[r].b[j]);
            mid[j] = bits_to_f(rows[r + 1].b[j]);
            down[j] = bits_to_f(rows[r + 2].b[j]);
        }}
        // Every lane shuffles, threads past the grid too: x-neighbours from the lanes beside.
        float left = __shfl_up_sync(FULL_MASK, mid[VEC - 1], 1);
        float right = __shfl_down_sync(FULL_MASK, mid[0], 1);
        if (lane == 0) {{
            left = beside[r];
        }}
        if (lane == 31) {{
            right = beside[r];
        }}
        const int y = y0 + r;
        if (y < ny && x0 < nx) {{
            const bool edge_row = y == 0 || y == ny - 1;
            Pack p;
#pragma unroll
            for (int j = 0; j < VEC; ++j) {{
                const float w = j == 0 ? left : mid[j - 1];
                const float e = j == VEC - 1 ? right : mid[j + 1];
                const bool edge = edge_row || x0 + j == 0 || x0 + j == nx - 1;
                p.b[j] = f_to_bits(edge ? mid[j] : 0.25f * ((up[j] + down[j]) + (w + e)));
            }}
            Word* out = reinterpret_cast<Word*>(v + (long long)y * nx + x0);
            {"__stcs(out, p.w);" if stream else "*out = p.w;"}
        }}
    }}
}}
"""
        plan = LaunchPlan(
            entry="kf_stencil2d",
            grid=[f"cdiv(nx, {bx * vec})", f"cdiv(ny, {by * ypt})"],
            block=[bx * by],
            args=["u", "v", "ny", "nx"],
        )
        return source, plan

    def _render2d(self, dtype: str, params: Params) -> tuple[str, LaunchPlan]:
        bx, by, ypt = int(params["bx"]), int(params["by"]), int(params["ypt"])
        if params["smem"]:
            stage = """__shared__ float tile[BY * YPT + 2][BX + 2];
const int ox = blockIdx.x * BX - 1;
const int oy = blockIdx.y * (BY * YPT) - 1;
for (int k = threadIdx.y * BX + threadIdx.x; k < (BY * YPT + 2) * (BX + 2); k += BX * BY) {
 const int gy = oy + k / (BX + 2);
 const int gx = ox + k % (BX + 2);
 tile[k / (BX + 2)][k % (BX + 2)] = gy >= 0 && gy < ny && gx >= 0 && gx < nx ? to_f(u[(long long)gy * nx + gx]) : 0.0f;
}
__syncthreads();
"""
            at = "tile[threadIdx.y + r * BY + 1 + ({dy})][threadIdx.x + 1 + ({dx})]"
        else:
            stage = ""
            at = "to_f(u[(long long)(y + ({dy})) * nx + x + ({dx})])"
        n, s, w, e, c = (at.format(dy=dy, dx=dx) for dy, dx in ((-1, 0), (1, 0), (0, -1), (0, 1), (0, 0)))
        source = f"""// 5-point Jacobi stencil ({dtype}, fp32 math): {bx}x{by} threads,
// {ypt} row(s) per thread, shared tile {params["smem"]}.
// Generated by the template proposer.
{prelude(dtype, 1)}#define BX {bx}
#define BY {by}
#define YPT {ypt}

extern "C" __global__ void {launch_bounds(bx * by, 1)} kf_stencil2d(const T* __restrict__ u, T* __restrict__ v,
                                                             int ny, int nx) {{
{stage}const int x = blockIdx.x * BX + threadIdx.x;
#pragma unroll
for (int r = 0; r < YPT; ++r) {{
 const int y = blockIdx.y * (BY * YPT) + r * BY + threadIdx.y;
 if (x < nx && y < ny) {{
  const bool edge = x == 0 || y == 0 || x == nx - 1 || y == ny - 1;
  v[(long long)y * nx + x] = from_f(edge ? {c} : 0.25f * (({n} + {s}) + ({w} + {e})));
 }}
}}
}}
"""
        plan = LaunchPlan(
            entry="kf_stencil2d",
            grid=[f"cdiv(nx, {bx})", f"cdiv(ny, {by * ypt})"],
            block=[bx, by],
            args=["u", "v", "ny", "nx"],
        )
        return source, plan

    def _render3d(self, dtype: str, params: Params) -> tuple[str, LaunchPlan]:
        bx, by, zpt = int(params["bx"]), int(params["by"]), int(params["zpt"])
        plane = "(long long)nx * ny"
        if params["smem"]:
            stage = """ __syncthreads();  // the previous plane's tile is no longer read
 for (int k = threadIdx.y * BX + threadIdx.x; k < (BY + 2) * (BX + 2); k += BX * BY) {
  const int gy = oy + k / (BX + 2);
  const int gx = ox + k % (BX + 2);
  const bool inside = gy >= 0 && gy < ny && gx >= 0 && gx < nx;
  tile[k / (BX + 2)][k % (BX + 2)] = inside ? to_f(u[z * plane + (long long)gy * nx + gx]) : 0.0f;
 }
 __syncthreads();
"""
            lateral = "tile[threadIdx.y + 1 + ({dy})][threadIdx.x + 1 + ({dx})]"
            decl = "__shared__ float tile[BY + 2][BX + 2];\n"
            decl += "const int ox = blockIdx.x * BX - 1;\nconst int oy = blockIdx.y * BY - 1;\n"
        else:
            stage, decl = "", ""
            lateral = "to_f(u[at + ({dy}) * (long long)nx + ({dx})])"
        n, s, w, e, c = (lateral.format(dy=dy, dx=dx) for dy, dx in ((-1, 0), (1, 0), (0, -1), (0, 1), (0, 0)))
        source = f"""// 7-point Jacobi stencil ({dtype}, fp32 math): {bx}x{by} threads,
// {zpt} plane(s) per thread, shared tile {params["smem"]}.
// Generated by the template proposer.
{prelude(dtype, 1)}#define BX {bx}
#define BY {by}
#define ZPT {zpt}

extern "C" __global__ void {launch_bounds(bx * by, 1)} kf_stencil3d(const T* __restrict__ u, T* __restrict__ v,
                                                             int nz, int ny, int nx) {{
{decl}const int x = blockIdx.x * BX + threadIdx.x;
const int y = blockIdx.y * BY + threadIdx.y;
const bool in = x < nx && y < ny;  // threads outside still join the barriers
const long long plane = {plane};
const int z0 = blockIdx.z * ZPT;
float below = in && z0 > 0 ? to_f(u[(z0 - 1) * plane + (long long)y * nx + x]) : 0.0f;
for (int k = 0; k < ZPT; ++k) {{
 const int z = z0 + k;
 if (z >= nz) {{
  break;  // uniform across the block
 }}
 const long long at = z * plane + (long long)y * nx + x;
{stage} if (in) {{
  const float center = {c};
  const float above = z + 1 < nz ? to_f(u[at + plane]) : 0.0f;
  const bool edge = x == 0 || y == 0 || z == 0 || x == nx - 1 || y == ny - 1 || z == nz - 1;
  v[at] = from_f(edge ? center : (1.0f / 6.0f) * ((({n} + {s}) + ({w} + {e})) + (below + above)));
  below = center;
 }}
}}
}}
"""
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
