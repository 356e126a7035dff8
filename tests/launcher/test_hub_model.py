"""`--model org/name` (issue 48 item 1): a hub id resolved through huggingface_hub against a cache this test lays out
as huggingface_hub does (testing/hub_cache_fixtures.py), with HF_HUB_OFFLINE=1 and no network call at all."""

from __future__ import annotations

import logging
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from testing.cache_dirs import private_cache_dir
from testing.gguf_fixtures import write_gguf
from testing.hub_cache_fixtures import commit_of, files_of, write_hub_snapshot
from testing.paths import REPO_ROOT
from zserve.common.server_config import ServerConfig
from zserve.engine_keywords import config_values, flag_args
from zserve.launcher.config_resolver import resolve_model
from zserve.launcher.hub_cache import HubCache
from zserve.launcher.hub_model import HubModelId, resolve_hub_model

GGUF_NAMES = ("tiny-Q4_K_M.gguf", "tiny-q8_0.gguf", "mmproj-tiny-Q4_K_M.gguf")


@pytest.fixture
def hub(tmp_path, monkeypatch) -> Path:
    """An empty hub cache that HF_HUB_CACHE points at, offline, with every socket connection an error."""
    cache_dir = tmp_path / "hub"
    cache_dir.mkdir()
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(cache_dir))
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")  # even a call that slipped through stays on this machine
    monkeypatch.setenv("ZSERVE_CACHE_DIR", str(private_cache_dir(tmp_path / "zserve-cache")))

    def refuse(*args, **kwargs):
        raise AssertionError(f"a network call in a test: {args}")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "getaddrinfo", refuse)
    return cache_dir


@pytest.fixture(scope="module")
def gguf_file(model_dir, tmp_path_factory) -> Path:
    """The tiny Llama as one F32 GGUF: the resolver picks by name, the weights' type is not its concern."""
    return write_gguf(model_dir, tmp_path_factory.mktemp("gguf") / "tiny.gguf", "F32")


def gguf_repo(hub: Path, gguf_file: Path, names=GGUF_NAMES, repo_id: str = "org/tiny-GGUF") -> Path:
    return write_hub_snapshot(hub, repo_id, {name: gguf_file for name in names}, listed_only={"README.md": 12})


def resolve(model: str, gguf_file: str = "", revision: str = "") -> Path | None:
    return resolve_hub_model(model, gguf_file, revision, HubCache.from_env())


def test_a_hub_id_is_its_cached_snapshot_offline(hub, model_dir):
    """Only what a server reads was fetched (the repo's .bin was not): offline, the snapshot counts as complete."""
    snapshot = write_hub_snapshot(hub, "org/tiny", files_of(model_dir), listed_only={"pytorch_model.bin": 99})
    assert resolve("org/tiny") == snapshot
    assert (snapshot / "config.json").is_symlink() and (snapshot / "config.json").resolve().parent.name == "blobs"


def test_a_snapshot_missing_a_file_it_needs_is_refused(hub, model_dir):
    write_hub_snapshot(hub, "org/tiny", files_of(model_dir), listed_only={"model-00002.safetensors": 99})
    with pytest.raises(ValueError, match=r"^--model org/tiny: .*incomplete.*model-00002\.safetensors"):
        resolve("org/tiny")


def test_a_revision_is_a_ref_or_a_commit(hub, model_dir, tmp_path):
    main = write_hub_snapshot(hub, "org/tiny", files_of(model_dir))
    older = shutil.copytree(model_dir, tmp_path / "older")
    (older / "generation_config.json").write_text('{"temperature": 0.5}')
    v1 = write_hub_snapshot(hub, "org/tiny", files_of(older), commit=commit_of("org/tiny", "v1"), refs=("v1",))
    assert resolve("org/tiny") == main
    assert resolve("org/tiny", revision="v1") == v1
    assert resolve("org/tiny", revision=commit_of("org/tiny", "v1")) == v1
    with pytest.raises(ValueError, match=r"^--model org/tiny \(--revision v2\): not a local path, and not in the hub cache"):
        resolve("org/tiny", revision="v2")


def test_a_wrong_id_is_one_error_naming_it(hub):
    with pytest.raises(ValueError) as caught:
        resolve("org/no-such-model")
    assert str(caught.value) == f"--model org/no-such-model: not a local path, and not in the hub cache {hub} (HF_HUB_OFFLINE=1)"


def test_a_gguf_by_its_quant_tag_or_its_name(hub, gguf_file):
    snapshot = gguf_repo(hub, gguf_file)
    # any case; the vision projector (mmproj-*) is never the model
    assert resolve("org/tiny-GGUF:Q4_K_M") == snapshot / "tiny-Q4_K_M.gguf"
    assert resolve("org/tiny-GGUF:Q8_0") == snapshot / "tiny-q8_0.gguf"
    assert resolve("org/tiny-GGUF", gguf_file="tiny-q8_0.gguf") == snapshot / "tiny-q8_0.gguf"


