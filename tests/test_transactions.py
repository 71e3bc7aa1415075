"""The transaction builder (txstream.topologies.api.Transactions, as the engine reads it:
txstream.schedulers.statements.Statements): the operations one kernel pass builds equal a
plain-Python reading of the statements, and what state_access gets wrong is a TopologyError
naming it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from txstream.errors import TopologyError
from txstream.schedulers._kernels import WAITED_SLOTS, run_transactions, statement_scratch
from txstream.schedulers._statement_kernels import statement_kernel
from txstream.schedulers.statements import Statements
from txstream.state._kernels import undo_log
from txstream.state.chunk import Outcomes
from txstream.state.dirty import groups_of
from txstream.state.layout import Layout
from txstream.state.operations import COMMITTED, READ, READ_MODIFY, REJECTED, WRITE, Ops
from txstream.state.tables import StateArrays
from txstream.topologies.api import (
    INT,
    INT_LIST,
    EventShare,
    ListColumn,
    Table,
    Topology,
    condition,
    function,
)

A = Table("a", ("x", "y"))
B = Table("b", ("z",))
SIZES = {"a": 7, "b": 5}


@function
def plus(value, args, reads, n_reads):
    return value + args[0]


@condition
def positive(value, args, reads, n_reads):
    return value > 0


def _topology() -> Topology:
    return Topology(
        name="builder",
        tables=(A, B),
        event_columns={"event_id": INT, "k": INT, "l": INT_LIST},
        kinds=(),
        functions=(plus,),
        conditions=(positive,),
        outputs=("o",),
        pre_process=lambda events: None,
        state_access=lambda events, txn: None,
    )


TOPOLOGY = _topology()
LAYOUT = Layout.of(TOPOLOGY.tables, SIZES)


def _events(n: int) -> EventShare:
    batch = pa.RecordBatch.from_pydict(
        {"event_id": list(range(n)), "k": [0] * n, "l": [[]] * n},
        schema=pa.schema(
            [("event_id", pa.int64()), ("k", pa.int64()), ("l", pa.list_(pa.int64()))]
        ),
    )
    return EventShare(batch, TOPOLOGY, SIZES)


def _built(txn: Statements) -> Ops:
    ops, reads, width = txn.sizes()[:3]
    built = Ops(
        *(np.full(ops, -9, d) for d in (np.int64, np.int64, np.int8)),
        *(np.full(ops, -9, np.int32) for _ in range(4)),
        args=np.full((ops, width), -9, np.int64),
        dep_ptr=np.full(ops + 1, -9, np.int64),
        dep_cell=np.full(reads, -9, np.int64),
        txn_ptr=np.full(txn.events.n + 1, -9, np.int64),
    )
    txn.build_into(built, 0, 0, 0)
    return built


def _lists(draw, n: int, high: int) -> ListColumn:
    rows = [draw(st.lists(st.integers(0, high), max_size=3)) for _ in range(n)]
    offsets = np.cumsum([0] + [len(r) for r in rows]).astype(np.int64)
    return ListColumn(offsets, np.array([v for r in rows for v in r], np.int64))


@st.composite
def _workloads(draw):
    """Events (some rejected) and statements of every shape: scalar or list keys,
    constant, column or list arguments, parametric reads, masks."""
    n = draw(st.integers(0, 12))
    rejected = np.array(draw(st.lists(st.booleans(), min_size=n, max_size=n)), bool)
    statements = []
    for _ in range(draw(st.integers(1, 4))):
        table, column = draw(st.sampled_from([(A, "x"), (A, "y"), (B, "z")]))
        size = SIZES[table.name]
        listed = draw(st.booleans())
        key = (
            _lists(draw, n, size - 1)
            if listed
            else np.array(
                draw(st.lists(st.integers(0, size - 1), min_size=n, max_size=n)), np.int64
            )
        )
        args = []
        for _ in range(draw(st.integers(0, 2))):
            choice = draw(
                st.sampled_from(
                    ["constant", "column", "list"] if listed else ["constant", "column"]
                )
            )
            if choice == "constant":
                args.append(draw(st.integers(-5, 5)))
            elif choice == "column":
                args.append(
                    np.array(draw(st.lists(st.integers(-9, 9), min_size=n, max_size=n)), np.int64)
                )
            else:  # as long as the key's lists: the values of the key's rows, shifted
                args.append(ListColumn(key.offsets, key.values + 100))
        reads = [
            (
                B["z"],
                _lists(draw, n, SIZES["b"] - 1) if draw(st.booleans()) else np.zeros(n, np.int64),
            )
            for _ in range(draw(st.integers(0, 2)))
        ]
        where = np.array(draw(st.lists(st.booleans(), min_size=n, max_size=n)), bool)
        statements.append(
            dict(
                kind=draw(st.sampled_from([READ, WRITE, READ_MODIFY])),
                column=table[column],
                key=key,
                args=args,
                reads=reads,
                where=where if draw(st.booleans()) else None,
                conditional=draw(st.booleans()),
            )
        )
    return n, rejected, statements


def _elements(source, t: int) -> list[int]:
    if isinstance(source, ListColumn):
        return source.values[source.offsets[t] : source.offsets[t + 1]].tolist()
    return [int(source[t])]


def _argument(arg, t: int, e: int) -> int:
    if isinstance(arg, ListColumn):
        return _elements(arg, t)[e]
    return arg if np.ndim(arg) == 0 else int(arg[t])


def _reference(n, rejected, statements) -> list[tuple]:
    """Every operation as (txn, cell, kind, fun, cond, args, read cells), in serial order."""
    ops = []
    for t in range(n):
        if rejected[t]:
            continue
        for s in statements:
            if s["where"] is not None and not s["where"][t]:
                continue
            column = s["column"]
            for e, key in enumerate(_elements(s["key"], t)):
                args = [_argument(a, t, e) for a in s["args"]]
                reads = [
                    LAYOUT.bases[(c.table.name, c.name)] + k
                    for c, key in s["reads"]
                    for k in _elements(key, t)
                ]
                base = LAYOUT.bases[(column.table.name, column.name)]
                ops.append((t, base + key, s["kind"], 1, int(s["conditional"]), args, reads))
    return ops


def _transactions(n, rejected, statements) -> Statements:
    """The drawn statements emitted over ``n`` events, ``rejected`` ones rejected."""
    events = _events(n)
    events.reason[rejected] = 1
    txn = Statements(events, LAYOUT)
    for i, s in enumerate(statements):
        emit = {READ: txn.read, WRITE: txn.write, READ_MODIFY: txn.read_modify}[s["kind"]]
        extra = dict(cond=positive, reason=f"not positive ({i})") if s["conditional"] else {}
        kw = dict(args=s["args"], reads=s["reads"], where=s["where"], **extra)
        emit(s["column"], s["key"], fun=plus, **kw) if s["kind"] == READ else emit(
            s["column"], s["key"], plus, **kw
        )
    return txn


@settings(deadline=None, max_examples=150)
@given(_workloads())
def test_the_built_operations_are_the_statements_in_serial_order(workload):
    n, rejected, statements = workload
    txn = _transactions(n, rejected, statements)
    expected = _reference(n, rejected, statements)
    built = _built(txn)
    width = built.args.shape[1]
    got = [
        (
            int(built.txn[o]),
            int(built.cell[o]),
            int(built.kind[o]),
            int(built.fun[o]),
            int(built.cond[o]),
            built.args[o].tolist(),
            built.dep_cell[built.dep_ptr[o] : built.dep_ptr[o + 1]].tolist(),
        )
        for o in range(len(built.txn))
    ]
    assert got == [(*op[:5], op[5] + [0] * (width - len(op[5])), op[6]) for op in expected]
    per_event = (
        np.bincount([op[0] for op in expected], minlength=n) if expected else np.zeros(n, int)
    )
    assert built.txn_ptr.tolist() == np.concatenate([[0], np.cumsum(per_event)]).tolist()
    counts = [sum(1 for op in expected if op[0] == t) for t in range(n)]
    reads = [len(op[6]) for op in expected]
    assert txn.sizes()[:2] == (len(expected), sum(reads))
    assert txn.sizes()[3:] == (max(counts, default=0), max(reads, default=0))


def _outcomes(n: int, rejected: np.ndarray) -> Outcomes:
    status = np.where(rejected, REJECTED, COMMITTED).astype(np.int8)
    outputs = np.zeros((n, 1), np.int64), np.zeros((n, 1), bool)
    return Outcomes(status, np.zeros(n, np.int32), *outputs)


def _state(values: list[int]) -> StateArrays:
    cells = np.array(values, np.int64)
    dirty = np.zeros(groups_of(len(cells)), np.uint8)
    return StateArrays(cells, np.zeros(16, np.int64), np.zeros(16, np.int64), dirty)


@pytest.fixture(scope="module")
def private_kernel_cache(tmp_path_factory):
    """Kernels of drawn statements (of a new shape nearly every example) made in a
    folder removed after the tests, not in the user's cache."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("XDG_CACHE_HOME", str(tmp_path_factory.mktemp("cache")))
        yield


