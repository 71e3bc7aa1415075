"""Temporary folders: what a run leaves behind when processes it started are killed."""

from __future__ import annotations

import mmap
import os
import time
from pathlib import Path

import pytest
from txstream.cluster import scratch
from txstream.cluster.scratch import written_whole


def _library(folder: Path) -> Path:
    """A folder as a JVM leaves it after extracting Ray's native library."""
    folder.mkdir(parents=True)
    library = folder / "libcore_worker_library_java.so"
    library.write_bytes(b"\0" * 4096)
    return library


def test_library_folders_of_killed_jvms_are_removed(tmp_path, monkeypatch):
    monkeypatch.setattr(scratch, "_JAVA_DRIVER_ROOT", tmp_path)
    monkeypatch.setattr(scratch, "_EXTRACTED_S", 0.0)
    earlier = _library(tmp_path / "1000").parent  # another run's, from before this one
    an_hour_ago = time.time() - 3600
    os.utime(earlier, (an_hour_ago, an_hour_ago))
    libraries = scratch.JavaDriverLibraries()
    killed = _library(tmp_path / "2000").parent  # made during the run, mapped by nobody
    libraries.remove()
    assert earlier.exists()
    assert not killed.exists()


def test_a_library_folder_a_live_process_maps_is_kept(monkeypatch):
    monkeypatch.setattr(scratch, "_EXTRACTED_S", 0.0)
    libraries = scratch.JavaDriverLibraries()
    root_existed = scratch._JAVA_DRIVER_ROOT.exists()
    library = _library(scratch._JAVA_DRIVER_ROOT / f"9{time.time_ns()}")
    try:
        with library.open("rb") as file, mmap.mmap(file.fileno(), 0, prot=mmap.PROT_READ):
            libraries.remove()  # this process maps it, as a running JVM does
            assert library.exists()
    finally:
        scratch.remove_tree(library.parent)
        if not root_existed:
            scratch._JAVA_DRIVER_ROOT.rmdir()


def test_a_file_written_whole_or_not_at_all(tmp_path):
    target = tmp_path / "kept.bin"
    target.write_bytes(b"before")
    with pytest.raises(RuntimeError), written_whole(target) as partial:
        partial.write_bytes(b"half")
        raise RuntimeError("the write failed")
    assert target.read_bytes() == b"before"
    with written_whole(target) as partial:
        partial.write_bytes(b"after")
    assert target.read_bytes() == b"after"
    assert [p.name for p in tmp_path.iterdir()] == ["kept.bin"]
