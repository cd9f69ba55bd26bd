"""Zip bombs: a package is refused by its members' declared sizes, by the bytes they actually inflate to, by their
count and their total, with the package and the member named, and no member is inflated whole before it is known
to fit. The limits are set low here; the bombs are small."""

from __future__ import annotations

import io
import struct
import tracemalloc
import zipfile
from pathlib import Path

import pytest

from kernelforge_tui.cast import manifest as manifests
from kernelforge_tui.cast.manifest import CastError, ReadLimits, read_package, write_package
from tests.support.fixtures.cast.cast_support import MACHINE, members_of, rezip, softmax_entry, write_cast

SMALL = ReadLimits(members=16, member_bytes=64 << 10, total_bytes=256 << 10)
BOMB = "kernels/k0-softmax/sets/bomb.npz"
BOMB_BYTES = 16 << 20
"""Zeros: they deflate to about 16 KiB."""


def _with_bomb(tmp_path: Path, verified: bool = True) -> Path:
    path = write_cast(tmp_path / "bomb.cast", [softmax_entry()], machine=MACHINE if verified else None)
    return rezip(path, {**members_of(path), BOMB: bytes(BOMB_BYTES)})


def _understated(path: Path, name: str, size: int) -> Path:
    """The zip at `path` with `name`'s uncompressed size in both its headers set to `size` (a lie)."""
    raw = bytearray(path.read_bytes())
    with zipfile.ZipFile(io.BytesIO(bytes(raw))) as archive:
        local, start = archive.getinfo(name).header_offset, archive.start_dir
    struct.pack_into("<I", raw, local + 22, size)
    pos = start
    while raw[pos : pos + 4] == b"PK\x01\x02":
        name_len, extra_len, comment_len = struct.unpack_from("<HHH", raw, pos + 28)
        if raw[pos + 46 : pos + 46 + name_len] == name.encode():
            struct.pack_into("<I", raw, pos + 24, size)
        pos += 46 + name_len + extra_len + comment_len
    path.write_bytes(bytes(raw))
    return path


def _peak_of(path: Path, **options: object) -> tuple[int, str]:
    """The peak of Python's allocations while reading the package, and the refusal."""
    tracemalloc.start()
    try:
        with pytest.raises(CastError) as caught:
            read_package(path, **options)  # type: ignore[arg-type]
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    return peak, str(caught.value)


def test_a_member_declared_too_large_is_refused_before_it_is_inflated(tmp_path: Path) -> None:
    path = _with_bomb(tmp_path)
    assert path.stat().st_size < 1 << 20
    peak, message = _peak_of(path, limits=SMALL)
    assert f"{path}: {BOMB}: {BOMB_BYTES} bytes, more than the {64 << 10} a member may hold" in message
    assert peak < 4 << 20  # never the 16 MiB


def test_a_member_whose_header_understates_its_size_is_stopped_by_its_bytes(tmp_path: Path) -> None:
    path = _understated(_with_bomb(tmp_path), BOMB, 100)
    assert zipfile.ZipFile(path).getinfo(BOMB).file_size == 100
    peak, message = _peak_of(path, limits=SMALL)
    assert str(path) in message and BOMB in message
    assert "does not match its zip header" in message
    assert peak < 4 << 20


def test_too_many_members_are_refused(tmp_path: Path) -> None:
    path = write_cast(tmp_path / "many.cast", [softmax_entry()])
    rezip(path, {**members_of(path), **{f"reports/r{i}.txt": b"x" for i in range(20)}})
    with pytest.raises(CastError, match=f"{path}: 25 members, more than the 16 a package may hold"):
        read_package(path, limits=SMALL)


def test_members_too_large_together_are_refused(tmp_path: Path) -> None:
    path = write_cast(tmp_path / "total.cast", [softmax_entry()])
    rezip(path, {**members_of(path), **{f"reports/r{i}.txt": bytes(60 << 10) for i in range(5)}})
    with pytest.raises(CastError, match=r"bytes in all, more than the 262144 a package may hold \(the largest"):
        read_package(path, limits=SMALL)


def test_a_package_not_checked_on_a_gpu_is_refused_before_its_members_are_read(tmp_path: Path) -> None:
    # The bomb lies about its size; "require" stops at the manifest, so its bytes are never touched.
    path = _understated(_with_bomb(tmp_path, verified=False), BOMB, 100)
    with pytest.raises(CastError, match="is not checked on a GPU yet"):
        read_package(path, stamp="require", limits=SMALL)


def test_a_member_twice_is_refused(tmp_path: Path) -> None:
    path = write_cast(tmp_path / "twice.cast", [softmax_entry()])
    with pytest.warns(UserWarning, match="Duplicate name"), zipfile.ZipFile(path, "a") as archive:
        archive.writestr("manifest.json", b"{}")
    with pytest.raises(CastError, match=r"manifest\.json is in the zip twice"):
        read_package(path)


def test_the_writer_refuses_a_package_the_reader_would(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(manifests, "DEFAULT_LIMITS", ReadLimits(member_bytes=8 << 10))
    package = read_package(write_cast(tmp_path / "a.cast", [softmax_entry()]))
    files = {**package.members, "reports/big.txt": bytes(16 << 10)}
    with pytest.raises(CastError, match=r"reports/big.txt: 16384 bytes, more than the 8192 .*export fewer kernels"):
        write_package(tmp_path / "b.cast", package.manifest, files)
    assert not (tmp_path / "b.cast").exists()