@pytest.mark.usefixtures("private_kernel_cache")
@settings(deadline=None, max_examples=80)
@given(_workloads(), st.lists(st.integers(-3, 3), min_size=LAYOUT.cells, max_size=LAYOUT.cells))
def test_transactions_run_from_statements_as_from_their_built_operations(workload, values):
    """A lone serial executor runs the statements without building operations, with a
    kernel made for them (`statement_kernel`): the same outcomes and state as
    `run_transactions` over them."""
    n, rejected, statements = workload
    txn = _transactions(n, rejected, statements)
    udf, sizes = TOPOLOGY.udf(), txn.sizes()
    built, state, outcomes = _built(txn), _state(values), _outcomes(n, rejected)
    reads, log = np.empty(max(1, sizes.op_reads), np.int64), undo_log(sizes.txn_ops)
    waited = np.zeros(WAITED_SLOTS, np.int64)
    assert run_transactions(0, n, built, state, udf, reads, log, outcomes, waited) == 0
    direct, direct_outcomes = _state(values), _outcomes(n, rejected)
    scratch = statement_scratch(sizes.arg_width, sizes.op_reads, sizes.txn_ops)
    tables = txn.tables()
    kernel = statement_kernel(tables[0], tables[1])
    assert kernel(0, n, *tables, direct, udf, scratch, direct_outcomes, waited) == 0
    assert direct.values.tolist() == state.values.tolist()
    for got, want in zip(direct_outcomes, outcomes, strict=True):
        assert got.tolist() == want.tolist()


