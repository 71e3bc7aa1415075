"""The checkpoint folder of a run that completed (no Ray needed)."""

from __future__ import annotations

import numpy as np
from txstream.state.checkpoints import CheckpointStore


def test_a_completed_run_leaves_no_checkpoint_and_is_not_resumed(tmp_path):
    store = CheckpointStore(tmp_path / "ckpt")
    for ts in (100, 200):
        store.write(ts, {"accounts": np.arange(10)}, {"topology": "sl"})
    assert store.latest().ts == 200
    store.mark_complete()
    assert store.complete and store.latest() is None
    assert [p.name for p in (tmp_path / "ckpt").iterdir()] == ["_COMPLETE"]
