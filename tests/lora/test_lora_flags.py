"""The LoRA flags: vLLM's --enable-lora --lora-modules NAME=PATH, SGLang's --lora-paths (NAME=PATH or PATH),
--max-loras (SGLang's --max-loras-per-batch), --max-lora-rank; and what the launcher refuses before any child."""

from __future__ import annotations

import pytest

from testing.lora_fixtures import build_peft_adapter
from zserve.common.lora_modules import AdapterConfig, LoraModule, lora_names, parse_lora_modules
from zserve.common.server_config import ServerConfig
from zserve.launcher.cli import parse_config
from zserve.launcher.config_check import check_flags


@pytest.fixture(scope="module")
def adapters(model_dir, tmp_path_factory):
    root = tmp_path_factory.mktemp("adapters")
    return build_peft_adapter(root / "a", model_dir, seed=1, rank=4), build_peft_adapter(root / "b", model_dir, seed=2)


def test_vllm_and_sglang_spellings_give_the_same_adapters(adapters):
    a, b = adapters
    vllm = parse_config(["--model", "m", "--enable-lora", "--lora-modules", f"sql={a}", f"chat={b}", "--max-loras", "4",
                         "--max-lora-rank", "16"])
    sglang = parse_config(["--model", "m", "--lora-paths", f"sql={a}", f"chat={b}", "--max-loras-per-batch", "4",
                           "--max-lora-rank", "16"])
    assert parse_lora_modules(vllm.lora_modules) == (LoraModule("sql", str(a)), LoraModule("chat", str(b)))
    assert vllm.lora_modules == sglang.lora_modules and vllm.max_loras == sglang.max_loras == 4
    assert lora_names(vllm.enable_lora, vllm.lora_modules) == ("sql", "chat")
    assert lora_names(sglang.enable_lora, sglang.lora_modules) == ("sql", "chat")  # --lora-paths alone turns it on
    assert lora_names(False, "") == ()
    assert parse_lora_modules(str(a)) == (LoraModule(str(a), str(a)),)  # SGLang's PATH alone: named by itself


def test_adapter_config_is_read_and_checked(adapters, tmp_path):
    a, _ = adapters
    config = AdapterConfig.read(a, max_rank=64)
    assert (config.rank, config.alpha, config.scaling) == (4, 8.0, 2.0)
    with pytest.raises(ValueError, match=r"rank r=4 is not in 1..2 \(--max-lora-rank\)"):
        AdapterConfig.read(a, max_rank=2)
    with pytest.raises(ValueError, match="no readable adapter_config.json"):
        AdapterConfig.read(tmp_path, max_rank=64)


@pytest.mark.parametrize(("flags", "error"), [
    (dict(enable_lora=True), "--enable-lora needs the adapters"),
    (dict(lora_modules="x=/a,x=/b"), "names the adapter 'x' twice"),
    (dict(lora_modules="=/a"), "is not NAME=PATH"),
    (dict(lora_modules="x=/nowhere"), "no readable adapter_config.json"),
])
def test_bad_lora_flags_are_refused_in_one_line(flags, error):
    with pytest.raises(ValueError, match=error):
        check_flags(ServerConfig(device="cpu", http_port=0, zmq_port=0, **flags))


def test_too_many_adapters_or_ranks_are_refused(adapters):
    a, b = adapters
    with pytest.raises(ValueError, match="names 2 adapters; --max-loras allows 1"):
        check_flags(ServerConfig(device="cpu", http_port=0, zmq_port=0, lora_modules=f"a={a},b={b}", max_loras=1))
    with pytest.raises(ValueError, match="--max-lora-rank"):
        check_flags(ServerConfig(device="cpu", http_port=0, zmq_port=0, lora_modules=f"a={a}", max_lora_rank=2))
    check_flags(ServerConfig(device="cpu", http_port=0, zmq_port=0, enable_lora=True, lora_modules=f"a={a},b={b}"))
