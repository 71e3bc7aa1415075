"""What a killed driver leaves behind, removed at once by a process that outlives it.

A driver killed with SIGKILL runs no cleanup: its tables in shared memory
(``/dev/shm/txstream_<pid>_*``), its local Ray's folder, the Ray processes that outlive
their raylet and the temporary output of a run given none stayed until the next run swept
them. So the first session of a process starts a small reaper process that reads a pipe
only the driver holds: when the driver ends, however it ends, the pipe closes and the
reaper removes what the driver left (the same sweeps the next run would do: after a clean
end there is nothing), then exits.
Checkpoints and a given output's ``_temporary`` stay: a resumed run continues from them.
"""

from __future__ import annotations

import os
import subprocess
import sys

_pipe: int | None = None
"""This process's end of its reaper's pipe (None: no reaper started yet)."""
_process: subprocess.Popen | None = None


def ensure_reaper() -> None:
    """Start this process's reaper unless it runs already (see the module docstring)."""
    global _pipe, _process
    if _pipe is not None:
        return
    read, write = os.pipe()  # not inherited by Ray's or Spark's processes (Python's default)
    try:
        _process = subprocess.Popen(
            [sys.executable, "-m", "txstream.engine.reaper", str(os.getpid())],
            stdin=read,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,  # a Ctrl-C of the terminal is not for it
        )
    finally:
        os.close(read)
    _pipe = write  # kept open until this process ends


def main() -> None:
    """The reaper: wait for the driver's end (its end of the pipe closes), then sweep."""
    driver = int(sys.argv[1])
    sys.stdin.buffer.read()
    # imported only now: numpy and the rest took ~0.1 CPU-s while the driver's run starts
    from txstream.cluster.scratch import sweep_abandoned_outputs, sweep_abandoned_rays
    from txstream.state.shared import sweep_stale_segments

    sweep_stale_segments(dead=driver)
    sweep_abandoned_rays(dead=driver)
    sweep_abandoned_outputs(dead=driver)


if __name__ == "__main__":
    main()
