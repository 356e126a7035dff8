"""The package graph, held by a test: every import in product code, as package -> package arrows,
against the allow-list below. A new arrow fails here with the file and line that added it; if it
is meant, it goes into ALLOWED_ARROWS with its reason.

    common  <- every package (the floor: messages, wire, config, the rules several processes share)
    tokenizer_proc <- detokenizer_proc, launcher          client <- http_proc, launcher, zserve
    launcher <- zserve                                    model_proc, scheduler_proc: common only

No product module imports `testing` or `tests` (test support), whatever the list says.

Inside model_proc the sub-packages stand on floors, and an import only runs down (MODEL_PROC_FLOORS,
MODEL_PROC_ARROWS; the modules at model_proc's top level, the runner and the worker, are the roof):

    (root)       model_runner, worker_process, sampler, ...          the roof
    models       the model families
    layers       modules, weight kernels (weight_kernels/), the KV pool
    quant        one class per quantization method
    checkpoints  the safetensors and GGUF readers
    weights      the quantized weight types, the GGUF block tables   kernels  the C++ ops, the CPU's features
    lora         the LoRA adapters' stacked updates, beside models (the runner attaches them to the model)

http_proc's wings stand on floors the same way (HTTP_PROC_FLOORS, HTTP_PROC_ARROWS; a module at
http_proc's top level is the roof, reasoning.py a one-file wing):

    (root)                          http_process, http_app: the process, the app that mounts every API
    apis/responses  apis/anthropic  translated onto the chat path of apis/openai
    apis/openai     apis/sglang     completions and chat (+ embeddings, tokenize); the native /generate
    shared                          state, guard, gate, errors, SSE, the request group, health, metrics
    tools           reasoning       the tool-call and reasoning parsers: no HTTP
"""

from __future__ import annotations

import ast
from collections.abc import Callable
from dataclasses import dataclass

import pytest

from testing.paths import REPO_ROOT

PACKAGES = ("common", "launcher", "tokenizer_proc", "scheduler_proc", "model_proc", "detokenizer_proc", "client", "http_proc",
            "zserve")
TEST_SUPPORT = ("testing", "tests")
ALLOWED_ARROWS = {
    **{(package, "common"): "common is the floor every process stands on" for package in PACKAGES if package != "common"},
    ("detokenizer_proc", "tokenizer_proc"): "the detokenizer decodes with the tokenizer process's TextTokenizer (one wrapper of `tokenizers`)",
    ("launcher", "tokenizer_proc"): "the launcher checks the tokenizer files and --chat-template, and reads the default template for ModelFacts",
    ("launcher", "client"): "--shell runs the terminal chat (client/chat_shell.py) against the server it started",
    ("http_proc", "client"): "the HTTP server is an AsyncClient of the frontend",
    ("zserve", "client"): "the package root gives the client's names (from zserve import Client)",
    ("zserve", "launcher"): "Engine starts a server as launch_server does (ServerSubprocess, the launcher's flags)",
}


MODEL_PROC_ROOT = "(root)"  # a module at model_proc's top level
MODEL_PROC_FLOORS = {"kernels": 0, "weights": 0, "lora": 4, "checkpoints": 1, "quant": 2, "layers": 3, "models": 4, MODEL_PROC_ROOT: 5}
MODEL_PROC_ARROWS = {
    ("checkpoints", "weights"): "a reader returns a matrix as stored, in its weight type (Int8Weight, PackedBlocks, ...)",
    ("checkpoints", "kernels"): "the GGUF reader packs a matrix from the file's rows by gguf_pack.cpp",
    ("quant", "checkpoints"): "a method opens the reader of its files (GGUFCheckpoint, an AWQ / GPTQ scheme)",
    ("quant", "weights"): "the gguf method keeps the block types of weights/gguf_blocks.py as stored",
    ("layers", "weights"): "the kernels pack the weight types; GemmWeight joins a fused matrix's pieces",
    ("layers", "checkpoints"): "a layer's `load` reads its tensors from a Checkpoint",
    ("layers", "kernels"): "the weight kernels and attention call the C++ ops",
    ("layers", "quant"): "registry.choose_kernel asks the --quantization's method which kernels run it",
    ("models", "layers"): "a model is built of layers",
    ("models", "checkpoints"): "a model's `load` reads its tensors from a Checkpoint",
    (MODEL_PROC_ROOT, "models"): "the runner builds the model",
    (MODEL_PROC_ROOT, "layers"): "the runner chooses the weight kernel, sizes the KV pool, packs the model",
    (MODEL_PROC_ROOT, "quant"): "the runner asks which method the checkpoint is stored in and what auto picks",
    (MODEL_PROC_ROOT, "kernels"): "the compute dtype and the fused ops depend on the kernels built",
    ("lora", "layers"): "an adapter's stacked matrices are GemmWeights, run on the server's weight kernel",
    ("lora", "kernels"): "on the CPU a projection's update is one call into lora_rows.cpp",
    (MODEL_PROC_ROOT, "lora"): "the runner loads the LoRA adapters into the model and says each step's adapted tokens",
    (MODEL_PROC_ROOT, "checkpoints"): "the runner opens the packed cache (--packed-cache) the GGUF reader fills or reads",
}


