"""RankLayout: which node runs which ranks, how they meet, and the flag errors (no processes)."""

from __future__ import annotations

import pytest

from zserve.common.rank_layout import RankLayout, parse_host_port
from zserve.common.server_config import ServerConfig
from zserve.common.transport import Addresses
from zserve.common.worker_env import default_num_threads
from zserve.launcher.cli import parse_config


def test_one_node_is_private_and_local():
    layout = RankLayout.from_config(ServerConfig(tp_size=2))
    assert list(layout.local_ranks) == [0, 1] and layout.is_head_node
    assert [layout.child_name(r) for r in layout.local_ranks] == ["model rank 0", "model rank 1"]
    assert layout.dist_init_method("/run/z") == "file:///run/z/dist-store"
    assert layout.broadcast_address("/run/z") == "ipc:///run/z/ranks.sock"
    assert layout.rank_env({}) == {"GLOO_SOCKET_IFNAME": "lo", "NCCL_SOCKET_IFNAME": "lo"}
    assert layout.rank_env({"NCCL_SOCKET_IFNAME": "ib0"}) == {"GLOO_SOCKET_IFNAME": "lo"}  # the user's choice stays


def test_single_rank_keeps_todays_names_and_env():
    layout = RankLayout.from_config(ServerConfig())
    assert layout.child_name(0) == "model" and list(layout.local_ranks) == [0]
    assert layout.rank_env({}) == {}
    assert layout.threads_per_rank(0) == 0  # the worker's own default applies


def test_second_node_runs_only_its_ranks_and_meets_node_0_at_the_given_address():
    layout = RankLayout.from_config(ServerConfig(tp_size=4, nnodes=2, node_rank=1, dist_init_addr="10.1.2.3:29500"))
    assert list(layout.local_ranks) == [2, 3] and not layout.is_head_node
    assert layout.local_index(3) == 1
    with pytest.raises(ValueError, match="rank 0 does not run on node 1"):
        layout.local_index(0)
    assert layout.dist_init_method("/run/z") == "tcp://10.1.2.3:29500"
    assert layout.broadcast_address("/run/z") == "tcp://10.1.2.3:29501"
    assert layout.rank_env({}) == {}  # a real network: the user picks the interfaces


def test_two_nodes_on_loopback_pin_sockets_to_loopback():
    layout = RankLayout.from_config(ServerConfig(tp_size=2, nnodes=2, node_rank=0, dist_init_addr="127.0.0.1:29500"))
    assert layout.rank_env({})["GLOO_SOCKET_IFNAME"] == "lo"
    assert RankLayout.from_config(ServerConfig(tp_size=2, nnodes=2, dist_init_addr="[::1]:7")).broadcast_address("/r") == "tcp://[::1]:8"


@pytest.mark.parametrize(
    ("flags", "needle"),
    [
        (dict(tp_size=0), "--tp-size must be >= 1"),
        (dict(tp_size=3, nnodes=2, dist_init_addr="h:1"), "does not split evenly over --nnodes 2"),
        (dict(tp_size=2, nnodes=2), "needs --dist-init-addr"),
        (dict(tp_size=2, nnodes=2, node_rank=2, dist_init_addr="h:1"), "--node-rank must be in 0..1"),
        (dict(tp_size=2, nnodes=2, dist_init_addr="h"), "HOST:PORT"),
        (dict(tp_size=2, nnodes=2, dist_init_addr="h:65535"), "PORT \\+ 1"),
        (dict(tp_size=2, device="cuda:1"), "use --device cuda"),
    ],
)
def test_bad_rank_flags_are_named(flags, needle):
    with pytest.raises(ValueError, match=needle):
        RankLayout.from_config(ServerConfig(**flags))


def test_one_gpu_per_node_may_be_named():
    RankLayout.from_config(ServerConfig(tp_size=2, nnodes=2, dist_init_addr="h:1", device="cuda:3"))


def test_model_must_split_evenly():
    layout = RankLayout.build(2, 1, 0)
    layout.check_model(num_heads=4, num_kv_heads=2, intermediate_size=96)
    with pytest.raises(ValueError, match="9 attention heads do not split evenly across 2 ranks.*Qwen/Qwen3-0.6B"):
        layout.check_model(num_heads=9, num_kv_heads=3, intermediate_size=1536)
    with pytest.raises(ValueError, match="1 KV heads"):
        layout.check_model(num_heads=4, num_kv_heads=1, intermediate_size=96)


def test_threads_are_shared_among_a_nodes_ranks():
    layout = RankLayout.build(4, 2, 0, "h:1")
    assert layout.threads_per_rank(0) == max(1, default_num_threads() // 2)
    assert layout.threads_per_rank(3) == 3  # explicit: per rank, as given


def test_cli_flags_and_addresses_round_trip():
    cfg = parse_config(["--tp-size", "2", "--nnodes", "2", "--node-rank", "1", "--dist-init-addr", "node0:5000"])
    assert (cfg.tp_size, cfg.nnodes, cfg.node_rank, cfg.dist_init_addr) == (2, 2, 1, "node0:5000")
    assert ServerConfig.from_json(cfg.to_json()) == cfg
    addrs = Addresses.in_dir("/run/z", "tcp://127.0.0.1:1", rank_broadcast="tcp://node0:5001", dist_init="tcp://node0:5000")
    assert Addresses.from_json(addrs.to_json()) == addrs
    assert Addresses.in_dir("/run/z", "tcp://127.0.0.1:1").rank_broadcast == "ipc:///run/z/ranks.sock"


def test_host_port_parsing():
    assert parse_host_port("node0.example:29500") == ("node0.example", 29500)
    assert parse_host_port("[fe80::1]:80") == ("fe80::1", 80)
