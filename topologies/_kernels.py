"""Kernel of the transaction builder: merging statements into serial operation order."""

from __future__ import annotations

from txstream.state._numba import jit


@jit
def merge_statements(
    stmt_ptr,
    stmt_attrs,
    txn,
    cell,
    args,
    dep_count,
    dep_cell,
    cursor,
    dest,
    out_txn,
    out_cell,
    out_attrs,
    out_args,
    out_dep_ptr,
    out_dep_cell,
    txn_ptr,
):
    """Counting-sort the statements' operations by transaction, stable (statement order
    within a transaction), and copy every field to its place. O(operations + reads).

    ``stmt_attrs[s]`` = (kind, fun, cond, reason, out) of statement s, whose operations
    are ``stmt_ptr[s]:stmt_ptr[s+1]``; ``cursor`` and ``dest`` are scratch.
    """
    n_ops = len(txn)
    for i in range(n_ops):
        txn_ptr[txn[i] + 1] += 1
    for t in range(len(txn_ptr) - 1):
        txn_ptr[t + 1] += txn_ptr[t]
        cursor[t] = txn_ptr[t]
    for s in range(len(stmt_ptr) - 1):
        for i in range(stmt_ptr[s], stmt_ptr[s + 1]):
            d = cursor[txn[i]]
            cursor[txn[i]] = d + 1
            dest[i] = d
            out_txn[d] = txn[i]
            out_cell[d] = cell[i]
            for a in range(stmt_attrs.shape[1]):
                out_attrs[d, a] = stmt_attrs[s, a]
            for a in range(args.shape[1]):
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
