"""zserve's Python client: `Client` (sync) and `AsyncClient` (asyncio)."""

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

__all__ = [
    "AsyncClient",
    "Client",
    "GenerateResult",
    "InvalidRequestError",
    "RequestTimeoutError",
    "ServerBusyError",
    "ServerError",
    "ServerGoneError",
    "ServerShuttingDownError",
    "TextStream",
    "UnauthorizedError",
    "Usage",
]
