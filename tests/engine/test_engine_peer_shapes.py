"""zserve.LLM (vLLM's names and RequestOutputs) and zserve.Engine's SGLang form (its keywords, sampling names
and result dicts) on the tiny model: per-prompt settings honoured, greedy tokens equal to transformers'
(the oracle), the peers' shapes field by field. One server of each kind for the module."""

from __future__ import annotations

import asyncio

import pytest

import zserve
from testing.e2e_fixtures import EOS_ID

PROMPTS = ["The quick brown fox", "Once upon a time, in a land far away"]
CONTEXT_LEN = 96
LLM_FLAGS = {"dtype": "float32", "num_threads": 1, "kv_cache_tokens": 4096, "echo_logs": False}


@pytest.fixture(scope="module")
def llm(model_dir):
    with zserve.LLM(model=str(model_dir), tensor_parallel_size=1, max_model_len=CONTEXT_LEN, max_num_seqs=8,
                    enable_prefix_caching=True, seed=0, **LLM_FLAGS) as llm:
        yield llm


@pytest.fixture(scope="module")
def engine(model_dir):
    with zserve.Engine(model_path=str(model_dir), tp_size=1, context_length=CONTEXT_LEN, max_running_requests=8,
                       random_seed=0, **LLM_FLAGS) as engine:
        yield engine


def test_llm_generate_honours_each_prompts_settings_with_vllms_shape(llm, oracle):
    outputs = llm.generate(PROMPTS, [zserve.SamplingParams(max_tokens=4, ignore_eos=True),
                                     zserve.SamplingParams(max_tokens=7, ignore_eos=True)], use_tqdm=False)
    assert [len(o.outputs[0].token_ids) for o in outputs] == [4, 7]
    for prompt, out, num in zip(PROMPTS, outputs, (4, 7), strict=True):
        assert isinstance(out, zserve.RequestOutput) and isinstance(out.request_id, str) and out.finished
        assert out.prompt == prompt and out.prompt_token_ids == oracle.encode(prompt)
        [choice] = out.outputs
        assert isinstance(choice, zserve.CompletionOutput) and choice.index == 0
        assert choice.token_ids == oracle.greedy(out.prompt_token_ids, num, stop_at_eos=False)
        assert choice.text == oracle.decode(choice.token_ids)
        assert choice.finish_reason == "length" and choice.stop_reason is None
        assert choice.logprobs is None and choice.cumulative_logprob is None
    one = llm.generate(PROMPTS[0], zserve.SamplingParams(max_tokens=4, ignore_eos=True), use_tqdm=False)
    assert len(one) == 1 and one[0].outputs[0].token_ids == outputs[0].outputs[0].token_ids


def test_llm_generate_one_setting_for_all_token_id_prompts_and_a_stop_at_eos(llm, oracle):
    ids = oracle.encode(PROMPTS[1])
    outputs = llm.generate([{"prompt_token_ids": ids}, {"prompt": PROMPTS[0]}], zserve.SamplingParams(max_tokens=40),
                           use_tqdm=False)
    assert outputs[0].prompt is None and outputs[0].prompt_token_ids == ids
    for out in outputs:
        expected = oracle.greedy(out.prompt_token_ids, 40)
        assert out.outputs[0].token_ids == [t for t in expected if t != EOS_ID]  # the EOS ends the text, unseen
        assert out.outputs[0].finish_reason == ("stop" if expected[-1] == EOS_ID else "length")


def test_llm_n_choices_and_logprobs(llm):
    params = zserve.SamplingParams(max_tokens=3, temperature=1.0, seed=5, n=2, ignore_eos=True)
    [out] = llm.generate([PROMPTS[0]], params, use_tqdm=False)
    assert [c.index for c in out.outputs] == [0, 1]
    expected = llm.engine.generate([PROMPTS[0]], {"max_tokens": 3, "temperature": 1.0, "seed": 5, "n": 2,
                                                  "ignore_eos": True}, use_tqdm=False)
    assert [c.token_ids for c in out.outputs] == [r.output_ids for r in expected]
    [out] = llm.generate([PROMPTS[1]], zserve.SamplingParams(max_tokens=3, logprobs=2, ignore_eos=True), use_tqdm=False)
    [choice] = out.outputs
    assert len(choice.logprobs) == 3
    for token_id, position in zip(choice.token_ids, choice.logprobs, strict=True):
        best = min(position.values(), key=lambda lp: lp.rank or 99)
        assert best.rank == 1 and position[token_id] == best  # greedy: the chosen token is the most likely
        assert len(position) == 2 and all(lp.logprob <= 0 for lp in position.values())
    assert choice.cumulative_logprob == pytest.approx(sum(p[t].logprob for t, p in zip(choice.token_ids, choice.logprobs, strict=True)))


