"""Where the tensor-parallel ranks live: which node runs which ranks, and how they meet (torch-free).

    --tp-size 4 --nnodes 2:   node 0: ranks 0 1 + scheduler, tokenizer, detokenizer (the server)
                              node 1: ranks 2 3 only, joined to node 0 at --dist-init-addr

Addresses between nodes are explicit. On one node (no --dist-init-addr) the ranks meet through
a file in the server's private runtime directory and rank 0 broadcasts batches over ipc, so
nothing listens on the network; torch.distributed's own sockets are pinned to the loopback
interface. Across nodes, node 0 listens on --dist-init-addr's port (torch.distributed's store)
and the next port (rank 0's batch broadcast).

The launcher builds one layout from the config and checks the model against it before it
starts anything; each worker builds the same layout to find its local index (its GPU).
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass

from zserve.common.config_sections import ParallelSection
from zserve.common.worker_env import default_num_threads

SOCKET_IFNAME_VARS = ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME")


@dataclass(frozen=True)
class RankLayout:
    tp_size: int
    nnodes: int
    node_rank: int
    dist_init_host: str  # "" = one node, private file rendezvous
    dist_init_port: int

    @staticmethod
    def from_config(cfg: ParallelSection) -> RankLayout:
        """Unpack and check the rank flags (a ServerConfig is one too); ValueError names the bad flag."""
        return RankLayout.build(cfg.tp_size, cfg.nnodes, cfg.node_rank, cfg.dist_init_addr, cfg.device)

    @staticmethod
    def build(tp_size: int, nnodes: int, node_rank: int, dist_init_addr: str = "", device: str = "auto") -> RankLayout:
        if tp_size < 1:
            raise ValueError(f"--tp-size must be >= 1, got {tp_size}")
        if nnodes < 1:
            raise ValueError(f"--nnodes must be >= 1, got {nnodes}")
        if tp_size % nnodes:
            raise ValueError(f"--tp-size {tp_size} does not split evenly over --nnodes {nnodes}")
        if not 0 <= node_rank < nnodes:
            raise ValueError(f"--node-rank must be in 0..{nnodes - 1} for --nnodes {nnodes}, got {node_rank}")
        if nnodes > 1 and not dist_init_addr:
            raise ValueError("--nnodes > 1 needs --dist-init-addr HOST:PORT, node 0's address as every node reaches it")
        host, port = parse_host_port(dist_init_addr) if dist_init_addr else ("", 0)
        if tp_size // nnodes > 1 and device.startswith("cuda:"):
            raise ValueError(
                f"--device {device} names one GPU, but this node runs {tp_size // nnodes} ranks: use --device cuda "
                "(local rank i takes cuda:i) and CUDA_VISIBLE_DEVICES to choose the GPUs"
            )
        return RankLayout(tp_size, nnodes, node_rank, host, port)

    @property
    def ranks_per_node(self) -> int:
        return self.tp_size // self.nnodes

    @property
    def local_ranks(self) -> range:
        return range(self.node_rank * self.ranks_per_node, (self.node_rank + 1) * self.ranks_per_node)

    @property
    def is_head_node(self) -> bool:
        """Node 0: runs rank 0 and the rest of the server."""
        return self.node_rank == 0

    def local_index(self, rank: int) -> int:
        """0.. on this node (the GPU a CUDA rank uses)."""
        if rank not in self.local_ranks:
            raise ValueError(
                f"rank {rank} does not run on node {self.node_rank} (its ranks are {list(self.local_ranks)})"
            )
        return rank - self.local_ranks.start

    def child_name(self, rank: int) -> str:
        return "model" if self.tp_size == 1 else f"model rank {rank}"

    def dist_init_method(self, runtime_dir: str) -> str:
        if self.dist_init_host:
            return f"tcp://{_url_host(self.dist_init_host)}:{self.dist_init_port}"
        return f"file://{runtime_dir}/dist-store"

    def broadcast_address(self, runtime_dir: str) -> str:
        if self.nnodes > 1:
            return f"tcp://{_url_host(self.dist_init_host)}:{self.dist_init_port + 1}"
        return f"ipc://{runtime_dir}/ranks.sock"

    @property
    def loopback_only(self) -> bool:
        return not self.dist_init_host or is_loopback(self.dist_init_host)

    def rank_env(self, environ: dict[str, str] | None = None) -> dict[str, str]:
        """Extra environment of a rank process: gloo and NCCL sockets on the loopback interface
        when every rank is on this machine, unless the user chose an interface already."""
        environ = os.environ if environ is None else environ
        lo = loopback_interface()
        if self.tp_size == 1 or not self.loopback_only or lo is None:
            return {}
        return {var: lo for var in SOCKET_IFNAME_VARS if var not in environ}

    def threads_per_rank(self, num_threads: int) -> int:
        """`--num-threads` as given, or (0) this node's worker threads shared among its ranks."""
        if num_threads > 0 or self.ranks_per_node == 1:
            return num_threads
        return max(1, default_num_threads() // self.ranks_per_node)

    def check_model(self, num_heads: int, num_kv_heads: int, intermediate_size: int) -> None:
        """Every column-parallel split must be even (the vocabulary is padded instead)."""
        splits = (("attention heads", num_heads), ("KV heads", num_kv_heads), ("MLP width", intermediate_size))
        for what, size in splits:
            if size % self.tp_size:
                raise ValueError(
                    f"--tp-size {self.tp_size}: the model's {size} {what} do not split evenly "
                    f"across {self.tp_size} ranks "
                    f"(it has {num_heads} attention heads, {num_kv_heads} KV heads, MLP width {intermediate_size}); "
                    "choose a tp size that divides all three, or a model that splits (Qwen/Qwen3-0.6B and "
                    "meta-llama/Llama-3.2-1B-Instruct split over 2, 4 and 8 ranks)"
                )


def parse_host_port(text: str) -> tuple[str, int]:
    """'10.0.0.1:29500' or '[::1]:29500' -> (host, port); port + 1 must be a port too."""
    host, sep, port_text = text.rpartition(":")
    host = host.strip("[]")
    if not sep or not host or not port_text.isdigit() or not 1 <= int(port_text) <= 65534:
        raise ValueError(
            f"--dist-init-addr must be HOST:PORT with PORT in 1..65534 (PORT + 1 is used too), got {text!r}"
        )
    return host, int(port_text)


def _url_host(host: str) -> str:
    return f"[{host}]" if ":" in host else host


def is_loopback(host: str) -> bool:
    try:
        infos = socket.getaddrinfo(host, None)
    except socket.gaierror:
        return False
    return all(info[4][0].startswith("127.") or info[4][0] == "::1" for info in infos)


def loopback_interface() -> str | None:
    try:
        names = [name for _, name in socket.if_nameindex()]
    except OSError:
        return None
    return next((n for n in names if n == "lo" or n == "lo0"), None)
