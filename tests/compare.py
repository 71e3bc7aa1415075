"""Assertions that two runs produced the same outputs and state (contract §4)."""

from __future__ import annotations

import pyarrow as pa
from txstream.result import Result


def assert_same_run(got_events: pa.Table, got_state: dict, want_events: pa.Table, want_state: dict):
    """Same columns, types, statuses, null reasons, outputs and final tables.

    Reason texts are free-form; only whether a reason is present is compared.
    """
    assert got_events.schema.names == want_events.schema.names
    assert got_events.schema.types == want_events.schema.types
    assert got_events.num_rows == want_events.num_rows
    for name in got_events.column_names:
        got, want = got_events.column(name), want_events.column(name)
        if name == "reason":
            got, want = got.is_null(), want.is_null()
        if not got.equals(want):
            g, w = got.to_pylist(), want.to_pylist()
            first = next(i for i in range(len(g)) if g[i] != w[i])
            raise AssertionError(
                f"column {name!r} differs first at ts {first}: got {g[first]!r}, want {w[first]!r}"
            )
    assert sorted(got_state) == sorted(want_state)
    for table in want_state:
        got, want = got_state[table], want_state[table]
        assert got.schema.names == want.schema.names, table
        for name in want.column_names:
            assert got.column(name).to_pylist() == want.column(name).to_pylist(), (table, name)


def assert_same_tables(got: Result, want: Result) -> None:
    """Two runs' events and state are equal to the letter, abort reasons included."""
    got_events, got_state = got.events, got.state
    want_events, want_state = want.events, want.state
    assert got_events.equals(want_events), _first_difference(got_events, want_events)
    assert sorted(got_state) == sorted(want_state)
    for name, table in want_state.items():
        assert got_state[name].equals(table), name


def _first_difference(got: pa.Table, want: pa.Table) -> str:
    for name in want.column_names:
        g, w = got.column(name).to_pylist(), want.column(name).to_pylist()
        if g != w:
            i = next(i for i in range(min(len(g), len(w))) if g[i] != w[i])
            return f"column {name!r} differs first at ts {i}: got {g[i]!r}, want {w[i]!r}"
    return "schemas differ"
