"""Group norm over NCHW: y = (x - mean) * rstd * gamma[c] + beta[c], statistics per (sample, group), eps 1e-5.

The kernel is cuda/group_norm.cu with its shared pieces (cuda/group_norm_*.cuh): the passes over a thread's chunks
(group_norm_chunks.cuh) and the statistics they make (group_norm_statistics.cuh) are device functions and pieces
chosen by the strategy and the moments; this module only chooses the parameters they render with.

Convention: inputs x [n, c, h, w], then per-channel scale and shift [c] (taken by position, any
names, e.g. x, gamma, beta); output y like x, optionally followed by the group statistics mean and rstd [n, groups]
(what aten.native_group_norm returns beside y: a captured call must return them); sizes n, c, h, w, groups (c
divisible by groups); one dtype, math in fp32. A (sample, group) is one contiguous span of c/groups * h * w elements.

Parameters: `strategy` (reread: statistics, then normalise reading x again from memory; registers or smem: each
block keeps its slice of the group on chip, so x is read once: 256 MB at 4.2 TB/s is the floor of a [8, 512, 128,
128] bf16 card, and reading it twice caps a kernel near two thirds of the copy ceiling; pipelined: as smem, with
two slices a block and a persistent grid of clusters, each working through groups while the copies of its next
group's slice are in flight, so loads and stores overlap and no last wave idles), `block`, `vec` (must
divide h*w so a chunk never straddles two channels), `split` (blocks per group: a thread block cluster whose blocks
merge their partial statistics through distributed shared memory, so a few large groups still fill 132 SMs and a
512 KB group fits on chip as 8 slices of 64 KB), `moments` (how the statistics are reduced: `centred`, the mean,
then the sum of squares about it, two reductions and two passes; `shifted`, the sums and squares about the group's
first element in one pass and one reduction, with the centred pass only where that element lies far from the mean;
`welford`, each thread's (count, mean, M2) merged with Chan's formula in one reduction, two passes).

The shifted moments cost one pass and one reduction (one read of x fewer when rereading, one cluster exchange and
one pass over the slice fewer when kept on chip): the variance is E[d^2] - E[d]^2 of d = x - pivot, which cancels
by E[d]^2 / var. The kernel takes it only where E[d]^2 <= SHIFT_LIMIT * var (cuda/group_norm.cu: the pivot within 4
standard deviations of the mean; of normal data all but about 1 group in 16,000), so fp32's rounding of the sums is
amplified at most 17 times; elsewhere (an outlier first element) it makes the centred pass too. Every block of a
cluster merges the same parts in the same order, so all take the same branch.

A cluster's blocks push their partial statistics into each other's shared memory (st.async onto each receiver's
mbarrier, see cuda/group_norm_pushed_reduce.cuh) rather than each pulling the others' between cluster barriers (two
barriers fewer).

Clusters are sized at compile time (__cluster_dims__), which a plain launch honours up to the portable 8 blocks;
16 would need cudaFuncAttributeNonPortableClusterSizeAllowed set on the function, which the worker does not set.

Normalising is (x - mean) * (gamma * rstd) + beta, not torch's x * a + (beta - mean * a): on a constant group
rstd = 1/sqrt(eps) = 316, and x * a cancels against mean * a in fp32's last bits, which beyond |x| ~ 100 is more
than a bf16 card's tolerance (the equal-rows stress set fails every seed of torch's form that way).
x - mean is exact there, and one subtraction more per element costs nothing in a kernel bound by memory. The
on-chip kernels sum x - x[0] of the group (its first element, the pivot): a constant group's mean is then exactly
its value, whatever the count, and a large mean does not swamp the sum.
"""

from __future__ import annotations

from typing import ClassVar, Literal

from kernelforge_tui.cards.model import LaunchPlan, OperatorCard
from kernelforge_tui.proposers.templates.common import (
    C_TYPE,
    ELEMENT_BYTES,
    MAX_DYNAMIC_SHARED,
    THREADS_PER_SM,
    Lever,
    Levers,
    Params,
    Space,
    Template,
    TemplateParams,
    dtype_of,
    prelude_values,
    reduce_values,
    vec_widths,
)
from kernelforge_tui.proposers.templates.source import render

