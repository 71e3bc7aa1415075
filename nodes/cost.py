"""What a unit's plan over several nodes costs, for the sequencer's choice between running
the unit in levels where its keys live and gathering it on one node
(`txstream.nodes.sequencer`).

A plan is priced by counts of what takes time: the nodes given a part of it (a call and the
part's set-up each), its steps (each a node's turn at a level), its messages (a node's
values sent to another), its steps through a node's pipeline (more than `IN_PLACE_EVENTS`
events: push, drain and the team's hand-offs, where a smaller step runs in place), the
events on its critical path (per level, the busiest node's), the events every node runs
(a cross transaction on each node it touches: their sum is the work where nodes share
cores) and the cell values it moves. Seconds per count are fitted by bench/nodes.py on
measured runs over a local cluster, which writes them to `FITTED` (the fit's held-out error:
bench/results/nodes.json). Sequencing is no term: a unit's plans are built whichever runs.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from txstream.nodes.member import IN_PLACE_EVENTS
from txstream.nodes.sequencer import Step, UnitPlan

FITTED = Path(__file__).with_name("cost.json")
"""Seconds per count, as bench/nodes.py fitted them on this host."""


def _placed(plan: UnitPlan) -> Iterator[tuple[int, Step]]:
    """Every step of the plan with the node it runs on."""
    for level in plan.steps:
        for node, step in enumerate(level):
            if step is not None:
                yield node, step


def levels(plan: UnitPlan) -> int:
    """Rounds of steps across the nodes."""
    return len(plan.steps)


def parts(plan: UnitPlan) -> int:
    """Nodes given a part of the plan: one call each."""
    return len({node for node, _ in _placed(plan)})


def steps(plan: UnitPlan) -> int:
    """Nodes' turns at the plan's levels."""
    return sum(1 for _ in _placed(plan))


def pipelined_steps(plan: UnitPlan) -> int:
    """Steps that run through a node's pipeline rather than in place."""
    return sum(len(step.events) > IN_PLACE_EVENTS for _, step in _placed(plan))


def critical_events(plan: UnitPlan) -> int:
    """Events on the plan's critical path: the sum over levels of the busiest node's."""
    return sum(
        max((len(step.events) for step in level if step is not None), default=0)
        for level in plan.steps
    )


def node_events(plan: UnitPlan) -> int:
    """Events run, summed over the nodes."""
    return sum(len(step.events) for _, step in _placed(plan))


def messages(plan: UnitPlan) -> int:
    """Values sent from a node to another, one message per step and receiver."""
    return sum(len(step.send) for _, step in _placed(plan))


def exchanged_values(plan: UnitPlan) -> int:
    """Cell values sent between nodes."""
    return plan.exchanged


COUNTS: dict[str, Callable[[UnitPlan], int]] = {
    f.__name__: f
    for f in (
        levels,
        parts,
        steps,
        messages,
        pipelined_steps,
        critical_events,
        node_events,
        exchanged_values,
    )
}
"""What a plan can be priced by, by name (a run's metrics count each)."""


def counts(plan: UnitPlan) -> dict[str, int]:
    """The plan's `COUNTS`."""
    return {name: count(plan) for name, count in COUNTS.items()}


@dataclass(frozen=True)
class CostModel:
    """Seconds of a unit's plan: ``seconds_per[name]`` for each count it names, of
    `COUNTS`."""

    seconds_per: dict[str, float]

    def seconds(self, plan: UnitPlan) -> float:
        """The plan's estimated time."""
        return sum(s * COUNTS[name](plan) for name, s in self.seconds_per.items())


def fitted(path: Path = FITTED) -> CostModel:
    """The model bench/nodes.py fitted, read from ``path``."""
    return CostModel(json.loads(path.read_text())["seconds_per"])


COST = fitted()
"""The model fitted on this host (bench/nodes.py)."""