def _one(key=None, args=(), reads=(), column=A["x"]) -> Statements:
    txn = Statements(_events(3), LAYOUT)
    txn.write(column, np.array([0, 1, 2]) if key is None else key, plus, args=args, reads=reads)
    return txn


def test_a_key_outside_its_table_is_a_topology_error_naming_the_table():
    with pytest.raises(TopologyError, match="key outside table 'b'"):
        _built(_one(key=np.array([0, 5, 1]), column=B["z"]))


def test_a_parametric_read_outside_its_table_is_a_topology_error_naming_the_table():
    lists = ListColumn(np.array([0, 1, 1, 3]), np.array([4, 0, 9]))
    with pytest.raises(TopologyError, match="key outside table 'b'"):
        _built(_one(reads=[(B["z"], lists)]))


def test_a_list_argument_shorter_than_its_key_list_is_a_topology_error():
    keys = ListColumn(np.array([0, 2, 2, 3]), np.array([1, 2, 3]))
    short = ListColumn(np.array([0, 1, 1, 2]), np.array([7, 8]))
    with pytest.raises(TopologyError, match="list argument is shorter"):
        _built(_one(key=keys, args=[short]))


@pytest.mark.parametrize(
    "txn",
    [
        _one(key=np.array([0, 5, 1]), column=B["z"]),
        _one(reads=[(B["z"], ListColumn(np.array([0, 1, 1, 3]), np.array([4, 0, 9])))]),
        _one(
            key=ListColumn(np.array([0, 2, 2, 3]), np.array([1, 2, 3])),
            args=[ListColumn(np.array([0, 1, 1, 2]), np.array([7, 8]))],
        ),
    ],
    ids=["key", "read", "argument"],
)
def test_running_from_statements_reports_what_building_does(txn):
    with pytest.raises(TopologyError) as built:
        _built(txn)
    sizes = txn.sizes()
    scratch = statement_scratch(sizes.arg_width, sizes.op_reads, sizes.txn_ops)
    waited = np.zeros(WAITED_SLOTS, np.int64)
    state, outcomes = _state([1] * LAYOUT.cells), _outcomes(3, np.zeros(3, bool))
    tables = txn.tables()
    kernel = statement_kernel(tables[0], tables[1])
    assert kernel(0, 3, *tables, state, TOPOLOGY.udf(), scratch, outcomes, waited)
    assert txn.error_message(scratch[-1]) == str(built.value)