def inner_imports(package: str, rel_path: str, source: str) -> list[tuple[list[str], int]]:
    """(the dotted name's parts below zserve.<package>, line) for every import in <package>/<rel_path> of
    one of the package's own modules."""
    found = []
    for node in ast.walk(ast.parse(source, rel_path)):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            names = [node.module or ""]
            if node.module == f"zserve.{package}":  # from zserve.<package> import x
                names = [f"zserve.{package}.{alias.name}" for alias in node.names]
        else:
            continue
        for name in names:
            parts = name.split(".")
            if parts[:2] == ["zserve", package] and len(parts) > 2:
                found.append((parts[2:], node.lineno))
    return found


def model_proc_unit(parts: list[str]) -> str:
    """The sub-package of model_proc's module <parts> (a path or a dotted name below model_proc, `.py` dropped)."""
    return parts[0] if parts[0] in MODEL_PROC_FLOORS else MODEL_PROC_ROOT


HTTP_PROC_ROOT = "(root)"  # a module at http_proc's top level (but a one-file wing: reasoning.py)
HTTP_PROC_FLOORS = {"tools": 0, "reasoning": 0, "shared": 1, "apis/openai": 2, "apis/sglang": 2, "apis/responses": 3,
                    "apis/anthropic": 3, HTTP_PROC_ROOT: 4}
HTTP_PROC_ARROWS = {
    ("shared", "tools"): "the state holds the server's tool-call parser (--tool-call-parser, else the template's)",
    ("shared", "reasoning"): "the state holds the server's --reasoning-parser",
    ("apis/openai", "shared"): "a route runs on the state, behind the guard, and sends its choices as a request group",
    ("apis/openai", "tools"): "chat answers' tool calls are parsed, and streamed, by the tool-call parser",
    ("apis/openai", "reasoning"): "chat answers' thinking is split by the reasoning parser",
    ("apis/sglang", "shared"): "/generate runs on the state, behind the guard, as a request group",
    ("apis/responses", "shared"): "the route runs on the state, behind the guard",
    ("apis/responses", "apis/openai"): "a Responses request runs as a chat request (ChatCall), its events from chat chunks",
    ("apis/anthropic", "shared"): "the route runs on the state, behind the guard; errors in Anthropic's shape",
    ("apis/anthropic", "apis/openai"): "a Messages request runs as a chat request (ChatCall), its events from chat chunks",
    (HTTP_PROC_ROOT, "apis/openai"): "the app mounts each API's routes",
    (HTTP_PROC_ROOT, "apis/sglang"): "the app mounts each API's routes",
    (HTTP_PROC_ROOT, "apis/responses"): "the app mounts each API's routes",
    (HTTP_PROC_ROOT, "apis/anthropic"): "the app mounts each API's routes",
    (HTTP_PROC_ROOT, "shared"): "the process builds the state; the app puts the gate and the guard in front",
    (HTTP_PROC_ROOT, "tools"): "the process picks the tool-call parser (--tool-call-parser, the chat template)",
    (HTTP_PROC_ROOT, "reasoning"): "the process builds the --reasoning-parser",
}


def http_proc_unit(parts: list[str]) -> str:
    """The wing of http_proc's module <parts> (a path or a dotted name below http_proc, `.py` dropped)."""
    if parts[0] == "apis" and len(parts) > 1 and parts[1] != "__init__":
        return f"apis/{parts[1]}"
    return parts[0] if parts[0] in HTTP_PROC_FLOORS else HTTP_PROC_ROOT


