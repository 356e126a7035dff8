"""`launch_server --dp-size N`: plan the replicas, run the Fleet, print its ready line.

    launch_server --model M --dp-size 2 --port 8000
        replica 0: cores 0-15, HTTP 127.0.0.1:<free>      replica 1: cores 16-31, HTTP 127.0.0.1:<free>
        sglang-router on --host:8000 (cache_aware) in front of both: the one endpoint

A bad fleet configuration, or sglang-router not installed, is refused in one line (exit code 2)
before anything starts, as a bad flag is (launcher/cli.py). The ready record (--ready-file) names
the router's HTTP port and replica 0's ZMQ port. With --api-key both the router and every replica
check the key, so a replica's own port is no way around it.
"""

from __future__ import annotations

import logging
import os
import signal
import sys

from zserve.common.net_ports import free_port
from zserve.common.server_config import API_KEY_ENV, ServerConfig
from zserve.launcher.cli import refuse
from zserve.launcher.config_check import check_port_free
from zserve.launcher.fleet.core_split import allowed_cpus, format_cpulist, read_numa_nodes
from zserve.launcher.fleet.plan import check_fleet_flags, endpoint_port, num_replicas_of, plan_replicas
from zserve.launcher.fleet.replica import Replica
from zserve.launcher.fleet.router import RouterSettings, check_router_installed
from zserve.launcher.fleet.supervisor import Fleet, FleetStartError
from zserve.launcher.hub_cache import HF_HUB_OFFLINE_ENV, HubCache
from zserve.launcher.hub_model import HubModelId, resolve_hub_model
from zserve.launcher.server_ready import ServerReady

logger = logging.getLogger("fleet")
FLEET_PID_ENV = "ZSERVE_FLEET_PID"  # a replica's launcher dies with the supervisor (launcher/__main__.py)


def run_fleet(cfg: ServerConfig) -> int:
    """The fleet's exit code: 0 after a stop signal, 1 when it failed to start or the router exited."""
    try:
        check_fleet_flags(cfg)
        check_router_installed()
        check_port_free("--router-port" if cfg.router_port else "--port", cfg.host, endpoint_port(cfg))
        allowed, numa_nodes = allowed_cpus(), read_numa_nodes()
        http_ports = free_ports(num_replicas_of(cfg, allowed, numa_nodes), avoid={endpoint_port(cfg)})
        specs = plan_replicas(cfg, resolve_fleet_model(cfg), allowed, numa_nodes, http_ports)
    except ValueError as exc:
        refuse(str(exc))
    logger.info("%d replica(s) on %d allowed core(s) (%s) of %d NUMA node(s)", len(specs), len(allowed),
                format_cpulist(allowed), max(1, len(numa_nodes)))
    env = {**os.environ, FLEET_PID_ENV: str(os.getpid())}
    if HubModelId.parse(cfg.model) is not None:
        env[HF_HUB_OFFLINE_ENV] = "1"  # fetched once above: each replica finds it in the cache, with no network call
    api_key = cfg.api_key or os.environ.get(API_KEY_ENV, "")
    if api_key:
        env[API_KEY_ENV] = api_key  # never on a command line; the router reads it there too (router_main.py)
    extra_urls = tuple(url for url in cfg.router_worker_urls.split(",") if url)
    router_settings = RouterSettings(
        host=cfg.host, port=endpoint_port(cfg), policy=cfg.router_policy,
        worker_urls=(*(spec.url for spec in specs), *extra_urls),
        prometheus_port=cfg.router_prometheus_port or free_port(cfg.host), log_level=cfg.log_level,
        extra_args=cfg.router_args, api_key=api_key,
    )
    fleet = Fleet([Replica(spec, env) for spec in specs], router_settings, cfg.startup_timeout_s, cfg.drain_timeout_s)
    signal.signal(signal.SIGTERM, fleet.on_stop_signal)
    signal.signal(signal.SIGINT, fleet.on_stop_signal)
    code = 1
    try:
        fleet.start()
        line = ready_line(fleet)
        sys.stdout.write(line + "\n")
        sys.stdout.flush()
        if cfg.ready_file:
            first = fleet.replicas[0].ready
            ServerReady(os.getpid(), 0, first.model, cfg.host, first.zmq_port, endpoint_port(cfg), line).write(
                cfg.ready_file
            )
        code = fleet.supervise()
    except FleetStartError as exc:
        logger.error("%s", exc)
    finally:
        fleet.shutdown()
    return code


def resolve_fleet_model(cfg: ServerConfig) -> str:
    """The demo model, or a hub id's files, fetched once here, not by every replica; --model goes to them as given
    (a hub id too: they resolve it from the cache, offline)."""
    if cfg.model:
        resolve_hub_model(cfg.model, cfg.gguf_file, cfg.revision, HubCache.from_env(cfg.download_dir))
        return cfg.model
    from zserve.launcher.demo_model import ensure_demo_model

    return str(ensure_demo_model(progress=True))


def free_ports(count: int, avoid: set[int]) -> list[int]:
    """`count` distinct free loopback ports, none in `avoid` (each replica's HTTP port)."""
    ports: list[int] = []
    while len(ports) < count:
        port = free_port()
        if port not in avoid and port not in ports:
            ports.append(port)
    return ports


def ready_line(fleet: Fleet) -> str:
    replicas = ", ".join(r.spec.url for r in fleet.replicas)
    settings = fleet.router_settings
    return (f"zserve fleet ready on {settings.url}: sglang-router ({settings.policy}) in front of "
            f"{len(fleet.replicas)} replica(s) at {replicas}")
