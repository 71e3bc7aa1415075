"""ArraySpec and SegmentLayout (txstream.state.segments): named arrays in one buffer;
the room a chunk segment reserves."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from txstream.config import RunConfig
from txstream.schedulers.morphstream import MorphStreamScheduler
from txstream.state.chunk import ChunkDims
from txstream.state.segments import ALIGN, RESERVED_BYTES, ArraySpec, SegmentLayout

SPECS = [
    ArraySpec("flags", "uint8", (3,)),
    ArraySpec("values", "int64", (5, 2), fill=-1),
    ArraySpec("locks", "int32", (17,)),
    ArraySpec("word", "int64", ()),
]


def _buffer(layout: SegmentLayout) -> memoryview:
    return memoryview(bytearray(layout.nbytes))


def _start(array: np.ndarray, buffer: memoryview) -> int:
    """Where ``array`` starts in ``buffer``, in bytes."""
    return array.__array_interface__["data"][0] - np.frombuffer(buffer, np.uint8).ctypes.data


_specs = st.lists(
    st.tuples(
        st.sampled_from(["uint8", "int32", "int64", "float64"]),
        st.lists(st.integers(1, 9), max_size=3).map(tuple),
    ),
    max_size=6,
).map(lambda specs: [ArraySpec(f"a{i}", d, s) for i, (d, s) in enumerate(specs)])


def test_an_array_takes_whole_cache_lines():
    assert (ArraySpec("a", "uint8", (1,)).nbytes, ArraySpec("a", "uint8", (64,)).nbytes) == (64, 64)
    assert ArraySpec("a", "int64", (9,)).nbytes == 128
    assert ArraySpec("a", "int32", (4, 5)).size == 20
    assert ArraySpec("a", "int64", ()).size == 1


def test_arrays_are_laid_out_one_after_the_other_on_cache_lines():
    layout = SegmentLayout(SPECS)
    assert layout.offsets.tolist() == [0, 64, 192, 320, 384]
    assert layout.nbytes == 384


@settings(deadline=None)
@given(specs=_specs)
def test_every_array_starts_on_its_own_cache_line_with_room_for_it(specs):
    layout = SegmentLayout(specs)
    offsets = layout.offsets.tolist()
    assert offsets[0] == 0 and layout.nbytes == offsets[-1]
    for spec, start, end in zip(specs, offsets[:-1], offsets[1:], strict=True):
        assert start % ALIGN == 0
        assert end - start >= spec.size * np.dtype(spec.dtype).itemsize
        assert end - start < spec.size * np.dtype(spec.dtype).itemsize + ALIGN


def test_an_array_declared_twice_is_refused():
    with pytest.raises(ValueError, match="'flags'"):
        SegmentLayout([*SPECS, ArraySpec("flags", "int64", (1,))])


def test_a_layout_fits_a_capacity_with_the_same_arrays_at_least_as_large():
    capacity = SegmentLayout(SPECS)
    assert SegmentLayout(SPECS).fits(capacity)
    smaller = [ArraySpec(s.name, s.dtype, (1,), s.fill) for s in SPECS]
    assert SegmentLayout(smaller).fits(capacity)
    reshaped = [*SPECS[:1], ArraySpec("values", "int64", (2, 5), fill=-1), *SPECS[2:]]
    assert SegmentLayout(reshaped).fits(capacity)  # regions are flat


@pytest.mark.parametrize(
    "changed",
    [
        ArraySpec("values", "int64", (5, 3)),  # larger
        ArraySpec("values", "float64", (5, 2)),  # another dtype
        ArraySpec("other", "int64", (5, 2)),  # another name
    ],
)
def test_a_layout_does_not_fit_a_capacity_with_another_array(changed):
    capacity = SegmentLayout(SPECS)
    assert not SegmentLayout([SPECS[0], changed, *SPECS[2:]]).fits(capacity)


def test_a_layout_does_not_fit_a_capacity_with_other_arrays_or_order():
    capacity = SegmentLayout(SPECS)
    assert not SegmentLayout(SPECS[:-1]).fits(capacity)
    assert not SegmentLayout(SPECS[:-1]).fits(SegmentLayout(SPECS))
    assert not SegmentLayout(SPECS).fits(SegmentLayout(SPECS[:-1]))
    assert not SegmentLayout([SPECS[1], SPECS[0], *SPECS[2:]]).fits(capacity)


def test_a_grown_capacity_has_room_to_spare_for_every_array():
    layout = SegmentLayout(SPECS)
    grown = layout.grown()
    assert layout.fits(grown)
    assert [s.name for s in grown.specs] == [s.name for s in SPECS]
    assert [s.fill for s in grown.specs] == [s.fill for s in SPECS]
    for spec, room in zip(SPECS, grown.specs, strict=True):
        assert room.size > spec.size * 1.4
    larger = [ArraySpec(s.name, s.dtype, (s.size + s.size // 3,), s.fill) for s in SPECS]
    assert SegmentLayout(larger).fits(grown)


def test_views_are_the_declared_arrays_in_their_regions():
    layout = SegmentLayout(SPECS)
    buffer = _buffer(layout)
    arrays = layout.views(buffer, layout)
    assert list(arrays) == [s.name for s in SPECS]
    for spec, start in zip(SPECS, layout.offsets, strict=False):
        array = arrays[spec.name]
        assert (array.shape, array.dtype) == (spec.shape, np.dtype(spec.dtype))
        assert array.flags.c_contiguous and array.flags.writeable
        assert _start(array, buffer) == start


def test_views_in_a_larger_capacity_start_where_its_regions_do():
    capacity = SegmentLayout(SPECS).grown()
    small = SegmentLayout([ArraySpec(s.name, s.dtype, (1,), s.fill) for s in SPECS])
    buffer = _buffer(capacity)
    arrays = small.views(buffer, capacity)
    assert [_start(arrays[s.name], buffer) for s in SPECS] == capacity.offsets[:-1].tolist()
    assert all(arrays[s.name].shape == (1,) for s in SPECS)


@settings(deadline=None)
@given(specs=_specs)
def test_views_do_not_overlap(specs):
    layout = SegmentLayout(specs)
    buffer = _buffer(layout)
    arrays = layout.views(buffer, layout)
    for i, spec in enumerate(specs):
        arrays[spec.name][...] = i + 1
    for i, spec in enumerate(specs):
        assert (arrays[spec.name] == i + 1).all(), spec.name
    names = list(arrays)
    for i, a in enumerate(names):
        for b in names[i + 1 :]:
            assert not np.shares_memory(arrays[a], arrays[b]), (a, b)


def test_fill_gives_every_array_its_declared_initial_value():
    layout = SegmentLayout(SPECS)
    arrays = layout.views(_buffer(layout), layout)
    arrays["flags"][...] = 7
    layout.fill(arrays)
    assert (arrays["values"] == -1).all()
    assert (arrays["flags"] == 7).all()  # fill 0: a new segment is zeros already
    assert (arrays["locks"] == 0).all()


def test_a_chunk_segment_reserves_room_for_the_runs_largest_chunk():
    """A run's chunks grow to ``--max-chunk-events``: the first segment has room for
    that at the first chunk's sizes per event, and at most `RESERVED_BYTES`."""
    dims = ChunkDims(
        operations=6_000, reads=9_000, transactions=2_048, arg_width=3, outputs=1,
        parties=2, pools=1, rows=1_000,
    )  # fmt: skip
    config = RunConfig(max_chunk_events=131_072)
    capacity = MorphStreamScheduler.chunk_capacity(config, dims)
    scale = 131_072 // 2_048
    largest = replace(dims, operations=6_000 * scale, reads=9_000 * scale, transactions=131_072)
    assert MorphStreamScheduler.chunk_layout(config, largest).fits(capacity)
    more = replace(largest, operations=2 * largest.operations)
    assert not MorphStreamScheduler.chunk_layout(config, more).fits(capacity)

    few = MorphStreamScheduler.chunk_capacity(RunConfig(max_chunk_events=100), dims)
    grown = replace(dims, operations=int(6_000 * 1.4), reads=int(9_000 * 1.4))
    assert MorphStreamScheduler.chunk_layout(config, grown).fits(few)

    huge = MorphStreamScheduler.chunk_capacity(RunConfig(max_chunk_events=10**12), dims)
    assert RESERVED_BYTES / 2 < huge.nbytes <= RESERVED_BYTES + 2 * ALIGN * len(huge.specs)
