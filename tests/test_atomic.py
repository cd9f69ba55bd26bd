"""The atomic-write helper: the target holds the old content or the new one, never part of either, and a failed
write leaves no temporary behind. Written against a helper that writes in place, these tests fail."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

from kernelforge_tui import atomic
from kernelforge_tui.atomic import replacing, temporary_beside, write_atomic


def _names(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir())


def test_write_atomic_replaces_bytes_and_text_and_leaves_only_the_target(tmp_path: Path) -> None:
    target = tmp_path / "manifest.json"
    write_atomic(target, b"old\n")
    assert target.read_bytes() == b"old\n"
    write_atomic(target, "new\n")
    assert target.read_text() == "new\n"
    assert _names(tmp_path) == ["manifest.json"]


def test_a_write_failing_midway_keeps_the_old_content_and_no_temporary(tmp_path: Path) -> None:
    target = tmp_path / "cache.json"
    target.write_text("old")
    with pytest.raises(UnicodeEncodeError):  # a lone surrogate encodes in no codec: the write fails part way
        write_atomic(target, "new \udc80 text")
    assert target.read_text() == "old"  # a helper that opened the target itself would have truncated it
    assert _names(tmp_path) == ["cache.json"]


def test_a_failed_rename_keeps_the_old_content_and_no_temporary(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    target = tmp_path / "entry.cubin"
    target.write_bytes(b"old")

    def refuse(src: object, dst: object) -> None:
        raise OSError("no rename today")

    monkeypatch.setattr(atomic.os, "replace", refuse)
    with pytest.raises(OSError, match="no rename today"):
        write_atomic(target, b"new")
    assert target.read_bytes() == b"old"
    assert _names(tmp_path) == ["entry.cubin"]


def test_a_reader_sees_the_old_file_until_the_block_ends(tmp_path: Path) -> None:
    target = tmp_path / "runs.db"
    target.write_bytes(b"old")
    with replacing(target) as tmp:
        assert tmp.parent == target.parent and tmp != target
        tmp.write_bytes(b"new, written in pieces")
        assert target.read_bytes() == b"old"
    assert target.read_bytes() == b"new, written in pieces"
    assert _names(tmp_path) == ["runs.db"]


def test_an_error_in_the_block_removes_the_temporary_and_its_companions(tmp_path: Path) -> None:
    target = tmp_path / "runs.db"
    target.write_bytes(b"old")
    with pytest.raises(RuntimeError), replacing(target, companions=("-wal", "-shm")) as tmp:
        tmp.write_bytes(b"half")
        tmp.with_name(tmp.name + "-wal").write_bytes(b"log")
        tmp.with_name(tmp.name + "-shm").write_bytes(b"index")
        raise RuntimeError("killed mid-build")
    assert target.read_bytes() == b"old"
    assert _names(tmp_path) == ["runs.db"]


def test_a_block_that_leaves_no_temporary_leaves_the_target_alone(tmp_path: Path) -> None:
    target = tmp_path / "model.cast"
    target.write_bytes(b"a proven package")
    with replacing(target, tag="export") as staged:
        assert staged.name.endswith(".export")
        staged.write_bytes(b"a package of no kernel")
        staged.unlink()
    assert target.read_bytes() == b"a proven package"
    with replacing(tmp_path / "never.cast"):
        pass
    assert _names(tmp_path) == ["model.cast"]


def test_a_new_file_gets_the_permissions_of_a_plain_write(tmp_path: Path) -> None:
    plain, replaced = tmp_path / "plain", tmp_path / "replaced"
    plain.write_bytes(b"x")
    write_atomic(replaced, b"x")
    assert replaced.stat().st_mode == plain.stat().st_mode


def test_every_temporary_name_is_new(tmp_path: Path) -> None:
    target = tmp_path / "manifest.json"
    names = {temporary_beside(target) for _ in range(100)}
    assert len(names) == 100
    assert all(n.parent == tmp_path and n.name.startswith(f".manifest.json.{os.getpid()}.") for n in names)


def test_a_polling_reader_never_sees_part_of_a_file(tmp_path: Path) -> None:
    target = tmp_path / "bench.json"
    versions = [bytes([65 + i]) * (1 << 20) for i in range(2)]
    write_atomic(target, versions[0])
    done = threading.Event()
    seen: set[bytes] = set()

    def write() -> None:
        try:
            for i in range(40):
                write_atomic(target, versions[i % 2])
        finally:
            done.set()

    writer = threading.Thread(target=write)
    writer.start()
    while not done.is_set():
        seen.add(target.read_bytes())
    writer.join()
    assert seen <= set(versions), sorted(len(s) for s in seen)
    assert _names(tmp_path) == ["bench.json"]
