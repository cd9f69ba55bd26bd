"""The .cast manifest: it round-trips, it is versioned, and a reader refuses what it cannot trust."""

from __future__ import annotations

import json
import zipfile
from pathlib import Path

import pytest

from kernelforge_tui.cast.manifest import FORMAT_VERSION, MANIFEST_NAME, CastError, read_package
from tests.support.fixtures.cast.cast_support import MACHINE, softmax_entry, write_cast


def _rewrite_manifest(path: Path, change: dict[str, object]) -> None:
    with zipfile.ZipFile(path) as archive:
        members = {name: archive.read(name) for name in archive.namelist()}
    manifest = json.loads(members[MANIFEST_NAME])
    manifest.update(change)
    members[MANIFEST_NAME] = json.dumps(manifest).encode()
    with zipfile.ZipFile(path, "w") as archive:
        for name, data in members.items():
            archive.writestr(name, data)


def test_a_package_round_trips_byte_for_byte(tmp_path: Path) -> None:
    first = write_cast(tmp_path / "a.cast", [softmax_entry()])
    package = read_package(first)
    assert package.manifest.format_version == FORMAT_VERSION == 3
    assert package.manifest.kernels[0].guard.inputs[0].shape == (4, 8)
    assert package.manifest.stamp is not None and package.manifest.stamp.machine == MACHINE
    again = tmp_path / "b.cast"
    from kernelforge_tui.cast.manifest import write_package

    write_package(again, package.manifest, package.members)
    assert read_package(again).manifest == package.manifest
    assert again.read_bytes() == first.read_bytes()  # fixed timestamps, sorted members


@pytest.mark.parametrize(
    ("version", "says"),
    [
        (4, "format version 4, this kernelforge reads versions 2 and 3: upgrade kernelforge"),
        (1, "format version 1, this kernelforge reads versions 2 and 3: export it again"),
    ],
)
def test_another_format_version_is_refused_by_name(tmp_path: Path, version: int, says: str) -> None:
    path = write_cast(tmp_path / "a.cast", [softmax_entry()])
    _rewrite_manifest(path, {"format_version": version})
    with pytest.raises(CastError, match=says):
        read_package(path)


def test_an_unknown_key_is_an_error_not_ignored(tmp_path: Path) -> None:
    path = write_cast(tmp_path / "a.cast", [softmax_entry()])
    _rewrite_manifest(path, {"surprise": 1})
    with pytest.raises(CastError, match="surprise"):
        read_package(path)


def test_what_is_not_a_package_says_so(tmp_path: Path) -> None:
    with pytest.raises(CastError, match="no such file"):
        read_package(tmp_path / "missing.cast")
    (tmp_path / "text.cast").write_text("hello")
    with pytest.raises(CastError, match="not a readable zip"):
        read_package(tmp_path / "text.cast")
    with zipfile.ZipFile(tmp_path / "empty.cast", "w") as archive:
        archive.writestr("other.txt", "x")
    with pytest.raises(CastError, match=f"no {MANIFEST_NAME}"):
        read_package(tmp_path / "empty.cast")


@pytest.mark.parametrize(
    ("change", "says"),
    [
        ({"capability": (8, 0)}, "GPU architecture sm_90 there, sm_80 here"),
        ({"driver_version": "535.104.05"}, "driver major 570 there, 535 here"),
        ({"cuda_version": "12.4"}, "CUDA 12.8 there, 12.4 here"),
        ({"torch_version": "2.12.0+cu128"}, "torch 2.13.0+cu128 there, 2.12.0+cu128 here"),
    ],
)
def test_machine_differences_name_each_field(change: dict[str, object], says: str) -> None:
    assert MACHINE.differences(MACHINE.model_copy(update=change)) == [says]


def test_the_same_machine_with_another_minor_driver_and_binding_does_not_differ() -> None:
    other = MACHINE.model_copy(update={"driver_version": "570.200.01", "cuda_version": "12.8.1", "binding": "pycuda"})
    assert MACHINE.differences(other) == []


def test_scalar_types_survive_the_round_trip(tmp_path: Path) -> None:
    # The guard compares types (True is not 1 there): JSON's 1 must come back an int, false a bool, 1.0 a float.
    package = read_package(write_cast(tmp_path / "a.cast", [softmax_entry()]))
    accepts = {a.name: a.accepts for a in package.manifest.kernels[0].guard.args if a.tensor is None}
    assert [type(v) for v in accepts["dim"]] == [int, int] and accepts["half_to_float"] == [False]
    assert type(accepts["half_to_float"][0]) is bool
    from kernelforge_tui.cast.manifest import AtenArg

    assert [
        type(v)
        for v in AtenArg.model_validate_json(
            '{"name": "eps", "position": 3, "accepts": [1.0, 2, true, [1, 2]]}'
        ).accepts
    ] == [float, int, bool, list]
