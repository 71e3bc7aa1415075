"""The nodes of the Ray cluster this process is connected to: which ones a run spreads over."""

from __future__ import annotations

from collections import Counter

from txstream.errors import UsageError


def pick_nodes(count: int, share: bool = False) -> list[str]:
    """The ids of ``count`` alive Ray nodes to hold the state partitions, this process's
    own node first (partition 0, the one a single-node run would use), the others in id
    order; a `UsageError` if the cluster has fewer, unless ``share`` (a recovery after
    the loss of a node): then some nodes hold several partitions."""
    import ray

    alive = sorted(n["NodeID"] for n in ray.nodes() if n.get("Alive"))
    own = ray.get_runtime_context().get_node_id()
    if own in alive:
        alive = [own] + [n for n in alive if n != own]
    if share and alive:
        alive = [alive[i % len(alive)] for i in range(count)]
    if count > len(alive):
        raise UsageError(
            f"--nodes {count}: the Ray cluster has {len(alive)} node{'s' * (len(alive) != 1)} alive"
        )
    return alive[:count]


def hosts_of(node_ids: list[str]) -> list[str]:
    """The host of each of ``node_ids``: the address of its raylet in Ray's node table
    (Ray nodes of one machine, as in a test cluster, have the same)."""
    import ray

    address = {n["NodeID"]: n["NodeManagerAddress"] for n in ray.nodes()}
    return [address.get(node_id, node_id) for node_id in node_ids]


def cpus_before(hosts: list[str], executors: int) -> list[int]:
    """Per node (``hosts``: each one's host, in node order), the CPUs that the nodes before
    it on its host take, ``executors`` each: its team is pinned past them
    (`HostTopology.assign`), not onto the same CPUs as theirs."""
    earlier: Counter[str] = Counter()
    before = []
    for host in hosts:
        before.append(earlier[host] * executors)
        earlier[host] += 1
    return before
