"""Kernel of the transaction builder: merging statements into serial operation order."""

from __future__ import annotations

from txstream.state._numba import jit


@jit
def merge_statements(
    stmt_ptr, stmt_attrs, txn, cell, args, dep_count, dep_cell, scratch, out, first
):
    """Sort the statements' operations by transaction, stable (statement order within a
    transaction), every field written to its place in ``out`` (an `Ops`).

    Statement s's operations are ``stmt_ptr[s]:stmt_ptr[s+1]`` in ascending transaction
    order (``txn``: 0 for the batch's first); ``stmt_attrs[s]`` = (kind, fun, cond,
    reason, out); ``dep_count`` and ``dep_cell`` their parametric reads, in the same
    order. ``first`` = (first_txn, first_op, first_read): where the batch's transactions,
    operations and reads start in the chunk (``out``'s indices are the chunk's).
    ``scratch``: (3, max(operations, transactions)) int64. O(operations + reads).

    A counting sort that scatters only where each operation goes (its source and
    statement), then fills ``out`` in order with tight gather loops: one per field, one
    for the statement's five attributes, none for parametric reads where there are none
    (an SL chunk of 368k operations, on its own: 26-29 ns per event; scattering every
    field, or one loop for all fields, took about twice as long; docs/performance.md).
    """
    first_txn, first_op, first_read = first
    n_ops = len(txn)
    txn_ptr = out.txn_ptr
    n_txn = len(txn_ptr) - 1
    source, statement, cursor = scratch[0], scratch[1], scratch[2]
    # txn_ptr[0] is a neighbour's last entry too: only final values are written to it
    for t in range(n_txn):
        cursor[t] = 0
    for i in range(n_ops):
        cursor[txn[i]] += 1
    running = 0
    for t in range(n_txn):
        count = cursor[t]
        cursor[t] = running
        txn_ptr[t] = first_op + running
        running += count
    txn_ptr[n_txn] = first_op + running
    for s in range(len(stmt_ptr) - 1):
        for i in range(stmt_ptr[s], stmt_ptr[s + 1]):
            d = cursor[txn[i]]
            cursor[txn[i]] = d + 1
            source[d] = i
            statement[d] = s
    # one simple loop per field: each is a gather that compiles tight
    for d in range(n_ops):
        out.txn[d] = txn[source[d]] + first_txn
    for d in range(n_ops):
        out.cell[d] = cell[source[d]]
    for d in range(n_ops):  # the statement's attributes: one gather for the five
        s = statement[d]
        out.kind[d] = stmt_attrs[s, 0]
        out.fun[d] = stmt_attrs[s, 1]
        out.cond[d] = stmt_attrs[s, 2]
        out.reason[d] = stmt_attrs[s, 3]
        out.out[d] = stmt_attrs[s, 4]
    for a in range(args.shape[1]):
        for d in range(n_ops):
            out.args[d, a] = args[source[d], a]
    if len(dep_cell) == 0:  # no parametric reads (SL): skip both passes of their copy
        for d in range(n_ops + 1):
            out.dep_ptr[d] = first_read
        return
    # parametric reads: where each operation's start in dep_cell (cursor), then copied
    r = 0
    for i in range(n_ops):
        cursor[i] = r
        r += dep_count[i]
    r = 0
    for d in range(n_ops):
        out.dep_ptr[d] = first_read + r
        i = source[d]
        for k in range(dep_count[i]):
            out.dep_cell[r + k] = dep_cell[cursor[i] + k]
        r += dep_count[i]
    out.dep_ptr[n_ops] = first_read + r


@jit
def rows_outside(offsets, values, low, high, out):
    """``out[i]``: some element of row i of a CSR list (``offsets``, ``values``) is outside
    ``low..high``. One pass, no per-element row index (numpy's repeat and bincount took
    most of GS's pre-processing)."""
    for i in range(len(out)):
        bad = False
        for j in range(offsets[i], offsets[i + 1]):
            v = values[j]
            if v < low or v > high:
                bad = True
        out[i] = bad
