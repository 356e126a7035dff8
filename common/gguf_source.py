"""The pointer from a launcher-made model directory to the GGUF file holding its weights.

launcher/gguf_model_dir.py writes `gguf_source.json` ({"gguf_file": "/abs/path.gguf"}); the
launcher's checks and the model worker (model_proc/checkpoints/gguf_checkpoint.py) read it. No torch here.
"""

from __future__ import annotations

import json
from pathlib import Path

GGUF_SOURCE_FILE = "gguf_source.json"


def gguf_source(model_dir: str | Path) -> Path | None:
    """The GGUF file `model_dir` points at, or None for a safetensors directory."""
    pointer = Path(model_dir) / GGUF_SOURCE_FILE
    if not pointer.is_file():
        return None
    try:
        return Path(json.loads(pointer.read_text(encoding="utf-8"))["gguf_file"])
    except (json.JSONDecodeError, UnicodeDecodeError, KeyError, TypeError) as exc:
        raise ValueError(f"{pointer} is malformed ({exc!r}); expected {{'gguf_file': path}}") from None


def write_gguf_source(model_dir: Path, gguf_file: Path) -> None:
    (model_dir / GGUF_SOURCE_FILE).write_text(json.dumps({"gguf_file": str(gguf_file)}) + "\n", encoding="utf-8")
