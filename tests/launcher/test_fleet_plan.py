"""launch_server --dp-size N: each replica's cores, ports, threads and flags; the one endpoint; what a fleet refuses."""

from __future__ import annotations

import subprocess
import sys

import pytest

from testing.paths import REPO_ROOT
from zserve.launcher.cli import parse_config
from zserve.launcher.fleet.plan import check_fleet_flags, config_argv, endpoint_port, plan_replicas


def test_each_replica_gets_its_cores_ports_and_threads_on_loopback():
    cfg = parse_config(["--dp-size", "2", "--host", "0.0.0.0", "--port", "9000", "--zmq-port", "9100", "--page-size", "32",
                        "--disable-radix-cache"])
    specs = plan_replicas(cfg, "/m", list(range(8)), [list(range(4)), list(range(4, 8))], [41000, 42000])
    assert [(s.cpus, s.http_port, s.zmq_port, s.num_threads) for s in specs] == [
        ((0, 1, 2, 3), 41000, 9100, 4), ((4, 5, 6, 7), 42000, 9101, 4),
    ]
    assert specs[1].url == "http://127.0.0.1:42000"  # only the router reaches a replica
    replica = parse_config(list(specs[1].argv))  # the replica's command line is an ordinary server's
    assert (replica.model, replica.host, replica.http_port, replica.zmq_port, replica.num_threads) == (
        "/m", "127.0.0.1", 42000, 9101, 4)
    assert (replica.page_size, replica.disable_radix_cache, replica.dp_size, replica.router) == (32, True, 1, False)


@pytest.mark.parametrize(("argv", "port"), [
    (["--dp-size", "2", "--port", "30000"], 30000),  # SGLang users' port: the router's default no longer collides
    (["--dp-size", "2", "--router", "--port", "30000"], 30000),
    (["--data-parallel-size", "2"], 8000),
    (["--dp-size", "2", "--port", "8000", "--router-port", "30000"], 30000),  # sglang_router.launch_server's spelling
])
def test_the_router_is_the_one_endpoint_on_port(argv, port):
    cfg = parse_config(argv)
    check_fleet_flags(cfg)
    assert endpoint_port(cfg) == port
    assert [s.http_port for s in plan_replicas(cfg, "/m", [0, 1], [], [41000, 42000])] == [41000, 42000]


def test_config_argv_rebuilds_every_changed_field_but_the_fleets():
    argv = ["--dp-size", "2", "--router", "--router-worker-urls", "http://a:1", "http://b:2", "--api-key", "secret",
            "--served-model-name=-odd", "--num-threads", "3", "--dtype", "half", "--strict-requests"]
    cfg = parse_config(argv)
    rebuilt = config_argv(cfg)
    assert "secret" not in " ".join(rebuilt) and "--router" not in rebuilt and "--num-threads" not in " ".join(rebuilt)
    again = parse_config(rebuilt)
    assert (again.served_model_name, again.dtype, again.strict_requests) == ("-odd", "float16", True)
    assert cfg.router_worker_urls == "http://a:1,http://b:2"
    assert plan_replicas(cfg, "/m", [0, 1], [], [41000, 42000])[0].num_threads == 3  # a given --num-threads wins


def test_dp_size_0_is_one_replica_per_numa_node():
    cfg = parse_config(["--dp-size", "0"])
    assert len(plan_replicas(cfg, "/m", list(range(6)), [[0, 1, 2], [3, 4, 5]], [41000, 42000])) == 2
    assert len(plan_replicas(cfg, "/m", list(range(6)), [], [41000])) == 1


@pytest.mark.parametrize(("argv", "needle"), [
    (["--dp-size", "2", "--port", "0"], "serve one HTTP endpoint"),
    (["--dp-size", "2", "--tp-size", "2"], "--tp-size and --nnodes must be 1"),
    (["--dp-size", "2", "--shell"], "--shell"),
    (["--dp-size", "2", "--port", "9000", "--zmq-port", "9000"], "is also --zmq-port"),
])
def test_what_a_fleet_cannot_do_is_refused(argv, needle):
    with pytest.raises(ValueError, match=needle):
        check_fleet_flags(parse_config(argv))


def test_router_port_on_a_replica_port_is_refused():
    cfg = parse_config(["--dp-size", "3", "--port", "9000", "--router-port", "9002"])
    with pytest.raises(ValueError, match="is also a replica's HTTP port"):
        plan_replicas(cfg, "/m", [0, 1, 2], [], [9001, 9002, 9003])


@pytest.mark.parametrize(("argv", "needle"), [
    (["--dp-size", "9999"], "needs at least one core per replica"),
    (["--dp-size", "2", "--port", "0"], "serve one HTTP endpoint"),
])
def test_the_launcher_refuses_a_bad_fleet_in_one_line(argv, needle, tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "zserve.launcher", "--model", str(tmp_path), *argv], capture_output=True, text=True,
        timeout=30, cwd=REPO_ROOT,
    )
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("launch_server: error: ") and needle in lines[0], proc.stderr


@pytest.mark.parametrize("fleet_flags", [["--dp-size", "2"], ["--dp-size", "2", "--router"]])
def test_dp_size_without_sglang_router_installed_is_one_clear_line(tmp_path, fleet_flags):
    blocker = tmp_path / "hide_router"
    blocker.mkdir()  # importlib.util.find_spec says "not installed" for a name sys.modules maps to None
    (blocker / "sitecustomize.py").write_text("import sys\nsys.modules['sglang_router'] = None\n")
    env = {"PYTHONPATH": f"{blocker}:{REPO_ROOT}", "PATH": "/usr/bin:/bin"}
    proc = subprocess.run(
        [sys.executable, "-m", "zserve.launcher", "--model", str(tmp_path), *fleet_flags],
        capture_output=True, text=True, timeout=30, cwd=REPO_ROOT, env=env,
    )
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip().splitlines() == [
        "launch_server: error: --dp-size serves one endpoint through sglang-router, which is not installed: "
        "pip install 'zserve[router]' (or sglang-router==0.3.2)"
    ], proc.stderr
