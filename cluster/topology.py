"""The host's sockets and cores, and which core each executor is pinned to.

Executors are grouped by socket (so a socket's executors can share a pool of work
and its cache) and each gets its own core while there are cores left. `--sockets S`
splits the usable cores into S emulated sockets, so multi-socket placement can be
exercised on a one-socket machine.
"""

from __future__ import annotations

import os
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from txstream.errors import UsageError


@dataclass(frozen=True)
class HostTopology:
    """Usable CPUs per socket (socket order, CPU order), and the NUMA node count."""

    sockets: tuple[tuple[int, ...], ...]
    numa_nodes: int = 1

    @staticmethod
    def detect(sysfs: str | os.PathLike = "/sys") -> HostTopology:
        """Read sockets from `cpu*/topology/physical_package_id`, keeping only the CPUs
        this process may run on; one socket when sysfs says nothing."""
        usable = sorted(os.sched_getaffinity(0))
        root = Path(sysfs) / "devices" / "system"
        by_socket: dict[int, list[int]] = {}
        for cpu in usable:
            package = root / "cpu" / f"cpu{cpu}" / "topology" / "physical_package_id"
            try:
                socket = int(package.read_text())
            except (OSError, ValueError):
                socket = 0
            by_socket.setdefault(socket, []).append(cpu)
        nodes = len(list((root / "node").glob("node[0-9]*")))
        return HostTopology(
            tuple(tuple(cpus) for _, cpus in sorted(by_socket.items())), max(1, nodes)
        )

    def with_sockets(self, count: int) -> HostTopology:
        """The same CPUs split into ``count`` emulated sockets of consecutive CPUs."""
        cpus = [cpu for socket in self.sockets for cpu in socket]
        if not 1 <= count <= len(cpus):
            raise UsageError(f"--sockets must be between 1 and {len(cpus)} (usable CPUs)")
        size, extra = divmod(len(cpus), count)
        bounds = [i * size + min(i, extra) for i in range(count + 1)]
        return HostTopology(
            tuple(tuple(cpus[bounds[i] : bounds[i + 1]]) for i in range(count)), self.numa_nodes
        )

    def assign(self, executors: int, cpus_taken: int = 0) -> list[tuple[int, int]]:
        """(socket, cpu) of each executor: executors split over sockets in proportion to
        their CPUs, consecutive executors on one socket, CPUs reused round-robin
        within a socket once every one has an executor.

        ``cpus_taken``: CPUs of this host that the teams of other nodes of a run take before
        this one (Ray nodes of one host each start a team, `txstream.nodes.member`). Each
        socket's CPUs are handed out from past those teams' share of them, taken as this
        team takes its own: the teams run on different CPUs while there are enough,
        instead of every team's first executor on the first CPU."""
        socket_of_cpu = [i for i, cpus in enumerate(self.sockets) for _ in cpus]
        # spread over all CPUs
        chosen = [socket_of_cpu[e * len(socket_of_cpu) // executors] for e in range(executors)]
        on_socket = Counter(chosen)
        earlier: Counter[int] = Counter()
        placed: list[tuple[int, int]] = []
        for socket in chosen:
            cpus = self.sockets[socket]
            past = cpus_taken * on_socket[socket] // executors
            placed.append((socket, cpus[(past + earlier[socket]) % len(cpus)]))
            earlier[socket] += 1
        return placed


def host_topology(sockets: int | None = None) -> HostTopology:
    """The detected topology, or its split into ``sockets`` emulated sockets."""
    detected = HostTopology.detect()
    return detected if sockets is None else detected.with_sockets(sockets)


def pin_process(cpu: int) -> None:
    """Pin every thread of this process to ``cpu`` (sched_setaffinity pins one thread)."""
    for task in Path("/proc/self/task").iterdir():
        try:
            os.sched_setaffinity(int(task.name), {cpu})
        except (ProcessLookupError, PermissionError):
            continue  # the thread ended meanwhile, or may not be moved
    os.sched_setaffinity(0, {cpu})


FEEDER_NICENESS = 10
"""How much lower the scheduling priority of the processes feeding the executors is."""


def yield_to_executors() -> None:
    """Lower this process's CPU priority (every thread of it: Linux nice is per thread).

    On a host with no core to spare, the ProgressController and Sink then run mostly
    while executors wait, instead of preempting one in the middle of a batch (which
    also stalls the executors waiting on it). They stay ahead of the executors thanks
    to the chunks in flight.
    """
    for task in Path("/proc/self/task").iterdir():
        try:
            current = os.getpriority(os.PRIO_PROCESS, int(task.name))
            os.setpriority(os.PRIO_PROCESS, int(task.name), current + FEEDER_NICENESS)
        except (ProcessLookupError, PermissionError, OSError):
            continue


_M_TRIM_THRESHOLD, _M_TOP_PAD, _M_MMAP_THRESHOLD, _M_ARENA_MAX = -1, -2, -3, -8  # glibc's mallopt


def keep_freed_memory() -> None:
    """Have this process's malloc keep the memory of freed arrays for the next ones.

    A chunk's arrays (operations, outcomes, rows: megabytes each) are allocated and freed
    once per chunk; glibc's defaults hand such blocks back to the kernel and then fault
    fresh pages in for the next chunk's. Freed memory stays with the process up to the peak
    it used. One arena for every thread: a thread's own arena hands a heap back to the
    kernel as soon as all of it is free, so the ProgressController's thread, reading and
    gathering chunks, would fault fresh pages into its arena for every chunk. Nothing
    happens without glibc.

    The one arena holds only for threads that allocate for the first time after this call:
    in `txstream run`, pyarrow's threads already have theirs. Called on import instead, one
    arena saves some page faults but no time, so it stays where the team starts.
    """
    import ctypes

    try:
        mallopt = ctypes.CDLL("libc.so.6").mallopt
    except (OSError, AttributeError):
        return
    mallopt(_M_MMAP_THRESHOLD, 32 << 20)  # glibc's largest: blocks below it come from the heap
    mallopt(_M_TRIM_THRESHOLD, 1 << 30)  # the heap's free top is kept up to 1 GiB
    mallopt(_M_TOP_PAD, 256 << 20)  # and grown by 256 MiB at a time
    mallopt(_M_ARENA_MAX, 1)  # every thread's blocks from that heap


OVERSUBSCRIPTION_LIMIT = 4
"""Executors per usable core beyond which a run is refused: they would mostly wait for
each other, and a small input would take minutes."""


def usable_cores() -> int:
    """CPUs this process may run on (its affinity)."""
    return len(os.sched_getaffinity(0))


CGROUP_MEMORY_LIMITS = ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes")
"""Where a container's memory limit is read (cgroup v2, then v1)."""


def memory_bytes() -> int:
    """The memory this process's processes may use: the host's, or its container's limit
    when that is lower."""
    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    for path in CGROUP_MEMORY_LIMITS:
        try:
            limit = Path(path).read_text().strip()
        except OSError:
            continue
        if limit.isdigit():
            return min(total, int(limit))
    return total


def check_executors(executors: int) -> str | None:
    """A warning when ``executors`` outnumber the usable cores; a `UsageError` when they
    are more than `OVERSUBSCRIPTION_LIMIT` times as many."""
    cores = usable_cores()
    if executors > OVERSUBSCRIPTION_LIMIT * cores:
        raise UsageError(
            f"--executors {executors} is over {OVERSUBSCRIPTION_LIMIT} times the {cores} "
            f"usable cores: the executors would mostly wait for each other"
        )
    if executors > cores:
        return (
            f"{executors} executors on {cores} usable cores: executors share cores, so "
            "every wait for a peer gets slower (expect a slower run than with "
            f"--executors {cores})"
        )
    return None
