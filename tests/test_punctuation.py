"""Punctuator and ChunkSizer (txstream.actors.punctuation), without Ray."""

from __future__ import annotations

import pickle

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from txstream.actors.punctuation import START_EVENTS, ChunkSizer, Punctuator
from txstream.config import CHUNK_EVENTS
from txstream.topologies.api import one_batch, own_memory


def _rows(first: int, n: int) -> pa.RecordBatch:
    """``n`` events whose ``ts`` column is their position in the stream."""
    return pa.record_batch({"ts": pa.array(range(first, first + n), pa.int64())})


def _feed(p: Punctuator, sizes: list[int], arrival: float = 0.0) -> None:
    first = p.ts + p.pending
    for i, n in enumerate(sizes):
        p.add(_rows(first, n), arrival + i)
        first += n


def _ts(chunk) -> list[int]:
    return chunk.events.column("ts").to_pylist()


# ---------------------------------------------------------------- Punctuator: cuts
def test_cuts_by_count_at_exactly_the_interval_whatever_the_push_sizes():
    for sizes in ([25], [3] * 8 + [1], [9, 1, 10, 5], [1] * 25):
        p = Punctuator(10, None)
        _feed(p, sizes)
        assert (p.pending, p.closed, p.count_cuts) == (25, 20, 2), sizes
        assert p.take(100).batch_ends.tolist() == [10, 20], sizes


def test_a_push_of_exactly_the_interval_closes_its_batch_and_leaves_none_open():
    p = Punctuator(10, 0.5)
    _feed(p, [10])
    assert (p.closed, p.count_cuts) == (10, 1)
    assert p.deadline() is None


def test_punctuate_closes_the_open_batch_and_never_cuts_an_empty_one():
    p = Punctuator(10, None)
    p.punctuate()
    assert p.take(100) is None
    _feed(p, [13])
    p.punctuate()
    p.punctuate()
    assert (p.pending, p.closed) == (13, 13)
    assert p.take(100).batch_ends.tolist() == [10, 13]
    assert p.take(100) is None
    assert (p.pending, p.closed, p.count_cuts, p.time_cuts) == (0, 0, 1, 0)


def test_empty_batches_are_ignored():
    p = Punctuator(10, 0.5)
    p.add(_rows(0, 0), 1.0)
    assert (p.pending, p.deadline()) == (0, None)


def test_deadline_is_the_oldest_open_event_arrival_plus_punctuation_s():
    p = Punctuator(10, 0.5)
    assert p.deadline() is None
    p.add(_rows(0, 3), 100.0)
    p.add(_rows(3, 3), 101.0)
    assert p.deadline() == 100.5


def test_after_a_count_cut_the_deadline_starts_from_the_first_event_after_it():
    p = Punctuator(10, 0.5)
    p.add(_rows(0, 4), 100.0)
    p.add(_rows(4, 8), 101.0)  # cut at 10: events 10, 11 arrived at 101
    p.add(_rows(12, 1), 102.0)
    assert p.deadline() == 101.5


def test_cut_if_due_cuts_only_once_the_oldest_event_waited_punctuation_s():
    p = Punctuator(10, 0.5)
    p.add(_rows(0, 3), 100.0)
    p.cut_if_due(100.49)
    assert (p.closed, p.time_cuts) == (0, 0)
    p.cut_if_due(100.5)
    assert (p.closed, p.time_cuts) == (3, 1)
    assert p.deadline() is None
    p.cut_if_due(1e12)  # nothing open: no cut, not counted
    assert (p.closed, p.time_cuts) == (3, 1)


def test_without_punctuation_s_nothing_is_ever_cut_by_time():
    p = Punctuator(10, None)
    p.add(_rows(0, 3), 100.0)
    assert p.deadline() is None
    p.cut_if_due(1e12)
    assert (p.closed, p.time_cuts) == (0, 0)


# ---------------------------------------------------------------- Punctuator: take
def test_take_is_none_while_no_batch_is_closed():
    p = Punctuator(10, None)
    _feed(p, [9])
    assert p.take(100) is None
    assert p.pending == 9


def test_take_hands_out_whole_batches_never_more_than_the_limit():
    p = Punctuator(10, None)
    _feed(p, [45])  # batches end at 10, 20, 30, 40; 5 open
    chunk = p.take(25)
    assert (chunk.ts0, chunk.size, chunk.batch_ends.tolist()) == (0, 20, [10, 20])
    chunk = p.take(20)
    assert (chunk.ts0, chunk.size, chunk.batch_ends.tolist()) == (20, 20, [10, 20])
    assert _ts(chunk) == list(range(20, 40))
    assert (p.ts, p.pending, p.closed) == (40, 5, 0)


