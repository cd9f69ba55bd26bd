"""Nsight Compute's CSV, read into typed metrics: one `ParsedKernel` per profiled launch, values in canonical units.

Why apart from the runner (`run.py`): parsing is pure text in, models out, tested on captured and
synthetic CSV on any machine; running ncu needs a GPU, a process group and a time limit.

The Profiler asks for `--csv --page raw --print-units base`: one column per metric under its raw name, which
is stable across ncu versions (the labels of the details page are not), with units unscaled. The details
page (`Section Name, Metric Name, Metric Unit, Metric Value` rows) is read too, so reports exported by hand
can be read.
"""

from __future__ import annotations

import csv
import io

from pydantic import BaseModel

from kernelforge_tui.vocabulary.profiles import Metric, Unit

SECTION_OF_PREFIX: tuple[tuple[str, str], ...] = (
    ("launch__occupancy", "Occupancy"),
    ("sm__maximum_warps", "Occupancy"),
    ("sm__warps_active", "Occupancy"),
    ("achieved_occupancy", "Occupancy"),
    ("launch__", "LaunchStats"),
    ("smsp__average_warp", "WarpStateStats"),
    ("smsp__pcsamp", "WarpStateStats"),
    ("smsp__thread_inst_executed_per", "WarpStateStats"),
    ("smsp__warps_eligible", "SchedulerStats"),
    ("smsp__warps_active", "SchedulerStats"),
    ("smsp__issue", "SchedulerStats"),
    ("smsp__maximum_warps", "SchedulerStats"),
    ("sm__inst_executed_pipe", "ComputeWorkloadAnalysis"),
    ("sm__pipe", "ComputeWorkloadAnalysis"),
    ("sm__instruction_throughput", "ComputeWorkloadAnalysis"),
    ("smsp__sass", "InstructionStats"),
    ("sm__sass", "InstructionStats"),
    ("smsp__inst_executed", "InstructionStats"),
    ("sm__inst_executed", "ComputeWorkloadAnalysis"),
    ("sm__throughput", "SpeedOfLight"),
    ("gpu__compute_memory", "SpeedOfLight"),
    ("gpu__time_duration", "SpeedOfLight"),
    ("gpc__cycles_elapsed", "SpeedOfLight"),
    ("gpu__dram_throughput", "SpeedOfLight"),
    ("dram__", "MemoryWorkloadAnalysis"),
    ("lts__", "MemoryWorkloadAnalysis"),
    ("l1tex__", "MemoryWorkloadAnalysis"),
)
"""The raw page has no section column: metrics are placed by their name's prefix (first match wins)."""

DETAILS_SECTIONS = {
    "GPU Speed Of Light Throughput": "SpeedOfLight",
    "Memory Workload Analysis": "MemoryWorkloadAnalysis",
    "Occupancy": "Occupancy",
    "Launch Statistics": "LaunchStats",
    "Warp State Statistics": "WarpStateStats",
    "Scheduler Statistics": "SchedulerStats",
    "Compute Workload Analysis": "ComputeWorkloadAnalysis",
}


PREFIXES = {"n": 1e-9, "u": 1e-6, "m": 1e-3, "K": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15}
BASE_WORDS = {
    "byte": "bytes",
    "bytes": "bytes",
    "second": "seconds",
    "s": "seconds",
    "cycle": "cycles",
    "hz": "hertz",
    "Hz": "hertz",
}
PER_THING = {"thread", "block", "warp", "sm", "SM", "request", "instruction", "inst"}


def _scaled(word: str) -> tuple[str, float]:
    """(base word, scale) of one unit word: 'Kbyte' -> ('bytes', 1e3), 'usecond' -> ('seconds', 1e-6)."""
    if word in BASE_WORDS:
        return BASE_WORDS[word], 1.0
    if len(word) > 1 and word[0] in PREFIXES and word[1:] in BASE_WORDS:
        return BASE_WORDS[word[1:]], PREFIXES[word[0]]
    return word, 1.0


def normalise(value: float, unit: str) -> tuple[float, Unit]:
    """Convert a value in an ncu unit into a canonical unit."""
    unit = unit.strip()
    if unit in ("%", "pct", "percent"):
        return value, "percent"
    if "/" in unit:
        top, _, bottom = unit.partition("/")
        top_word, top_scale = _scaled(top)
        bottom_word, bottom_scale = _scaled(bottom)
        scale = top_scale / bottom_scale
        if top_word == "bytes" and bottom_word == "seconds":
            return value * scale, "bytes/second"
        if top_word == "cycles" and bottom_word == "seconds":
            return value * scale, "hertz"
        if top_word == "bytes" and bottom_word in PER_THING:
            return value * top_scale, "bytes"
        if bottom_word in ("thread", "block", "SM", "sm"):
            return value * scale, "count"
        return value * scale, "ratio"
    word, scale = _scaled(unit)
    if word in ("bytes", "seconds", "cycles", "hertz"):
        return value * scale, word  # type: ignore[return-value]
    return value, "count"


