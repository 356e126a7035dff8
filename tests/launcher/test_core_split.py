"""The allowed CPUs split into disjoint per-replica sets, on fake topologies."""

from __future__ import annotations

import pytest

from zserve.launcher.fleet.core_split import (
    format_cpulist,
    parse_cpulist,
    read_numa_nodes,
    replicas_per_numa_node,
    split_cores,
)


def test_cpulist_round_trip():
    assert parse_cpulist("0-3,8,10-11\n") == [0, 1, 2, 3, 8, 10, 11]
    assert format_cpulist([11, 0, 1, 2, 3, 8, 10]) == "0-3,8,10-11"
    assert parse_cpulist("") == [] and format_cpulist([5]) == "5"


def test_one_node_is_cut_into_contiguous_runs_differing_by_at_most_one():
    assert split_cores([0, 1], [[0, 1]], 2) == [[0], [1]]
    assert split_cores(list(range(10)), [], 3) == [[0, 1, 2, 3], [4, 5, 6], [7, 8, 9]]


def test_numa_nodes_keep_their_replicas_on_their_own_cores():
    nodes = [list(range(0, 8)), list(range(8, 16))]
    assert split_cores(list(range(16)), nodes, 2) == [list(range(0, 8)), list(range(8, 16))]
    assert split_cores(list(range(16)), nodes, 4) == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11], [12, 13, 14, 15]]


def test_interleaved_node_numbering_follows_the_nodes_not_the_ids():
    nodes = [[0, 2, 4, 6], [1, 3, 5, 7]]  # SMT siblings / interleaved numbering
    assert split_cores(list(range(8)), nodes, 2) == [[0, 2, 4, 6], [1, 3, 5, 7]]


def test_only_allowed_cpus_are_used_and_nodes_without_any_are_skipped():
    nodes = [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11]]
    allowed = [2, 3, 8, 9, 10, 11]  # a cgroup / taskset left node 1 out
    assert split_cores(allowed, nodes, 2) == [[2, 3], [8, 9, 10, 11]]
    assert replicas_per_numa_node(allowed, nodes) == 2


def test_a_count_the_nodes_do_not_divide_splits_the_allowed_cpus_in_order():
    nodes = [list(range(0, 4)), list(range(4, 8))]
    sets = split_cores(list(range(8)), nodes, 3)
    assert sets == [[0, 1, 2], [3, 4, 5], [6, 7]]
    assert sorted(c for s in sets for c in s) == list(range(8))


def test_more_replicas_than_cores_is_refused():
    with pytest.raises(ValueError, match="needs at least one core per replica; this process may use 2 \\(0-1\\)"):
        split_cores([0, 1], [[0, 1]], 3)


def test_numa_nodes_are_read_from_sysfs(tmp_path):
    for idx, cpulist in ((1, "4-7\n"), (0, "0-3\n"), (10, "8\n")):
        (tmp_path / f"node{idx}").mkdir()
        (tmp_path / f"node{idx}" / "cpulist").write_text(cpulist)
    (tmp_path / "possible").write_text("0-10\n")
    assert read_numa_nodes(tmp_path) == [[0, 1, 2, 3], [4, 5, 6, 7], [8]]
    assert read_numa_nodes(tmp_path / "missing") == []
