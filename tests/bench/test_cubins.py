"""bench/cubins.py's `split`: one folder per configuration, so that a configuration whose kernel faults (the TMA
GEMM's "illegal instruction" on the H100, 2026-12-07, which killed every later configuration's run with its
context) is run, and fails, alone."""

from __future__ import annotations

import json
from pathlib import Path

from tests.support.scripts import ROOT, load_script

cubins = load_script(ROOT / "bench" / "cubins.py")


def _variant(case: str, config: str, cubin: str) -> dict[str, object]:
    return {"case": case, "config": config, "cubin": cubin, "grid": [1, 1, 1], "block": 128, "shared": 0, "args": []}


def test_each_configuration_gets_a_manifest_of_its_own_cases_and_cubins(tmp_path: Path) -> None:
    built = tmp_path / "built"
    built.mkdir()
    variants = [
        _variant("mm", "tma", "a.cubin"),
        _variant("mm", "cp_async", "b.cubin"),
        _variant("bmm", "tma", "c.cubin"),
    ]
    for v in variants:
        (built / str(v["cubin"])).write_bytes(str(v["cubin"]).encode())
    cases = [{"name": "mm", "M": 8}, {"name": "bmm", "M": 4}]
    (built / "manifest.json").write_text(json.dumps({"cases": cases, "variants": variants, "build_seconds": [1.0]}))

    folders = cubins.split(built, tmp_path / "split")

    assert [f.name for f in folders] == ["0", "1"]  # in the manifest's order of first appearance
    first, second = (json.loads((f / "manifest.json").read_text()) for f in folders)
    assert [(v["case"], v["cubin"]) for v in first["variants"]] == [("mm", "a.cubin"), ("bmm", "c.cubin")]
    assert [c["name"] for c in first["cases"]] == ["mm", "bmm"]
    assert [c["name"] for c in second["cases"]] == ["mm"]  # a case none of its variants build is not run
    assert (folders[0] / "c.cubin").read_bytes() == b"c.cubin"
    assert not (folders[1] / "a.cubin").exists()
