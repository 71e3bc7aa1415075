"""Numba options and low-level intrinsics in one place.

Kernels take only arrays and scalars, never raise, and are compiled with
`cache=True` so each process pays ~150 ms on first call instead of a compile.
"""

from __future__ import annotations

import numba
from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

jit = numba.njit(cache=True, nogil=True, _nrt=False)
"""Decorator for every engine kernel. Kernels allocate nothing (the caller passes
scratch arrays), so numba's reference counting is off: with it, every array handed
to an inlined function costs an atomic incref/decref pair, an order of magnitude more
than the operation itself."""

inline = numba.njit(cache=True, nogil=True, _nrt=False, inline="always")
"""Decorator for functions called from kernels (inlined at the IR level)."""

CLOCK_MONOTONIC = 1

INT_PTR = types.CPointer(types.int64)
FLOAT_PTR = types.CPointer(types.float64)

USER_SIG = types.int64(types.int64, INT_PTR, INT_PTR, types.int64)
"""`f(value, args, reads, n_reads)` of every user function (C ABI, called by address).

``args`` and ``reads`` are pointers - index them (``args[0]``, ``reads[i]`` for
``i < n_reads``). Scalars and pointers keep a call at a few ns; array arguments to an
indirect call cost tens of ns each, which would dominate a 2-op transaction.
"""


@intrinsic
def bits_as_float(typingctx, bits):
    """The float64 whose bits are the int64 ``bits`` (how the state holds a float64)."""

    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], ir.DoubleType())

    return types.float64(types.int64), codegen


@intrinsic
def float_as_bits(typingctx, value):
    """The bits of float64 ``value`` as an int64 (`bits_as_float` undone)."""

    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], ir.IntType(64))

    return types.int64(types.float64), codegen


@intrinsic
def as_float_pointer(typingctx, pointer):
    """An int64 pointer as a float64 one: arguments and reads of a float64 column are its
    bits."""

    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], ir.DoubleType().as_pointer())

    return FLOAT_PTR(INT_PTR), codegen


@intrinsic
def element_pointer(typingctx, array, index):
    """Pointer to flat element ``index`` of a C-contiguous int64 array."""

    def codegen(context, builder, signature, args):
        arr = context.make_array(signature.args[0])(context, builder, args[0])
        return builder.gep(arr.data, [args[1]])

    return INT_PTR(array, index), codegen


@intrinsic
def call_user(typingctx, address, value, args, reads, n_reads):
    """Call the user function at ``address`` (see USER_SIG)."""

    def codegen(context, builder, signature, call_args):
        i64 = ir.IntType(64)
        fnty = ir.FunctionType(i64, [i64, i64.as_pointer(), i64.as_pointer(), i64])
        fn = builder.inttoptr(call_args[0], fnty.as_pointer())
        return builder.call(fn, call_args[1:])

    return types.int64(types.int64, types.int64, INT_PTR, INT_PTR, types.int64), codegen


@intrinsic
def load_int64(typingctx, address, index):
    """``((int64 *) address)[index]``: an element of a C-contiguous int64 array given by
    its address (the caller keeps the array alive). One kernel then reads any number of
    columns without copying them into one array or compiling itself for each count."""

    def codegen(context, builder, signature, args):
        i64 = ir.IntType(64)
        base = builder.inttoptr(args[0], i64.as_pointer())
        return builder.load(builder.gep(base, [args[1]]))

    return types.int64(types.int64, types.int64), codegen


@intrinsic
def load_flag(typingctx, address, index):
    """``((uint8 *) address)[index] != 0``: an element of a C-contiguous bool array
    given by its address (see `load_int64`)."""

    def codegen(context, builder, signature, args):
        i8 = ir.IntType(8)
        base = builder.inttoptr(args[0], i8.as_pointer())
        byte = builder.load(builder.gep(base, [args[1]]))
        return builder.icmp_unsigned("!=", byte, ir.Constant(i8, 0))

    return types.boolean(types.int64, types.int64), codegen


@intrinsic
def load_byte(typingctx, address, index):
    """``((uint8 *) address)[index]`` as an int64 (see `load_int64`)."""

    def codegen(context, builder, signature, args):
        i8 = ir.IntType(8)
        base = builder.inttoptr(args[0], i8.as_pointer())
        return builder.zext(builder.load(builder.gep(base, [args[1]])), ir.IntType(64))

    return types.int64(types.int64, types.int64), codegen


@intrinsic
def monotonic_ns(typingctx):
    """``clock_gettime(CLOCK_MONOTONIC)`` in ns, inside kernels (vDSO: ~25 ns a call).

    A wall clock, not a cycle counter: busy work measured with it needs no calibration
    and is not stretched when the process is descheduled.
    """

    def codegen(context, builder, signature, args):
        i64, i32 = ir.IntType(64), ir.IntType(32)
        timespec = ir.LiteralStructType([i64, i64])
        fnty = ir.FunctionType(i32, [i32, timespec.as_pointer()])
        fn = cgutils.get_or_insert_function(builder.module, fnty, "clock_gettime")
        ts = cgutils.alloca_once(builder, timespec)
        builder.call(fn, [ir.Constant(i32, CLOCK_MONOTONIC), ts])
        sec = builder.load(builder.gep(ts, [ir.Constant(i32, 0), ir.Constant(i32, 0)]))
        nsec = builder.load(builder.gep(ts, [ir.Constant(i32, 0), ir.Constant(i32, 1)]))
        return builder.add(builder.mul(sec, ir.Constant(i64, 1_000_000_000)), nsec)

    return types.int64(), codegen


