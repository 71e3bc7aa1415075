"""`--follow`'s folder watch, without a session: what ends it and what it leaves."""

from __future__ import annotations

import threading

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from txstream.connectors.follow import STOP_FILE, check_folder, follow
from txstream.errors import UsageError


def test_stop_ends_following_after_the_files_present_and_is_consumed(tmp_path):
    pq.write_table(pa.table({"x": [1, 2]}), tmp_path / "a.parquet")
    (tmp_path / STOP_FILE).touch()
    assert "is already there" in check_folder(tmp_path)  # said, not silent
    pushed = []
    assert follow(pushed.append, lambda: 2, tmp_path, threading.Event()) == 1
    assert pushed == [tmp_path / "a.parquet"]
    assert not (tmp_path / STOP_FILE).exists()  # a later run on the folder follows it
    assert check_folder(tmp_path) is None


def test_following_what_is_not_a_folder_is_refused(tmp_path):
    with pytest.raises(UsageError, match="is not a folder"):
        check_folder(tmp_path / "missing")
