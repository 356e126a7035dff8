"""zserve's public names: `import zserve`.

    from zserve import Engine, Client, AsyncClient, SamplingParams

The design's top-level folders (client/, common/, launcher/, ...) are this package's parts:
`zserve.client`, `zserve.common`, `zserve.launcher`, ... pyproject.toml maps each folder under the
`zserve` name, so an installed zserve puts only `zserve` into site-packages and a user's own
`client.py` or `common.py` cannot shadow any part of it (scripts/setup.sh installs it editable).
"""


from zserve.client.async_client import AsyncClient
from zserve.client.client import Client, TextStream
from zserve.client.types import (
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
from zserve.common.error_code import ErrorCode
from zserve.common.sampling_params import SamplingParams
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
