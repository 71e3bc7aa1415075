"""What a unit's plan over several nodes costs, for the sequencer's choice between running
the unit in levels where its keys live and gathering it on one node
(`txstream.nodes.sequencer`).

A plan is priced by three counts: its steps (each an actor call, with the values it takes
and sends passing through Ray), the events on its critical path (per level, the busiest
node's), and the cell values it moves. The coefficients are fitted by bench/nodes.py on
measured runs over a local cluster (its held-out error: docs/performance.md).
"""

from __future__ import annotations

from dataclasses import dataclass

from txstream.nodes.sequencer import UnitPlan


@dataclass(frozen=True)
class CostModel:
    """Seconds of a unit's plan: ``step_s`` per step, ``event_s`` per event on its
    critical path, ``value_s`` per cell value moved between nodes."""

    step_s: float = 5.3e-3
    event_s: float = 2.1e-6
    value_s: float = 0.1e-6
    """Below what the fit resolves (a unit moves few values for its events): a bound."""

    def seconds(self, plan: UnitPlan) -> float:
        """The plan's estimated time."""
        return (
            self.step_s * steps(plan)
            + self.event_s * critical_events(plan)
            + self.value_s * plan.exchanged
        )


def steps(plan: UnitPlan) -> int:
    """Actor calls the plan makes."""
    return sum(step is not None for level in plan.steps for step in level)


def critical_events(plan: UnitPlan) -> int:
    """Events on the plan's critical path: the sum over levels of the busiest node's."""
    return sum(
        max((len(step.events) for step in level if step is not None), default=0)
        for level in plan.steps
    )


COST = CostModel()
"""The model fitted on this host (bench/nodes.py)."""
