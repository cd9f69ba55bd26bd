"""The reward of a node: its measured speedup, hardware evidence from ncu, and guardrails, every term recorded.

Why more than the speedup: two children can be equally fast while one moved the kernel toward its roof
(fewer DRAM bytes, higher throughput of the bounding unit) and the other just spent registers. The
speedup dominates; evidence is capped so it can break ties and reward steps in the right direction but
never make a slower kernel look better than a faster one by much; guardrails charge resources (registers,
shared memory, spills, occupancy) that bought no time. Everything here is a pure function of measured
numbers, so the TUI can show exactly which terms made a node's score.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from pydantic import BaseModel, Field

from kernelforge_tui.config import RewardWeights as RewardWeights
from kernelforge_tui.gpu.ncu.hardware import (
    ACHIEVED_OCCUPANCY,
    DRAM_BYTES,
    DRAM_THROUGHPUT,
    MEMORY_THROUGHPUT,
    SM_THROUGHPUT,
    classify,
)
from kernelforge_tui.vocabulary.evaluation import PtxasStats
from kernelforge_tui.vocabulary.profiles import CLASS_NAMES, Bottleneck
from kernelforge_tui.vocabulary.rewards import Reward, RewardTerm

Metrics = Mapping[str, float]


class Resources(BaseModel):
    """What a kernel costs each thread and block: from ptxas, plus the plan's dynamic shared memory."""

    registers: int = 0
    shared_bytes: int = 0
    spill_bytes: int = 0

    @classmethod
    def of(cls, ptxas: PtxasStats | None, dynamic_shared: int = 0) -> Resources | None:
        if ptxas is None:
            return None
        return cls(
            registers=ptxas.registers,
            shared_bytes=ptxas.shared_bytes + dynamic_shared,
            spill_bytes=ptxas.spill_store_bytes + ptxas.spill_load_bytes,
        )


class Evidence(BaseModel):
    """What is known about one node: its speedup over the baseline, its ncu metrics, its resources."""

    speedup: float = Field(gt=0)
    metrics: dict[str, float] | None = None
    ptxas: PtxasStats | None = None
    dynamic_shared: int = 0
    judge_score: float | None = Field(default=None, ge=0, le=1)
    """An LLM judge's score of the edit that made the node, when one scored it."""


def bottleneck_of(metrics: Metrics, threshold_pct: float = 30.0) -> Bottleneck | None:
    sm, memory = metrics.get(SM_THROUGHPUT), metrics.get(MEMORY_THROUGHPUT)
    if sm is None or memory is None:
        return None
    return classify(sm, memory, threshold_pct)[0]


def _dram_pct(metrics: Metrics) -> float | None:
    for name in DRAM_THROUGHPUT:
        if name in metrics:
            return metrics[name]
    return None


def _bounding_pct(metrics: Metrics) -> float | None:
    """The larger Speed-Of-Light headline: how close the kernel runs to whichever roof bounds it."""
    sm, memory = metrics.get(SM_THROUGHPUT), metrics.get(MEMORY_THROUGHPUT)
    if sm is None or memory is None:
        return None
    return max(sm, memory)


def _pct_change(new: float, old: float) -> str:
    return f"{(new / old - 1) * 100:+.0f}%" if old else "new"


def failure_reward(kind: str, reason: str = "", weights: RewardWeights | None = None) -> Reward:
    """The reward of a node that did not count."""
    weights = weights or RewardWeights()
    term = RewardTerm(name="failure", value=weights.failure, explanation=f"{kind}: {reason}".strip(": "))
    return Reward(total=weights.failure, terms=[term], explanation=f"failed ({kind})")


