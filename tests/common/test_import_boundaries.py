"""The light processes stay light, and product code never reaches into test support.

Every module of the tokenizer, detokenizer, HTTP, launcher and client packages is imported in a
fresh interpreter: none of them may pull in torch (hundreds of MB and seconds at start) or the
model worker's package. And no product module imports `testing` or `tests`."""

from __future__ import annotations

import ast
import json
import subprocess
import sys

from testing.paths import REPO_ROOT

LIGHT_PACKAGES = ("tokenizer_proc", "detokenizer_proc", "http_proc", "launcher", "client", "zserve")
PRODUCT_PACKAGES = (*LIGHT_PACKAGES, "common", "scheduler_proc", "model_proc")
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
heavy = sorted(m for m in sys.modules if m.split(".")[0] in ("torch", "model_proc"))
print(json.dumps({{"imported": imported, "heavy": heavy}}))
"""


def test_light_packages_import_neither_torch_nor_model_proc():
    code = PROBE.format(packages=LIGHT_PACKAGES)
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout.strip().splitlines()[-1])
    assert len(report["imported"]) > 30, report["imported"]  # really walked every module
    assert {"launcher.demo_model", "http_proc.http_app", "client.async_client"} <= set(report["imported"])
    assert report["heavy"] == []


def test_no_product_module_imports_test_support():
    offenders = []
    for package in PRODUCT_PACKAGES:
        for path in sorted((REPO_ROOT / package).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                names = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""] if isinstance(node, ast.ImportFrom) else []
                offenders += [f"{path.relative_to(REPO_ROOT)}: {n}" for n in names if n.split(".")[0] in ("testing", "tests")]
    assert offenders == []


def test_benchmarks_do_not_import_tests():
    offenders = []
    for path in sorted((REPO_ROOT / "benchmarks").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "tests":
                offenders.append(str(path.relative_to(REPO_ROOT)))
    assert offenders == []
