"""Which cores each data-parallel replica runs on: the allowed CPUs split into disjoint sets.

    nodes = read_numa_nodes()                       # [[0, 1, ..., 31], [32, ..., 63]] or [] off NUMA
    sets = split_cores(allowed_cpus(), nodes, 4)    # 2 replicas per node, 16 cores each

Rules (pure, tested with fake topologies in tests/launcher/test_core_split.py):

  - Only allowed CPUs (os.sched_getaffinity) are handed out; a node with none of them is skipped.
  - More than one usable node and the replicas divide evenly among them: each node's cores go
    to its replicas only, so a replica's threads and its memory (first touch) stay on one node.
        node 0: [0 .. 31]  -> replica 0 [0..15],  replica 1 [16..31]
        node 1: [32 .. 63] -> replica 2 [32..47], replica 3 [48..63]
  - Otherwise (one node, no NUMA information, or a count the nodes do not divide): the allowed
    CPUs in order, cut into N contiguous runs whose sizes differ by at most one.
  - Fewer allowed CPUs than replicas is refused (ValueError): two replicas sharing a core would
    each run their OpenMP regions at the speed of the other's time slice.
"""

from __future__ import annotations

import os
from pathlib import Path

NUMA_ROOT = Path("/sys/devices/system/node")


def parse_cpulist(text: str) -> list[int]:
    """The kernel's cpulist format ("0-3,8,10-11") as sorted CPU ids."""
    cpus: set[int] = set()
    for part in text.strip().split(","):
        if not part:
            continue
        low, _, high = part.partition("-")
        cpus.update(range(int(low), int(high or low) + 1))
    return sorted(cpus)


def format_cpulist(cpus: list[int]) -> str:
    """Sorted CPU ids as the kernel's cpulist ("0-3,8"): how the logs name a replica's cores."""
    runs: list[str] = []
    ordered = sorted(cpus)
    start_idx = 0
    for idx in range(1, len(ordered) + 1):
        if idx == len(ordered) or ordered[idx] != ordered[idx - 1] + 1:
            low, high = ordered[start_idx], ordered[idx - 1]
            runs.append(str(low) if low == high else f"{low}-{high}")
            start_idx = idx
    return ",".join(runs)


def read_numa_nodes(root: Path = NUMA_ROOT) -> list[list[int]]:
    """Each NUMA node's CPUs, in node order ([] when the machine does not say)."""
    nodes = []
    for path in sorted(root.glob("node[0-9]*"), key=lambda p: int(p.name[4:])):
        cpulist = path / "cpulist"
        if cpulist.is_file():
            nodes.append(parse_cpulist(cpulist.read_text()))
    return nodes


def allowed_cpus() -> list[int]:
    try:
        return sorted(os.sched_getaffinity(0))
    except AttributeError:  # not Linux: no pinning, every CPU counts
        return list(range(os.cpu_count() or 1))


def split_cores(allowed: list[int], numa_nodes: list[list[int]], num_replicas: int) -> list[list[int]]:
    """`num_replicas` disjoint, non-empty sets of `allowed` CPUs (see the module docstring)."""
    if num_replicas < 1:
        raise ValueError(f"num_replicas must be >= 1, got {num_replicas}")
    allowed_set = set(allowed)
    if len(allowed_set) < num_replicas:
        raise ValueError(
            f"--dp-size {num_replicas} needs at least one core per replica; this process may use "
            f"{len(allowed_set)} ({format_cpulist(sorted(allowed_set))})"
        )
    usable = [sorted(allowed_set.intersection(node)) for node in numa_nodes]
    usable = [node for node in usable if node]
    if len(usable) > 1 and num_replicas % len(usable) == 0:
        per_node = num_replicas // len(usable)
        if all(len(node) >= per_node for node in usable):
            return [cores for node in usable for cores in _even_runs(node, per_node)]
    return _even_runs(sorted(allowed_set), num_replicas)


def replicas_per_numa_node(allowed: list[int], numa_nodes: list[list[int]]) -> int:
    """--dp-size 0: one replica per NUMA node holding allowed CPUs (1 without NUMA information)."""
    allowed_set = set(allowed)
    return max(1, sum(1 for node in numa_nodes if allowed_set.intersection(node)))


def _even_runs(cpus: list[int], num_runs: int) -> list[list[int]]:
    """`cpus` cut into `num_runs` contiguous runs; the first len % num_runs runs get one more."""
    base, extra = divmod(len(cpus), num_runs)
    runs, start = [], 0
    for run_idx in range(num_runs):
        size = base + (1 if run_idx < extra else 0)
        runs.append(cpus[start:start + size])
        start += size
    return runs