def compute_reward(
    child: Evidence,
    parent: Evidence | None = None,
    *,
    weights: RewardWeights | None = None,
    threshold_pct: float = 30.0,
) -> Reward:
    """Score a measured node against its parent (or alone, for a root). `threshold_pct`: the classifier's
    latency-bound threshold (`ClassifierSettings`), for the words of the explanation."""
    w = weights or RewardWeights()
    terms: list[RewardTerm] = [
        RewardTerm(
            name="speedup",
            value=w.speedup * math.log(child.speedup),
            explanation=f"{child.speedup:.2f}x over the baseline: {w.speedup:g} x ln({child.speedup:.3f})",
        )
    ]
    gain = math.log(child.speedup / parent.speedup) if parent is not None else 0.0
    gained = parent is not None and gain >= math.log1p(w.gain_threshold)
    slower = parent is not None and gain < 0
    words: list[str] = []
    if parent is not None:
        words.append(f"{math.exp(gain):.2f}x the parent's speed")

    evidence: list[RewardTerm] = []
    cm, pm = child.metrics, parent.metrics if parent is not None else None
    if cm is not None and pm is not None:
        c_pct, p_pct = _bounding_pct(cm), _bounding_pct(pm)
        if c_pct is not None and p_pct is not None:
            evidence.append(
                RewardTerm(
                    name="throughput",
                    value=w.throughput * (c_pct - p_pct) / 100,
                    explanation=f"bounding throughput {p_pct:.0f}% -> {c_pct:.0f}% of peak",
                )
            )
        c_bytes, p_bytes = cm.get(DRAM_BYTES), pm.get(DRAM_BYTES)
        if c_bytes and p_bytes:
            evidence.append(
                RewardTerm(
                    name="dram_bytes",
                    value=-w.dram_bytes * math.log(c_bytes / p_bytes),
                    explanation=f"DRAM bytes {_pct_change(c_bytes, p_bytes)} "
                    f"({p_bytes / 1e6:.1f} -> {c_bytes / 1e6:.1f} MB)",
                )
            )
            if abs(c_bytes / p_bytes - 1) >= 0.05:
                words.append(f"DRAM bytes {_pct_change(c_bytes, p_bytes)}")
        c_dram, p_dram = _dram_pct(cm), _dram_pct(pm)
        if c_dram is not None and p_dram is not None and abs(c_dram - p_dram) >= 5:
            words.append(f"DRAM throughput {p_dram:.0f}% -> {c_dram:.0f}%")
    raw_evidence = sum(t.value for t in evidence)
    clipped = max(-w.evidence_cap, min(w.evidence_cap, raw_evidence))
    if evidence and clipped != raw_evidence:
        scale = clipped / raw_evidence
        note = f" (evidence capped at +-{w.evidence_cap:g})"
        evidence = [RewardTerm(name=t.name, value=t.value * scale, explanation=t.explanation + note) for t in evidence]
    terms += evidence

    c_res = Resources.of(child.ptxas, child.dynamic_shared)
    p_res = Resources.of(parent.ptxas, parent.dynamic_shared) if parent is not None else None
    if c_res is not None and p_res is not None and not gained:
        why = "with no gain" if not slower else "while slower"
        if c_res.registers > p_res.registers > 0:
            terms.append(
                RewardTerm(
                    name="registers",
                    value=-w.registers * math.log(c_res.registers / p_res.registers),
                    explanation=f"registers {p_res.registers} -> {c_res.registers} per thread {why}",
                )
            )
            words.append(f"registers {p_res.registers} -> {c_res.registers} for nothing")
        if c_res.shared_bytes > p_res.shared_bytes:
            ratio = c_res.shared_bytes / p_res.shared_bytes if p_res.shared_bytes else 2.0
            terms.append(
                RewardTerm(
                    name="shared_memory",
                    value=-w.shared_memory * math.log(ratio),
                    explanation=f"shared memory {p_res.shared_bytes} -> {c_res.shared_bytes} B per block {why}",
                )
            )
            words.append(f"shared memory {p_res.shared_bytes} -> {c_res.shared_bytes} B for nothing")
        if c_res.spill_bytes > p_res.spill_bytes:
            terms.append(
                RewardTerm(
                    name="spills",
                    value=-w.spills * math.log((1 + c_res.spill_bytes) / (1 + p_res.spill_bytes)),
                    explanation=f"spill bytes {p_res.spill_bytes} -> {c_res.spill_bytes} {why}",
                )
            )
            words.append(f"spills {p_res.spill_bytes} -> {c_res.spill_bytes} B")
    if cm is not None and pm is not None and slower:
        c_occ, p_occ = cm.get(ACHIEVED_OCCUPANCY), pm.get(ACHIEVED_OCCUPANCY)
        if c_occ is not None and p_occ is not None and c_occ < p_occ:
            terms.append(
                RewardTerm(
                    name="occupancy",
                    value=-w.occupancy * (p_occ - c_occ) / 100,
                    explanation=f"achieved occupancy {p_occ:.0f}% -> {c_occ:.0f}% and slower than the parent",
                )
            )
            words.append(f"occupancy {p_occ:.0f}% -> {c_occ:.0f}% cost time")
    if cm is not None:
        bottleneck = bottleneck_of(cm, threshold_pct)
        pct = _bounding_pct(cm)
        if bottleneck is not None and pct is not None:
            prefix = "now " if pm is not None and bottleneck_of(pm, threshold_pct) != bottleneck else ""
            words.append(f"{prefix}{CLASS_NAMES[bottleneck]} at {pct:.0f}% of peak")
    if child.judge_score is not None:
        terms.append(
            RewardTerm(
                name="judge",
                value=w.judge * (2 * child.judge_score - 1),
                explanation=f"the judge scored the edit {child.judge_score:.2f} (0.5 is neutral)",
            )
        )
    total = sum(t.value for t in terms)
    if not words:
        words.append(f"{child.speedup:.2f}x over the baseline")
    head = ", ".join(words[:-1])
    explanation = f"{head}: {words[-1]}" if head else words[-1]
    return Reward(total=total, terms=terms, explanation=explanation)
