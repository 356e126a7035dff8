"""POST /tokenize and /detokenize in vLLM's shapes, answered by the frontend's tokenizer (nothing is scheduled).

    /tokenize    {model?, prompt, add_special_tokens = true}
                 {model?, messages, tools?, add_generation_prompt = true, add_special_tokens = false}
                 -> {"count", "max_model_len", "tokens", "token_strs": null}
    /detokenize  {model?, tokens} -> {"prompt"}

Messages are rendered with the server's chat template, as a chat request's are. What vLLM takes and zserve
does not do here (`return_token_strs`, `add_generation_prompt: false`, `continue_final_message`,
`add_special_tokens` with messages, `chat_template`) is a 400 naming it; a prompt's checks and limits are a
generate request's (tokenizer_proc/tokenize_answer.py).
"""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from zserve.http_proc.apis.openai.protocol import ChatMessage, Tool
from zserve.http_proc.shared.api_error import ApiError
from zserve.http_proc.shared.http_state import HttpState
from zserve.http_proc.shared.request_body import RequestModel, parse_body
from zserve.http_proc.shared.response_guard import guarded


class TokenizeRequest(RequestModel):
    model: str | None = None
    prompt: str | None = None
    messages: list[ChatMessage] | None = None
    tools: list[Tool] | None = None
    add_special_tokens: bool | None = None  # vLLM's defaults: true with a prompt, false with messages
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    return_token_strs: bool = False
    chat_template: str | None = None

    def body(self) -> dict:
        """What the frontend encodes; a 400 for what vLLM takes and this server does not."""
        if (self.prompt is None) == (self.messages is None):
            raise ApiError(400, "give exactly one of prompt and messages", param="prompt")
        refused = {
            "return_token_strs": self.return_token_strs,
            "add_generation_prompt": not self.add_generation_prompt,
            "continue_final_message": self.continue_final_message,
            "chat_template": self.chat_template is not None,
            "add_special_tokens": self.messages is not None and bool(self.add_special_tokens),
            "tools": self.prompt is not None and self.tools is not None,
        }
        for name, is_refused in refused.items():
            if is_refused:
                raise ApiError(400, f"{name} is not supported on /tokenize by this server", param=name)
        if self.prompt is not None:
            return {"prompt": self.prompt}
        messages = [m.to_dict(i) for i, m in enumerate(self.messages)]
        return {"messages": messages, **({"tools": [t.to_dict() for t in self.tools]} if self.tools else {})}


class DetokenizeRequest(RequestModel):
    model: str | None = None
    tokens: list[int]


def tokenize_routes(state: HttpState) -> list[Route]:
    async def tokenize(request: Request) -> Response:
        return await guarded(state, "/tokenize", request, lambda: serve_tokenize(state, request))

    async def detokenize(request: Request) -> Response:
        return await guarded(state, "/detokenize", request, lambda: serve_detokenize(state, request))

    return [Route("/tokenize", tokenize, methods=["POST"]), Route("/detokenize", detokenize, methods=["POST"])]


async def serve_tokenize(state: HttpState, request: Request) -> Response:
    body = parse_body(TokenizeRequest, await request.body())
    state.unknown_fields.check(body, "/tokenize")
    state.check_model(body.model)
    add_special_tokens = body.add_special_tokens is not False  # only a prompt reaches here with it true
    answer = await state.client.tokenize(body.body(), add_special_tokens)
    tokens = list(answer.input_ids)
    return JSONResponse({"count": len(tokens), "max_model_len": state.context_len, "tokens": tokens,
                         "token_strs": None})


async def serve_detokenize(state: HttpState, request: Request) -> Response:
    body = parse_body(DetokenizeRequest, await request.body())
    state.unknown_fields.check(body, "/detokenize")
    state.check_model(body.model)
    answer = await state.client.tokenize({"input_ids": body.tokens})
    return JSONResponse({"prompt": answer.text})