def test_statements_of_one_shape_share_a_kernel_compiled_once_per_installation():
    """A statement kernel is made per shape (kinds of operation, keys, arguments, reads),
    not per column, table or chunk; numba's cache of it serves the next process."""
    kernel = statement_kernel(*_one().tables()[:2])
    assert statement_kernel(*_one(key=np.array([4, 0, 3]), column=B["z"]).tables()[:2]) is kernel
    assert statement_kernel(*_one(args=[np.array([1, 2, 3])]).tables()[:2]) is not kernel
    reading = Statements(_events(3), LAYOUT)
    reading.read(A["x"], np.array([0, 1, 2]))
    assert statement_kernel(*reading.tables()[:2]) is not kernel
    source = Path(kernel.py_func.__code__.co_filename)
    assert source.parent.name == "kernels" and source.read_text().startswith('"""Generated')
    call = (
        "import numpy as np, tests.test_transactions as t\n"
        "from txstream.schedulers._kernels import statement_scratch\n"
        "txn = t._one()\n"
        "kernel = t.statement_kernel(*txn.tables()[:2])\n"
        "state, outcomes = t._state([1] * t.LAYOUT.cells), t._outcomes(3, np.zeros(3, bool))\n"
        "waited, scratch = np.zeros(t.WAITED_SLOTS, np.int64), statement_scratch(1, 1, 1)\n"
        "kernel(0, 3, *txn.tables(), state, t.TOPOLOGY.udf(), scratch, outcomes, waited)\n"
        "print(sum(kernel.stats.cache_hits.values()), sum(kernel.stats.cache_misses.values()))\n"
    )
    runs = [
        subprocess.run(
            [sys.executable, "-c", call],
            cwd=Path(__file__).parents[1],
            capture_output=True,
            text=True,
        )
        for _ in range(2)  # the first compiles it if no test did yet
    ]
    assert all(run.returncode == 0 for run in runs), runs[-1].stderr
    assert runs[1].stdout.split() == ["1", "0"]  # loaded from the cache, not compiled


def test_a_list_argument_needs_a_list_key_and_columns_one_value_per_event():
    lists = ListColumn(np.array([0, 1, 2, 3]), np.array([1, 2, 3]))
    with pytest.raises(TopologyError, match="list argument needs a list-valued key"):
        _one(args=[lists])
    with pytest.raises(TopologyError, match=r"column of shape \(2,\) for 3 events"):
        _one(key=np.array([0, 1]))
    with pytest.raises(TopologyError, match="needs a `reason`"):
        Statements(_events(3), LAYOUT).write(A["x"], np.zeros(3, np.int64), plus, cond=positive)
