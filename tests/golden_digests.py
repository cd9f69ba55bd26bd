"""Golden digests: a test's renders as sha256 digests held in tests/golden/*.json, so that a change to a kernel's text
is a reviewed change, never a side effect of moving text around. After a deliberate change, rewrite the digests with
`KERNELFORGE_UPDATE_GOLDEN=1 pytest <the test>` and commit the JSON with a word on why the kernels changed."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

GOLDEN = Path(__file__).parent / "golden"
UPDATE = os.environ.get("KERNELFORGE_UPDATE_GOLDEN") == "1"


def sha256(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def assert_matches_golden(file: str, section: str, got: dict[str, str]) -> None:
    """`got` (render name -> digests) equals the section of GOLDEN/file, or, with the update flag, replaces it."""
    path = GOLDEN / file
    golden: dict[str, dict[str, str]] = json.loads(path.read_text()) if path.is_file() else {}
    if UPDATE:
        golden[section] = got
        path.write_text(json.dumps(dict(sorted(golden.items())), indent=1) + "\n")
    want = golden.get(section, {})
    changed = sorted(k for k in got.keys() & want.keys() if got[k] != want[k])
    assert (changed, sorted(got.keys() - want.keys()), sorted(want.keys() - got.keys())) == ([], [], []), (
        f"{section}'s renders differ from {file} (changed, new, gone): if the change is meant, rerun with "
        "KERNELFORGE_UPDATE_GOLDEN=1 and commit the JSON saying why"
    )
