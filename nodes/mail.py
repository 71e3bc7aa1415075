"""The values nodes send each other for a unit's next level (`txstream.nodes.member`).

A node's values reach a node on the same host through a Unix socket of that node's (one
`Link` per pair, written by the sender's step, read by a thread of the receiver's
`Listener`): a write and a read, where an actor call costs Ray's submission and scheduling
on both sides. Nodes on other hosts are sent their values by an actor call
(`NodeTeam.deliver`). Either way they land in the receiver's `Mailbox`, by (unit, level,
sending node), where its step waits for the ones it reads.

Sockets are abstract (Linux): a node reaches another's by name when both run in the same
kernel and network namespace (`host`), with no file to clean up.
"""

from __future__ import annotations

import os
import socket
import struct
import threading
import time
import uuid
from pathlib import Path

import numpy as np
from txstream.errors import RuntimeFailure

HEADER = struct.Struct("<qqqq")
"""Before a message's values: unit, level, sending node, how many values (int64)."""

Key = tuple[int, int, int]
"""(unit, level, sending node)."""


def host() -> str | None:
    """The kernel and network namespace this process runs in: processes of the same one
    reach each other's abstract Unix sockets. None where /proc does not tell (or not
    Linux)."""
    try:
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
        net = os.stat("/proc/self/ns/net").st_ino
    except OSError:
        return None
    return f"{boot}/{net}"


class Mailbox:
    """Values delivered to node ``node``, until its step takes them."""

    def __init__(self, node: int, timeout_s: float):
        self.node = node
        self.timeout_s = timeout_s
        self._mail: dict[Key, np.ndarray] = {}
        self._arrived = threading.Condition()

    def put(self, key: Key, values: np.ndarray) -> None:
        """Values arrived for the step ``key`` names."""
        with self._arrived:
            self._mail[key] = values
            self._arrived.notify_all()

    def take(self, unit: int, level: int, sources: list[int]) -> list[np.ndarray]:
        """The values of ``sources`` for the step of ``level`` of ``unit``, once all
        arrived; `RuntimeFailure` if they do not within the timeout (a sender lost)."""
        keys = [(unit, level, source) for source in sources]
        deadline = time.monotonic() + self.timeout_s
        with self._arrived:
            while not all(key in self._mail for key in keys):
                if not self._arrived.wait(max(0.0, deadline - time.monotonic())):
                    raise RuntimeFailure(
                        f"node {self.node}: no values from nodes {sources} within "
                        f"{self.timeout_s} s"
                    )
            return [self._mail.pop(key) for key in keys]


class Listener:
    """A node's socket: each node of its host that connects gets a thread that puts what
    it sends into ``mailbox``."""

    def __init__(self, mailbox: Mailbox):
        self.mailbox = mailbox
        self.name = f"\0txstream-node-{uuid.uuid4().hex}"
        self._socket = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._socket.bind(self.name)
        self._socket.listen()
        threading.Thread(target=self._accept, daemon=True, name="mail").start()

    def _accept(self) -> None:
        while True:
            try:
                connection, _ = self._socket.accept()
            except OSError:  # closed
                return
            threading.Thread(target=self._read, args=(connection,), daemon=True).start()

    def _read(self, connection: socket.socket) -> None:
        """Messages of one sender until it closes (or its process ends)."""
        with connection:
            while True:
                header = _exactly(connection, HEADER.size)
                if header is None:
                    return
                unit, level, source, count = HEADER.unpack(header)
                body = _exactly(connection, 8 * count)
                if body is None:
                    return
                self.mailbox.put((unit, level, source), np.frombuffer(body, np.int64))

    def close(self) -> None:
        """No more connections (those made end with their senders)."""
        self._socket.close()


class Link:
    """The sending end to one node of this host, at its `Listener`'s ``name``."""

    def __init__(self, name: str):
        self._socket = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._socket.connect(name)

    def send(self, key: Key, values: np.ndarray) -> None:
        """``values`` (int64) for the receiver's step ``key`` names; OSError if it is gone."""
        values = np.ascontiguousarray(values, np.int64)
        self._socket.sendall(HEADER.pack(*key, len(values)) + values.tobytes())

    def close(self) -> None:
        """The receiver's reading thread ends."""
        self._socket.close()


def _exactly(connection: socket.socket, size: int) -> bytearray | None:
    """``size`` bytes read from ``connection``; None once it ends."""
    data = bytearray(size)
    view, got = memoryview(data), 0
    while got < size:
        try:
            n = connection.recv_into(view[got:])
        except OSError:
            return None
        if n == 0:
            return None
        got += n
    return data
