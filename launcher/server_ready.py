"""ServerReady: the launcher's typed readiness signal, for a program that starts the server.

With `--ready-file PATH`, once every process of this node reported ready, the launcher writes
one JSON record to PATH (atomically: a reader sees the whole record or no file) next to its
human `zserve ready: ...` log line. A program that starts `launch_server` (zserve.Engine,
testing/server_process.py, both through launcher/server_subprocess.py) waits for that file
instead of scraping the log for ports.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path


@dataclass(frozen=True, slots=True)
class ServerReady:
    pid: int  # the launcher's
    node_rank: int  # a node other than 0 runs model worker ranks only: no client or HTTP port
    model: str
    host: str
    zmq_port: int  # the native clients' port (0 on a node other than 0)
    http_port: int  # 0 = no HTTP server
    ready_line: str  # the human line the launcher printed just before writing this record

    @property
    def address(self) -> str:
        """Where Client() / AsyncClient() connect."""
        return f"tcp://{self.host}:{self.zmq_port}"

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @staticmethod
    def from_json(text: str) -> ServerReady:
        return ServerReady(**json.loads(text))

    def write(self, path: str | Path) -> None:
        """Write the record so that PATH appears only once it is whole."""
        path = Path(path)
        partial = path.with_name(f".{path.name}.{os.getpid()}.partial")
        partial.write_text(self.to_json() + "\n")
        os.replace(partial, path)

    @staticmethod
    def read(path: str | Path) -> ServerReady | None:
        """The record at PATH, or None while it is not there."""
        try:
            return ServerReady.from_json(Path(path).read_text())
        except FileNotFoundError:
            return None