def test_take_hands_out_one_batch_larger_than_the_limit_rather_than_none():
    p = Punctuator(10, None)
    _feed(p, [30])
    chunk = p.take(3)
    assert (chunk.size, chunk.batch_ends.tolist()) == (10, [10])
    assert p.closed == 20


def test_take_with_split_cuts_a_first_batch_larger_than_the_limit_and_moves_no_cut():
    p = Punctuator(10, None)
    _feed(p, [25])
    chunk = p.take(3, split=True)
    assert (chunk.size, chunk.batch_ends.tolist(), _ts(chunk)) == (3, [3], [0, 1, 2])
    assert p.take(100).batch_ends.tolist() == [7, 17]  # the count cuts at 10 and 20 stay
    p.punctuate()
    assert p.take(100, split=True).batch_ends.tolist() == [5]


def test_take_splits_pushes_mid_batch_with_their_arrivals():
    p = Punctuator(4, None, start_ts=100)
    p.add(_rows(100, 3), 1.0)
    p.add(_rows(103, 3), 2.0)  # cut at 104: this push is split
    p.add(_rows(106, 3), 3.0)  # cut at 108
    first = p.take(4)
    assert (first.ts0, first.batch_ends.tolist()) == (100, [4])
    assert _ts(first) == [100, 101, 102, 103]
    assert first.arrival.tolist() == [1.0, 1.0, 1.0, 2.0]
    p.punctuate()
    second = p.take(100)
    assert (second.ts0, second.batch_ends.tolist()) == (104, [4, 5])
    assert _ts(second) == [104, 105, 106, 107, 108]
    assert second.arrival.tolist() == [2.0, 2.0, 3.0, 3.0, 3.0]
    assert (p.ts, p.pending) == (109, 0)


def test_rows_read_in_order_from_one_batch_are_one_slice_of_it_conformed_once():
    source = pa.record_batch(
        {
            "ts": pa.array(range(10), pa.int32()),
            "kind": pa.array(["a", "b"] * 5),
            "extra": pa.array([0.5] * 10),
        }
    )
    schema = pa.schema([("ts", pa.int64()), ("kind", pa.dictionary(pa.int32(), pa.string()))])
    p = Punctuator(4, None, schema=schema)
    for first, arrival in ((0, 1.0), (3, 2.0), (6, 3.0)):  # read a step of 3 at a time
        p.add(source, arrival, first, 3)
    p.add(pa.record_batch({"ts": pa.array([9, 10]), "kind": pa.array(["c", "c"])}), 4.0)
    chunk = p.take(8)
    assert chunk.events.schema == schema
    assert [len(b) for b in chunk.events.to_batches()] == [8]  # one slice, one conversion
    assert _ts(chunk) == list(range(8))
    assert chunk.events.column("kind").to_pylist() == ["a", "b"] * 4
    assert chunk.arrival.tolist() == [1.0] * 3 + [2.0] * 3 + [3.0] * 2
    p.punctuate()
    rest = p.take(100)
    assert [len(b) for b in rest.events.to_batches()] == [1, 2]  # two batches, two slices
    assert _ts(rest) == [8, 9, 10]


def test_a_chunk_for_another_process_pickles_its_own_rows_only():
    source = pa.record_batch({"ts": pa.array(range(100_000)), "kind": pa.array(["a"] * 100_000)})
    p = Punctuator(1000, None)
    p.add(source, 1.0, 5000, 2000)
    chunk = one_batch(p.take(2000).events)
    assert len(pickle.dumps(chunk)) > 40 * len(pickle.dumps(own_memory(chunk)))
    assert own_memory(chunk).equals(chunk)
    whole = own_memory(chunk)
    assert own_memory(whole) is whole  # nothing to drop: no copy


# ---------------------------------------------------------------- Punctuator: property
_ops = st.lists(
    st.one_of(
        st.tuples(st.just("add"), st.integers(0, 30)),
        st.tuples(st.just("wait"), st.sampled_from([0.1, 0.4, 1.0])),
        st.tuples(st.just("punctuate"), st.none()),
        st.tuples(st.just("take"), st.integers(1, 40)),
    ),
    max_size=40,
)


