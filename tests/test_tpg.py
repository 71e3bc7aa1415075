"""The TPG's building blocks against plain-Python versions written from their
definitions: links (TD, PD through proxy reads, row units, PD successors), strata,
cycle merging of coarse units, dependency counts, and the Coordinator's marking."""

from __future__ import annotations

import threading
from itertools import pairwise as consecutive

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from txstream.schedulers._tpg import (
    Units,
    count_pending,
    cycle_scratch,
    fine_levels,
    merge_cycles,
    reset_units,
)
from txstream.schedulers.team._links import (
    HOT,
    LINK_STATS,
    Links,
    deal_share,
    forget_chunk,
    link_batch,
    partition,
    take_dealt,
)
from txstream.schedulers.team._versions import Fates, Versions, find_affected
from txstream.schedulers.team.placement import row_pools
from txstream.state.operations import Ops

CELLS = 6
SPANS = np.array([(0, 2, 0), (2, 2, 2), (4, 2, 2)], np.int64)
"""A table of one column and one of two, two keys each (`Layout.spans`)."""
ROW_OF_CELL = np.array([0, 1, 2, 3, 2, 3], np.int64)
LARGE_SPANS = np.array([(0, 2, 0), (2, 2, 2), (4, 1 << 20, 2)], np.int64)
"""The same rows of the same cells in a state far larger than a chunk's tables: linking
hashes cells and rows (`partition`'s ``direct`` is false)."""


@st.composite
def batches(draw, max_txns=10):
    """Operations of random transactions over few cells (rows of two cells), with
    parametric reads, cut into punctuation batches."""
    txns = draw(
        st.lists(
            st.lists(st.integers(0, CELLS - 1), min_size=1, max_size=4),
            min_size=1,
            max_size=max_txns,
        )
    )
    cell = [c for t in txns for c in t]
    reads = [draw(st.lists(st.integers(0, CELLS - 1), max_size=2)) for _ in cell]
    cond = [draw(st.booleans()) for _ in cell]
    cuts = sorted(set(draw(st.lists(st.integers(1, len(txns)), max_size=3))) | {len(txns)})
    return txns, cell, reads, cond, [0, *cuts]


def _ops(txns, cell, reads, cond) -> Ops:
    n = len(cell)
    return Ops(
        txn=np.repeat(np.arange(len(txns)), [len(t) for t in txns]).astype(np.int64),
        cell=np.asarray(cell, np.int64),
        kind=np.zeros(n, np.int8),
        fun=np.zeros(n, np.int32),
        cond=np.asarray(cond, np.int32),
        reason=np.zeros(n, np.int32),
        out=np.zeros(n, np.int32),
        args=np.zeros((n, 1), np.int64),
        dep_ptr=np.cumsum([0] + [len(r) for r in reads]).astype(np.int64),
        dep_cell=np.asarray([c for r in reads for c in r], np.int64),
        txn_ptr=np.cumsum([0] + [len(t) for t in txns]).astype(np.int64),
    )


