"""Kernels of the topology API: building a batch's operations, checking list columns."""

from __future__ import annotations

import numpy as np
from txstream.state._numba import inline, jit, load_flag, load_int64

INT_COLUMN, LIST_COLUMN, CONSTANT = 0, 1, 2
"""Kinds of a *source* of keys or arguments, given as (kind, a, b): an int64 column (a:
its address), a list<int64> column as CSR (a: the offsets' address, b: the values'),
or a constant (a: the value)."""

(
    KIND,
    FUN,
    COND,
    REASON,
    OUT,
    BASE,
    SIZE,
    WHERE,
    KEY_KIND,
    KEY_A,
    KEY_B,
    FIRST_ARG,
    ARGS,
    FIRST_READ,
    READS,
    TARGET,
) = range(16)
"""Rows of ``statements`` (one column per statement): the operation's kind, function,
condition, abort reason and output slot; its target's first cell and key count; the
address of its ``where`` mask (0: every event); its key's source; its arguments
(``args[FIRST_ARG:]``) and parametric reads (``reads[FIRST_READ:]``); its target's
index."""

SOURCE_KIND, SOURCE_A, SOURCE_B = range(3)
"""Fields of a row of ``args``: a source."""
READ_BASE, READ_SIZE, READ_KIND, READ_A, READ_B, READ_TARGET = range(6)
"""Fields of a row of ``reads``: the read column's first cell and key count, its key's
source, the column's target index."""

KEY_OUTSIDE, READ_OUTSIDE, ARG_SHORTER = 1, 2, 3
"""Errors `build_operations` reports in ``error[0]`` (statement in ``error[1]``, read in
``error[2]``): a key outside its table, a parametric read's key outside its table, a list
argument shorter than its key list."""


@inline
def source_length(kind, a, t):
    """Elements of a source for event ``t``: a list's length, else 1."""
    if kind == LIST_COLUMN:
        return load_int64(a, t + 1) - load_int64(a, t)
    return 1


@inline
def source_element(kind, a, b, t, e):
    """Element ``e`` of a source for event ``t`` (the value itself unless a list)."""
    if kind == INT_COLUMN:
        return load_int64(a, t)
    if kind == LIST_COLUMN:
        return load_int64(b, load_int64(a, t) + e)
    return a


@inline
def selected(where, t):
    """Whether event ``t`` is in a statement's ``where`` mask (its address; 0: every event)."""
    return where == 0 or load_flag(where, t)


@inline
def emits(statements, s, t):
    """Whether statement ``s`` emits for (not rejected) event ``t``: its mask says so."""
    return selected(statements[WHERE, s], t)


@jit
def count_operations(rejected, statements, reads, per_event):
    """(operations, parametric reads, most operations of an event, most reads of an
    operation) that `build_operations` makes of these statements for the events whose
    ``rejected`` reason is 0; ``per_event`` (scratch, one per event) ends with the
    operations of the events up to each (running totals). Statement by statement over
    the events, not event by event: the inner loop is then one statement's and
    vectorises (an order of magnitude faster)."""
    n = len(rejected)
    for t in range(n):
        per_event[t] = 0
    n_reads = 0
    most_reads = 0
    for s in range(statements.shape[1]):
        # the statement's fields held in locals: loaded in the loop, they could alias
        # ``per_event`` and the loop would not vectorise
        where = statements[WHERE, s]
        kind, a = statements[KEY_KIND, s], statements[KEY_A, s]
        first, last = statements[FIRST_READ, s], statements[FIRST_READ, s] + statements[READS, s]
        for t in range(n):
            # a count, not a branch: kinds in random order made half the branches mispredict
            m = (rejected[t] == 0) * selected(where, t) * source_length(kind, a, t)
            per_event[t] += m
            op_reads = 0
            for q in range(first, last):
                op_reads += source_length(reads[q, READ_KIND], reads[q, READ_A], t)
            n_reads += m * op_reads
            most_reads = max(most_reads, op_reads * (m > 0))
    n_ops = 0
    most_ops = 0
    for t in range(n):
        n_ops += per_event[t]
        most_ops = max(most_ops, per_event[t])
        per_event[t] = n_ops
    return n_ops, n_reads, most_ops, most_reads


@inline
def put_arg(args_out, row, j, kind, a, b, t, e):
    """Argument ``j`` (a source: ``kind``, ``a``, ``b``) for element ``e`` of event ``t``
    into ``args_out[row, j]``; False if it is a list shorter than the key list."""
    if kind == LIST_COLUMN and e >= source_length(kind, a, t):
        return False
    args_out[row, j] = source_element(kind, a, b, t, e)
    return True


@inline
def put_args(args_out, row, t, e, s, statements, args, error):
    """Statement ``s``'s arguments for element ``e`` of event ``t`` into row ``row`` of
    ``args_out`` (zeros past them); False, with ``error`` filled in, if a list argument
    is shorter than the key list."""
    first_arg, n_args = statements[FIRST_ARG, s], statements[ARGS, s]
    for j in range(n_args):
        arg = first_arg + j
        kind, a, b = args[arg, SOURCE_KIND], args[arg, SOURCE_A], args[arg, SOURCE_B]
        if not put_arg(args_out, row, j, kind, a, b, t, e):
            error[0], error[1] = ARG_SHORTER, s
            return False
    for j in range(n_args, args_out.shape[1]):
        args_out[row, j] = 0
    return True