def test_llm_chat_renders_the_template(llm, oracle):
    messages = [{"role": "user", "content": "Say something."}]
    [out] = llm.chat(messages, zserve.SamplingParams(max_tokens=5, ignore_eos=True), use_tqdm=False)
    assert out.prompt_token_ids == oracle.chat_ids(messages)
    assert out.outputs[0].token_ids == oracle.greedy(out.prompt_token_ids, 5, stop_at_eos=False)
    assert "Say something." in out.prompt


def test_a_list_of_settings_of_another_length_is_a_value_error(llm, engine):
    with pytest.raises(ValueError, match="1 sampling settings for 2 prompts"):
        llm.generate(PROMPTS, [zserve.SamplingParams(max_tokens=2)])
    with pytest.raises(ValueError, match="3 sampling settings for 2 prompts"):
        engine.generate(prompt=PROMPTS, sampling_params=[{"max_new_tokens": 2}] * 3)


def test_engine_sglang_form_returns_sglangs_dicts(engine, oracle):
    outputs = engine.generate(prompt=PROMPTS, sampling_params=[{"max_new_tokens": 3, "ignore_eos": True},
                                                               {"max_new_tokens": 6, "ignore_eos": True}])
    assert isinstance(outputs, list) and len(outputs) == 2
    for prompt, out, num in zip(PROMPTS, outputs, (3, 6), strict=True):
        assert set(out) == {"text", "output_ids", "meta_info"}
        assert out["output_ids"] == oracle.greedy(oracle.encode(prompt), num, stop_at_eos=False)
        assert out["text"] == oracle.decode(out["output_ids"])
        meta = out["meta_info"]
        assert set(meta) == {"id", "finish_reason", "prompt_tokens", "completion_tokens", "cached_tokens", "e2e_latency"}
        assert meta["finish_reason"] == {"type": "length", "length": num}
        assert meta["prompt_tokens"] == len(oracle.encode(prompt)) and meta["completion_tokens"] == num
        assert isinstance(meta["id"], str) and meta["e2e_latency"] > 0
    one = engine.generate(prompt=PROMPTS[0], sampling_params={"max_new_tokens": 3, "ignore_eos": True})
    assert isinstance(one, dict) and one["output_ids"] == outputs[0]["output_ids"]
    by_ids = engine.generate(input_ids=oracle.encode(PROMPTS[0]), sampling_params={"max_new_tokens": 3, "top_k": -1,
                                                                                   "ignore_eos": True})
    assert by_ids["output_ids"] == outputs[0]["output_ids"] and isinstance(by_ids["meta_info"]["cached_tokens"], int)


def test_engine_keeps_zserves_own_form_and_its_context_length(engine):
    [result] = engine.generate([PROMPTS[0]], {"max_tokens": 3, "ignore_eos": True}, use_tqdm=False)
    assert isinstance(result, zserve.GenerateResult) and len(result.output_ids) == 3
    per_prompt = [{"max_tokens": 2, "n": 2, "temperature": 1.0, "seed": 3, "ignore_eos": True},
                  {"max_tokens": 3, "ignore_eos": True}]  # a list of settings, with its own n per prompt
    results = engine.generate(PROMPTS, per_prompt, use_tqdm=False)
    assert [len(r.output_ids) for r in results] == [2, 2, 3]
    assert results[2].output_ids[:2] == engine.generate([PROMPTS[1]], {"max_tokens": 2, "ignore_eos": True})[0].output_ids
    async_results = asyncio.run(engine.agenerate(PROMPTS, per_prompt))
    assert [r.output_ids for r in async_results] == [r.output_ids for r in results]
    with pytest.raises(zserve.InvalidRequestError, match=str(CONTEXT_LEN)):  # context_length reached the server
        engine.generate(input_ids=[5] * (CONTEXT_LEN + 1), sampling_params={"max_new_tokens": 1})


def test_sglangs_positional_example_reads_zserves_results_as_its_dicts(engine):
    """SGLang's quick start: `outputs = llm.generate(prompts, sampling_params)`, then `output["text"]`."""
    outputs = engine.generate(PROMPTS, {"max_new_tokens": 3, "ignore_eos": True, "top_k": -1}, use_tqdm=False)
    for out in outputs:
        assert out["text"] == out.text and out["output_ids"] == out.output_ids and len(out.output_ids) == 3
        assert out["meta_info"]["completion_tokens"] == 3 and out["meta_info"]["finish_reason"]["type"] == "length"
    with pytest.raises(KeyError):
        outputs[0]["no_such_key"]
