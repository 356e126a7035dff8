"""The scheduler's periodic stats line, on a real server: it appears while a request runs and its
figures are the scheduler's own counters (what `Client.stats()` reports)."""

from __future__ import annotations

import re
import time

from testing.server_process import start_server, wait_idle
from zserve.client import Client

LINE = re.compile(
    r"stats: prompt [\d.]+ tok/s, generation [\d.]+ tok/s; running (\d+), waiting (\d+), retracted (\d+) \(total\); "
    r"KV [\d.]+% used; prefix cache hit [\d.]+%; (\d+) tokens generated \(total\)"
)


def test_stats_line_appears_while_a_200_token_request_runs_and_matches_stats(model_dir):
    server = start_server(
        model_dir, "--dtype", "float32", "--num-threads", "1", "--log-stats-interval-s", "0.05", "--kv-cache-tokens", "2048",
    )
    try:
        with Client(server.port, timeout_s=60) as c:
            before = len(LINE.findall(server.log()))
            assert before == 0, "a line was logged while idle"
            result = c.generate("Once upon a time", max_tokens=200, ignore_eos=True)
            assert len(result.output_ids) == 200
            stats = wait_idle(c)
            deadline = time.monotonic() + 5
            while time.monotonic() < deadline:  # the last busy interval's line comes within the interval
                lines = [tuple(map(int, m)) for m in LINE.findall(server.log())]
                if lines and lines[-1][3] == stats["num_generated_tokens"]:
                    break
                time.sleep(0.05)
            assert lines, server.log_tail()
            assert any(running == 1 for running, _, _, _ in lines), lines  # logged while the request ran
            running, waiting, retracted, generated = lines[-1]
            assert (running, waiting, retracted) == (stats["num_running"], stats["num_waiting"], stats["num_retracted"])
            assert generated == stats["num_generated_tokens"] == 200
            num_lines = len(lines)
            time.sleep(0.5)  # idle: no more lines
            assert len(LINE.findall(server.log())) == num_lines
    finally:
        assert server.stop() == 0
