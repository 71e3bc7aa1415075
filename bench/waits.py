"""Hand-off latency between two pinned processes on a shared word, per wait policy: what
`txstream.state.sync`'s wait policy was chosen from.

Two processes pinned to CPUs 0 and 1 pass a counter back and forth through shared memory
(each waits for the other's increment); the round trip is timed, with the waiter
spinning, calling ``sched_yield``, sleeping ``usleep(20)`` (default timer slack),
sleeping ``usleep(10)`` at 1 us timer slack, or sleeping on a futex the poster wakes. Then
again with a nice +10 busy process on each CPU (a feeder that wants the core). Last, the
CPU a waiter takes while it sleeps in steps of 10 us to 1 ms (what the growing steps of
`pause` were chosen from).

    python bench/waits.py [--rounds 20000]     -> bench/results/waits.json
"""

from __future__ import annotations

import argparse
import ctypes
import multiprocessing as mp
import os
import time
from multiprocessing import shared_memory

import numba
import numpy as np
from common import write_results
from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic
from txstream.state._numba import (
    fetch_add,
    fine_timer_slack,
    load_acquire,
    monotonic_ns,
    sleep_us,
)

SPIN, YIELD, SLEEP, SLACK, FUTEX = range(5)
NAMES = ("spin", "sched_yield", "usleep(20)", "usleep(10) at 1 us slack", "spin, then futex")
SYS_FUTEX = 202  # x86_64


@intrinsic
def _yield(typingctx):
    def codegen(context, builder, signature, args):
        fn = cgutils.get_or_insert_function(
            builder.module, ir.FunctionType(ir.IntType(32), []), "sched_yield"
        )
        builder.call(fn, [])
        return context.get_dummy_value()

    return types.void(), codegen


@intrinsic
def _futex(typingctx, array, index, op, val):
    def codegen(context, builder, signature, args):
        i64 = ir.IntType(64)
        arr = context.make_array(signature.args[0])(context, builder, args[0])
        address = builder.ptrtoint(builder.gep(arr.data, [args[1]]), i64)
        fn = cgutils.get_or_insert_function(
            builder.module, ir.FunctionType(i64, [i64], var_arg=True), "syscall"
        )
        null = ir.Constant(i64, 0)
        builder.call(fn, [ir.Constant(i64, SYS_FUTEX), address, args[2], args[3], null, null, null])
        return context.get_dummy_value()

    return types.void(array, index, op, val), codegen


@numba.njit(nogil=True)
def _wait(w, target, policy):
    spins = 0
    while load_acquire(w, 0) < target:
        spins += 1
        if policy == YIELD:
            _yield()
        elif policy == SLEEP:
            sleep_us(20)
        elif policy == SLACK:
            sleep_us(10)
        elif policy == FUTEX and spins > 100:
            fetch_add(w, 8, 1)  # a sleeper is announced before the last check
            if load_acquire(w, 0) < target:
                _futex(w, 0, 0, target - 1)
            fetch_add(w, 8, -1)


@numba.njit(nogil=True)
def _post(w, policy):
    fetch_add(w, 0, 1)
    if policy == FUTEX and load_acquire(w, 8):
        _futex(w, 0, 1, 1)


@numba.njit(nogil=True)
def _pingpong(a, b, rounds, policy, starter, out):
    for r in range(rounds):
        if starter:
            t0 = monotonic_ns()
            _post(a, policy)
            _wait(b, r + 1, policy)
            out[r] = monotonic_ns() - t0
        else:
            _wait(a, r + 1, policy)
            _post(b, policy)


def _member(name, cpu, rounds, policy, queue):
    os.sched_setaffinity(0, {cpu})
    if policy == SLACK:
        ctypes.CDLL(None).prctl(29, 1000, 0, 0, 0)  # PR_SET_TIMERSLACK, 1 us
    shm = shared_memory.SharedMemory(name)
    w = np.ndarray(32, np.int64, shm.buf)
    out = np.zeros(rounds, np.int64)
    _pingpong(np.ones(16, np.int64), np.ones(16, np.int64), 1, policy, cpu == 0, out)  # compile
    queue.put("ready")
    while w[31] == 0:
        time.sleep(0.001)
    _pingpong(w[:16], w[16:], rounds, policy, cpu == 0, out)
    if cpu == 0:
        queue.put(out)
    del w
    shm.close()


def _hog(cpu, stop):
    os.sched_setaffinity(0, {cpu})
    os.nice(10)
    while not stop.is_set():
        sum(range(100_000))
        time.sleep(0.0002)


def measure(policy: int, rounds: int, hogs: int) -> np.ndarray:
    """Round trips (us) of ``rounds`` hand-offs and back with ``policy``."""
    ctx = mp.get_context("fork")
    shm = shared_memory.SharedMemory(create=True, size=32 * 8)
    try:
        w = np.ndarray(32, np.int64, shm.buf)
        w[:] = 0
        queue, stop = ctx.Queue(), ctx.Event()
        busy = [ctx.Process(target=_hog, args=(c, stop)) for c in range(hogs)]
        pair = [
            ctx.Process(target=_member, args=(shm.name, c, rounds, policy, queue)) for c in (0, 1)
        ]
        for p in busy + pair:
            p.start()
        queue.get(), queue.get()
        w[31] = 1
        out = queue.get()
        for p in pair:
            p.join()
        stop.set()
        for p in busy:
            p.join()
        del w
        return out[100:] / 1000
    finally:
        shm.close()
        shm.unlink()


@numba.njit(nogil=True, cache=True)
def _sleep_for(step_us, ns):
    """Sleep in steps of ``step_us`` (1 us timer slack) for ``ns``; the steps taken."""
    fine_timer_slack()
    start, steps = monotonic_ns(), 0
    while monotonic_ns() - start < ns:
        sleep_us(step_us)
        steps += 1
    return steps


def sleeping_waiter(step_us: int, seconds: float = 1.0) -> dict:
    """The CPU (cores) a waiter takes while it sleeps in steps of ``step_us``."""
    _sleep_for(step_us, 1_000_000)
    cpu, wall = time.thread_time(), time.perf_counter()
    steps = _sleep_for(step_us, int(seconds * 1e9))
    wall = time.perf_counter() - wall
    return {
        "step_us": step_us,
        "wakeups_per_s": round(steps / wall),
        "cores": round((time.thread_time() - cpu) / wall, 3),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=20_000)
    args = parser.parse_args()
    rows = []
    for hogs in (0, 2):
        for policy, name in enumerate(NAMES):
            rounds = args.rounds // 7 if policy in (SLEEP, SLACK) else args.rounds
            us = measure(policy, rounds, hogs)
            quantiles = {f"p{q}_us": round(float(np.percentile(us, q)), 2) for q in (50, 90, 99)}
            row = {"policy": name, "busy_processes": hogs, "round_trips": len(us), **quantiles}
            rows.append(row)
            print(row, flush=True)
    sleeping = [sleeping_waiter(step) for step in (10, 50, 200, 1000)]
    for row in sleeping:
        print(row, flush=True)
    print("->", write_results("waits", {"rows": rows, "sleeping_waiter": sleeping}))


if __name__ == "__main__":
    main()
