"""`launch_server --shell` on a terminal: the chat has the terminal to itself (server logs go to a
file whose path is printed), Ctrl-C stops an answer without touching the server, and Ctrl-D stops
the server cleanly: exit 0, no process left."""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

from testing.paths import REPO_ROOT
from testing.processes import wait_dead
from testing.pty_session import PtySession
from testing.server_process import free_port


def child_pids(pid: int) -> list[int]:
    out = os.popen(f"pgrep -P {pid}").read()
    return [int(p) for p in out.split()]


def test_shell_logs_to_a_file_survives_ctrl_c_and_ctrl_d_stops_everything(model_dir):
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT), PYTHONUNBUFFERED="1")
    cmd = [sys.executable, "-m", "zserve.launcher", "--model", str(model_dir), "--shell", "--zmq-port", str(free_port()), "--port", "0",
           "--dtype", "float32", "--num-threads", "1", "--kv-cache-tokens", "2048"]
    with PtySession.spawn(cmd, env) as term:
        term.expect("server logs go to ")
        at = term.expect("> ", timeout_s=120)
        children = child_pids(term.proc.pid)
        assert len(children) >= 4
        log_path = Path(re.search(r"server logs go to (\S+)", term.output).group(1))
        term.send("Tell me a long story.\r")
        at = term.expect("Tell me a long story.", after=at)
        try:
            term.expect("\n", after=at, timeout_s=60)  # the answer has begun (or ended)
        except AssertionError:
            raise AssertionError(f"no answer; server log:\n{log_path.read_text()[-3000:]}") from None
        term.send_interrupt()  # stops the answer (if still streaming) or clears the line: the server stays up
        at = term.expect("> ", after=at, timeout_s=60)
        term.send("Hello?\r")
        at = term.expect("Hello?", after=at)
        at = term.expect("> ", after=at, timeout_s=60)
        assert all(os.path.exists(f"/proc/{p}") for p in children), "a server process died on Ctrl-C"
        term.send_eof()
        assert term.wait(timeout_s=60) == 0, term.output
    assert wait_dead(children, 10) == []
    log = log_path.read_text()
    assert "zserve ready" not in term.output.split("server logs go to")[0]
    assert "scheduler ready" in log and "all processes stopped" in log  # the server's lines went to the file
    assert " INFO " not in term.output, term.output  # ... and none to the terminal
    assert "Traceback" not in term.output
    log_path.unlink()