def _slot_pointer(context, builder, array_type, array, index):
    arr = context.make_array(array_type)(context, builder, array)
    return builder.gep(arr.data, [index])


@intrinsic
def prefetch(typingctx, array, index):
    """Ask for the cache line of ``array[index]`` without waiting for it: a loop goes on
    while the line is on its way, where a load it does not use yet would hold the loop's
    later instructions back once enough of them queue behind it."""

    def codegen(context, builder, signature, args):
        i8, i32 = ir.IntType(8), ir.IntType(32)
        ptr = _slot_pointer(context, builder, signature.args[0], args[0], args[1])
        fnty = ir.FunctionType(ir.VoidType(), [i8.as_pointer(), i32, i32, i32])
        fn = cgutils.get_or_insert_function(builder.module, fnty, "llvm.prefetch.p0")
        read, keep, data = ir.Constant(i32, 0), ir.Constant(i32, 3), ir.Constant(i32, 1)
        builder.call(fn, [builder.bitcast(ptr, i8.as_pointer()), read, keep, data])
        return context.get_dummy_value()

    return types.void(array, index), codegen


@intrinsic
def load_word(typingctx, array, index):
    """The 8 bytes of a uint8 array from ``index`` on (any alignment), as one uint64."""

    def codegen(context, builder, signature, args):
        ptr = _slot_pointer(context, builder, signature.args[0], args[0], args[1])
        return builder.load(builder.bitcast(ptr, ir.IntType(64).as_pointer()), align=1)

    return types.uint64(array, index), codegen


@intrinsic
def store_word(typingctx, array, index, value):
    """Write ``value`` (uint64) as the 8 bytes of a uint8 array from ``index`` on."""

    def codegen(context, builder, signature, args):
        ptr = _slot_pointer(context, builder, signature.args[0], args[0], args[1])
        builder.store(args[2], builder.bitcast(ptr, ir.IntType(64).as_pointer()), align=1)
        return context.get_dummy_value()

    return types.void(array, index, value), codegen


@intrinsic
def load_acquire(typingctx, array, index):
    """``array[index]`` as an atomic load-acquire (int64): never hoisted out of a spin
    loop, and later reads see what the writer stored before its release."""

    def codegen(context, builder, signature, args):
        ptr = _slot_pointer(context, builder, signature.args[0], args[0], args[1])
        return builder.load_atomic(ptr, "acquire", 8)

    return types.int64(array, index), codegen


@intrinsic
def store_release(typingctx, array, index, value):
    """``array[index] = value`` as an atomic store-release (int64)."""

    def codegen(context, builder, signature, args):
        ptr = _slot_pointer(context, builder, signature.args[0], args[0], args[1])
        builder.store_atomic(args[2], ptr, "release", 8)
        return context.get_dummy_value()

    return types.void(array, index, value), codegen


@intrinsic
def fetch_add(typingctx, array, index, value):
    """Atomically add ``value`` to ``array[index]`` (int64); returns the old value."""

    def codegen(context, builder, signature, args):
        ptr = _slot_pointer(context, builder, signature.args[0], args[0], args[1])
        return builder.atomic_rmw("add", ptr, args[2], "acq_rel")

    return types.int64(array, index, value), codegen


@intrinsic
def compare_exchange(typingctx, array, index, expected, new):
    """Atomically set ``array[index]`` to ``new`` if it holds ``expected``; returns the
    value it held (== expected on success)."""

    def codegen(context, builder, signature, args):
        ptr = _slot_pointer(context, builder, signature.args[0], args[0], args[1])
        pair = builder.cmpxchg(ptr, args[2], args[3], "acq_rel", "acquire")
        return builder.extract_value(pair, 0)

    return types.int64(array, index, expected, new), codegen


@intrinsic
def sleep_us(typingctx, microseconds):
    """Sleep (``usleep``): a waiter that spun long enough gives its core away, e.g.
    to the processes feeding the executors on a host with few cores."""

    def codegen(context, builder, signature, args):
        i32 = ir.IntType(32)
        fnty = ir.FunctionType(i32, [i32])
        fn = cgutils.get_or_insert_function(builder.module, fnty, "usleep")
        builder.call(fn, [builder.trunc(args[0], i32)])
        return context.get_dummy_value()

    return types.void(microseconds), codegen


PR_SET_TIMERSLACK = 29
TIMER_SLACK_NS = 1000


@intrinsic
def fine_timer_slack(typingctx):
    """``prctl(PR_SET_TIMERSLACK, 1 us)`` for the calling thread: Linux lets a sleep of a
    normal thread overrun by 50 us by default, so ``usleep(20)`` may last twice as long
    as asked; with 1 us of slack a short sleep ends close to when it was asked to."""

    def codegen(context, builder, signature, args):
        i32, i64 = ir.IntType(32), ir.IntType(64)
        fnty = ir.FunctionType(i32, [i32], var_arg=True)
        fn = cgutils.get_or_insert_function(builder.module, fnty, "prctl")
        builder.call(fn, [ir.Constant(i32, PR_SET_TIMERSLACK), ir.Constant(i64, TIMER_SLACK_NS)])
        return context.get_dummy_value()

    return types.void(), codegen
