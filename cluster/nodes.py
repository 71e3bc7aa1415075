"""The nodes of the Ray cluster this process is connected to: which ones a run spreads over."""

from __future__ import annotations

from txstream.errors import UsageError


def pick_nodes(count: int) -> list[str]:
    """The ids of ``count`` alive Ray nodes to hold the state partitions, this process's
    own node first (partition 0, the one a single-node run would use), the others in id
    order; a `UsageError` if the cluster has fewer."""
    import ray

    alive = sorted(n["NodeID"] for n in ray.nodes() if n.get("Alive"))
    if count > len(alive):
        raise UsageError(
            f"--nodes {count}: the Ray cluster has {len(alive)} node{'s' * (len(alive) != 1)} alive"
        )
    own = ray.get_runtime_context().get_node_id()
    ordered = [own] + [n for n in alive if n != own] if own in alive else alive
    return ordered[:count]


def alive(node_id: str) -> bool:
    """Whether the Ray node ``node_id`` is still part of the cluster."""
    import ray

    return any(n["NodeID"] == node_id and n.get("Alive") for n in ray.nodes())