SIZES = ("n", "c", "h", "w", "groups")
ON_CHIP = ("registers", "smem", "bulk", "pipelined")
CP_ASYNC = ("smem", "pipelined")
"""The strategies that copy x into shared memory with cp.async, a copy a thread."""
SHARED = (*CP_ASYNC, "bulk")
"""The strategies that keep slices in shared memory (bulk: one bulk copy a block, cp.async.bulk on sm_90)."""
TAILED = ("smem", "bulk")
"""The strategies whose `minb` may leave part of a slice in memory (see on_chip_chunks)."""
GPCS = 8
SMS_PER_GPC = 16
"""The H200's graphics processing clusters and the fewest SMs one has (132 SMs: some have 18): a thread block cluster
runs inside one GPC, so the pipelined strategy's persistent grid holds as many clusters as fit in every GPC at once."""
REGISTERS_PER_SM = 64 * 1024
SHARED_PER_SM = 228 * 1024
"""Hopper's shared memory per SM: how many blocks keeping their slice there can be resident."""
BLOCK_OVERHEAD = 2048
"""Shared memory a block takes beside its kept chunks: the 1 KB the hardware reserves and the reductions' scratch."""
MOMENTS = ("centred", "shifted", "welford")
"""How the statistics are reduced (see the module's docstring), in the order of the moments lever."""
MINB = (0, 4, 8)
"""The blocks an SM that smem and bulk size their kept chunks for (0: as many as whole slices allow)."""
CP_ASYNC_BYTES = (4, 8, 16)
"""The copy sizes of cp.async (__pipeline_memcpy_async): the smem and pipelined strategies copy whole vectors."""


class GroupNormParams(TemplateParams):
    strategy: Literal["reread", "registers", "smem", "bulk", "pipelined"]
    block: int
    vec: int
    split: int
    moments: Literal["centred", "shifted", "welford"]
    minb: int


def working_registers(params: GroupNormParams) -> int:
    """Registers a thread needs beside the values it keeps (ptxas 13, sm_90, bf16 [8, 512, 128, 128]: 62 at 32 kept
    values with one reduction, 113 at 64 with two; an smem thread, keeping none, 48 to 85 as its chunks go 8 to 16).
    ptxas holds kept values widened to fp32 across the passes, so registers keep one value each, not two bf16. The
    shifted moments with a tail (minb) hold the pivot and three sums across the tail's loads: at 64 registers (block
    256, 4 blocks an SM) ptxas spilled."""
    if params.moments == "welford" and params.strategy == "registers":
        return 32
    return 72 if params.moments == "shifted" and params.minb else 48


def _mbarrier_wait(name: str, semantics: str, scope_cluster: bool) -> str:
    """cuda/group_norm_mbarrier_wait.cuh as the function `name`, with `semantics` (`.acquire.cluster`: what the
    cluster's other blocks stored is visible after it; none: acquire at the block's scope): one file for both waits,
    each rendered apart (its last newline is the line of group_norm.cu that takes it)."""
    text = render("group_norm_mbarrier_wait.cuh", wait_name=name, wait_semantics=semantics, wait_why=scope_cluster)
    return text.removesuffix("\n")


WHERE = {
    "reread": "x read again to normalise",
    "registers": "slice kept in registers",
    "smem": "slice kept in shared memory",
    "bulk": "slice kept in shared memory, copied in bulk by one thread",
    "pipelined": "slices double-buffered in shared memory by persistent clusters",
}


