"""zserve.SamplingParams: the per-request options (common/sampling_params.py, the wire message, whose field
names it takes) plus vLLM's names for what the wire spells otherwise:

    n=4                            4 choices of the prompt (a request field next to the prompt)
    logprobs=k                     each output token's logprob and the k most likely (return_logprob, top_logprobs)
    include_stop_str_in_output     the stop string stays in the text (SGLang's no_stop_trim)
    top_k=-1                       off (vLLM's and SGLang's old "off"; ours is 0)

A bad value is a ValueError when the object is made, with the server's own message. No max_tokens: the
native default (128 new tokens; vLLM's is 16); `temperature` defaults to 0 (greedy; vLLM's to 1).
"""

from __future__ import annotations

from typing import Any

from msgspec.structs import asdict

from zserve.common.choices import bad_n_error, num_choices
from zserve.common.request_limits import LIMITS
from zserve.common.sampling_params import SamplingParams as WireSamplingParams

PEER_FIELDS = ("n", "logprobs", "include_stop_str_in_output")


class SamplingParams(WireSamplingParams, frozen=True):
    n: int = 1
    logprobs: int | None = None  # vLLM's: this many most likely tokens at each output position, with the chosen one
    include_stop_str_in_output: bool = False

    def __post_init__(self) -> None:
        self.request_options()  # raises ValueError for a bad value

    def request_options(self) -> dict[str, Any]:
        """The request's options as the clients take them (sampling fields and `n`); None values left out,
        so a missing max_tokens is the clients' default."""
        d = asdict(self)
        n, logprobs, keep_stop = (d.pop(name) for name in PEER_FIELDS)
        if isinstance(d["stop"], str):
            d["stop"] = [d["stop"]]
        d["stop"], d["stop_token_ids"] = list(d["stop"]), list(d["stop_token_ids"])
        d["logit_bias"] = {str(k): v for k, v in d["logit_bias"].items()}  # vLLM's int token ids; strings on the wire
        if d["top_k"] == -1:
            d["top_k"] = 0
        if logprobs is not None:
            if type(logprobs) is not int or not 0 <= logprobs <= LIMITS.max_top_logprobs:
                raise ValueError(f"logprobs must be an integer in [0, {LIMITS.max_top_logprobs}], got {logprobs!r:.64}")
            d["return_logprob"], d["top_logprobs"] = True, logprobs
        if not isinstance(keep_stop, bool):
            raise ValueError(f"include_stop_str_in_output must be a boolean, got {keep_stop!r:.64}")
        d["no_stop_trim"] = d["no_stop_trim"] or keep_stop
        options = {k: v for k, v in d.items() if v is not None}
        WireSamplingParams.from_dict(options)  # the server's checks, here at once
        if num_choices({"n": n}) is None:
            raise ValueError(bad_n_error({"n": n}))
        return {**options, **({"n": n} if n != 1 else {})}


def request_options(sampling: dict[str, Any] | WireSamplingParams | None) -> dict[str, Any]:
    """One sampling setting as the clients' keyword options: a dict as it is ({"max_tokens": None} stays: up to
    the context), a SamplingParams without its None values (a missing max_tokens: the clients' 128)."""
    if sampling is None:
        return {}
    if isinstance(sampling, SamplingParams):
        return sampling.request_options()
    if isinstance(sampling, WireSamplingParams):
        return {k: v for k, v in sampling.to_dict().items() if v is not None}
    if not isinstance(sampling, dict):
        raise TypeError(f"a sampling setting is a dict or a SamplingParams, got {type(sampling).__name__}")
    return dict(sampling)
