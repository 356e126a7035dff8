"""The frontend's answer to a TokenizeReq (POST /tokenize, /detokenize): its own tokenizer and chat
template, the same checks a generate request's prompt gets (RequestValidator), nothing scheduled.

A prompt may be as long as the context allows a generate request's (vLLM's /tokenize counts a prompt that
does not fit too; here the limits stay one set, so that a 400 here is the 400 generate would give).
"""

from __future__ import annotations

from zserve.common.error_code import ErrorCode
from zserve.common.messages import TokenizeOut, TokenizeReq
from zserve.tokenizer_proc.request_validator import RequestValidator

PROMPT_KEYS = ("prompt", "messages", "input_ids")


def answer_tokenize(validator: RequestValidator, msg: TokenizeReq) -> TokenizeOut:
    """The ids of the body's prompt or messages, or the text of its input_ids; INVALID with the reason."""
    body = msg.body
    given = [k for k in PROMPT_KEYS if body.get(k) is not None]
    token_strs = body.get("return_token_strs", False)
    try:
        if len(given) != 1 or not isinstance(msg.add_special_tokens, bool):
            raise ValueError(f"give exactly one of prompt, messages, input_ids; got {' and '.join(given) or 'none'}")
        if not isinstance(token_strs, bool):
            raise ValueError(f"return_token_strs must be a boolean, got {type(token_strs).__name__}")
        if given == ["input_ids"]:
            ids = validator.check_ids(body["input_ids"])
            return TokenizeOut(msg.req_id, input_ids=ids, text=validator.tokenizer.decode(ids))
        if given == ["prompt"]:
            ids = validator.encode_prompt(body["prompt"], msg.add_special_tokens)
        else:
            ids = validator.encode_messages(body["messages"], validator.chat_options(body))
    except ValueError as exc:
        return TokenizeOut(msg.req_id, code=ErrorCode.INVALID, error=str(exc))
    strs = validator.tokenizer.token_strs(ids) if token_strs else None
    return TokenizeOut(msg.req_id, input_ids=list(ids), token_strs=strs)
