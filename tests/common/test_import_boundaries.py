"""The light processes stay light, and every part is imported as zserve.<folder>.

Every module of the tokenizer, detokenizer, HTTP, launcher and client packages is imported in a
fresh interpreter: none of them may pull in torch (hundreds of MB and seconds at start) or the
model worker's package. (Which package may import which, and that no product module imports
`testing` or `tests`: test_import_graph.py.)"""

from __future__ import annotations

import ast
import json
import subprocess
import sys

from testing.paths import REPO_ROOT

PARTS = ("tokenizer_proc", "detokenizer_proc", "http_proc", "launcher", "client", "common", "scheduler_proc", "model_proc")
LIGHT_PACKAGES = ("zserve.tokenizer_proc", "zserve.detokenizer_proc", "zserve.http_proc", "zserve.launcher", "zserve.client", "zserve")
PROBE = """
import importlib, json, pkgutil, sys
imported = []
for package in {packages!r}:
    pkg = importlib.import_module(package)
    imported.append(package)
    for info in pkgutil.walk_packages(pkg.__path__, package + "."):
        if info.name.endswith(".__main__"):  # an entry point runs its process on import
            continue
        importlib.import_module(info.name)
        imported.append(info.name)
heavy = sorted(m for m in sys.modules if m.split(".")[0] == "torch" or m.startswith("zserve.model_proc"))
print(json.dumps({{"imported": imported, "heavy": heavy}}))
"""


def test_light_packages_import_neither_torch_nor_model_proc():
    code = PROBE.format(packages=LIGHT_PACKAGES)
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout.strip().splitlines()[-1])
    assert len(report["imported"]) > 30, report["imported"]  # really walked every module
    assert {"zserve.launcher.demo_model", "zserve.http_proc.http_app", "zserve.client.async_client"} <= set(report["imported"])
    assert report["heavy"] == []


def test_benchmarks_do_not_import_tests():
    offenders = []
    for path in sorted((REPO_ROOT / "benchmarks").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "tests":
                offenders.append(str(path.relative_to(REPO_ROOT)))
    assert offenders == []


SHADOW_PROBE = """
import importlib.metadata, json, zserve
from zserve.common.messages import GenerateReq
from zserve.client.client import Client
top = importlib.metadata.distribution("zserve").read_text("top_level.txt")
print(json.dumps({"client": zserve.Client is Client, "file": zserve.__file__, "top": top.split() if top else None}))
"""


def test_a_users_own_modules_cannot_shadow_zserve(tmp_path):
    """A user's working directory holding client.py and common.py (names the design's folders use) does not
    break `import zserve`: every part is imported as zserve.<folder>, and no generic name is installed."""
    for name in ("client", "common", "launcher", "scheduler_proc"):
        (tmp_path / f"{name}.py").write_text("raise ImportError('the user module was imported')\n")
    out = subprocess.run([sys.executable, "-c", SHADOW_PROBE], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout.strip().splitlines()[-1])
    assert report["client"] is True and report["file"].startswith(str(REPO_ROOT))
    assert report["top"] in (None, ["zserve"]), report["top"]  # editable installs may list no top_level.txt


def test_no_module_imports_a_part_by_its_bare_folder_name():
    """`from common.x import` would work only from the checkout's root: every import names zserve.<folder>."""
    offenders = []
    for folder in ("zserve", *PARTS, "testing", "tests", "benchmarks"):
        for path in sorted((REPO_ROOT / folder).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                names = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""] if isinstance(node, ast.ImportFrom) and node.level == 0 else []
                offenders += [f"{path.relative_to(REPO_ROOT)}: {n}" for n in names if n.split(".")[0] in PARTS]
    assert offenders == []