def test_a_quant_tag_matching_several_files_or_none_lists_them(hub, gguf_file):
    gguf_repo(hub, gguf_file, names=("tiny-Q4_K_M.gguf", "tiny-Q4_K_M-imat.gguf", "tiny-Q4_K_S.gguf"))
    with pytest.raises(ValueError, match=r"^--model org/tiny-GGUF:q4_k_m: 2 \.gguf files match q4_k_m "
                                         r"\(tiny-Q4_K_M-imat\.gguf, tiny-Q4_K_M\.gguf\): name one with --gguf-file$"):
        resolve("org/tiny-GGUF:q4_k_m")
    with pytest.raises(ValueError, match=r"no \.gguf file of the repo matches Q4_K \(its \.gguf files: "):
        resolve("org/tiny-GGUF:Q4_K")  # a tag is a word of the name, not a prefix of Q4_K_M


def test_a_gguf_repo_without_a_tag(hub, gguf_file):
    only = write_hub_snapshot(hub, "org/one-GGUF", {"one.Q8_0.gguf": gguf_file})
    assert resolve("org/one-GGUF") == only / "one.Q8_0.gguf"
    gguf_repo(hub, gguf_file)
    with pytest.raises(ValueError, match=r"a GGUF repo of 2 files \(tiny-Q4_K_M\.gguf, tiny-q8_0\.gguf\): pick one"):
        resolve("org/tiny-GGUF")


def test_a_local_path_that_exists_wins(hub, model_dir, tmp_path, monkeypatch):
    write_hub_snapshot(hub, "org/tiny", files_of(model_dir))
    monkeypatch.chdir(tmp_path)
    shutil.copytree(model_dir, tmp_path / "org" / "tiny")
    assert HubModelId.parse("org/tiny") is None and resolve("org/tiny") is None
    for not_an_id in ("/abs/path", "./rel", "a/b/c", "name", "org/"):
        assert HubModelId.parse(not_an_id) is None, not_an_id
    assert HubModelId.parse("Qwen/Qwen3-0.6B") == HubModelId("Qwen/Qwen3-0.6B")
    assert HubModelId.parse("unsloth/Qwen3-0.6B-GGUF:Q4_K_M") == HubModelId("unsloth/Qwen3-0.6B-GGUF", "Q4_K_M")


def test_the_cache_directory_and_offline_switch_follow_huggingface_hub(tmp_path):
    home = Path(os.path.expanduser("~"))
    assert HubCache.from_env("", {}) == HubCache(home / ".cache" / "huggingface" / "hub", offline=False)
    assert HubCache.from_env("", {"XDG_CACHE_HOME": "/x"}).cache_dir == Path("/x/huggingface/hub")
    assert HubCache.from_env("", {"HF_HOME": "/h", "XDG_CACHE_HOME": "/x"}).cache_dir == Path("/h/hub")
    assert HubCache.from_env("", {"HF_HOME": "/h", "HF_HUB_CACHE": "/c"}).cache_dir == Path("/c")
    assert HubCache.from_env("/d", {"HF_HUB_CACHE": "/c"}).cache_dir == Path("/d")  # --download-dir
    for value, offline in (("1", True), ("true", True), ("ON", True), ("0", False), ("", False)):
        assert HubCache.from_env("", {"HF_HUB_OFFLINE": value}).offline is offline
    assert HubCache.from_env("", {"TRANSFORMERS_OFFLINE": "1"}).offline


def test_the_launcher_serves_the_snapshot_under_the_id(hub, model_dir, gguf_file):
    snapshot = write_hub_snapshot(hub, "org/tiny", files_of(model_dir))
    cfg = resolve_model(ServerConfig(model="org/tiny"))
    assert (cfg.model, cfg.served_model_name) == (str(snapshot), "org/tiny")
    assert resolve_model(ServerConfig(model="org/tiny", served_model_name="mine")).served_model_name == "mine"
    gguf_repo(hub, gguf_file)
    cfg = resolve_model(ServerConfig(model="org/tiny-GGUF:Q4_K_M"))
    assert cfg.served_model_name == "org/tiny-GGUF:Q4_K_M"
    source = (Path(cfg.model) / "gguf_source.json").read_text()
    assert "tiny-Q4_K_M.gguf" in source  # the snapshot's name, not the blob's hash it links to


def test_revision_on_a_local_path_is_a_warning(hub, model_dir, caplog):
    with caplog.at_level(logging.WARNING, logger="launcher"):
        assert resolve_model(ServerConfig(model=str(model_dir), revision="v1")).model == str(model_dir)
    assert f"--revision v1 has no effect: --model {model_dir} is a local path" in caplog.text


def test_engine_keywords_reach_the_flags():
    values = config_values({"revision": "v1", "download_dir": "/d", "hf_file": "x.gguf"}, "Engine()")
    assert flag_args(values) == ["--revision", "v1", "--download-dir", "/d", "--gguf-file", "x.gguf"]


