"""Runs a job on the engine's thread transport: the whole team (ProgressController,
executors, Coordinator, Sink) as threads of this process, exactly the engine of a run
without Ray's start-up, so hundreds of hypothesis examples stay fast. Kernels release the
GIL: executors do run in parallel."""

from __future__ import annotations

import pyarrow as pa
from txstream import Job, Result, ThreadTransport

TIMEOUT_S = 60.0


def run_local(
    topology: str,
    events: pa.Table,
    init: dict[str, pa.Table],
    *,
    batches_per_chunk: int | None = 3,
    **options: object,
) -> Result:
    """The `Result` of ``events`` from ``init``; ``options`` are `RunConfig` fields.
    Chunks hold at most ``batches_per_chunk`` punctuation batches (None: a run's
    default)."""
    options.setdefault("timeout_s", TIMEOUT_S)
    if batches_per_chunk is not None:
        interval = options.get("punctuation_interval", 10240)
        options["max_chunk_events"] = interval * batches_per_chunk
    job = Job(topology, transport=ThreadTransport(), progress=False, **options)
    return job.run(events, init)