@inline
def put_reads(cells, r, t, s, statements, reads, read_target, error):
    """The cells statement ``s``'s parametric reads read for event ``t``, into
    ``cells[r:]`` (their targets' indices into ``read_target`` too, if it is not empty);
    the index after them, or -1 with ``error`` filled in if one is outside its table."""
    first = statements[FIRST_READ, s]
    for q in range(first, first + statements[READS, s]):
        kind, a, b = reads[q, READ_KIND], reads[q, READ_A], reads[q, READ_B]
        for k in range(source_length(kind, a, t)):
            value = source_element(kind, a, b, t, k)
            if value < 0 or value >= reads[q, READ_SIZE]:
                error[0], error[1], error[2] = READ_OUTSIDE, s, q - first
                return -1
            cells[r] = reads[q, READ_BASE] + value
            if len(read_target):
                read_target[r] = reads[q, READ_TARGET]
            r += 1
    return r


@inline
def _put(o, r, t, e, key, s, statements, args, reads, out, first, targets, error):
    """Operation ``o``: element ``e`` of statement ``s``'s key for event ``t`` (``key``),
    its parametric reads from ``r`` on. The next read's index, or -1 after an error."""
    first_txn, _, first_read = first
    out.txn[o] = first_txn + t
    out.cell[o] = statements[BASE, s] + key
    out.kind[o] = statements[KIND, s]
    out.fun[o] = statements[FUN, s]
    out.cond[o] = statements[COND, s]
    out.reason[o] = statements[REASON, s]
    out.out[o] = statements[OUT, s]
    if not put_args(out.args, o, t, e, s, statements, args, error):
        return -1
    op_target, read_target = targets
    if len(op_target):
        op_target[o] = statements[TARGET, s]
    out.dep_ptr[o] = first_read + r
    return put_reads(out.dep_cell, r, t, s, statements, reads, read_target, error)


@jit
def build_operations(rejected, statements, args, reads, out, first, targets, error):
    """Every operation of the events whose ``rejected`` reason is 0, in serial order:
    by event, then statement (``statements``: one column per builder call, in call
    order), then list element; written into ``out`` (an `Ops`: views of a chunk's
    arrays, whose indices are the chunk's, ``first`` = (first event, operation, read)
    there). One pass over the events: nothing gathered per statement, nothing merged.

    A statement's operation targets cell ``BASE + key``; its parametric reads are the
    cells ``READ_BASE + key`` of each of its ``reads``. With ``targets`` = (per
    operation, per read) arrays of their sizes, the target index of each is written
    there too (a node's layout maps keys to rows afterwards). Returns 0, or an error
    code (`KEY_OUTSIDE`, ...) with ``error`` filled in, at the first error.
    """
    first_op = first[1]
    o = 0
    r = 0
    for t in range(len(rejected)):
        out.txn_ptr[t] = first_op + o
        if rejected[t] != 0:
            continue
        for s in range(statements.shape[1]):
            if not emits(statements, s, t):
                continue
            kind, a = statements[KEY_KIND, s], statements[KEY_A, s]
            size = statements[SIZE, s]
            if kind == INT_COLUMN:  # one operation: no loop (a third of the time, on SL)
                key = load_int64(a, t)
                if key < 0 or key >= size:
                    error[0], error[1] = KEY_OUTSIDE, s
                    return KEY_OUTSIDE
                r = _put(o, r, t, 0, key, s, statements, args, reads, out, first, targets, error)
                if r < 0:
                    return error[0]
                o += 1
                continue
            b = statements[KEY_B, s]
            for e in range(source_length(kind, a, t)):
                key = source_element(kind, a, b, t, e)
                if key < 0 or key >= size:
                    error[0], error[1] = KEY_OUTSIDE, s
                    return KEY_OUTSIDE
                r = _put(o, r, t, e, key, s, statements, args, reads, out, first, targets, error)
                if r < 0:
                    return error[0]
                o += 1
    out.txn_ptr[len(rejected)] = first_op + o
    out.dep_ptr[o] = first[2] + r
    return 0


@jit
def reject_outside(offsets, values, low, high, where, reason, code):
    """Give ``code`` to the events not yet rejected (``reason`` 0) and in ``where``
    (empty: every event) whose field is outside ``low..high``: ``values[i]``, or every
    element of row i of a CSR list (``offsets``, empty for a plain column). One pass
    and no temporaries (numpy's comparisons, masks and their combination took most of
    SL's pre-processing)."""
    listed = len(offsets) > 0
    every = len(where) == 0
    for i in range(len(reason)):
        bad = False
        if listed:
            for j in range(offsets[i], offsets[i + 1]):
                v = values[j]
                if v < low or v > high:
                    bad = True
        else:
            v = values[i]
            bad = v < low or v > high
        if bad and reason[i] == 0 and (every or where[i]):
            reason[i] = code


@jit
def reject_unset(valid, where, reason, code):
    """Give ``code`` to the events not yet rejected and in ``where`` (empty: every event)
    whose ``valid`` flag is 0 (a null field)."""
    every = len(where) == 0
    for i in range(len(reason)):
        if valid[i] == 0 and reason[i] == 0 and (every or where[i]):
            reason[i] = code


@jit
def committed_keys(status, committed, keys, where, out):
    """Into ``out``, the ``keys`` of the events whose ``status`` is ``committed``, of those
    ``where`` is set (empty: all); how many. Each key is written and then kept or not,
    without a branch: ``where`` mixes events of several kinds at random."""
    n = 0
    for i in range(len(keys)):
        out[n] = keys[i]
        kept = np.int64(status[i] == committed)
        if len(where):
            kept &= np.int64(where[i])
        n += kept
    return n
