"""Ray's native library for Java, extracted once and linked into each local Ray's session."""

from __future__ import annotations

import os
import sys
import zipfile
from pathlib import Path

import pytest
from txstream.cluster import ray_private
from txstream.cluster.ray_private import JAVA_LIBRARY, java_library_placed

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux")


def _jar(path: Path, library: bytes | None, mtime: int) -> Path:
    with zipfile.ZipFile(path, "w") as jar:
        jar.writestr("io/ray/Other.class", b"class")
        if library is not None:
            jar.writestr(JAVA_LIBRARY, library)
    os.utime(path, (mtime, mtime))
    return path


def _session(tmp_path: Path, name: str) -> Path:
    folder = tmp_path / name
    folder.mkdir()
    return folder


def test_extracted_once_and_linked_into_every_session(tmp_path, monkeypatch):
    jar, kept = _jar(tmp_path / "ray.jar", b"library 1", 1_000), tmp_path / "kept"
    first = _session(tmp_path, "session_1")
    java_library_placed(first, jar, kept)
    linked = first / "libcore_worker_library_java.so"
    assert linked.is_symlink() and linked.read_bytes() == b"library 1"
    (library,) = kept.glob("ray-java-*.so")
    assert linked.resolve() == library.resolve()

    def no_extraction(*args):
        raise AssertionError("extracted again")

    monkeypatch.setattr(ray_private, "_extract", no_extraction)
    second = _session(tmp_path, "session_2")
    java_library_placed(second, jar, kept)
    assert (second / "libcore_worker_library_java.so").read_bytes() == b"library 1"


def test_another_jar_replaces_the_kept_library(tmp_path):
    kept = tmp_path / "kept"
    java_library_placed(_session(tmp_path, "a"), _jar(tmp_path / "1.jar", b"old", 1_000), kept)
    session = _session(tmp_path, "b")
    java_library_placed(session, _jar(tmp_path / "2.jar", b"newer", 2_000), kept)
    assert (session / "libcore_worker_library_java.so").read_bytes() == b"newer"
    assert len(list(kept.glob("ray-java-*.so"))) == 1
    assert not list(kept.glob("*.partial"))


def test_nothing_placed_without_the_library_or_over_one_there(tmp_path):
    kept = tmp_path / "kept"
    session = _session(tmp_path, "a")
    java_library_placed(session, _jar(tmp_path / "none.jar", None, 1_000), kept)
    assert not list(session.iterdir())  # Ray extracts it itself
    extracted = _session(tmp_path, "b") / "libcore_worker_library_java.so"
    extracted.write_bytes(b"extracted by Ray")
    java_library_placed(extracted.parent, _jar(tmp_path / "ray.jar", b"lib", 1_000), kept)
    assert not extracted.is_symlink() and extracted.read_bytes() == b"extracted by Ray"
