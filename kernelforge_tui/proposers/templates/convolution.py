"""Direct convolutions, 1-d and 2-d: y = conv(x, weight), stride 1, zero padding k // 2 (same size), NCHW.

Convention (the suite's conv_1d and conv_2d): x [n, ci, l] or [n, ci, h, w], weight [co, ci, k] or [co, ci, k, k]
with k odd, y [n, co, l] or [n, co, h, w], sizes n, ci, co, k and l or h, w, one dtype. A 1-d card is a 2-d one of
height 1 with 1 x k taps. Captured convolution cards (capture/families.py: sizes c, o, kh, kw, with the stride,
padding and dilation as captured) are not served: their names say why.

A block computes a th x tw tile of the output planes of `cob` output channels of one image (a 1-d grid over image,
channel group and tile): it stages `cib` input channels of the input tile plus its halo (zeros past the image: the
padding) and their taps in shared memory as fp32, then each thread sums `pw` positions of one row (`layout`
blocked: adjacent, so its window's reads overlap; strided: tw / pw apart, so a warp's reads and stores are
consecutive) for `cpt` output channels in registers: every staged input it reads serves `cpt` channels, every tap
`pw` positions. The tile's own columns load `vec` elements at a time (vec must divide w and tw), the halo's one by
one. Tiles past the image's edge are computed on zeros and not stored, so any h and w work.

The kernel is cuda/conv_direct.cu.
"""

from __future__ import annotations

from typing import ClassVar, Literal

