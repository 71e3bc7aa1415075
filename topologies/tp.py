"""TP - Toll Processing: Linear Road position reports updating segment statistics (contract §3)."""

from __future__ import annotations

import numpy as np
from txstream.topologies.api import (
    INT,
    EventShare,
    Outputs,
    Table,
    Topology,
    Transactions,
    condition,
    function,
)
from txstream.topologies.functions import add

SEGMENT_SPEED = Table("segment_speed", ("speed_sum", "speed_count"))
SEGMENT_VEHICLES = Table(
    "segment_vehicles", ("vehicle_count",), distinct=True, size_of="segment_speed"
)

MAX_SPEED = 200
"""Readings at or above this speed are implausible and abort."""


@condition
def plausible_speed(value, args, reads, n_reads):
    """The reported speed is below MAX_SPEED."""
    return args[0] < MAX_SPEED


@function
def increment(value, args, reads, n_reads):
    """``value + 1``."""
    return value + 1


@function
def average(value, args, reads, n_reads):
    """Speed sum divided by the speed count read alongside."""
    return value // reads[0]


def pre_process(events: EventShare) -> None:
    """Reject reports with missing fields, negative values or unknown segments."""
    events.require_present(["event_id", "vehicle", "segment", "speed"])
    events.require_between("vehicle", 0, None)
    events.require_between("speed", 0, None)
    events.require_key("segment", SEGMENT_SPEED)


def state_access(events: EventShare, txn: Transactions) -> None:
    """Update the segment's speed statistics and vehicle set, then read the average."""
    segment, speed = events.int("segment"), events.int("speed")
    speed_sum, speed_count = SEGMENT_SPEED["speed_sum"], SEGMENT_SPEED["speed_count"]
    txn.read_modify(
        speed_sum, segment, add, args=[speed], cond=plausible_speed, reason="implausible speed"
    )
    txn.read_modify(speed_count, segment, increment)
    txn.set_add(
        SEGMENT_VEHICLES["vehicle_count"], segment, events.int("vehicle"), out="vehicle_count"
    )
    txn.read(speed_sum, segment, fun=average, reads=[(speed_count, segment)], out="avg_speed")


def post_process(events: EventShare, outputs: Outputs) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Toll ``2 * (cnt - 50)^2`` on congested segments (average below 40, over 50 vehicles)."""
    avg, cnt = outputs.values["avg_speed"], outputs.values["vehicle_count"]
    valid = outputs.valid["avg_speed"]
    toll = np.where((avg < 40) & (cnt > 50), 2 * (cnt - 50) ** 2, 0)
    return {"toll": (toll, valid), "avg_speed": (avg, valid), "vehicle_count": (cnt, valid)}


def topology() -> Topology:
    """Build the TP topology."""
    return Topology(
        name="tp",
        tables=(SEGMENT_SPEED, SEGMENT_VEHICLES),
        event_columns={"event_id": INT, "vehicle": INT, "segment": INT, "speed": INT},
        kinds=(),
        functions=(add, increment, average),
        conditions=(plausible_speed,),
        outputs=("avg_speed", "vehicle_count"),
        output_columns=("toll", "avg_speed", "vehicle_count"),
        pre_process=pre_process,
        post_process=post_process,
        state_access=state_access,
    )
