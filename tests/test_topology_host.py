"""Host topology detection, emulated sockets, and executors pinned to cores."""

from __future__ import annotations

import os

import pytest
from txstream import Job
from txstream.cluster.nodes import cpus_before
from txstream.cluster.topology import HostTopology, host_topology
from txstream.errors import UsageError


def _fake_sysfs(root, packages: dict[int, int], nodes: int):
    for cpu, package in packages.items():
        folder = root / "devices" / "system" / "cpu" / f"cpu{cpu}" / "topology"
        folder.mkdir(parents=True)
        (folder / "physical_package_id").write_text(f"{package}\n")
    for node in range(nodes):
        (root / "devices" / "system" / "node" / f"node{node}").mkdir(parents=True)


def test_detect_groups_usable_cpus_by_package(tmp_path):
    usable = sorted(os.sched_getaffinity(0))
    _fake_sysfs(tmp_path, {cpu: 1 - i % 2 for i, cpu in enumerate(usable)}, nodes=2)
    host = HostTopology.detect(tmp_path)
    assert sorted(cpu for socket in host.sockets for cpu in socket) == usable
    assert host.sockets[-1] == tuple(usable[0::2])  # package 1 comes after package 0
    assert host.numa_nodes == 2


def test_detect_without_sysfs_is_one_socket(tmp_path):
    assert HostTopology.detect(tmp_path).sockets == (tuple(sorted(os.sched_getaffinity(0))),)


def test_emulated_sockets_split_consecutive_cpus():
    host = HostTopology(((0, 1, 2), (3, 4)))
    assert host.with_sockets(2).sockets == ((0, 1, 2), (3, 4))
    assert host.with_sockets(3).sockets == ((0, 1), (2, 3), (4,))
    assert host.with_sockets(1).sockets == ((0, 1, 2, 3, 4),)
    for bad in (0, 6):
        with pytest.raises(UsageError, match="--sockets"):
            host.with_sockets(bad)


@pytest.mark.parametrize(
    ("sockets", "executors", "want"),
    [
        (((0, 1),), 1, [(0, 0)]),
        (((0, 1),), 2, [(0, 0), (0, 1)]),
        (((0, 1),), 3, [(0, 0), (0, 1), (0, 0)]),
        (((0,), (1,)), 2, [(0, 0), (1, 1)]),
        (((0,), (1,)), 3, [(0, 0), (0, 0), (1, 1)]),
        (((0, 1), (2, 3)), 4, [(0, 0), (0, 1), (1, 2), (1, 3)]),
    ],
)
def test_executors_fill_sockets_in_order_one_core_each(sockets, executors, want):
    assert HostTopology(sockets).assign(executors) == want


@pytest.mark.parametrize(
    ("sockets", "executors", "cpus_taken", "want"),
    [
        (((0, 1),), 1, 1, [(0, 1)]),
        (((0, 1),), 1, 2, [(0, 0)]),  # more teams than CPUs: round the host again
        (((0, 1, 2),), 2, 2, [(0, 2), (0, 0)]),
        (((0, 1), (2, 3)), 2, 2, [(0, 1), (1, 3)]),  # the team before took 0 and 2
        (((0, 1), (2, 3)), 4, 4, [(0, 0), (0, 1), (1, 2), (1, 3)]),
    ],
)
def test_executors_are_pinned_past_the_cpus_other_nodes_teams_take(
    sockets, executors, cpus_taken, want
):
    assert HostTopology(sockets).assign(executors, cpus_taken=cpus_taken) == want


def test_nodes_of_one_host_are_pinned_past_the_nodes_before_them():
    hosts = ["10.0.0.1", "10.0.0.2", "10.0.0.1", "10.0.0.1"]
    assert cpus_before(hosts, 2) == [0, 0, 2, 4]
    host = HostTopology(((0, 1, 2, 3),))
    teams = [host.assign(1, cpus_taken=taken) for taken in cpus_before(["h"] * 4, 1)]
    assert sorted(cpu for team in teams for _, cpu in team) == [0, 1, 2, 3]


@pytest.mark.usefixtures("ray_cluster")
def test_executors_run_pinned_to_their_cores():
    from test_job import _sl_tables

    events, init = _sl_tables(30)
    cpus = [cpu for socket in host_topology().sockets for cpu in socket]
    sockets = min(2, len(cpus))
    metrics = Job("sl", executors=2, sockets=sockets, progress=False).run(events, init).metrics
    cores = metrics["executor_cores"]
    assert [c["socket"] for c in cores] == [0, sockets - 1]
    assert all(len(c["cpus"]) == 1 for c in cores)
    if len(cpus) >= 2:
        assert cores[0]["cpus"] != cores[1]["cpus"]
    assert metrics["config"]["sockets"] == sockets


def test_bad_sockets_is_a_usage_error_before_anything_runs():
    from test_job import _sl_tables

    events, init = _sl_tables(4)
    with pytest.raises(UsageError, match="--sockets"):
        Job("sl", sockets=len(os.sched_getaffinity(0)) + 1).run(events, init)