@dataclass(frozen=True)
class Floors:
    """A package's units (sub-packages, wings) on floors: an import from one unit to another runs down, and is
    in `arrows` with its reason. Floors that only run down make a graph without circles."""

    package: str
    floors: dict[str, int]
    arrows: dict[tuple[str, str], str]
    unit: Callable[[list[str]], str]  # a module's unit, from its parts below the package
    units_on_disk: Callable[[], set[str]]  # the units the package's folders and files make

    def arrows_in(self, rel_path: str, source: str) -> list[tuple[str, str, str]]:
        """(importer unit, imported unit, where) for every import in <package>/<rel_path> that reaches
        another unit of the package."""
        importer, arrows = self.unit(rel_path.removesuffix(".py").split("/")), []
        for parts, line in inner_imports(self.package, rel_path, source):
            imported = self.unit(parts)
            if imported != importer:
                arrows.append((importer, imported, f"{self.package}/{rel_path}:{line}"))
        return arrows

    def all_arrows(self) -> list[tuple[str, str, str]]:
        root = REPO_ROOT / self.package
        return [arrow for path in sorted(root.rglob("*.py"))
                for arrow in self.arrows_in(str(path.relative_to(root)), path.read_text(encoding="utf-8"))]


def model_proc_units_on_disk() -> set[str]:
    root = REPO_ROOT / "model_proc"
    return {p.name for p in root.iterdir() if p.is_dir() and (p / "__init__.py").is_file()} | {MODEL_PROC_ROOT}


def http_proc_units_on_disk() -> set[str]:
    root = REPO_ROOT / "http_proc"
    wings = {str(p.parent.relative_to(root)) for p in [*root.glob("*/__init__.py"), *root.glob("apis/*/__init__.py")]}
    one_file_wings = {p.stem for p in root.glob("*.py") if p.stem in HTTP_PROC_FLOORS}
    return (wings - {"apis"}) | one_file_wings | {HTTP_PROC_ROOT}


MODEL_PROC = Floors("model_proc", MODEL_PROC_FLOORS, MODEL_PROC_ARROWS, model_proc_unit, model_proc_units_on_disk)
HTTP_PROC = Floors("http_proc", HTTP_PROC_FLOORS, HTTP_PROC_ARROWS, http_proc_unit, http_proc_units_on_disk)
FLOORED = [pytest.param(MODEL_PROC, id="model_proc"), pytest.param(HTTP_PROC, id="http_proc")]


@dataclass(frozen=True)
class ImportSite:
    importer: str  # the importing package
    imported: str  # the imported package ("testing" / "tests" for test support)
    module: str  # the name as written
    where: str  # path:line

    def message(self) -> str:
        if self.imported in TEST_SUPPORT:
            return f"{self.where}: product code imports test support ({self.module})"
        return (f"{self.where}: {self.importer} imports {self.module}, an arrow {self.importer} -> {self.imported} "
                f"not in ALLOWED_ARROWS (add it there with its reason if it is meant)")


def import_sites(package: str, rel_path: str, source: str) -> list[ImportSite]:
    """Every import in one module of `package` that reaches another package or test support."""
    sites = []
    for node in ast.walk(ast.parse(source, rel_path)):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            names = [node.module or ""]
        else:
            continue  # a relative import stays inside its own package
        for name in names:
            parts = name.split(".")
            if parts[0] in TEST_SUPPORT:
                imported = parts[0]
            elif parts[0] == "zserve":
                imported = parts[1] if len(parts) > 1 and parts[1] in PACKAGES else "zserve"
            else:
                continue  # the standard library or a third-party package
            if imported != package:
                sites.append(ImportSite(package, imported, name, f"{rel_path}:{node.lineno}"))
    return sites


def product_import_sites() -> list[ImportSite]:
    sites = []
    for package in PACKAGES:
        for path in sorted((REPO_ROOT / package).rglob("*.py")):
            sites += import_sites(package, str(path.relative_to(REPO_ROOT)), path.read_text(encoding="utf-8"))
    return sites


def forbidden(sites: list[ImportSite]) -> list[str]:
    return [s.message() for s in sites if s.imported in TEST_SUPPORT or (s.importer, s.imported) not in ALLOWED_ARROWS]


