"""Chunk sizes start small and grow with measurements; a one-shot run reads its input as
the team consumes it, so its latency stays near the target (threads, no Ray)."""

from __future__ import annotations

from local_engine import run_local
from txstream.actors.punctuation import GROWTH, START_EVENTS, ChunkSizer
from txstream.topologies.generators import WorkloadSpec, generate


def test_sizer_starts_small_and_grows_by_measurements():
    sizer = ChunkSizer(latency_target_s=0.5, largest=1_000_000)
    assert sizer.limit(10**9) == sizer.step == START_EVENTS
    sizes = []
    for _ in range(8):  # a fast team: 10M events/s
        size = sizer.limit(10**9)
        sizes.append(size)
        sizer.observe(size, size / 10e6)
    assert all(b <= GROWTH * a for a, b in zip(sizes, sizes[1:], strict=False))
    assert sizes[-1] == 1_000_000


def test_sizer_keeps_chunks_within_twice_the_target():
    sizer = ChunkSizer(latency_target_s=0.5, largest=1_000_000)
    for _ in range(10):  # a slow team: 1000 events/s
        size = sizer.limit(10**9)
        assert size / 1000 <= 2 * 0.5 or sizer.rate is None
        sizer.observe(size, size / 1000)
    assert sizer.limit(0) == 250 and sizer.limit(10**9) == 500


def test_one_shot_latency_follows_the_target():
    """40k SL events at 40 us per function take ~5 s: read at once and cut blind, the
    last outputs would come seconds after their events; sized by the team's pace, chunks
    keep them near the 500 ms target."""
    events, init = generate("sl", WorkloadSpec(events=40_000))
    result = run_local(
        "sl",
        events,
        init,
        batches_per_chunk=None,
        udf_cost_us=40.0,
        latency_target_ms=500,
        source="arrow",
    )
    assert result.metrics["events"] == 40_000
    assert result.metrics["latency_ms"]["p50"] < 750
    assert result.metrics["latency_ms"]["p99"] < 1_250
