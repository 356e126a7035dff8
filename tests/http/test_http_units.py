"""HTTP front end pieces without a server: request expansion, refusals, error mapping, response
shapes, health states and metrics rendering."""

from __future__ import annotations

import asyncio

import pytest
from prometheus_client.parser import text_string_to_metric_families
from pydantic import ValidationError

from zserve.client.types import (
    GenerateResult,
    RequestTimeoutError,
    ServerBusyError,
    ServerError,
    ServerGoneError,
    Usage,
)
from zserve.common.error_code import ErrorCode
from zserve.common.finish_reason import FinishReason
from zserve.common.histogram import TTFT_BOUNDS_S, Histogram
from zserve.common.messages import FrontendStats, StatsOut
from zserve.common.scheduler_stats import SchedulerStats
from zserve.http_proc.apis.openai.chat_formatter import ChatFormatter
from zserve.http_proc.apis.openai.completion_formatter import CompletionFormatter
from zserve.http_proc.apis.openai.formatter import usage_of
from zserve.http_proc.apis.openai.protocol import MAX_CHOICES, ChatCompletionRequest, CompletionRequest
from zserve.http_proc.shared.api_error import ApiError
from zserve.http_proc.shared.health_monitor import HealthMonitor
from zserve.http_proc.shared.request_group import ChoiceEvent
from zserve.http_proc.shared.server_metrics import ServerMetrics


def test_completion_expands_n_and_prompt_lists_with_the_requests_seed():
    """Every copy carries the request's seed: the scheduler alone seeds copy i with seed + i (the group sends each
    prompt once with n); that the choices differ and reproduce is checked end to end in test_http_server.py."""
    req = CompletionRequest(prompt=["a", "b"], n=3, seed=7, temperature=0.5, stop="x", max_tokens=5)
    subs = req.sub_requests()
    assert [s.choice_idx for s in subs] == list(range(6))
    assert [s.prompt_idx for s in subs] == [0, 0, 0, 1, 1, 1]
    assert [s.prompt for s in subs[:1]] == [{"prompt": "a"}]
    assert [s.sampling["seed"] for s in subs] == [7] * 6
    assert subs[0].sampling == {"max_tokens": 5, "temperature": 0.5, "seed": 7, "stop": ["x"]}


def test_completion_token_prompts_and_defaults():
    assert CompletionRequest(prompt=[1, 2, 3]).sub_requests()[0].prompt == {"input_ids": [1, 2, 3]}
    subs = CompletionRequest(prompt=[[1], [2, 3]]).sub_requests()
    assert [s.prompt for s in subs] == [{"input_ids": [1]}, {"input_ids": [2, 3]}]
    sampling = CompletionRequest(prompt="hi").sub_requests()[0].sampling
    assert sampling == {"max_tokens": 16}  # OpenAI's max_tokens default; temperature is the server's (one default for every door)


def test_chat_without_max_tokens_sends_none_and_flattens_text_parts():
    req = ChatCompletionRequest(
        messages=[{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}],
        ignore_eos=True, top_k=5, min_p=0.1, stop_token_ids=[3],
    )
    [sub] = req.sub_requests()
    assert sub.prompt == {"messages": [{"role": "user", "content": "a\nb"}]}
    # no max_tokens: the server lets it run up to the context (and reserves only an estimate of that)
    assert sub.sampling == {"top_k": 5, "min_p": 0.1, "stop_token_ids": [3], "ignore_eos": True}
    req = ChatCompletionRequest(messages=[{"role": "user", "content": "x"}], max_completion_tokens=9)
    assert req.sub_requests()[0].sampling["max_tokens"] == 9


UNSUPPORTED = [
    (lambda: CompletionRequest(prompt="a", logprobs=21).sub_requests(), "logprobs"),
    (lambda: CompletionRequest(prompt="a", suffix="b").sub_requests(), "suffix"),
    (lambda: CompletionRequest(prompt="a", best_of=3).sub_requests(), "best_of"),
    (lambda: CompletionRequest(prompt="a", n=MAX_CHOICES + 1).sub_requests(), "n"),
    (lambda: CompletionRequest(prompt="a", stream_options={"include_usage": True}).sub_requests(), "stream_options"),
    (lambda: CompletionRequest(prompt=[]).sub_requests(), "prompt"),
    (lambda: ChatCompletionRequest(messages=[{"role": "user", "content": "a"}], tool_choice="required").sub_requests(), "tool_choice"),
    (lambda: ChatCompletionRequest(messages=[{"role": "user", "content": "a"}], tools=[{"type": "function", "function": {"name": "f"}}],
                                   tool_choice={"type": "function", "function": {"name": "g"}}).sub_requests(), "tool_choice"),
    (lambda: ChatCompletionRequest(messages=[{"role": "user", "content": "a"}], tools=[{"type": "function", "function": {"name": "f"}}],
                                   tool_choice="required", response_format={"type": "json_object"}).sub_requests(), "tool_choice"),
    (lambda: ChatCompletionRequest(messages=[{"role": "user", "content": "a"}], top_logprobs=2).sub_requests(), "top_logprobs"),
    (lambda: ChatCompletionRequest(messages=[{"role": "assistant"}]).sub_requests(), "messages"),
    (lambda: ChatCompletionRequest(messages=[{"role": "user", "content": "a"}], response_format={"type": "yaml"}).sub_requests(), "response_format"),
]