def section_of(name: str) -> str:
    for prefix, section in SECTION_OF_PREFIX:
        if name.startswith(prefix):
            return section
    return "raw"


def _number(text: str) -> float | None:
    cleaned = text.strip().replace(",", "")
    if not cleaned or cleaned.lower() in ("n/a", "nan", "-"):
        return None
    try:
        return float(cleaned)
    except ValueError:
        return None


class ParsedKernel(BaseModel):
    """The metrics of one profiled launch in an ncu CSV."""

    kernel: str
    metrics: dict[str, Metric]


RAW_ID_COLUMNS = {
    "ID",
    "Process ID",
    "Process Name",
    "Host Name",
    "Kernel Name",
    "Kernel Time",
    "Context",
    "Stream",
    "Block Size",
    "Grid Size",
    "Device",
    "CC",
    "Section Name",
    "Metric Name",
    "Metric Unit",
    "Metric Value",
    "Rule Name",
    "Rule Type",
    "Rule Description",
    "Estimated Speedup Type",
    "Estimated Speedup",
}


def _csv_rows(text: str) -> list[list[str]]:
    """The CSV part of ncu's output: from the header row (it names 'Kernel Name') on, ==PROF== lines dropped."""
    lines = [line for line in text.splitlines() if line.strip() and not line.startswith("==")]
    for index, line in enumerate(lines):
        if '"Kernel Name"' in line or line.startswith('"ID"'):
            return list(csv.reader(io.StringIO("\n".join(lines[index:]))))
    return []


def parse_csv(text: str) -> list[ParsedKernel]:
    """Parse `ncu --csv` output (raw or details page) into one ParsedKernel per profiled launch."""
    rows = _csv_rows(text)
    if not rows:
        return []
    header = rows[0]
    if "Metric Name" in header and "Metric Value" in header:
        return _parse_details(header, rows[1:])
    return _parse_raw(header, rows[1:])


def _parse_raw(header: list[str], rows: list[list[str]]) -> list[ParsedKernel]:
    """Raw page: a units row, then one row per launch with one column per metric."""
    if not rows:
        return []
    units = rows[0] if rows[0] and rows[0][0].strip() == "" else [""] * len(header)
    body = rows[1:] if units is rows[0] else rows
    name_at = header.index("Kernel Name") if "Kernel Name" in header else None
    kernels: list[ParsedKernel] = []
    for row in body:
        metrics: dict[str, Metric] = {}
        for column, (name, cell) in enumerate(zip(header, row, strict=False)):
            if name in RAW_ID_COLUMNS:
                continue
            number = _number(cell)
            if number is None:
                continue
            raw_unit = units[column] if column < len(units) else ""
            value, unit = normalise(number, raw_unit)
            metrics[name] = Metric(name=name, section=section_of(name), value=value, unit=unit, raw_unit=raw_unit)
        kernel = row[name_at] if name_at is not None and name_at < len(row) else ""
        kernels.append(ParsedKernel(kernel=kernel, metrics=metrics))
    return kernels


def _parse_details(header: list[str], rows: list[list[str]]) -> list[ParsedKernel]:
    """Details page: one row per (launch, section, metric); raw `--metrics` come under their raw names."""
    at = {name: i for i, name in enumerate(header)}
    kernels: dict[str, ParsedKernel] = {}
    needed = max(at[name] for name in ("Metric Name", "Metric Value") if name in at)
    for row in rows:
        if len(row) <= needed:  # rule columns at the end are often left off
            continue
        launch_id = row[at["ID"]] if "ID" in at else "0"
        parsed = kernels.setdefault(
            launch_id, ParsedKernel(kernel=row[at["Kernel Name"]] if "Kernel Name" in at else "", metrics={})
        )
        number = _number(row[at["Metric Value"]])
        name = row[at["Metric Name"]].strip()
        if number is None or not name:
            continue
        raw_unit = row[at["Metric Unit"]] if "Metric Unit" in at and at["Metric Unit"] < len(row) else ""
        value, unit = normalise(number, raw_unit)
        label = row[at["Section Name"]] if "Section Name" in at and at["Section Name"] < len(row) else ""
        section = DETAILS_SECTIONS.get(label, section_of(name) if "__" in name else label or "raw")
        parsed.metrics.setdefault(name, Metric(name=name, section=section, value=value, unit=unit, raw_unit=raw_unit))
    return list(kernels.values())