def test_the_launcher_refuses_a_wrong_id_in_one_line(tmp_path):
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_HUB_CACHE=str(tmp_path), HF_ENDPOINT="http://127.0.0.1:9",
               PYTHONPATH=str(REPO_ROOT))
    proc = subprocess.run(
        [sys.executable, "-m", "zserve.launcher", "--model", "org/no-such-model", "--port", "0", "--zmq-port", "0"],
        capture_output=True, text=True, env=env, timeout=60,
    )
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert proc.stderr.strip().splitlines() == [
        f"launch_server: error: --model org/no-such-model: not a local path, and not in the hub cache {tmp_path} "
        "(HF_HUB_OFFLINE=1)"
    ]


def test_a_fleet_fetches_once_and_passes_the_id_on(hub, model_dir):
    """The replicas get the id as typed (their API name) and resolve it from the cache offline (launcher/fleet/run.py)."""
    from zserve.launcher.fleet.run import resolve_fleet_model

    write_hub_snapshot(hub, "org/tiny", files_of(model_dir))
    assert resolve_fleet_model(ServerConfig(model="org/tiny")) == "org/tiny"
    with pytest.raises(ValueError, match="^--model org/no-such-model: not a local path"):
        resolve_fleet_model(ServerConfig(model="org/no-such-model"))


def test_only_what_a_server_reads_is_fetched():
    """The patterns given to snapshot_download, applied by huggingface_hub's own filter to a typical repo."""
    from huggingface_hub.utils import filter_repo_objects

    from zserve.launcher.hub_model import SERVER_FILES, SKIPPED_FILES

    repo = [
        "config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
        "tokenizer.model", "merges.txt", "vocab.json", "chat_template.jinja", "model-00001-of-00002.safetensors",
        "model-00002-of-00002.safetensors", "model.safetensors.index.json", "modules.json", "1_Pooling/config.json",
        "pytorch_model.bin", "pytorch_model.bin.index.json", "optimizer.pt", "training_args.bin", "README.md",
        ".gitattributes", "consolidated.safetensors", "original/consolidated.00.pth", "original/params.json",
        "model.gguf", "onnx/model.onnx",
    ]
    fetched = list(filter_repo_objects(repo, allow_patterns=list(SERVER_FILES), ignore_patterns=list(SKIPPED_FILES)))
    assert fetched == [
        "config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
        "tokenizer.model", "merges.txt", "vocab.json", "chat_template.jinja", "model-00001-of-00002.safetensors",
        "model-00002-of-00002.safetensors", "model.safetensors.index.json", "modules.json", "1_Pooling/config.json",
        "pytorch_model.bin.index.json",
    ]


def test_online_the_snapshot_is_downloaded_with_those_patterns(hub, model_dir, monkeypatch):
    """Not offline: snapshot_download is asked (here a stand-in: no network in tests) for the server's files."""
    import huggingface_hub

    snapshot = write_hub_snapshot(hub, "org/tiny", files_of(model_dir))
    calls = []

    def fake_snapshot_download(repo_id, **kwargs):
        calls.append((repo_id, kwargs))
        return str(snapshot)

    monkeypatch.setattr(huggingface_hub, "snapshot_download", fake_snapshot_download)
    cache = HubCache(hub, offline=False)
    assert resolve_hub_model("org/tiny", "", "v1", cache) == snapshot
    [(repo_id, kwargs)] = calls
    assert repo_id == "org/tiny" and kwargs["revision"] == "v1" and kwargs["local_files_only"] is False
    assert Path(kwargs["cache_dir"]) == hub and "*.safetensors" in kwargs["allow_patterns"]


def test_a_hub_out_of_reach_lists_the_cached_gguf_files(hub, gguf_file, monkeypatch):
    from huggingface_hub import HfApi

    from zserve.launcher.hub_model import gguf_names

    def unreachable(self, *args, **kwargs):
        raise ConnectionError("no route to the hub")

    monkeypatch.setattr(HfApi, "list_repo_files", unreachable)
    gguf_repo(hub, gguf_file)
    assert gguf_names("org/tiny-GGUF", "main", HubCache(hub, offline=False)) == ["tiny-Q4_K_M.gguf", "tiny-q8_0.gguf"]
    with pytest.raises(ValueError, match=r"the hub could not be reached \(no route to the hub\) and the hub cache"):
        gguf_names("org/other-GGUF", "main", HubCache(hub, offline=False))


def test_gguf_file_names_one_of_a_local_directorys(hub, gguf_file, tmp_path):
    folder = tmp_path / "ggufs"
    folder.mkdir()
    for name in ("a.Q4_K_M.gguf", "a.Q8_0.gguf"):
        shutil.copy(gguf_file, folder / name)
    with pytest.raises(ValueError, match=r"holds 2 \.gguf files \(a\.Q4_K_M\.gguf, a\.Q8_0\.gguf\): name one \(--gguf-file\)"):
        resolve_model(ServerConfig(model=str(folder)))
    cfg = resolve_model(ServerConfig(model=str(folder), gguf_file="a.Q8_0.gguf"))
    assert "a.Q8_0.gguf" in (Path(cfg.model) / "gguf_source.json").read_text() and cfg.served_model_name == "a.Q8_0.gguf"
    with pytest.raises(ValueError, match=r"^--gguf-file b\.gguf: no such file in "):
        resolve_model(ServerConfig(model=str(folder), gguf_file="b.gguf"))
