"""POST /v1/embeddings in OpenAI's shape, for a server started with --task embed (vLLM's --runner
pooling, SGLang's --is-embedding).

    {model?, input: str | [str] | [int] | [[int]], encoding_format = "float" | "base64", dimensions?, user?}
    -> {"object": "list", "data": [{"object": "embedding", "index", "embedding"}], "model",
        "usage": {"prompt_tokens", "total_tokens"}}

Each input is one request to the server, all in flight at once; the scheduler prefills it (in chunks
when long) and the worker pools the final hidden states as the model's sentence-transformers config
says (common/pooling.py). `base64` is the float32 little-endian bytes, as the OpenAI SDK decodes them.
`dimensions` other than the model's size is a 400 (nothing here shortens vectors), as is vLLM's
`truncate_prompt_tokens` (an input past the context is refused, never cut); `user` is ignored.
On a generating server this route is a 400 saying to start it with --task embed.
"""

from __future__ import annotations

import base64
from typing import Literal

import numpy as np
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from zserve.http_proc.shared.api_error import ApiError
from zserve.http_proc.shared.http_state import HttpState
from zserve.http_proc.shared.request_body import RequestModel, parse_body
from zserve.http_proc.shared.response_guard import guarded

MAX_INPUTS = 2048  # OpenAI's own bound on one request's inputs


class EmbeddingRequest(RequestModel):
    model: str | None = None
    input: str | list[str] | list[int] | list[list[int]]
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: int | None = None
    user: str | None = None  # ignored: nothing here is per user
    truncate_prompt_tokens: int | None = None  # vLLM's: refused (it would change the answer; nothing is cut here)

    def bodies(self) -> list[dict]:
        """One prompt keyword per input (a 400 for an empty or oversized input list)."""
        if self.truncate_prompt_tokens is not None:
            raise ApiError(400, "truncate_prompt_tokens is not supported on /v1/embeddings by this server: an input "
                                "longer than the context is refused, never cut", param="truncate_prompt_tokens")
        inputs = self.input
        if isinstance(inputs, str):
            return [{"prompt": inputs}]
        if not inputs:
            raise ApiError(400, "input is empty: give a string, a list of strings or token ids", param="input")
        if len(inputs) > MAX_INPUTS:
            raise ApiError(400, f"input has {len(inputs)} entries; at most {MAX_INPUTS} a request", param="input")
        if isinstance(inputs[0], int):  # one prompt as token ids
            return [{"input_ids": inputs}]
        return [{"prompt": x} if isinstance(x, str) else {"input_ids": x} for x in inputs]


def embeddings_routes(state: HttpState) -> list[Route]:
    async def embeddings(request: Request) -> Response:
        return await guarded(state, "/v1/embeddings", request, lambda: serve_embeddings(state, request))

    return [Route("/v1/embeddings", embeddings, methods=["POST"])]


async def serve_embeddings(state: HttpState, request: Request) -> Response:
    body = parse_body(EmbeddingRequest, await request.body())
    state.unknown_fields.check(body, "/v1/embeddings")
    state.check_model(body.model)
    if state.embedding_size is None:
        raise ApiError(400, "this server generates text; /v1/embeddings needs a server started with --task embed "
                            "(--runner pooling, --is-embedding)", param="model")
    if body.dimensions is not None and body.dimensions != state.embedding_size:
        raise ApiError(400, f"dimensions must be the model's embedding size, {state.embedding_size} "
                            f"(this server does not shorten vectors); got {body.dimensions}", param="dimensions")
    bodies = body.bodies()
    state.check_accepting()
    req_ids = await state.client.submit_all(bodies, embed=True, max_tokens=None)
    results = await state.client.results(req_ids)
    data = [{"object": "embedding", "index": i, "embedding": _encoded(r.embedding, body.encoding_format)}
            for i, r in enumerate(results)]
    num_tokens = sum(r.usage.prompt_tokens for r in results)
    return JSONResponse({"object": "list", "data": data, "model": state.model_name,
                         "usage": {"prompt_tokens": num_tokens, "total_tokens": num_tokens}},
                        headers={"X-Request-Id": str(req_ids[0])})


def _encoded(vector: np.ndarray | None, encoding_format: str) -> list[float] | str:
    assert vector is not None, "an embedding request's result carries its vector"
    if encoding_format == "base64":
        return base64.b64encode(vector.astype("<f4").tobytes()).decode("ascii")
    return vector.tolist()
