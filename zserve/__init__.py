"""zserve's public names: `import zserve`.

    from zserve import Engine, LLM, Client, AsyncClient, SamplingParams

The design's top-level folders (client/, common/, launcher/, ...) are this package's parts:
`zserve.client`, `zserve.common`, `zserve.launcher`, ... pyproject.toml maps each folder under the
`zserve` name, so an installed zserve puts only `zserve` into site-packages and a user's own
`client.py` or `common.py` cannot shadow any part of it (scripts/setup.sh installs it editable).
"""


from zserve import client as _client
from zserve.client import *  # noqa: F403  (the client's public names, listed once in zserve/client/__init__.py)
from zserve.common.error_code import ErrorCode as ErrorCode
from zserve.engine import Engine as Engine
from zserve.engine import EngineError as EngineError
from zserve.llm import LLM as LLM
from zserve.request_output import CompletionOutput as CompletionOutput
from zserve.request_output import RequestOutput as RequestOutput
from zserve.sampling_params import SamplingParams as SamplingParams

__all__ = sorted([
    *_client.__all__, "CompletionOutput", "Engine", "EngineError", "ErrorCode", "LLM", "RequestOutput",
    "SamplingParams",
])
