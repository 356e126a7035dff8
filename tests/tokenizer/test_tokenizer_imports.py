"""The tokenizer and detokenizer components stay light: no torch, no transformers (seconds and
hundreds of MB at startup), checked in a fresh interpreter."""

from __future__ import annotations

import json
import subprocess
import sys

from testing.paths import REPO_ROOT
from testing.tokenizer_fixtures import build_byte_level_bpe

RUNTIME_MODULES = (
    "zserve.tokenizer_proc.text_tokenizer",
    "zserve.tokenizer_proc.tokenizer_files",
    "zserve.tokenizer_proc.chat_template",
    "zserve.tokenizer_proc.request_validator",
    "zserve.detokenizer_proc.incremental_detokenizer",
    "zserve.detokenizer_proc.stop_matcher",
)
PROBE = """
import json, sys, time
t0 = time.perf_counter()
for name in {modules!r}:
    __import__(name)
from zserve.tokenizer_proc.text_tokenizer import TextTokenizer
from zserve.tokenizer_proc.request_validator import RequestValidator
from zserve.detokenizer_proc.incremental_detokenizer import IncrementalDetokenizer
tok = TextTokenizer.from_model_dir({model_dir!r})
ids, _ = RequestValidator(tok, 512).validate({{"messages": [{{"role": "user", "content": "hi"}}]}})
detok = IncrementalDetokenizer(tok, stop=["x"])
detok.add_tokens(ids)
heavy = sorted(m for m in sys.modules if m.split(".")[0] in ("torch", "transformers"))
# VmHWM, not ru_maxrss: Linux carries ru_maxrss over from the (big) parent across fork + exec.
hwm_kb = next(int(line.split()[1]) for line in open("/proc/self/status") if line.startswith("VmHWM:"))
print(json.dumps({{"heavy": heavy, "seconds": time.perf_counter() - t0, "peak_rss_mb": hwm_kb / 1024}}))
"""


def test_runtime_modules_import_neither_torch_nor_transformers(tmp_path):
    model_dir = build_byte_level_bpe(tmp_path)
    code = PROBE.format(modules=RUNTIME_MODULES, model_dir=str(model_dir))
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True, text=True, timeout=60, check=True
    )
    report = json.loads(out.stdout.strip().splitlines()[-1])
    assert report["heavy"] == []
    assert report["peak_rss_mb"] < 150, report  # importing torch alone takes ~220 MB