from kernelforge_tui.cards.model import LaunchPlan, OperatorCard
from kernelforge_tui.proposers.templates.common import (
    STATIC_SHARED,
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
from kernelforge_tui.proposers.templates.source import render

MAX_ACCUMULATORS = 64
"""cpt x pw fp32 sums a thread holds, as the matmul template's micro-tile."""
MAX_GRID = 2**31 - 1


class ConvolutionParams(TemplateParams):
    tw: int
    th: int
    pw: int
    layout: Literal["blocked", "strided"]
    cob: int
    cpt: int
    cib: int
    vec: int
    minb: int


def _geometry(card: OperatorCard) -> dict[str, int]:
    """The kernel's compile-time sizes: channels, plane and taps (a 1-d card is one row of 1 x k taps)."""
    sizes = card.sizes
    two_d = len(card.inputs[0].shape) == 4
    return {
        "n": sizes["n"],
        "ci": sizes["ci"],
        "co": sizes["co"],
        "h": sizes["h"] if two_d else 1,
        "w": sizes["w"] if two_d else sizes["l"],
        "kh": sizes["k"] if two_d else 1,
        "kw": sizes["k"],
    }


def _threads(params: ConvolutionParams) -> int:
    return params.th * params.tw // params.pw * (params.cob // params.cpt)


def _tiles(size: int, tile: int) -> int:
    return -(-size // tile)


class ConvolutionTemplate(Template[ConvolutionParams]):
    name = "convolution"
    families = ("convolution",)
    entry = "kf_conv"
    levers: ClassVar[Levers] = {
        "memory_bandwidth": (
            Lever("vec", "up", "wider tile loads"),
            Lever("tw", "up", "less halo per staged input"),
            Lever("th", "up", "less halo per staged input"),
        ),
        "memory_latency": (
            Lever("minb", "up", "more resident blocks"),
            Lever("cib", "up", "more channels staged per barrier"),
            Lever("cob", "down", "more blocks"),
            Lever("tw", "down", "more blocks"),
        ),
        "compute": (
            Lever("cpt", "up", "each staged input serves more channels"),
            Lever("pw", "up", "each tap serves more positions"),
            Lever("layout", "any", "shared reads across banks"),
            Lever("cob", "up", "each staged tile serves more channels"),
        ),
    }

    def unsupported(self, card: OperatorCard) -> str | None:
        one_d = len(card.inputs[0].shape) == 3
        spatial = ["l"] if one_d else ["h", "w"]
        problem = naming_problem(card, ["x", "weight"], ["y"], ["n", "ci", "co", "k", *spatial])
        if problem is not None:
            return problem
        taps = ["k"] * len(spatial)
        want = [("n", "ci", *spatial), ("co", "ci", *taps), ("n", "co", *spatial)]
        have = [tuple(map(str, t.shape)) for t in [*card.inputs, *card.outputs]]
        if have != [tuple(w) for w in want]:
            return f"expects x {want[0]}, weight {want[1]} -> y {want[2]} (stride 1, same size), card has {have}"
        if card.sizes["k"] % 2 == 0:
            return f"k = {card.sizes['k']} taps: same-size padding k // 2 each side needs an odd k"
        return None

    def space(self, card: OperatorCard) -> Space:
        """A 1-d card has one row a tile (th 1)."""
        return {
            "tw": (16, 32, 64, 128, 256),
            "th": (1, 2, 4, 8, 16) if _geometry(card)["h"] > 1 else (1,),
            "pw": (1, 2, 4, 8),
            "layout": ("blocked", "strided"),
            "cob": (1, 2, 4, 8, 16),
            "cpt": (1, 2, 4, 8),
            "cib": (1, 2, 4, 8, 16),
            "vec": vec_widths(dtype_of(card)),
            "minb": (1, 2),
        }

    def params_type(self, card: OperatorCard) -> type[ConvolutionParams]:
        return ConvolutionParams

    def canonical(self, card: OperatorCard, params: ConvolutionParams) -> ConvolutionParams:
        """One position a thread is the same kernel in both layouts."""
        return params.but(layout="strided") if params.pw == 1 else params

    def problem(self, card: OperatorCard, params: ConvolutionParams) -> str | None:
        g = _geometry(card)
        p = params
        for name, part, whole in (("pw", p.pw, p.tw), ("cpt", p.cpt, p.cob), ("cob", p.cob, g["co"]),
                                  ("cib", p.cib, g["ci"]), ("vec", p.vec, g["w"]), ("vec", p.vec, p.tw)):  # fmt: skip
            if whole % part:
                return f"{name} {part} does not divide {whole}"
        space = self.space(card)
        for name, tile, size in (("tw", p.tw, g["w"]), ("th", p.th, g["h"])):
            if tile > size and tile != min(v for v in space[name] if isinstance(v, int) and v >= size):
                return f"{name} {tile} exceeds {size} by more than a smaller tile would"
        threads = _threads(p)
        if not 32 <= threads <= 1024:
            return f"{p.th * p.tw // p.pw} x {p.cob // p.cpt} = {threads} threads per block, outside 32..1024"
        if p.cpt * p.pw > MAX_ACCUMULATORS:
            return f"{p.cpt * p.pw} accumulators per thread (at most {MAX_ACCUMULATORS})"
        if p.minb * threads > THREADS_PER_SM:
            return f"minb {p.minb} x {threads} threads exceeds {THREADS_PER_SM} threads per SM"
        staged = p.cib * (p.th + g["kh"] - 1) * (p.tw + g["kw"] - 1) + p.cob * p.cib * g["kh"] * g["kw"]
        if staged * 4 > STATIC_SHARED:
            return f"{staged * 4} bytes of shared tiles exceed {STATIC_SHARED}"
        if (blocks := self._blocks(card, p)) > MAX_GRID:
            return f"{blocks} blocks exceed the grid's {MAX_GRID}"
        return None

    def _blocks(self, card: OperatorCard, params: ConvolutionParams) -> int:
        g = _geometry(card)
        return g["n"] * (g["co"] // params.cob) * _tiles(g["h"], params.th) * _tiles(g["w"], params.tw)

    def render(self, card: OperatorCard, params: ConvolutionParams) -> tuple[str, LaunchPlan]:
        dtype = dtype_of(card)
        p = params
        threads = _threads(p)
        source = render(
            "conv_direct.cu",
            **prelude_values(dtype, p.vec),
            **{key: value for key, value in _geometry(card).items() if key != "n"},
            dtype=dtype,
            th=p.th,
            tw=p.tw,
            pw=p.pw,
            layout=p.layout,
            cob=p.cob,
            cpt=p.cpt,
            cib=p.cib,
            threads=threads,
            minb=p.minb,
            col="q * PW + j" if p.layout == "blocked" else "q + j * (TW / PW)",
        )
        plan = LaunchPlan(entry=self.entry, grid=[self._blocks(card, p)], block=[threads], args=["x", "weight", "y"])
        return source, plan

    def seed_params(self, card: OperatorCard) -> list[Params]:
        """Every output channel of the block from each staged input first (cob = co: the input tile is read once),
        wide rows for 1-d cards and square-ish tiles for 2-d ones; then fewer channels a block (more blocks on small
        cards), and the textbook kernel: a thread per output, all of a block's channels staged at once."""
        g = _geometry(card)
        vec = max(vec_widths(dtype_of(card)))
        co, ci = min(g["co"], 16), min(g["ci"], 16)
        base: Params = {"tw": 64, "th": 8, "pw": 2, "layout": "strided", "cob": co, "cpt": min(co, 8), "cib": ci,
                        "vec": vec, "minb": 1}  # fmt: skip
        if g["h"] == 1:
            base = {**base, "tw": 256, "th": 1}
        return [
            base,
            {**base, "pw": 4, "layout": "blocked"},
            {**base, "cpt": max(1, co // 2), "minb": 2},
            {**base, "tw": 32, "pw": 1, "cob": max(1, co // 2), "cpt": max(1, co // 4)},
            {**base, "pw": 1, "cpt": 1, "cob": 1, "vec": 1},  # a thread per output
        ]
