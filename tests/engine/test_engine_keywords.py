"""The keywords of zserve.Engine and zserve.LLM are the flags table's spellings (zserve/engine_keywords.py):
SGLang's and vLLM's names set the same config as the same flags on the command line; an unknown keyword
or two keywords for one flag are a TypeError naming them; zserve.SamplingParams takes vLLM's names."""

from __future__ import annotations

import pytest

import zserve
from zserve.common.server_flags import FLAG_SPECS, flag_of
from zserve.engine_keywords import config_values, engine_keywords, flag_args, keyword_of
from zserve.launcher.cli import parse_config

SGLANG = {
    "model_path": "/m", "tp_size": 2, "mem_fraction_static": 0.5, "context_length": 1024,
    "max_running_requests": 7, "chunked_prefill_size": 256, "dtype": "float32", "random_seed": 3,
    "tokenizer_path": "/t", "max_total_tokens": 4096, "page_size": 32, "disable_radix_cache": True,
}
SGLANG_ARGV = [
    "--model-path", "/m", "--tp-size", "2", "--mem-fraction-static", "0.5", "--context-length", "1024",
    "--max-running-requests", "7", "--chunked-prefill-size", "256", "--dtype", "float32", "--random-seed", "3",
    "--tokenizer-path", "/t", "--max-total-tokens", "4096", "--page-size", "32", "--disable-radix-cache",
]
VLLM = {
    "model": "/m", "tensor_parallel_size": 2, "max_model_len": 1024, "gpu_memory_utilization": 0.5,
    "dtype": "half", "seed": 3, "max_num_seqs": 7, "max_num_batched_tokens": 256, "enable_prefix_caching": False,
    "trust_remote_code": True, "tokenizer": "/t", "block_size": 32, "disable_log_stats": True,
}
VLLM_ARGV = [
    "--model", "/m", "--tensor-parallel-size", "2", "--max-model-len", "1024", "--gpu-memory-utilization", "0.5",
    "--dtype", "half", "--seed", "3", "--max-num-seqs", "7", "--max-num-batched-tokens", "256",
    "--no-enable-prefix-caching", "--trust-remote-code", "--tokenizer", "/t", "--block-size", "32",
    "--disable-log-stats",
]


@pytest.mark.parametrize(("keywords", "argv"), [(SGLANG, SGLANG_ARGV), (VLLM, VLLM_ARGV)], ids=["sglang", "vllm"])
def test_peer_keywords_make_the_config_their_flags_make(keywords, argv):
    assert parse_config(flag_args(config_values(keywords, "Engine()"))) == parse_config(argv)


def test_every_spelling_of_every_flag_is_a_keyword_for_its_field():
    table = engine_keywords()
    for name, spec in FLAG_SPECS.items():
        assert table[name].field == name
        for spelling in (flag_of(name), *spec.aliases, *spec.switches):
            assert table[keyword_of(spelling)].field == name, spelling


def test_enable_prefix_caching_true_and_false():
    assert config_values({"enable_prefix_caching": True}, "LLM()") == {"disable_radix_cache": False}
    assert config_values({"enable_prefix_caching": False}, "LLM()") == {"disable_radix_cache": True}
    with pytest.raises(TypeError, match="enable_prefix_caching takes True or False"):
        config_values({"enable_prefix_caching": 1}, "LLM()")


def test_unknown_or_doubled_keywords_are_type_errors_before_anything_starts():
    with pytest.raises(TypeError, match=r"LLM\(\) got an unknown server flag 'cpu_offload_gb'"):
        zserve.LLM(model="/nowhere", cpu_offload_gb=4)
    with pytest.raises(TypeError, match=r"Engine\(\) got an unknown server flag 'swap_space'"):
        zserve.Engine(model_path="/nowhere", swap_space=4)
    with pytest.raises(TypeError, match="'tp_size' and 'tensor_parallel_size', which set the same flag"):
        zserve.Engine(model_path="/nowhere", tp_size=1, tensor_parallel_size=1)
    with pytest.raises(TypeError, match="'model' and 'model_path'"):
        zserve.Engine("/nowhere", model_path="/nowhere")


VLLM_SAMPLING = dict(
    max_tokens=5, temperature=0.5, top_p=0.9, top_k=-1, min_p=0.1, stop=["\n\n"], stop_token_ids=[7], seed=11, n=3,
    repetition_penalty=1.1, presence_penalty=0.2, frequency_penalty=0.3, logprobs=2, ignore_eos=True,
    skip_special_tokens=False, include_stop_str_in_output=True,
)


def test_sampling_params_take_vllms_names():
    options = zserve.SamplingParams(**VLLM_SAMPLING).request_options()
    assert options["n"] == 3 and options["top_k"] == 0  # vLLM's "off"
    assert options["return_logprob"] is True and options["top_logprobs"] == 2
    assert options["no_stop_trim"] is True and options["stop"] == ["\n\n"] and options["seed"] == 11
    assert "logprobs" not in options and "include_stop_str_in_output" not in options
    assert zserve.SamplingParams(stop="END").request_options()["stop"] == ["END"]
    assert "n" not in zserve.SamplingParams().request_options() and "max_tokens" not in zserve.SamplingParams().request_options()


@pytest.mark.parametrize(("bad", "needle"), [
    ({"n": 0}, "n must be an integer in"), ({"logprobs": 21}, "logprobs must be an integer in"),
    ({"top_p": 0.0}, "top_p must be in"), ({"max_tokens": 0}, "max_tokens must be an integer"),
])
def test_bad_sampling_params_are_value_errors_when_made(bad, needle):
    with pytest.raises(ValueError, match=needle):
        zserve.SamplingParams(**bad)


def test_a_sampling_keyword_zserve_does_not_know_is_a_type_error():
    with pytest.raises(TypeError, match="best_of"):
        zserve.SamplingParams(best_of=2)
