"""What `txstream top` shows of a running run, captured as its terminal shows it.

A `txstream run --follow` with ``--metrics-port`` and checkpoints is fed a file of events
a second; `txstream top URL` runs in a tmux window of its own tmux server (110 x 40);
once its screen shows a rate, a checkpoint and a recovery (an executor's process is
killed midway), the screen is written to bench/results/top.txt.

    ../shared/tools/heavy python bench/top_capture.py
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import pyarrow.parquet as pq
from common import RESULTS
from txstream.topologies.generators import WorkloadSpec, generate, write_workload

EVENTS_PER_FILE = 20_000
TXSTREAM = str(Path(sys.executable).with_name("txstream"))


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def tmux(server: str, *args: str) -> str:
    return subprocess.run(
        ["tmux", "-L", server, *args], capture_output=True, text=True, check=True
    ).stdout


def executor_pids(tag: str) -> list[int]:
    """The processes of the run's executors: Ray's workers titled after their actor,
    started with ``tag`` in their environment (no other run's)."""
    pids = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            title = cmdline.read_bytes().split(b"\0")[0].decode(errors="replace")
            environ = (cmdline.parent / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if title.startswith("ray::Executor") and tag.encode() in environ:
            pids.append(int(cmdline.parent.name))
    return pids


def main() -> None:
    with tempfile.TemporaryDirectory(prefix="txstream_top_") as folder:
        tmp = Path(folder)
        events, init = generate("sl", WorkloadSpec(events=2_000_000, keys=10_000, seed=9))
        write_workload(tmp / "data", events, init)
        incoming = tmp / "incoming"
        incoming.mkdir()
        port = free_port()
        command = [TXSTREAM, "run", "sl", "--input", str(incoming), "--follow"]
        command += ["--init-state", str(tmp / "data" / "init"), "--output", str(tmp / "out")]
        command += ["--source", "arrow", "--executors", "2", "--transport", "ray"]
        command += ["--no-progress", "--name", "payments-live", "--metrics-port", str(port)]
        command += ["--checkpoint-dir", str(tmp / "checkpoints"), "--checkpoint-every", "5"]
        server = f"txstream-top-capture-{os.getpid()}"
        tag = f"TXSTREAM_TOP_CAPTURE={server}"
        env = {**os.environ, "RAY_ADDRESS": "", "TXSTREAM_TOP_CAPTURE": server}
        log = open(tmp / "run.log", "w")  # noqa: SIM115 (closed once the run has ended)
        run = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env)
        files = 0

        def feed() -> None:
            nonlocal files
            share = events.slice(files * EVENTS_PER_FILE, EVENTS_PER_FILE)
            pq.write_table(share, incoming / f".e-{files:05d}.parquet")
            os.replace(incoming / f".e-{files:05d}.parquet", incoming / f"e-{files:05d}.parquet")
            files += 1

        try:
            url = f"http://127.0.0.1:{port}/metrics"
            feed()
            wait_for_metrics(url, run, tmp / "run.log")
            shell = f'{TXSTREAM} top {url}; echo "[exit $?]"; sleep 600'  # the screen stays
            tmux(server, "new-session", "-d", "-s", "top", "-x", "110", "-y", "40", shell)
            killed = False
            deadline = time.monotonic() + 300
            while True:
                if run.poll() is not None:
                    raise SystemExit((tmp / "run.log").read_text()[-3000:])
                feed()
                time.sleep(1.0)
                screen = tmux(server, "capture-pane", "-p", "-t", "top")
                if not killed and re.search(r"checkpoints\s+[1-9]", screen):
                    os.kill(executor_pids(tag)[0], signal.SIGKILL)
                    killed = True
                recovered = re.search(r"recoveries\s+1\b", screen)
                if killed and recovered and " 0 events/s" not in screen:
                    break
                if "[exit" in screen or time.monotonic() > deadline:
                    raise SystemExit(f"top never showed a recovery:\n{screen}")
            for _ in range(5):  # a few seconds more: the rate after the recovery
                feed()
                time.sleep(1.0)
            screen = tmux(server, "capture-pane", "-p", "-t", "top")
            (incoming / "_STOP").touch()
            run.wait(120)
        finally:
            subprocess.run(["tmux", "-L", server, "kill-server"], capture_output=True)
            if run.poll() is None:
                run.kill()
                run.wait()
            log.close()
    target = RESULTS / "top.txt"
    target.write_text("\n".join(line.rstrip() for line in screen.rstrip().splitlines()) + "\n")
    print(target.read_text())


def wait_for_metrics(url: str, run: subprocess.Popen, log: Path) -> None:
    deadline = time.monotonic() + 120
    while True:
        try:
            with urllib.request.urlopen(url, timeout=5):
                return
        except OSError:
            if run.poll() is not None:
                raise SystemExit(log.read_text()[-3000:]) from None
            if time.monotonic() > deadline:
                raise SystemExit("the run's metrics never answered") from None
            time.sleep(0.3)


if __name__ == "__main__":
    main()
