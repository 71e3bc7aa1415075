"""A node's checkpoints as rounds of the run's (`txstream.nodes.rounds`), without Ray: a
node's successor goes back to the round asked for, even while the process of the node
before it, stopped but not yet gone, still writes the next round's checkpoint."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from txstream.errors import RuntimeFailure
from txstream.nodes import rounds
from txstream.state.checkpoints import PREFIX, CheckpointStore

TS = 2000
"""The node's own events at both rounds: the units between them were gathered ones."""

# The node before: holds the folder, then writes round 2's checkpoint of the same ts as
# round 1's, as `NodeTeam.checkpoint` does, late enough that its successor started.
LATE_NODE = """
import sys, time
from pathlib import Path
import numpy as np
from txstream.nodes import rounds
from txstream.state.checkpoints import PREFIX, CheckpointStore
folder = Path(sys.argv[1])
held = rounds.claim(folder, 5.0)
print("held", flush=True)
time.sleep(0.5)
rounds.keep_aside(folder, {ts})
names = ("values", "set_cells", "set_members")
CheckpointStore(folder).write({ts}, {{n: np.full(64, 2, np.int64) for n in names}}, {{}})
rounds.mark(folder, {ts}, 2)
"""


def write_round(folder: Path, number: int) -> None:
    """A node's checkpoint of `TS` events at round ``number``, its values all ``number``."""
    arrays = {
        name: np.full(64, number, np.int64) for name in ("values", "set_cells", "set_members")
    }
    CheckpointStore(folder).write(TS, arrays, {})
    rounds.mark(folder, TS, number)


def _late_node(folder: Path) -> subprocess.Popen:
    node = subprocess.Popen(
        [sys.executable, "-c", LATE_NODE.format(ts=TS), str(folder)],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert node.stdout.readline().strip() == "held"
    return node


def test_a_successor_goes_back_to_the_round_asked_once_the_node_before_is_gone(tmp_path):
    folder = tmp_path / "node-2"
    write_round(folder, 1)
    late = _late_node(folder)
    try:
        held = rounds.claim(folder, 10.0)  # what the successor does first
        rounds.take_back(folder, TS, 1)
        newest = CheckpointStore(folder).latest()
        assert late.wait(timeout=10) == 0
        assert rounds.round_of(newest.path) == 1
        for name in ("values", "set_cells", "set_members"):
            assert newest.load(name).tolist() == [1] * 64
        os.close(held)
    finally:
        late.kill()


def test_a_node_whose_folder_stays_held_fails(tmp_path):
    folder = tmp_path / "node-0"
    write_round(folder, 1)
    late = _late_node(folder)
    try:
        with pytest.raises(RuntimeFailure, match="still runs"):
            rounds.claim(folder, 0.1)
    finally:
        late.kill()
        late.wait()


def test_a_node_that_ended_while_replacing_its_checkpoint_goes_back_to_the_one_kept(tmp_path):
    """Round 2 removed round 1's checkpoint of the same ts, and the process ended before
    its own was renamed into place: the one kept takes that name again, not the name of
    an older one, which stays as it was."""
    folder = tmp_path / "node-1"
    CheckpointStore(folder).write(TS - 500, {"values": np.zeros(64, np.int64)}, {})
    rounds.mark(folder, TS - 500, 0)
    write_round(folder, 1)
    rounds.keep_aside(folder, TS)
    shutil.rmtree(folder / f"{PREFIX}{TS:012d}")
    rounds.take_back(folder, TS, 1)
    newest = CheckpointStore(folder).latest()
    assert newest.path.name == f"{PREFIX}{TS:012d}" and newest.ts == TS
    assert rounds.round_of(newest.path) == 1
    assert newest.load("set_members").tolist() == [1] * 64
    assert rounds.round_of(folder / f"{PREFIX}{TS - 500:012d}") == 0


class Killed(BaseException):
    """The process ended there."""


def test_a_node_killed_while_removing_the_checkpoint_it_replaces_goes_back_whole(
    tmp_path, monkeypatch
):
    """Round 2 replaces round 1's checkpoint of the same ts, and the process ends while a
    folder is being removed (a file gone, the rest left): round 1's checkpoint is still
    there whole, never one that looks complete but lacks a file."""
    folder = tmp_path / "node-2"
    write_round(folder, 1)
    rounds.keep_aside(folder, TS)

    def killed_midway(path, ignore_errors=False):
        if Path(path).exists():
            (Path(path) / "set_members.npy").unlink()
            raise Killed

    arrays = {name: np.full(64, 2, np.int64) for name in ("values", "set_cells", "set_members")}
    with monkeypatch.context() as patched, pytest.raises(Killed):
        patched.setattr(shutil, "rmtree", killed_midway)
        CheckpointStore(folder).write(TS, arrays, {})
    rounds.take_back(folder, TS, 1)
    newest = CheckpointStore(folder).latest()
    assert rounds.round_of(newest.path) == 1
    for name in ("values", "set_cells", "set_members"):
        assert newest.load(name).tolist() == [1] * 64
