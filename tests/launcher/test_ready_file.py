"""The launcher's typed readiness signal (--ready-file, ServerReady) and the one helper that
starts launch_server and waits for it (ServerSubprocess, used by zserve.Engine and the tests)."""

from __future__ import annotations

import pytest

from zserve import Client
from zserve.launcher.server_ready import ServerReady
from zserve.launcher.server_subprocess import ServerStartError, ServerSubprocess

FLAGS = ["--num-threads", "1", "--kv-cache-tokens", "1024", "--port", "0", "--zmq-port", "0"]


def test_the_record_round_trips_and_appears_whole(tmp_path):
    path = tmp_path / "ready.json"
    assert ServerReady.read(path) is None
    record = ServerReady(pid=7, node_rank=0, model="m", host="127.0.0.1", zmq_port=30001, http_port=0, ready_line="zserve ready: x")
    record.write(path)
    assert ServerReady.read(path) == record
    assert record.address == "tcp://127.0.0.1:30001"
    assert [p.name for p in tmp_path.iterdir()] == ["ready.json"]  # the partial file was renamed, not left


def test_a_launcher_that_exits_before_ready_is_reported_with_its_log():
    server = ServerSubprocess.start(["--page-size", "0"])
    with pytest.raises(ServerStartError, match=r"(?s)exited with code 2 before it was ready.*--page-size"):
        server.wait_ready(60)
    assert not server.ready_path.exists()


def test_the_ready_record_names_the_port_the_server_picked_and_the_log_has_the_line_first(model_dir):
    server = ServerSubprocess.start(["--model", str(model_dir), *FLAGS])
    try:
        ready = server.wait_ready(120)
        assert ready.zmq_port > 0 and ready.http_port == 0 and ready.pid == server.proc.pid and ready.node_rank == 0
        assert not server.ready_path.exists()  # read once, then removed
        assert ready.ready_line.startswith("zserve ready:") and f"tcp://127.0.0.1:{ready.zmq_port}" in ready.ready_line
        assert ready.ready_line + "\n" in server.log_lines  # the human line is kept, and already in the log
        with Client(ready.address, timeout_s=60) as client:
            assert client.generate("Hello", max_tokens=2, ignore_eos=True).usage.completion_tokens == 2
    finally:
        assert server.stop() == 0, server.log_tail()
