"""A run's log: what its process and children write goes to OUTPUT/_logs/txstream.log."""

from __future__ import annotations

import io
import logging
import os
import subprocess
import sys

import pytest
from txstream.errors import SchemaError, UsageError
from txstream.monitor.console import Console
from txstream.monitor.logs import LOG_FILE, LOG_FOLDER, log_of, run_log


def _noise() -> None:
    """What Ray, Spark and the JVM do: write to fds 1 and 2, from this process and from
    a child that inherits them (Python's own sys.stdout is fd 1 in the command, not under
    pytest: the command's test covers it)."""
    os.write(1, b"native stdout\n")
    os.write(2, b"native stderr\n")
    child = "import sys; print('child out'); sys.stderr.write('child err')"
    subprocess.run([sys.executable, "-c", child], check=True)
    logging.getLogger("txstream").info("a record")


def test_output_of_the_process_and_its_children_goes_to_the_log(tmp_path, capfd):
    console = Console(enabled=True)
    with run_log(tmp_path / "out", "info", console=console) as path:
        _noise()
        with console.phase("starting Ray"):
            pass
    assert path == tmp_path / "out" / LOG_FOLDER / LOG_FILE
    out, err = capfd.readouterr()
    assert out == ""
    assert err.startswith("txstream: starting Ray ... ") and err.count("\n") == 1
    text = path.read_text()
    for line in ("native stdout", "native stderr", "child out", "child err", "a record"):
        assert line in text
    assert "starting Ray: done in" in text
    print("after the run")  # the fds are back
    assert capfd.readouterr().out == "after the run\n"


def test_verbose_leaves_the_output_on_the_terminal_and_records_in_both(tmp_path, capfd):
    with run_log(tmp_path / "out", "info", verbose=True) as path:
        _noise()
    out, err = capfd.readouterr()
    assert "native stdout" in out and "native stderr" in err and "a record" in err
    assert "a record" in path.read_text() and "native stderr" not in path.read_text()


def test_level_filters_txstream_records(tmp_path):
    with run_log(tmp_path / "out", "warning") as path:
        logging.getLogger("txstream").info("detail")
        logging.getLogger("txstream").warning("important")
    text = path.read_text()
    assert "important" in text and "detail" not in text
    with pytest.raises(UsageError, match="--log-level"), run_log(tmp_path / "x", "loud"):
        pass


def test_without_output_the_log_is_removed_unless_the_run_failed(tmp_path, monkeypatch):
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", None)
    with run_log(None) as path:
        pass
    assert not path.parent.exists()
    with pytest.raises(ZeroDivisionError) as failure, run_log(None) as path:
        raise ZeroDivisionError("division by zero")
    assert log_of(failure.value) == path
    assert failure.value.__notes__ == [f"txstream log: {path}"]
    assert "Traceback" in path.read_text() and "ZeroDivisionError" in path.read_text()
    assert path.parent.parent == tmp_path


def test_a_schema_error_leaves_no_log_and_no_output_folder(tmp_path):
    with pytest.raises(SchemaError), run_log(tmp_path / "out"):
        raise SchemaError("missing column 'asset'")
    assert not (tmp_path / "out").exists()
    (tmp_path / "kept").mkdir()
    with pytest.raises(UsageError), run_log(tmp_path / "kept"):
        raise UsageError("no")
    assert list((tmp_path / "kept").iterdir()) == []


def test_console_with_its_own_stream_keeps_it(tmp_path, capfd):
    mine = io.StringIO()
    console = Console(stream=mine)
    with run_log(tmp_path / "out", console=console), console.phase("staging the input"):
        pass
    assert mine.getvalue().startswith("txstream: staging the input ... ")
    assert capfd.readouterr().err == ""


def test_a_run_started_again_appends_to_the_log_of_the_one_before(tmp_path):
    with pytest.raises(ZeroDivisionError), run_log(tmp_path / "out") as path:
        logging.getLogger("txstream").info("the first run, killed")
        raise ZeroDivisionError("killed")
    with pytest.raises(UsageError), run_log(tmp_path / "out"):
        raise UsageError("a bad option: nothing ran")
    with run_log(tmp_path / "out"):
        logging.getLogger("txstream").info("the second run, resumed")
    text = path.read_text()
    assert text.index("the first run, killed") < text.index("the second run, resumed")
    assert text.count(" pid ") == 3  # each run starts with its own header