def _link(ops: Ops, op_cuts: list[int], parties: int, share_cuts=None, spans=SPANS):
    """Deal every executor's share of the chunk (``share_cuts``: where each executor's
    operations begin, then the end; default: even), then link every batch with
    ``parties`` executors (one after the other: each writes only its rows) over the
    state of ``spans``. Returns the links and, per batch, the summed statistics."""
    n, r = len(ops.txn), len(ops.dep_cell)
    links = Links(
        *(
            np.full(
                r if name in ("dep_prev", "dep_initial", "pd_next", "read_op") else n, -7, np.int64
            )
            for name in Links._fields
        )
    )
    part_of = row_pools(len(set(ROW_OF_CELL)), parties)[ROW_OF_CELL]
    parts = [partition(spans, parties, n) for _ in range(parties)]
    assert all(p.direct == (spans is SPANS and CELLS <= n * 3 // 2) for p in parts)
    if share_cuts is None:
        share_cuts = [n * e // parties for e in range(parties + 1)]
    dealt = np.full(n + r, -(10**9), np.int64)
    ptr = np.full(parties * (parties + 1), -7, np.int64)
    for me, (first, end) in enumerate(consecutive(share_cuts)):
        row = parties + 1
        first_item = first + int(ops.dep_ptr[first])
        deal_share(
            first, end, first_item, ops, parts[me], links, dealt, ptr[me * row : (me + 1) * row]
        )
    assert (dealt > -(10**9)).all()  # every operation and read dealt once
    for me in range(parties):
        take_dealt(me, parts[me], ptr)
    values = np.arange(100, 100 + CELLS, dtype=np.int64)
    stats = []
    for first, end in consecutive(op_cuts):
        total = np.zeros(LINK_STATS, np.int64)
        for me in range(parties):
            row = np.zeros(LINK_STATS, np.int64)
            listed = int(parts[me].counts[1])
            link_batch(me, first, end, ops, parts[me], links, dealt, values, row)
            mine = parts[me].mine[listed : parts[me].counts[1]]
            assert mine.tolist() == [o for o in range(first, end) if part_of[ops.cell[o]] == me]
            total[:HOT] += row[:HOT]
            total[HOT] = max(total[HOT], row[HOT])
        stats.append(total)
    for part in parts:
        assert (part.cursor == part.stop).all()  # every item linked
        forget_chunk(part)
        assert (part.cells[:, 0] == -1).all() and (part.rows[:, 0] == -1).all()
    return links, stats


def _naive_links(txns, cell, reads, op_cuts):
    """The links from their definitions (the contract: ts order, statement order)."""
    n = len(cell)
    read_cells = [c for rs in reads for c in rs]
    read_op = [o for o, rs in enumerate(reads) for _ in rs]
    batch_of = [
        next(b for b, (a, e) in enumerate(consecutive(op_cuts)) if a <= o < e) for o in range(n)
    ]
    chain_prev = [max((p for p in range(o) if cell[p] == cell[o]), default=-1) for o in range(n)]
    chain_next = [
        min((p for p in range(o + 1, n) if cell[p] == cell[o]), default=-1) for o in range(n)
    ]
    dep_prev = [
        max((p for p in range(read_op[k]) if cell[p] == read_cells[k]), default=-1)
        for k in range(len(read_cells))
    ]
    head = [
        min(
            p
            for p in range(n)
            if batch_of[p] == batch_of[o] and ROW_OF_CELL[cell[p]] == ROW_OF_CELL[cell[o]]
        )
        for o in range(n)
    ]
    row_next = [
        min(
            (
                p
                for p in range(o + 1, n)
                if batch_of[p] == batch_of[o] and ROW_OF_CELL[cell[p]] == ROW_OF_CELL[cell[o]]
            ),
            default=-1,
        )
        for o in range(n)
    ]
    successors = [
        sorted(
            k
            for k in range(len(read_cells))
            if dep_prev[k] == o and batch_of[read_op[k]] == batch_of[o]
        )
        for o in range(n)
    ]
    stats = []
    for first, end in consecutive(op_cuts):
        ops_b = range(first, end)
        reads_b = [k for k in range(len(read_cells)) if first <= read_op[k] < end]
        in_batch = [k for k in reads_b if dep_prev[k] >= first]
        per_cell = [sum(1 for o in ops_b if cell[o] == c) for c in range(CELLS)]
        stats.append(
            [
                sum(1 for o in ops_b if chain_prev[o] >= first),
                len(in_batch),
                sum(
                    1
                    for k in in_batch
                    if ROW_OF_CELL[read_cells[k]] != ROW_OF_CELL[cell[read_op[k]]]
                ),
                len({ROW_OF_CELL[cell[o]] for o in ops_b}),
                max(per_cell, default=0),
            ]
        )
    return dict(
        chain_prev=chain_prev,
        chain_next=chain_next,
        dep_prev=dep_prev,
        head=head,
        row_next=row_next,
        read_op=read_op,
        successors=successors,
        stats=stats,
    )


def _successors(links: Links, o: int) -> list[int]:
    out, k = [], links.pd_head[o]
    while k >= 0:
        out.append(int(k))
        k = links.pd_next[k]
    return sorted(out)


@settings(max_examples=150, deadline=None)
@given(batch=batches(), parties=st.integers(1, 3), data=st.data())
def test_links_equal_their_definitions(batch, parties, data):
    txns, cell, reads, cond, cuts = batch
    ops = _ops(txns, cell, reads, cond)
    op_cuts = [int(ops.txn_ptr[c]) for c in cuts]
    n = len(cell)
    inner = sorted(
        data.draw(st.lists(st.integers(0, n), min_size=parties - 1, max_size=parties - 1))
    )
    spans = data.draw(st.sampled_from((SPANS, LARGE_SPANS)), label="spans")
    links, stats = _link(ops, op_cuts, parties, share_cuts=[0, *inner, n], spans=spans)
    want = _naive_links(txns, cell, reads, op_cuts)
    for name in ("chain_prev", "chain_next", "dep_prev", "head", "row_next", "read_op"):
        assert getattr(links, name).tolist() == want[name], name
    assert [_successors(links, o) for o in range(len(cell))] == want["successors"]
    assert [s.tolist() for s in stats] == want["stats"]
    values = np.arange(100, 100 + CELLS)
    for k, q in enumerate(want["dep_prev"]):
        if q < 0:  # a read of a cell no operation wrote before: the value as linked
            assert links.dep_initial[k] == values[ops.dep_cell[k]]
    assert set(links.owner.tolist()) <= set(range(parties))


def _units(n: int) -> Units:
    return Units(*(np.zeros(n + 1, np.int64) for _ in Units._fields))


def _naive_coarse(cell, read_op, read_cells, dep_prev, head, first, end):
    """Coarse units of operations first..end-1 from the definitions: rows grouped,
    strongly connected groups (mutual reachability) merged; strata = longest path."""
    heads = sorted({head[o] for o in range(first, end)})
    edges = {
        (head[dep_prev[k]], head[read_op[k]])
        for k in range(len(read_cells))
        if first <= read_op[k] < end
        and dep_prev[k] >= first
        and head[dep_prev[k]] != head[read_op[k]]
    }
    reach = {h: {h} for h in heads}
    changed = True
    while changed:
        changed = False
        for a, b in edges:
            for h in heads:
                if a in reach[h] and b not in reach[h]:
                    reach[h].add(b)
                    changed = True
    rep = {h: min(g for g in heads if g in reach[h] and h in reach[g]) for h in heads}
    level = dict.fromkeys(heads, 0)
    for _ in heads:  # longest path by relaxation over the condensation
        for a, b in edges:
            if rep[a] != rep[b]:
                level[rep[b]] = max(level[rep[b]], level[rep[a]] + 1)
    strata = 1 + max((level[rep[h]] for h in heads), default=0)
    groups = {}
    for h in heads:
        groups.setdefault(rep[h], []).append(h)
    merged = {
        r: sorted(o for o in range(first, end) if rep[head[o]] == r)
        for r, hs in groups.items()
        if len(hs) > 1
    }
    return rep, {r: level[r] for r in groups}, strata, merged


@settings(max_examples=150, deadline=None)
@given(batch=batches(max_txns=14))
def test_cycle_merging_and_strata_of_coarse_units_equal_their_definitions(batch):
    txns, cell, reads, cond, cuts = batch
    ops = _ops(txns, cell, reads, cond)
    op_cuts = [int(ops.txn_ptr[c]) for c in cuts]
    links, _ = _link(ops, op_cuts, 1)
    n = len(cell)
    units = _units(n)
    scratch = cycle_scratch(n, len(ops.dep_cell))
    read_cells = ops.dep_cell.tolist()
    for first, end in consecutive(op_cuts):
        reset_units(first, end, units)
        merged_count, cyclic, strata = merge_cycles(first, end, ops, links, units, scratch)
        rep, level, want_strata, merged = _naive_coarse(
            cell,
            links.read_op.tolist(),
            read_cells,
            links.dep_prev.tolist(),
            links.head.tolist(),
            first,
            end,
        )
        for h, r in rep.items():
            assert units.rep[h] == r
            assert units.level[r] == level[r]
        assert strata == want_strata
        assert cyclic == len(merged)
        assert merged_count == sum(
            len({links.head[o] for o in ops_}) - 1 for ops_ in merged.values()
        )
        for r, ops_ in merged.items():
            m = units.merged[r]
            assert units.merged_ops[units.merged_ptr[m] : units.merged_ptr[m + 1]].tolist() == ops_
        assert (scratch.node == -1).all()


@settings(max_examples=100, deadline=None)
@given(batch=batches(), parties=st.integers(1, 3))
def test_fine_strata_and_dependency_counts_equal_their_definitions(batch, parties):
    txns, cell, reads, cond, cuts = batch
    ops = _ops(txns, cell, reads, cond)
    op_cuts = [int(ops.txn_ptr[c]) for c in cuts]
    links, _ = _link(ops, op_cuts, parties)
    n = len(cell)
    units = _units(n)
    progress = np.zeros(8 * parties, np.int64)
    sync = np.zeros(128, np.int64)
    for first, end in consecutive(op_cuts):
        reset_units(first, end, units)
        progress[:] = first
        results = [None] * parties

        def level(me, results=results, first=first, end=end):
            own = np.flatnonzero(links.owner[first:end] == me).astype(np.int64) + first
            results[me] = fine_levels(
                *(me, first, end, own, ops, links, units, progress, sync, 10**10),
                np.zeros(1, np.int64),
            )

        threads = [threading.Thread(target=level, args=(me,)) for me in range(parties)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert all(why == 0 for why, _ in results)
        strata = max(mine for _, mine in results)
        preds = {}
        for o in range(first, end):
            reads_of = links.dep_prev[ops.dep_ptr[o] : ops.dep_ptr[o + 1]]
            preds[o] = [p for p in [links.chain_prev[o], *reads_of] if p >= first]
        want = {}
        for o in range(first, end):
            want[o] = max((want[p] + 1 for p in preds[o]), default=0)
        assert {o: int(units.level[o]) for o in range(first, end)} == want
        assert strata == 1 + max(want.values())
        counted = np.zeros(1, np.int64)
        for me in range(parties):
            count_pending(me, first, end, True, ops, links, units, SPANS, 1, counted)
        assert {o: int(units.pending[o]) for o in range(first, end)} == {
            o: len(p) for o, p in preds.items()
        }
        assert counted[0] == end - first


def _versions(n: int, changed, done) -> Versions:
    return Versions(
        before=np.zeros(n, np.int64),
        after=np.asarray(changed, np.int64),
        result=np.zeros(n, np.int64),
        slot=np.full(n, -1, np.int64),
        ok=np.ones(n, np.int8),
        done=np.asarray(done, np.int64),
        redo=np.zeros(n, np.int8),
        marked=np.full(n, -1, np.int64),
    )


def _mark(ops: Ops, v: Versions, failed, fresh):
    """find_affected over all transactions; (count, marked, affected, failed)."""
    t = len(ops.txn_ptr) - 1
    links, _ = _link(ops, [0, len(ops.txn)], 1)
    fates = Fates(
        np.asarray(failed, np.int8),
        np.asarray(fresh, np.int8),
        np.zeros(t, np.int8),
        np.full(t, -1, np.int64),
    )
    stack = np.zeros(2 * len(ops.txn) + len(ops.dep_cell), np.int64)
    count = find_affected(0, t, ops, links, v, fates, stack)
    assert not fates.fresh.any()
    assert v.marked[:count].tolist() == np.flatnonzero(v.redo).tolist()  # listed in ts order
    return count, v.marked[:count].tolist(), fates.affected.tolist(), fates.failed.tolist()


def _marks(txns, failed, changed, cond=(), deps=None, done=None):
    """find_affected on transactions given as lists of cells: ``changed`` per operation,
    ``cond`` the conditional operations, ``deps`` per operation the cells it reads,
    ``done`` the executed operations (default all)."""
    cell = [c for t in txns for c in t]
    ops = _ops(txns, cell, deps or [[] for _ in cell], [o in cond for o in range(len(cell))])
    v = _versions(len(cell), changed, done if done is not None else [1] * len(cell))
    return _mark(ops, v, failed, failed)


def test_a_failed_write_taints_later_operations_on_its_cells():
    # t0 fails after changing cell 1; t1 touches 1 and 2; t2 touches 2; t3 touches 3
    got = _marks([[0, 1], [1, 2], [2], [3]], [1, 0, 0, 0], [0, 5, 0, 0, 0, 0])
    assert got == (1, [2], [0, 0, 0, 0], [1, 0, 0, 0])  # only t1's operation on cell 1


def test_a_tainted_condition_redoes_its_transaction_and_taints_its_cells_transitively():
    # as above, but t1's operation on cell 1 is conditional: t1's outcome may change
    got = _marks([[0, 1], [1, 2], [2], [3]], [1, 1, 0, 0], [0, 5, 0, 0, 0, 0], cond={2})
    assert got == (3, [2, 3, 4], [0, 1, 0, 0], [1, 0, 0, 0])  # t1's failure forgotten


def test_a_failed_transaction_that_changed_nothing_taints_nothing():
    assert _marks([[0], [0]], [1, 1], [0, 0], cond={0, 1}) == (0, [], [0, 0], [1, 1])


def test_a_parametric_read_of_a_tainted_cell_is_marked():
    deps = [[], [], [1]]  # t2's operation on cell 2 reads cell 1
    got = _marks([[0], [1], [2]], [1, 1, 1], [0, 7, 0], cond={0, 1, 2}, deps=deps)
    assert got == (1, [2], [0, 0, 1], [1, 1, 0])


def test_operations_not_executed_yet_are_neither_marked_nor_taint():
    # eager: t1's operation on cell 1 has not run yet; t2 read cell 1 after t0's write
    deps = [[], [], [], [1]]
    got = _marks([[0, 1], [1], [2]], [1, 0, 0], [0, 5, 0, 0], deps=deps, done=[1, 1, 0, 1])
    assert got == (0, [], [0, 0, 0], [1, 0, 0])  # t2 read the version before t1's operation


def _naive_marks(ops: Ops, done, changed, failed, fresh):
    """The Coordinator's marking, from its definition (see `find_affected`)."""
    txn_ptr, cell = ops.txn_ptr.tolist(), ops.cell.tolist()
    reads = [ops.dep_cell[ops.dep_ptr[o] : ops.dep_ptr[o + 1]].tolist() for o in range(len(cell))]
    dirty, marked, affected, failed = set(), set(), set(), list(failed)
    for t in range(len(txn_ptr) - 1):
        own = range(txn_ptr[t], txn_ptr[t + 1])
        fate = False
        for o in own:
            if done[o] and ({cell[o], *reads[o]} & dirty):
                marked.add(o)
                dirty.add(cell[o])
                fate = fate or bool(ops.cond[o])
        if fate:
            affected.add(t)
            failed[t] = 0
            marked |= {o for o in own if done[o]}
            dirty |= {cell[o] for o in own if done[o]}
        elif fresh[t] and failed[t]:
            dirty |= {cell[o] for o in own if done[o] and changed[o]}
    return sorted(marked), sorted(affected), failed


@settings(max_examples=200, deadline=None)
@given(batch=batches(max_txns=12), data=st.data())
def test_coordinator_marks_equal_their_definition(batch, data):
    txns, cell, reads, cond, _ = batch
    ops = _ops(txns, cell, reads, cond)
    n, t = len(cell), len(txns)
    done = data.draw(st.lists(st.booleans(), min_size=n, max_size=n), label="done")
    # operations run in dependency order: an operation is executed only after the ones
    # before it on its cell and those it reads (what every exploration guarantees)
    links, _ = _link(ops, [0, n], 1)
    for o in range(n):
        preds = [links.chain_prev[o], *links.dep_prev[ops.dep_ptr[o] : ops.dep_ptr[o + 1]]]
        done[o] = done[o] and all(done[p] for p in preds if p >= 0)
    changed = data.draw(st.lists(st.booleans(), min_size=n, max_size=n), label="changed")
    failed = data.draw(st.lists(st.booleans(), min_size=t, max_size=t), label="failed")
    fresh = [f and data.draw(st.booleans()) for f in failed]
    count, marked, affected, failed_after = _mark(ops, _versions(n, changed, done), failed, fresh)
    want_marked, want_affected, want_failed = _naive_marks(ops, done, changed, failed, fresh)
    assert marked == want_marked and count == len(marked)
    assert [t for t, a in enumerate(affected) if a] == want_affected
    assert failed_after == [int(f) for f in want_failed]