@pytest.mark.parametrize(("build", "param"), UNSUPPORTED, ids=[p for _, p in UNSUPPORTED])
def test_unsupported_options_are_400s_naming_the_param(build, param):
    with pytest.raises(ApiError) as info:
        build()
    assert info.value.status == 400 and info.value.param == param


def test_penalties_bias_and_min_tokens_pass_through_to_the_server():
    [sub] = CompletionRequest(
        prompt="a", presence_penalty=0.5, frequency_penalty=-0.25, repetition_penalty=1.0, logit_bias={"5": 2.0}, min_tokens=3,
    ).sub_requests()
    assert sub.sampling == {"max_tokens": 16, "presence_penalty": 0.5, "frequency_penalty": -0.25, "repetition_penalty": 1.0,
                            "logit_bias": {"5": 2.0}, "min_tokens": 3}


def test_unknown_fields_are_kept_aside_and_known_ones_still_validated():
    """The model does not refuse an unknown field (UnknownFieldPolicy decides: tests/http/test_unknown_fields.py)."""
    assert CompletionRequest(prompt="a", frobnicate=1).model_extra == {"frobnicate": 1}
    with pytest.raises(ValidationError, match="temperature"):
        CompletionRequest(prompt="a", temperature="hot", frobnicate=1)


@pytest.mark.parametrize(
    ("exc", "status"),
    [
        (ServerBusyError("server busy: 9 requests waiting", req_id=1), 503),
        (ServerGoneError("server at x has not answered"), 503),
        (RequestTimeoutError("no result"), 503),
        (ServerError("prompt is empty", ErrorCode.INVALID, req_id=1), 400),
        (ServerGoneError("server failure: the model process died", ErrorCode.GONE, req_id=1), 500),
        (RuntimeError("bug"), 500),
    ],
)
def test_client_errors_map_to_statuses(exc, status):
    error = ApiError.from_client_error(exc)
    assert error.status == status
    body = error.body()["error"]
    assert set(body) == {"message", "type", "param", "code"}
    if status == 400:
        assert body["message"] == "prompt is empty" and body["type"] == "invalid_request_error"


def result(text: str, finish: str | None, prompt: int, completion: int, cached: int) -> GenerateResult:
    return GenerateResult(1, text=text, finish_reason=finish, usage=Usage(prompt, completion, cached))


def test_usage_counts_each_prompt_once_and_sums_completions():
    subs = CompletionRequest(prompt=["a", "bb"], n=2).sub_requests()
    results = [result("x", "stop", 3, 2, 0), result("y", "length", 3, 5, 3), result("z", "stop", 4, 1, 4), result("w", "stop", 4, 1, 4)]
    assert usage_of(subs, results) == {
        "prompt_tokens": 7, "completion_tokens": 9, "total_tokens": 16, "prompt_tokens_details": {"cached_tokens": 4},
    }


def test_chat_formatter_shapes():
    fmt = ChatFormatter(model_name="m", include_usage=True)
    [opening] = fmt.opening_chunks(1)
    assert b'"role":"assistant"' in opening and b'"usage":null' in opening
    assert fmt.event_chunk(ChoiceEvent(0, "", [], result("", None, 1, 0, 0))) is None
    last = fmt.event_chunk(ChoiceEvent(0, "hi", [5], result("hi", "length", 1, 1, 0)))
    assert b'"delta":{"content":"hi"}' in last and b'"finish_reason":"length"' in last
    subs = ChatCompletionRequest(messages=[{"role": "user", "content": "a"}]).sub_requests()
    body = fmt.body(subs, [result("hi", "stop", 1, 1, 0)])
    assert body["object"] == "chat.completion" and body["choices"][0]["message"] == {"role": "assistant", "content": "hi"}
    assert CompletionFormatter(model_name="m").usage_chunk(subs, []) is None


