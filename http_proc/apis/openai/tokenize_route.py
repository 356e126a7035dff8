"""POST /tokenize and /detokenize in vLLM's shapes, answered by the frontend's tokenizer (nothing is scheduled).

    /tokenize    {model?, prompt, add_special_tokens = true, return_token_strs = false}
                 {model?, messages, tools?, add_generation_prompt = true, continue_final_message = false,
                  chat_template?, chat_template_kwargs?, add_special_tokens = false, return_token_strs = false}
                 -> {"count", "max_model_len", "tokens", "token_strs": [...] or null}
    /detokenize  {model?, tokens} -> {"prompt"}

Messages are rendered as a chat request's are (the server's chat template, or the request's own
`chat_template`; tokenizer_proc/chat_options.py). What vLLM takes and zserve does not do here
(`add_special_tokens` with messages: the template writes its own) is a 400 naming it; a prompt's checks and
limits are a generate request's (tokenizer_proc/tokenize_answer.py).
"""

from __future__ import annotations

from typing import Any

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
    chat_template_kwargs: dict[str, Any] | None = None

    def body(self) -> dict:
        """What the frontend encodes; a 400 for what vLLM takes and this server does not."""
        if (self.prompt is None) == (self.messages is None):
            raise ApiError(400, "give exactly one of prompt and messages", param="prompt")
        if self.messages is not None and self.add_special_tokens:
            raise ApiError(400, "add_special_tokens is not supported with messages on /tokenize by this server "
                           "(the chat template writes its own)", param="add_special_tokens")
        token_strs = {"return_token_strs": True} if self.return_token_strs else {}
        if self.prompt is not None:
            for name in ("tools", "chat_template", "chat_template_kwargs"):
                if getattr(self, name) is not None:
                    raise ApiError(400, f"{name} needs messages, not a prompt", param=name)
            if not self.add_generation_prompt or self.continue_final_message:
                name = "continue_final_message" if self.continue_final_message else "add_generation_prompt"
                raise ApiError(400, f"{name} needs messages, not a prompt", param=name)
            return {"prompt": self.prompt, **token_strs}
        chat = {
            "tools": [t.to_dict() for t in self.tools] if self.tools else None,
            "continue_final_message": self.continue_final_message or None,
            "add_generation_prompt": None if self.add_generation_prompt else False,
            "chat_template": self.chat_template, "chat_template_kwargs": self.chat_template_kwargs,
        }
        messages = [m.to_dict(i) for i, m in enumerate(self.messages)]
        return {"messages": messages, **{k: v for k, v in chat.items() if v is not None}, **token_strs}


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
                         "token_strs": answer.token_strs})


async def serve_detokenize(state: HttpState, request: Request) -> Response:
    body = parse_body(DetokenizeRequest, await request.body())
    state.unknown_fields.check(body, "/detokenize")
    state.check_model(body.model)
    answer = await state.client.tokenize({"input_ids": body.tokens})
    return JSONResponse({"prompt": answer.text})
