"""zserve's public names: `import zserve`.

    from zserve import Engine, Client, AsyncClient, SamplingParams

The internal packages (client/, common/, launcher/, ...) stay where they are; this package is the
stable name a user's code imports, and a user's own `client.py` cannot shadow it.
"""

from client.async_client import AsyncClient
from client.client import Client, TextStream
from client.types import (
    GenerateResult,
    InvalidRequestError,
    RequestTimeoutError,
    ServerBusyError,
    ServerError,
    ServerGoneError,
    ServerShuttingDownError,
    UnauthorizedError,
    Usage,
)
from common.error_code import ErrorCode
from common.sampling_params import SamplingParams
from zserve.engine import Engine, EngineError

__all__ = [
    "AsyncClient",
    "Client",
    "Engine",
    "EngineError",
    "ErrorCode",
    "GenerateResult",
    "InvalidRequestError",
    "RequestTimeoutError",
    "SamplingParams",
    "ServerBusyError",
    "ServerError",
    "ServerGoneError",
    "ServerShuttingDownError",
    "TextStream",
    "UnauthorizedError",
    "Usage",
]
