"""Kernel of the transaction builder: merging statements into serial operation order."""

from __future__ import annotations

from txstream.state._numba import jit


@jit
def merge_statements(
    stmt_ptr, stmt_attrs, txn, cell, args, dep_count, dep_cell, cursor, dest, out, first_txn
):
    """Counting-sort the statements' operations by transaction, stable (statement order
    within a transaction), and copy every field to its place in ``out`` (an `Ops`, its
    ``dep_ptr`` and ``txn_ptr`` zeroed), transactions numbered from ``first_txn``.
    O(operations + reads).

    ``stmt_attrs[s]`` = (kind, fun, cond, reason, out) of statement s, whose operations
    are ``stmt_ptr[s]:stmt_ptr[s+1]``; ``cursor`` and ``dest`` are scratch. The five
    attributes go straight to their own columns, not through an (operations, 5) array
    and copies out of it (with building in place, constructing went from 71 to 47 ns
    per event, bench/stages.py).
    """
    n_ops = len(txn)
    txn_ptr, out_args, out_dep_ptr, out_dep_cell = out.txn_ptr, out.args, out.dep_ptr, out.dep_cell
    for i in range(n_ops):
        txn_ptr[txn[i] + 1] += 1
    for t in range(len(txn_ptr) - 1):
        txn_ptr[t + 1] += txn_ptr[t]
        cursor[t] = txn_ptr[t]
    width = args.shape[1]
    for s in range(len(stmt_ptr) - 1):
        kind, fun, cond, reason, slot = stmt_attrs[s]
        for i in range(stmt_ptr[s], stmt_ptr[s + 1]):
            d = cursor[txn[i]]
            cursor[txn[i]] = d + 1
            dest[i] = d
            out.txn[d] = txn[i] + first_txn
            out.cell[d] = cell[i]
            out.kind[d] = kind
            out.fun[d] = fun
            out.cond[d] = cond
            out.reason[d] = reason
            out.out[d] = slot
            for a in range(width):
                out_args[d, a] = args[i, a]
    out_dep_ptr[0] = 0
    for i in range(n_ops):
        out_dep_ptr[dest[i] + 1] = dep_count[i]
    for d in range(n_ops):
        out_dep_ptr[d + 1] += out_dep_ptr[d]
    src = 0
    for i in range(n_ops):
        first = out_dep_ptr[dest[i]]
        for k in range(dep_count[i]):
            out_dep_cell[first + k] = dep_cell[src + k]
        src += dep_count[i]
