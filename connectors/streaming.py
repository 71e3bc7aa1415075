"""Spark Structured Streaming into a session: ``df.writeStream.foreachBatch(...)``.

    with Job("sl").start("data/sl/init", output="out/stream") as session:
        query = (spark.readStream.schema(schema).parquet("incoming/")
                 .writeStream.foreachBatch(txstream.connectors.streaming.foreach_batch(session))
                 .start())

Spark calls the function in the driver, one micro-batch at a time, in batch order. Each
micro-batch is pushed whole (its rows in the DataFrame's own order) and flushed, so that
when the function returns its outputs are written and committed - and, if the session
writes checkpoints, checkpointed: Spark records the batch as done when the function
returns, and after a crash both resume from there. A micro-batch that Spark
delivers again (``batchId`` not above the last one applied, e.g. after Spark restarted
from its checkpoint) is skipped: each is applied once.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pyarrow as pa


def foreach_batch(session: Any) -> Callable[[Any, int], None]:
    """The function to give ``foreachBatch``: pushes each micro-batch of a streaming query
    into ``session`` once (see module docstring)."""
    state = {"last": session.last_batch_id}

    def push(frame: Any, batch_id: int) -> None:
        if batch_id <= state["last"]:
            return
        session.push(_to_arrow(frame), batch_id=batch_id)
        if session.checkpointing:  # durable before Spark commits the batch
            session.checkpoint()
        else:
            session.flush()
        state["last"] = batch_id

    return push


def _to_arrow(frame: Any) -> pa.Table:
    """A (small) micro-batch collected to the driver as Arrow, in partition order."""
    from txstream.connectors.spark import arrow_schema

    schema = arrow_schema(frame.schema)
    batches = frame._collect_as_arrow()
    return pa.Table.from_batches(batches, schema=schema) if batches else schema.empty_table()
