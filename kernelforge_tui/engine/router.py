"""The router: which of the pooled coder models write first, by how they did before on the same op family.

Why past success: models differ most in whether their kernels are correct at all on a given kind of operator, and
every run's store records which model wrote which node and whether it was proven correct. A model with no record on
the family keeps its place in the config; one with a record is ranked by its smoothed success rate, (correct + 1) /
(kernels + 2), so two lucky kernels do not outrank a long, solid record.
"""

from __future__ import annotations

from pathlib import Path

from kernelforge_tui.config import LlmSettings
from kernelforge_tui.engine.backend import SIMULATED
from kernelforge_tui.store import RunStore, StoreError, list_runs
from kernelforge_tui.vocabulary.llm import ModelRecord

PRIOR = 0.5
"""The smoothed rate of a model with no kernels on the family: between a proven and a failing one."""


def past_records(family: str, root: Path | None = None) -> list[ModelRecord]:
    """What every readable run of this op family under `root` records of its models (unreadable runs are skipped,
    and simulated ones: they prove no kernel correct)."""
    records: list[ModelRecord] = []
    for info in list_runs(root).runs:
        if info.family != family or info.backend == SIMULATED:
            continue
        try:
            with RunStore.open(info.run_dir, readonly=True) as store:
                records += store.model_records()
        except StoreError:
            continue
    return records


def rank_coders(llm: LlmSettings, records: list[ModelRecord]) -> list[str]:
    """The coder pool (config names), best first."""
    rates: dict[str, float] = {}
    for name in llm.roles.coder:
        model = llm.model(name)
        mine = [r for r in records if r.provider == model.provider and r.model == model.model]
        kernels = sum(r.kernels for r in mine)
        correct = sum(r.correct for r in mine)
        rates[name] = (correct + 1) / (kernels + 2) if kernels else PRIOR
    order = {name: i for i, name in enumerate(llm.roles.coder)}
    return sorted(llm.roles.coder, key=lambda name: (-rates[name], order[name]))