def slice_chunks(card: OperatorCard, params: GroupNormParams) -> int:
    """The most chunks one block of a group covers: its blocks share the group's chunks as evenly as integers allow
    (block r covers [nchunk * r / split, nchunk * (r + 1) / split))."""
    nchunk = card.sizes["c"] // card.sizes["groups"] * card.sizes["h"] * card.sizes["w"] // params.vec
    return -(-nchunk // params.split)


def on_chip_chunks(card: OperatorCard, params: GroupNormParams) -> int:
    """The chunks of a block's slice kept on chip: all of them, or for smem and bulk with `minb` blocks an SM as many
    as let that many blocks share its shared memory (each block also holds its static scratch and the 1 KB the hardware
    reserves), the rest of the slice read from memory in every pass."""
    whole = slice_chunks(card, params)
    minb = params.minb
    if params.strategy not in TAILED or not minb:
        return whole
    chunk_bytes = params.vec * ELEMENT_BYTES[dtype_of(card)]
    return min(whole, (SHARED_PER_SM // minb - BLOCK_OVERHEAD) // chunk_bytes)


def has_tail(card: OperatorCard, params: GroupNormParams) -> bool:
    """Whether part of a block's slice is read from memory, not kept on chip (see on_chip_chunks)."""
    return on_chip_chunks(card, params) < slice_chunks(card, params)


def kept_items(card: OperatorCard, params: GroupNormParams) -> int:
    """Chunks each thread keeps on chip: the block's kept chunks over its threads, rounded up."""
    return -(-on_chip_chunks(card, params) // params.block)


def kept_bytes(card: OperatorCard, params: GroupNormParams) -> int:
    """Dynamic shared memory of the strategies that keep slices there: the kept chunks of the largest slice (two
    slices for the pipelined one)."""
    buffers = 2 if params.strategy == "pipelined" else 1
    return buffers * on_chip_chunks(card, params) * params.vec * ELEMENT_BYTES[dtype_of(card)]


def persistent_clusters(card: OperatorCard, params: GroupNormParams) -> int:
    """The pipelined strategy's clusters: as many as are resident at once in every GPC (a grid larger than that would
    run its last clusters after the others, twice as long)."""
    return GPCS * (SMS_PER_GPC * resident_blocks(card, params) // params.split)


def kept_registers(card: OperatorCard, params: GroupNormParams) -> int:
    """A registers thread's estimate: one per kept value, and its working set."""
    return kept_items(card, params) * params.vec + working_registers(params)


def resident_blocks(card: OperatorCard, params: GroupNormParams) -> int:
    """The blocks per SM asked of ptxas (__launch_bounds__): as many as threads, the registers estimate and shared
    memory allow, at least one (too many would cap registers below what the kernel needs: spills)."""
    block, strategy = params.block, params.strategy
    if strategy == "registers":
        return max(1, min(THREADS_PER_SM // block, REGISTERS_PER_SM // (block * kept_registers(card, params))))
    if strategy in SHARED:
        by_registers = REGISTERS_PER_SM // (block * working_registers(params))
        by_shared = SHARED_PER_SM // (kept_bytes(card, params) + BLOCK_OVERHEAD)
        return max(1, min(THREADS_PER_SM // block, by_registers, by_shared))
    return 1


class GroupNormTemplate(Template[GroupNormParams]):
    name = "group_norm"
    version = 2
    families = ("group_norm",)
    entry = "kf_group_norm"
    levers: ClassVar[Levers] = {
        "memory_bandwidth": (
            Lever("strategy", "up", "x read once, kept on chip"),
            Lever("moments", "up", "statistics in one reduction: one read or cluster exchange fewer"),
            Lever("vec", "up", "wider accesses"),
        ),
        "memory_latency": (
            Lever("split", "up", "more blocks per group fill the SMs"),
            Lever("minb", "up", "more resident blocks, each reading part of its slice from L2"),
            Lever("block", "any", "threads per group"),
        ),
        "compute": (Lever("vec", "up", "fewer instructions per element"),),
    }

    def unsupported(self, card: OperatorCard) -> str | None:
        if len(card.inputs) != 3 or len(card.outputs) not in (1, 3):
            return "expects inputs x, gamma, beta and the output y, or y, mean and rstd"
        groups = (card.sizes.get("n"), card.sizes.get("groups"))
        if len(card.outputs) == 3 and any(tuple(o.dims(card.sizes)) != groups for o in card.outputs[1:]):
            return "mean and rstd outputs must have shape [n, groups]"
        if any(s not in card.sizes for s in SIZES):
            return f"card lacks sizes among {SIZES}"
        dtypes = {t.dtype for t in [*card.inputs, *card.outputs]}
        if len(dtypes) != 1 or not dtypes <= set(C_TYPE):
            return f"expects one dtype among {sorted(C_TYPE)}"
        if card.sizes["c"] % card.sizes["groups"]:
            return "c must be divisible by groups"
        return None

    def space(self, card: OperatorCard) -> Space:
        return {
            "strategy": ("reread", *ON_CHIP),
            "block": (128, 256, 512, 1024),
            "vec": vec_widths(dtype_of(card)),
            "split": (1, 2, 4, 8),
            "moments": MOMENTS,
            "minb": MINB,
        }

    def params_type(self, card: OperatorCard) -> type[GroupNormParams]:
        return GroupNormParams

    def canonical(self, card: OperatorCard, params: GroupNormParams) -> GroupNormParams:
        """minb only matters for smem and bulk, and only where it leaves a tail (a whole slice is the kernel of 0)."""
        if params.strategy not in TAILED or not has_tail(card, params):
            return params.but(minb=0)
        return params

    def problem(self, card: OperatorCard, params: GroupNormParams) -> str | None:
        vec, block = params.vec, params.block
        if (card.sizes["h"] * card.sizes["w"]) % vec:
            return f"vec {vec} does not divide h*w"
        vec_bytes = vec * ELEMENT_BYTES[dtype_of(card)]
        if params.strategy == "registers" and kept_registers(card, params) > min(255, REGISTERS_PER_SM // block):
            return f"{kept_items(card, params) * vec} values a thread do not fit in registers at block {block}"
        if params.strategy in CP_ASYNC and vec_bytes not in CP_ASYNC_BYTES:
            return f"cp.async copies {CP_ASYNC_BYTES} bytes, not a {vec_bytes}-byte vector"
        if params.strategy == "bulk" and vec_bytes != 16:
            return f"a bulk copy moves 16-byte units from 16-byte boundaries, not {vec_bytes}-byte chunks"
        if params.strategy in SHARED and kept_bytes(card, params) > MAX_DYNAMIC_SHARED:
            return f"{kept_bytes(card, params)} bytes of kept slices do not fit in shared memory"
        minb = params.minb
        if has_tail(card, params) and 2 * on_chip_chunks(card, params) < slice_chunks(card, params):
            return f"minb {minb} keeps less of a slice than it leaves in memory (L2 holds the tails of a few)"
        if minb and minb * block > THREADS_PER_SM:
            return f"minb {minb} x block {block} exceeds {THREADS_PER_SM} threads an SM"
        if minb and resident_blocks(card, params) < minb:
            return f"the registers of block {block} allow {resident_blocks(card, params)} blocks an SM, not minb {minb}"
        return None

    def render(self, card: OperatorCard, params: GroupNormParams) -> tuple[str, LaunchPlan]:
        dtype = dtype_of(card)
        block, vec, split = params.block, params.vec, params.split
        strategy, moments = params.strategy, params.moments
        welford = moments == "welford"
        state = "Welford" if welford else "Sum"
        pipelined = strategy == "pipelined"
        stats = len(card.outputs) == 3  # the statistics aten.native_group_norm returns beside y, rounded like y
        plain_chunk = stats and ELEMENT_BYTES[dtype] == 2  # see cuda/group_norm_statistics.cuh
        pushed = split > 1 and not pipelined  # see cuda/group_norm_pushed_reduce.cuh
        bulk = strategy == "bulk"
        tail = has_tail(card, params)
        # Each reduction's scratch and its exchange (a cluster's parts): the first reduction's triple (shifted, with
        # the statistics outputs) or pair (shifted; centred on chip with them), else its single state; then the
        # squares' own, where a second reduction has one.
        part3 = moments == "shifted" and stats
        where = WHERE[strategy] + (f" (its first {on_chip_chunks(card, params)} chunks)" if tail else "")
        source = render(
            "group_norm.cu",
            **prelude_values(dtype, vec),
            **reduce_values(True),
            dtype=dtype,
            strategy=strategy,
            where=where,
            split=split,
            state=state,
            block=block,
            resident=resident_blocks(card, params),
            cp_async=strategy in CP_ASYNC,
            reread=strategy == "reread",
            on_chip=strategy != "reread",
            sliced=strategy in TAILED or strategy == "registers",
            registers=strategy == "registers",
            smem=strategy == "smem",
            shared_wait=strategy in TAILED,
            waits=strategy in TAILED and not tail,
            items=kept_items(card, params),
            hw=card.sizes["h"] * card.sizes["w"],
            pipelined=pipelined,
            slice=slice_chunks(card, params),
            tail=tail,
            kept=on_chip_chunks(card, params),
            minb=params.minb,
            mbarriers=bulk or pushed,
            block_wait=_mbarrier_wait("mbarrier_wait", "", scope_cluster=False),
            bulk=bulk,
            pushed=pushed,
            cluster_wait=_mbarrier_wait("mbarrier_wait_cluster", ".acquire.cluster", scope_cluster=True),
            pulled=split > 1 and not pushed,
            single=split == 1,
            clustered=split > 1,
            stats=stats,
            part3=part3,
            part2=moments == "shifted" or (stats and moments == "centred" and strategy != "reread"),
            part_q=not (welford or part3),
            shared_slices=strategy in SHARED,
            shifted=moments == "shifted",
            welford=welford,
            centred=moments == "centred",
            plain_chunk=plain_chunk,
            plain_each=stats and not plain_chunk,
        )
        names = [t.name for t in [*card.inputs, *card.outputs]]
        groups = f"min(n * groups, {persistent_clusters(card, params)})" if pipelined else "n * groups"
        plan = LaunchPlan(
            entry=self.entry,
            grid=[f"{groups} * {split}"],
            block=[block],
            shared_bytes=kept_bytes(card, params) if strategy in SHARED else 0,
            args=[*names, "c", "h * w", "groups", *(["n"] if pipelined else [])],
        )
        return source, plan

    def seed_params(self, card: OperatorCard) -> list[Params]:
        """Fastest measured first: x read once, a 512 KB group's slices of 64 KB kept across a cluster of 8 in
        shared memory, one group a cluster, the shifted moments (one pass and one cluster exchange), each slice
        copied in bulk by one thread, then by cp.async a thread; then the centred moments, in bulk and by cp.async;
        both with 4 blocks an SM, each keeping 55 KB of its slice and reading the rest from memory; Welford's one
        reduction; registers (1 block an SM); then the kernels that read x again; last the slices double-buffered
        by persistent clusters (the next group loading while one is normalised), the slowest measured. The measured
        times are on the docs' results page."""
        vec = max(vec_widths(dtype_of(card)))
        cluster = {"block": 256, "vec": vec, "split": 8}
        seeds: list[Params] = [
            {"strategy": "bulk", **cluster, "moments": "shifted"},
            {"strategy": "smem", **cluster, "moments": "shifted"},
            {"strategy": "bulk", **cluster, "moments": "centred"},
            {"strategy": "smem", **cluster, "moments": "centred"},
            {"strategy": "bulk", **cluster, "moments": "centred", "minb": 4},
            {"strategy": "smem", **cluster, "moments": "centred", "minb": 4},
            {"strategy": "smem", **cluster, "moments": "welford"},
            {"strategy": "registers", "block": 1024, "vec": vec, "split": 8, "moments": "welford"},
            {"strategy": "reread", "block": 512, "vec": vec, "split": 4, "moments": "centred"},
            {"strategy": "reread", "block": 512, "vec": vec, "split": 1, "moments": "welford"},
            {"strategy": "reread", "block": 1024, "vec": vec, "split": 2, "moments": "centred"},
            {"strategy": "reread", "block": 256, "vec": 1, "split": 8, "moments": "welford"},
            {"strategy": "pipelined", **cluster, "moments": "centred"},
        ]
        return [{"minb": 0, **p} for p in seeds]
