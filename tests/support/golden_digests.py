"""Golden digests: a test's renders as sha256 digests held in tests/support/golden/*.json, so that a change to a
kernel's text is a reviewed change, never a side effect of moving text around. After a deliberate change (a template's:
with its version bumped), rewrite the digests with `KERNELFORGE_UPDATE_GOLDEN=1 pytest <the test>` and commit the JSON
with a word on why the kernels changed."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

GOLDEN = Path(__file__).parent / "golden"
UPDATE = os.environ.get("KERNELFORGE_UPDATE_GOLDEN") == "1"


def sha256(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def assert_matches_golden(file: str, section: str, got: dict[str, str], version: int | None = None) -> None:
    """`got` (render name -> digests) equals the section of GOLDEN/file, or, with the update flag, replaces it.

    With a `version` (a template's), the section holds it beside the digests, and a digest that changed under the
    version it was recorded with fails even with the update flag: a template's changed render is a new candidate of
    a new version (vocabulary/identity.py), so the version must be bumped first."""
    path = GOLDEN / file
    golden: dict[str, Any] = json.loads(path.read_text()) if path.is_file() else {}
    stored = golden.get(section, {})
    want: dict[str, str] = stored.get("renders", {}) if version is not None else stored
    changed = sorted(k for k in got.keys() & want.keys() if got[k] != want[k])
    if version is not None and changed and stored.get("version") == version:
        raise AssertionError(
            f"{section}: {len(changed)} renders changed under version {version} (first: {changed[0]}): bump its "
            "version (runs hold its candidates by template, version and params), then rerun with "
            "KERNELFORGE_UPDATE_GOLDEN=1"
        )
    if UPDATE:
        golden[section] = got if version is None else {"version": version, "renders": got}
        path.write_text(json.dumps(dict(sorted(golden.items())), indent=1) + "\n")
        return
    assert (changed, sorted(got.keys() - want.keys()), sorted(want.keys() - got.keys())) == ([], [], []), (
        f"{section}'s renders differ from {file} (changed, new, gone): if the change is meant, rerun with "
        "KERNELFORGE_UPDATE_GOLDEN=1 and commit the JSON saying why"
    )
    if version is not None:
        assert stored.get("version") == version, (
            f"{section} is version {version}, {file} holds version {stored.get('version')}: rerun with "
            "KERNELFORGE_UPDATE_GOLDEN=1"
        )
