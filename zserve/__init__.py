"""zserve's public names: `import zserve`.

    from zserve import Engine, LLM, Client, AsyncClient, SamplingParams

The design's top-level folders (client/, common/, launcher/, ...) are this package's parts:
`zserve.client`, `zserve.common`, `zserve.launcher`, ... pyproject.toml maps each folder under the
`zserve` name, so an installed zserve puts only `zserve` into site-packages and a user's own
`client.py` or `common.py` cannot shadow any part of it (scripts/setup.sh installs it editable).

The public names are imported on first use (PEP 562 `__getattr__`): every server process imports
a part of this package (`zserve.model_proc`, `zserve.scheduler_proc`, ...), and none of them should
pay for the client, the Engine and numpy at start (about 0.3 s each on a 2-core machine).
"""

from importlib import import_module

_CLIENT_NAMES = (
    "AsyncClient", "Client", "GenerateResult", "InvalidRequestError", "RequestTimeoutError", "ServerBusyError",
    "ServerError", "ServerGoneError", "ServerShuttingDownError", "TextStream", "UnauthorizedError", "Usage",
)
_HOMES = {  # public name -> the module that defines it
    **dict.fromkeys(_CLIENT_NAMES, "zserve.client"),
    "ErrorCode": "zserve.common.error_code",
    "Engine": "zserve.engine",
    "EngineError": "zserve.engine",
    "LLM": "zserve.llm",
    "CompletionOutput": "zserve.request_output",
    "RequestOutput": "zserve.request_output",
    "SamplingParams": "zserve.sampling_params",
}
__all__ = sorted(_HOMES)


def __getattr__(name: str):
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'zserve' has no attribute {name!r}")
    value = getattr(import_module(home), name)
    globals()[name] = value  # once: later lookups find it without this hook
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
