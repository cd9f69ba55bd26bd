"""The stamp is bound to the contents: a stamp typed into the JSON, an edit to the manifest or a member after
verification, and a member that does not match its recorded sha256 are refused when the package is opened."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kernelforge_tui.cast.manifest import MANIFEST_NAME, CastError, content_digest, read_package, sha256
from tests.support.fixtures.cast.cast_support import MACHINE, members_of, rezip, softmax_entry, write_cast

STALE = "its stamp does not match its contents"


def _edit_manifest(path: Path, change: dict[str, object]) -> Path:
    members = members_of(path)
    manifest = json.loads(members[MANIFEST_NAME])
    manifest.update(change)
    members[MANIFEST_NAME] = json.dumps(manifest).encode()
    return rezip(path, members)


def test_a_written_stamp_carries_the_digest_of_the_contents(tmp_path: Path) -> None:
    package = read_package(write_cast(tmp_path / "a.cast", [softmax_entry()]))
    stamp = package.manifest.stamp
    assert stamp is not None and len(stamp.digest) == 64
    hashes = {name: sha256(data) for name, data in package.members.items()}
    assert stamp.digest == content_digest(package.manifest, hashes)


@pytest.mark.parametrize("digest", [None, "", "0" * 64])
def test_a_stamp_typed_into_the_json_is_refused(tmp_path: Path, digest: str | None) -> None:
    path = write_cast(tmp_path / "a.cast", [softmax_entry()], machine=None)
    stamp: dict[str, object] = {"machine": MACHINE.model_dump(mode="json"), "at": 0.0, "by": "verify"}
    stamp["sanitizer"] = True
    if digest is not None:
        stamp["digest"] = digest
    _edit_manifest(path, {"stamp": stamp})
    with pytest.raises(CastError, match=STALE) as caught:
        read_package(path)
    assert f"kernelforge verify {path}" in str(caught.value)


def test_a_manifest_edited_after_verification_is_refused(tmp_path: Path) -> None:
    path = write_cast(tmp_path / "a.cast", [softmax_entry()])
    manifest = json.loads(members_of(path)[MANIFEST_NAME])
    manifest["kernels"][0]["tolerances"]["y"]["rtol"] = 0.5
    _edit_manifest(path, {"kernels": manifest["kernels"]})
    with pytest.raises(CastError, match=STALE):
        read_package(path)


def test_an_edited_stamp_machine_is_refused(tmp_path: Path) -> None:
    path = write_cast(tmp_path / "a.cast", [softmax_entry()])
    stamp = json.loads(members_of(path)[MANIFEST_NAME])["stamp"]
    stamp["machine"]["torch_version"] = "2.1.0"
    _edit_manifest(path, {"stamp": stamp})
    with pytest.raises(CastError, match=STALE):
        read_package(path)


def test_a_cubin_swapped_with_its_hash_after_verification_is_refused(tmp_path: Path) -> None:
    path = write_cast(tmp_path / "a.cast", [softmax_entry()])
    entry = read_package(path).manifest.kernels[0]
    members = members_of(path)
    other = b"\x7fELF another kernel"
    members[entry.files.cubin] = other
    manifest = json.loads(members[MANIFEST_NAME])
    manifest["kernels"][0]["files"]["sha256"][entry.files.cubin] = sha256(other)
    members[MANIFEST_NAME] = json.dumps(manifest).encode()
    rezip(path, members)
    with pytest.raises(CastError, match=STALE):
        read_package(path)


def test_a_member_added_after_verification_is_refused(tmp_path: Path) -> None:
    path = write_cast(tmp_path / "a.cast", [softmax_entry()])
    rezip(path, {**members_of(path), "reports/extra.txt": b"x"})
    with pytest.raises(CastError, match=STALE):
        read_package(path)


def test_a_changed_member_fails_its_hash_on_opening(tmp_path: Path) -> None:
    path = write_cast(tmp_path / "a.cast", [softmax_entry()], machine=None)
    entry = read_package(path).manifest.kernels[0]
    rezip(path, {**members_of(path), entry.files.ptx: b".version 9.9\n"})
    with pytest.raises(CastError, match=f"{entry.files.ptx} does not match its sha256 in the manifest"):
        read_package(path, stamp="ignore")


def test_a_kernel_file_without_a_recorded_hash_is_refused(tmp_path: Path) -> None:
    path = write_cast(tmp_path / "a.cast", [softmax_entry()], machine=None)
    manifest = json.loads(members_of(path)[MANIFEST_NAME])
    cubin = manifest["kernels"][0]["files"]["cubin"]
    del manifest["kernels"][0]["files"]["sha256"][cubin]
    _edit_manifest(path, {"kernels": manifest["kernels"]})
    with pytest.raises(CastError, match=f"{cubin} has no sha256 in the manifest"):
        read_package(path)


def test_verify_reads_a_package_whose_stamp_went_stale(tmp_path: Path) -> None:
    # verify runs every check again and replaces the stamp: an edited note must not lock the package out of it.
    path = write_cast(tmp_path / "a.cast", [softmax_entry()])
    _edit_manifest(path, {"notes": ["edited by hand"]})
    assert read_package(path, stamp="ignore").manifest.notes == ["edited by hand"]
    with pytest.raises(CastError, match=STALE):
        read_package(path)


def test_require_refuses_a_package_not_checked_on_a_gpu(tmp_path: Path) -> None:
    path = write_cast(tmp_path / "a.cast", [softmax_entry()], machine=None)
    assert read_package(path).manifest.stamp is None
    with pytest.raises(
        CastError,
        match=r"is not checked on a GPU yet \(exported with --no-sanitize\): its kernels were proven in the search but "
        r"not yet through the runtime on a GPU, so the loader refuses it until `kernelforge verify .*a\.cast` passes",
    ):
        read_package(path, stamp="require")