def test_every_arrow_between_packages_is_allowed():
    sites = product_import_sites()
    assert len(sites) > 150  # really read the product's imports
    offenders = forbidden(sites)
    assert not offenders, "\n".join(offenders)


def test_every_allowed_arrow_is_still_used():
    """The list is the graph as it is: an arrow nothing uses any more leaves it."""
    used = {(s.importer, s.imported) for s in product_import_sites()}
    assert sorted(set(ALLOWED_ARROWS) - used) == []


@pytest.mark.parametrize(("package", "rel_path", "source", "expected"), [
    ("launcher", "launcher/x.py", "from zserve.http_proc.tools.parser import x\n",
     "launcher/x.py:1: launcher imports zserve.http_proc.tools.parser, an arrow launcher -> http_proc not in ALLOWED_ARROWS"),
    ("model_proc", "model_proc/x.py", "def f():\n    import zserve.scheduler_proc.scheduler\n",
     "model_proc/x.py:2: model_proc imports zserve.scheduler_proc.scheduler, an arrow model_proc -> scheduler_proc"),
    ("common", "common/x.py", "from zserve import Client\n", "common/x.py:1: common imports zserve, an arrow common -> zserve"),
    ("client", "client/x.py", "from testing.paths import REPO_ROOT\n", "client/x.py:1: product code imports test support (testing.paths)"),
])
def test_the_checker_refuses_a_forbidden_import(package, rel_path, source, expected):
    offenders = forbidden(import_sites(package, rel_path, source))
    assert len(offenders) == 1 and offenders[0].startswith(expected), offenders


def test_the_checker_lets_allowed_and_outside_imports_pass():
    source = "import json\nimport torch\nfrom zserve.common.messages import GenerateReq\nfrom zserve.http_proc.x import y\nfrom . import z\n"
    assert forbidden(import_sites("http_proc", "http_proc/x.py", source)) == []
    assert [s.imported for s in import_sites("http_proc", "http_proc/x.py", source)] == ["common"]


@pytest.mark.parametrize("floored", FLOORED)
def test_the_floors_cover_the_units_on_disk(floored):
    assert floored.units_on_disk() == set(floored.floors)


@pytest.mark.parametrize("floored", FLOORED)
def test_every_allowed_arrow_inside_a_package_runs_down(floored):
    up = [arrow for arrow in floored.arrows if floored.floors[arrow[0]] <= floored.floors[arrow[1]]]
    assert up == []


@pytest.mark.parametrize("floored", FLOORED)
def test_no_import_runs_back_up_inside_a_package(floored):
    arrows = floored.all_arrows()
    assert len(arrows) > 50  # really read the package's imports
    offenders = [f"{where}: {importer} imports {imported}, an arrow not in the {floored.package} arrows (see its floors)"
                 for importer, imported, where in arrows if (importer, imported) not in floored.arrows]
    assert not offenders, "\n".join(offenders)
    assert sorted(set(floored.arrows) - {(a, b) for a, b, _ in arrows}) == []  # the list is the graph as it is


@pytest.mark.parametrize(("floored", "rel_path", "source", "expected"), [
    (MODEL_PROC, "checkpoints/x.py", "from zserve.model_proc.layers.int8_weights import Int8Weight\n",
     ("checkpoints", "layers")),
    (MODEL_PROC, "weights/x.py", "from zserve.model_proc import gguf_checkpoint\n", ("weights", MODEL_PROC_ROOT)),
    (MODEL_PROC, "layers/x.py", "def f():\n    import zserve.model_proc.models.llama\n", ("layers", "models")),
    (HTTP_PROC, "tools/x.py", "from zserve.http_proc.shared.api_error import ApiError\n", ("tools", "shared")),
    (HTTP_PROC, "shared/x.py", "from zserve.http_proc import http_app\n", ("shared", HTTP_PROC_ROOT)),
    (HTTP_PROC, "apis/openai/x.py", "from zserve.http_proc.apis.responses import events\n",
     ("apis/openai", "apis/responses")),
    (HTTP_PROC, "reasoning.py", "def f():\n    import zserve.http_proc.shared.http_state\n", ("reasoning", "shared")),
])
def test_the_floor_checker_sees_an_arrow_running_up(floored, rel_path, source, expected):
    (arrow,) = floored.arrows_in(rel_path, source)
    assert arrow[:2] == expected and expected not in floored.arrows