@settings(max_examples=300, deadline=None)
@given(
    interval=st.integers(1, 40),
    punctuation_s=st.sampled_from([None, 0.5]),
    start=st.integers(0, 5),
    ops=_ops,
)
def test_taken_chunks_are_the_input_in_order_cut_where_the_punctuator_cut(
    interval, punctuation_s, start, ops
):
    """Against a plain model of the cuts: count every ``interval`` events since the last
    cut, time once the oldest open event waited ``punctuation_s``, on demand."""
    p = Punctuator(interval, punctuation_s, start_ts=start)
    now, end, open_start, open_since = 0.0, start, start, None
    cuts, arrivals, taken, taken_ends = [], [], [], []
    expected_count_cuts = expected_time_cuts = 0
    for op, arg in ops:
        if op == "add":
            p.add(_rows(end, arg), now)
            arrivals += [now] * arg
            for _ in range(arg):
                if open_since is None:
                    open_since = now
                end += 1
                if end - open_start == interval:
                    cuts.append(end)
                    open_start, open_since = end, None
                    expected_count_cuts += 1
        elif op == "wait":
            now += arg
            due = punctuation_s is not None and open_since is not None
            if due and now >= open_since + punctuation_s:
                cuts.append(end)
                open_start, open_since = end, None
                expected_time_cuts += 1
            p.cut_if_due(now)
        elif op == "punctuate":
            if end > open_start:
                cuts.append(end)
                open_start, open_since = end, None
            p.punctuate()
        else:
            chunk = p.take(arg)
            closed = [c for c in cuts if c > (taken_ends[-1] if taken_ends else start)]
            if not closed:
                assert chunk is None
                continue
            ends = (chunk.ts0 + chunk.batch_ends).tolist()
            assert chunk.ts0 == (taken_ends[-1] if taken_ends else start)
            assert ends == closed[: len(ends)]  # whole batches, in order
            assert chunk.size == chunk.batch_ends[-1] == len(chunk.arrival)
            assert chunk.size <= arg or len(ends) == 1
            if len(ends) < len(closed):  # the longest run within the limit
                assert closed[len(ends)] - chunk.ts0 > arg
            assert chunk.arrival.tolist() == arrivals[chunk.ts0 - start : ends[-1] - start]
            taken += _ts(chunk)
            taken_ends += ends
        assert p.pending == end - p.ts
        last_cut = cuts[-1] if cuts else start
        assert p.closed == last_cut - p.ts
    assert taken == list(range(start, start + len(taken)))
    assert (p.count_cuts, p.time_cuts) == (expected_count_cuts, expected_time_cuts)


# ---------------------------------------------------------------- ChunkSizer
def test_the_sizer_starts_small_before_any_observation():
    sizer = ChunkSizer(0.2, largest=5000)
    assert sizer.limit(0) == sizer.limit(10**9) == START_EVENTS
    assert ChunkSizer(0.2, largest=100).limit(0) == 100  # never above the largest
    assert ChunkSizer(0.2).largest == CHUNK_EVENTS


def test_the_limit_is_what_the_team_serves_in_half_the_latency_target():
    sizer = ChunkSizer(0.2, largest=5000)
    sizer.observe(1000, 1.0)  # 1000 events/s: 200 within the target
    assert sizer.limit(0) == sizer.limit(200) == 100


def test_the_events_served_in_a_target_are_unbounded_until_measured():
    sizer = ChunkSizer(0.2, largest=5000)
    assert sizer.target_events == float("inf")
    sizer.observe(1000, 1.0)
    assert sizer.target_events == pytest.approx(200)


def test_a_backlog_larger_than_the_target_gets_a_whole_targets_worth():
    sizer = ChunkSizer(0.2, largest=5000)
    sizer.observe(1000, 1.0)  # 1000 events/s: 200 within the target
    assert sizer.limit(201) == 200  # twice the step, never more once measured


def test_the_limit_is_clipped_to_one_and_the_largest():
    slow = ChunkSizer(0.2, largest=5000)
    slow.observe(1, 100.0)
    assert slow.limit(0) == 1
    fast = ChunkSizer(0.2, largest=5000)
    fast.observe(10**9, 1.0)
    assert fast.limit(0) == 5000


def test_the_rate_is_smoothed_over_recent_chunks():
    sizer = ChunkSizer(1.0, largest=10**6)
    sizer.observe(1000, 1.0)
    sizer.observe(2000, 1.0)
    assert sizer.rate == pytest.approx(1000 + ChunkSizer.SMOOTHING * 1000)
    assert sizer.limit(0) == 650


def test_empty_or_instant_chunks_tell_the_sizer_nothing():
    sizer = ChunkSizer(0.2, largest=5000)
    sizer.observe(0, 1.0)
    sizer.observe(100, 0.0)
    assert sizer.rate is None
    sizer.observe(1000, 1.0)
    sizer.observe(-5, 1.0)
    assert sizer.rate == 1000


@settings(deadline=None)
@given(
    chunks=st.lists(st.tuples(st.integers(1, 10**6), st.floats(1e-4, 10.0)), min_size=1),
    backlog=st.integers(0, 10**7),
)
def test_the_limit_is_always_between_one_and_the_largest(chunks, backlog):
    sizer = ChunkSizer(0.05, largest=4096)
    for events, seconds in chunks:
        sizer.observe(events, seconds)
    rates = [e / s for e, s in chunks]
    assert min(rates) * (1 - 1e-9) <= sizer.rate <= max(rates) * (1 + 1e-9)
    assert 1 <= sizer.limit(backlog) <= 4096