class FakeClient:
    """Answers stats like the server would, after delay_s (a scheduler in a long model step answers
    when it ends), or fails when told to; counts stats and generate calls."""

    def __init__(self):
        self.stats_reply = {"num_steps": 0, "num_waiting": 0, "num_running": 0, "num_prefilling": 0}
        self.delay_s = 0.0
        self.error: Exception | None = None
        self.num_stats = 0
        self.num_generates = 0

    async def stats(self) -> dict:
        self.num_stats += 1
        await asyncio.sleep(self.delay_s)
        if self.error is not None:
            raise self.error
        return dict(self.stats_reply)

    async def generate(self, **kwargs) -> GenerateResult:
        self.num_generates += 1
        return result("", "length", 1, 1, 0)


async def poll_for(health: HealthMonitor, seconds: float) -> set[str]:
    """The states /health showed while polling for `seconds`."""
    seen = set()
    deadline = asyncio.get_running_loop().time() + seconds
    while asyncio.get_running_loop().time() < deadline:
        await health.poll_once()
        seen.add(health.state)
    return seen


def test_health_states_come_from_polled_stats_without_running_requests():
    async def scenario():
        client = FakeClient()
        health = HealthMonitor(client, answer_wait_s=0.02, watchdog_s=10.0)
        assert health.check() == (False, "starting: the server has not answered yet")
        client.delay_s = 0.1
        await health.poll_once()
        assert health.state == "starting"  # no answer yet
        await poll_for(health, 0.15)
        assert health.check()[0] and health.state == "ready"
        client.delay_s, client.error = 0.0, ServerError("refused")
        await poll_for(health, 0.05)
        healthy, detail = health.check()
        assert not healthy and health.state == "broken" and "stats request failed" in detail
        client.error = None
        await health.poll_once()
        assert health.state == "ready" and client.num_generates == 0  # /health never runs a request
        assert await health.probe_generate() == (True, "generated one token") and client.num_generates == 1
        health.mark_draining("test")
        await health.poll_once()
        assert health.check()[0] is False and health.state == "draining"

    asyncio.run(scenario())


def test_health_stays_ready_while_a_long_step_delays_the_stats_answer():
    """A scheduler in a model step answers stats when the step ends: an answer 10x later than a
    poll waits (the old 5 s "broken" threshold, scaled down) is a busy server, not a broken one;
    one request is in flight at a time, however slow."""
    async def scenario():
        client = FakeClient()
        health = HealthMonitor(client, answer_wait_s=0.02, watchdog_s=1.0)
        await poll_for(health, 0.05)
        assert health.state == "ready"
        client.stats_reply.update(num_waiting=1, num_running=1)
        for step in range(1, 4):  # three steps of 0.3 s each, with work waiting all along
            client.stats_reply["num_steps"] = step
            client.delay_s = 0.3
            num_asked = client.num_stats
            seen = await poll_for(health, 0.35)
            assert seen == {"ready"}, seen
            assert client.num_stats - num_asked <= 2  # not one request per poll

    asyncio.run(scenario())


def test_health_is_stalled_when_no_answer_and_no_step_outlast_the_watchdog():
    async def scenario():
        client = FakeClient()
        health = HealthMonitor(client, answer_wait_s=0.02, watchdog_s=0.3)
        await poll_for(health, 0.05)
        client.stats_reply.update(num_steps=1, num_waiting=1)
        await poll_for(health, 0.05)
        client.delay_s = 0.6  # the worker hangs for twice the watchdog: the scheduler answers late
        assert await poll_for(health, 0.2) == {"ready"}
        await poll_for(health, 0.2)
        healthy, detail = health.check()
        assert not healthy and health.state == "stalled" and "no step for" in detail and "--watchdog-timeout 0.3s" in detail
        client.delay_s = 0.0
        client.stats_reply["num_steps"] = 2  # the late answer shows a step done: ready again
        await poll_for(health, 0.3)
        assert health.state == "ready"

    asyncio.run(scenario())


def test_health_is_stalled_when_work_waits_and_no_step_runs():
    health = HealthMonitor(FakeClient(), watchdog_s=10.0)
    busy = {"num_steps": 5, "num_waiting": 2}
    health.on_stats(busy, now_s=100.0)
    health.on_stats(busy, now_s=105.0)
    assert health.state == "ready"
    health.on_stats(busy, now_s=111.0)
    assert health.state == "stalled" and "no step ran for 11s" in health.reason
    health.on_stats({**busy, "num_steps": 6}, now_s=112.0)
    assert health.state == "ready"
    health.on_stats({"num_steps": 6}, now_s=500.0)  # idle: no step is expected
    assert health.state == "ready"


