"""What each data-parallel replica of `launch_server --dp-size N` is: its cores, ports and command line.

    plan = plan_replicas(cfg, model, allowed_cpus(), read_numa_nodes(), http_ports)
    for spec in plan:  spec.argv  ->  `launch_server` flags of one ordinary server

The fleet's one endpoint is the router on --host:--port (endpoint_port). Replica i listens for HTTP
on loopback only, on http_ports[i] (free ports the caller picked: only the router reaches them), and
for ZMQ clients on --zmq-port + i (0: each picks a free one); it runs on the i-th set of
launcher/fleet/core_split.py and gets --num-threads = its core count unless --num-threads was given.
Every other flag the user gave is passed on unchanged: the replica is a normal single server (a flag
is rebuilt from the parsed config, so aliases and environment defaults arrive as the value they set).
"""

from __future__ import annotations

from dataclasses import MISSING, dataclass, fields

from zserve.common.net_ports import http_url
from zserve.common.server_config import ServerConfig
from zserve.common.server_flags import FLAG_SPECS, flag_of
from zserve.launcher.fleet.core_split import replicas_per_numa_node, split_cores

# fields of the fleet itself, or set per replica: never copied from the fleet's config
FLEET_FIELDS = {
    "dp_size", "router", "router_port", "router_policy", "router_worker_urls", "router_prometheus_port", "router_args",
    "model", "http_port", "zmq_port", "num_threads", "ready_file", "shell", "api_key", "host",
}
REPLICA_HOST = "127.0.0.1"  # the replicas answer the router, not the network


@dataclass(frozen=True)
class ReplicaSpec:
    replica_idx: int
    cpus: tuple[int, ...]
    http_port: int
    zmq_port: int  # 0 = the replica picks a free one
    num_threads: int
    host: str
    argv: tuple[str, ...]  # launch_server flags

    @property
    def url(self) -> str:
        """Where the router (and a health check) reach it."""
        return http_url(self.host, self.http_port)


def endpoint_port(cfg: ServerConfig) -> int:
    """Where the fleet's clients connect: the router, on --port unless --router-port says otherwise."""
    return cfg.router_port or cfg.http_port


def check_fleet_flags(cfg: ServerConfig) -> None:
    """What a fleet cannot do, refused in one line (ValueError) before anything starts."""
    if cfg.http_port == 0:
        raise ValueError("--dp-size and --router serve one HTTP endpoint: give --port > 0 (the router listens there)")
    if cfg.nnodes > 1 or cfg.tp_size > 1:
        raise ValueError("--dp-size and --router run whole single-node servers: --tp-size and --nnodes must be 1")
    if cfg.shell:
        raise ValueError("--shell opens a chat with one server: not with --dp-size or --router")
    if cfg.zmq_port and endpoint_port(cfg) == cfg.zmq_port:
        raise ValueError(f"the router's port {endpoint_port(cfg)} is also --zmq-port")


def num_replicas_of(cfg: ServerConfig, allowed: list[int], numa_nodes: list[list[int]]) -> int:
    return cfg.dp_size or replicas_per_numa_node(allowed, numa_nodes)


def plan_replicas(
    cfg: ServerConfig, model: str, allowed: list[int], numa_nodes: list[list[int]], http_ports: list[int],
) -> list[ReplicaSpec]:
    """One spec per replica, replica i on http_ports[i] (ValueError: more replicas than cores, ports past 65535,
    or a replica's port that is the router's)."""
    num_replicas = num_replicas_of(cfg, allowed, numa_nodes)
    if len(http_ports) != num_replicas:
        raise ValueError(f"{num_replicas} replica(s) need as many HTTP ports, got {len(http_ports)}")
    if cfg.zmq_port and cfg.zmq_port + num_replicas - 1 > 65535:
        raise ValueError(f"--dp-size {num_replicas}: replica ZMQ ports --zmq-port + i pass 65535")
    if endpoint_port(cfg) in http_ports:
        raise ValueError(f"the router's port {endpoint_port(cfg)} is also a replica's HTTP port")
    common = config_argv(cfg)
    specs = []
    for replica_idx, cpus in enumerate(split_cores(allowed, numa_nodes, num_replicas)):
        http_port = http_ports[replica_idx]
        zmq_port = cfg.zmq_port + replica_idx if cfg.zmq_port else 0
        num_threads = cfg.num_threads or len(cpus)
        argv = (
            "--model", model, *common, "--host", REPLICA_HOST,
            "--port", str(http_port), "--zmq-port", str(zmq_port), "--num-threads", str(num_threads),
        )
        specs.append(ReplicaSpec(replica_idx, tuple(cpus), http_port, zmq_port, num_threads, REPLICA_HOST, argv))
    return specs


def config_argv(cfg: ServerConfig) -> list[str]:
    """The flags that rebuild `cfg`'s values that differ from their defaults (fleet fields left out)."""
    argv: list[str] = []
    for f in fields(ServerConfig):
        value = getattr(cfg, f.name)
        if f.name in FLEET_FIELDS or (f.default is not MISSING and value == f.default):
            continue
        flag = flag_of(f.name)
        if isinstance(value, bool):
            argv.append(flag)  # every bool flag defaults to off: only True differs
        elif FLAG_SPECS[f.name].nargs:
            argv += [flag, *value.split(",")]
        else:
            argv += [f"{flag}={value}"]  # '=': a value starting with '-' stays a value
    return argv
