"""The README's Python examples run as written: the client section against a server, the Engine section on its
own (the tiny model in place of the README's paths and default ports)."""

from __future__ import annotations

import re
import subprocess
import sys

from testing.paths import REPO_ROOT
from testing.server_process import start_server


def readme_block(section: str, level: str = "##") -> str:
    """The first ```python block under the README heading `section` (a `level` heading)."""
    text = (REPO_ROOT / "README.md").read_text()
    start = text.index(f"\n{level} {section}")
    return re.search(r"```python\n(.*?)```", text[start:], re.S).group(1)


def run_example(code: str, tmp_path) -> subprocess.CompletedProcess:
    script = tmp_path / "example.py"
    script.write_text(code)
    return subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True, timeout=300)


def test_the_client_example_runs_as_written(model_dir, tmp_path):
    code = readme_block("Using the client")
    assert "with Client() as c:" in code and "async with AsyncClient() as c:" in code
    server = start_server(model_dir, "--num-threads", "1", "--kv-cache-tokens", "8192")
    try:
        code = code.replace("Client()", f"Client({server.port})")  # the default port may be another server's here
        code += "\nimport asyncio\nasyncio.run(main())\nprint('EXAMPLE DONE')\n"
        proc = run_example(code, tmp_path)
        assert proc.returncode == 0 and "EXAMPLE DONE" in proc.stdout, proc.stdout + proc.stderr
    finally:
        assert server.stop() == 0, server.log_tail()


def test_the_engine_example_runs_as_written(model_dir, tmp_path):
    code = readme_block("Offline batches")
    assert 'zserve.Engine("/path/to/model"' in code
    code = code.replace('"/path/to/model"', f'"{model_dir}", num_threads=1, kv_cache_tokens=8192, echo_logs=False')
    proc = run_example(code + "\nprint('EXAMPLE DONE')\n", tmp_path)
    assert proc.returncode == 0 and "EXAMPLE DONE" in proc.stdout, proc.stdout + proc.stderr


def test_the_peer_shapes_example_runs_as_written(model_dir, tmp_path):
    code = readme_block("SGLang's and vLLM's shapes", level="###")
    assert 'zserve.Engine(model_path="/path/to/model"' in code and 'zserve.LLM(model="/path/to/model"' in code
    code = code.replace('"/path/to/model"', f'"{model_dir}", num_threads=1, kv_cache_tokens=8192, echo_logs=False')
    proc = run_example(code.replace("2048", "256") + "\nprint('EXAMPLE DONE')\n", tmp_path)  # the tiny model's context: 512
    assert proc.returncode == 0 and "EXAMPLE DONE" in proc.stdout, proc.stdout + proc.stderr