def test_metrics_render_parses_with_and_without_stats():
    metrics = ServerMetrics("tiny")
    metrics.count_response("/v1/completions", 200)
    metrics.count_aborted("client_disconnect")
    ttft = Histogram.of(TTFT_BOUNDS_S)
    ttft.observe(0.01)
    ttft.observe(100.0)
    scheduler = SchedulerStats(
        num_running=2, num_waiting=1, num_prompt_tokens=10, num_prefix_hit_tokens=4, num_generated_tokens=7, num_retracted=3,
        num_free_pages=6, num_cached_pages=0, num_used_pages=3, num_reserved_pages=1,
    )
    frontend = FrontendStats(num_in_flight=0, is_draining=False, num_finished={FinishReason.LENGTH: 5}, num_errors={ErrorCode.INVALID: 2})
    stats = StatsOut(req_id=1, scheduler=scheduler, frontend=frontend, histograms={"time_to_first_token_seconds": ttft})
    text = metrics.render(stats).decode()
    assert "_created" not in text
    samples = {s.name: s for f in text_string_to_metric_families(text) for s in f.samples}
    assert all(s.labels.get("model_name") == "tiny" for s in samples.values()), text
    assert samples["zserve_num_requests_running"].value == 2
    assert samples["zserve_scheduler_retracted_requests_total"].value == 3
    assert samples["zserve_prefix_cache_hit_rate"].value == pytest.approx(0.4)
    assert samples["zserve_kv_cache_usage_ratio"].value == pytest.approx(4 / 9)  # (3 used + 1 reserved) / 9 pages
    assert samples["zserve_generation_tokens_total"].value == 7
    assert samples["zserve_time_to_first_token_seconds_count"].value == 2
    assert samples["zserve_time_to_first_token_seconds_sum"].value == pytest.approx(100.01)
    buckets = {s.labels["le"]: s.value for f in text_string_to_metric_families(text) for s in f.samples
               if s.name == "zserve_time_to_first_token_seconds_bucket"}
    assert buckets["0.01"] == 1 and buckets["40.0"] == 1 and buckets["+Inf"] == 2
    outcomes = {(s.name, tuple(sorted(s.labels.items()))): s.value for f in text_string_to_metric_families(text) for s in f.samples}
    assert outcomes[("zserve_request_outcomes_total", (("finish_reason", "length"), ("model_name", "tiny")))] == 5
    assert outcomes[("zserve_request_errors_total", (("code", "invalid"), ("model_name", "tiny")))] == 2
    assert samples["zserve_requests_aborted_total"].labels == {"model_name": "tiny", "cause": "client_disconnect"}
    down = {s.name: s.value for f in text_string_to_metric_families(metrics.render(None).decode()) for s in f.samples}
    assert down["zserve_scheduler_up"] == 0 and "zserve_num_requests_running" not in down


def test_echo_asks_for_prompt_logprobs_only_with_logprobs():
    [sub] = CompletionRequest(prompt="a", echo=True, logprobs=2).sub_requests()
    assert sub.sampling["prompt_logprobs"] == 2 and sub.sampling["top_logprobs"] == 2
    [sub] = CompletionRequest(prompt="a", echo=True).sub_requests()
    assert "prompt_logprobs" not in sub.sampling  # the text is echoed; nothing is scored
    [sub] = CompletionRequest(prompt="a", logprobs=1).sub_requests()
    assert "prompt_logprobs" not in sub.sampling


def test_max_tokens_zero_only_with_echo_and_then_one_token_is_asked():
    """echo with max_tokens 0 (lm-eval-harness' loglikelihood requests) generates one token that the
    answer drops; without echo, 0 is refused naming max_tokens, as is min_tokens above 0."""
    [sub] = CompletionRequest(prompt="a", echo=True, logprobs=1, max_tokens=0).sub_requests()
    assert sub.sampling["max_tokens"] == 1 and sub.sampling["prompt_logprobs"] == 1
    for request, param in [
        (CompletionRequest(prompt="a", max_tokens=0), "max_tokens"),
        (CompletionRequest(prompt="a", echo=True, max_tokens=0, min_tokens=1), "min_tokens"),
    ]:
        with pytest.raises(ApiError) as info:
            request.sub_requests()
        assert info.value.status == 400 and info.value.param == param
