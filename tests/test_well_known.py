"""The library's well-known functions and conditions: what the kernels compute inline
equals what their compiled Python bodies return when called by address."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from txstream.schedulers._kernels import WAITED_SLOTS, run_transactions
from txstream.state._kernels import CALLED, Udf, undo_log
from txstream.state.chunk import Outcomes
from txstream.state.operations import COMMITTED, READ_MODIFY, Ops
from txstream.state.tables import StateArrays
from txstream.topologies import functions
from txstream.topologies.api import identity

FUNCTIONS = [identity, functions.add, functions.subtract, functions.assign]
CONDITIONS = [functions.covers]


def _run(udf: Udf, fun: int, cond: int, value: int, arg: int) -> tuple[int, int]:
    """One transaction of one READ_MODIFY on a cell holding ``value``: its status and
    the cell's value after it."""
    ops = Ops(
        txn=np.zeros(1, np.int64),
        cell=np.zeros(1, np.int64),
        kind=np.array([READ_MODIFY], np.int8),
        fun=np.array([fun], np.int32),
        cond=np.array([cond], np.int32),
        reason=np.ones(1, np.int32),
        out=np.full(1, -1, np.int32),
        args=np.array([[arg]], np.int64),
        dep_ptr=np.zeros(2, np.int64),
        dep_cell=np.zeros(0, np.int64),
        txn_ptr=np.array([0, 1], np.int64),
    )
    state = StateArrays(
        np.array([value], np.int64),
        np.zeros(16, np.int64),
        np.zeros(16, np.int64),
        np.zeros(8, np.uint8),
    )
    outcomes = Outcomes(
        np.full(1, COMMITTED, np.int8),
        np.zeros(1, np.int32),
        np.zeros((1, 1), np.int64),
        np.zeros((1, 1), bool),
    )
    waited = np.zeros(WAITED_SLOTS, np.int64)
    run_transactions(0, 1, ops, state, udf, np.zeros(1, np.int64), undo_log(1), outcomes, waited)
    return int(outcomes.status[0]), int(state.values[0])


def _udf(inline: bool) -> Udf:
    for f in (*FUNCTIONS, *CONDITIONS):
        f.compile()
    funs = [f.computes if inline else CALLED for f in FUNCTIONS]
    conds = [0, *(c.computes if inline else CALLED for c in CONDITIONS)]
    return Udf(
        np.array([f.address for f in FUNCTIONS], np.int64),
        np.array([0, *(c.address for c in CONDITIONS)], np.int64),
        0,
        np.array(funs, np.int64),
        np.array(conds, np.int64),
    )


def test_the_library_says_which_functions_are_computed_inline():
    assert all(f.computes != CALLED for f in (*FUNCTIONS, *CONDITIONS))


@pytest.mark.parametrize("fun", range(len(FUNCTIONS)))
@settings(deadline=None, max_examples=60)
@given(value=st.integers(-(2**40), 2**40), arg=st.integers(-(2**40), 2**40), cond=st.integers(0, 1))
def test_inline_equals_called(fun, value, arg, cond):
    assert _run(_udf(True), fun, cond, value, arg) == _run(_udf(False), fun, cond, value, arg)
