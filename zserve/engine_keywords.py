"""The keyword arguments of zserve.Engine and zserve.LLM: every spelling of a launch_server flag, read from the
flags table (common/server_flags.py), so the keywords and the command line cannot drift apart.

    ServerConfig field      tp_size, max_prefill_tokens         (zserve's own names)
    the flag, any alias     --tp-size --tensor-parallel-size    -> tp_size=, tensor_parallel_size=
                            --chunked-prefill-size              -> chunked_prefill_size=
    a peer's switch         --enable-prefix-caching             -> enable_prefix_caching=True / False

A keyword the table does not know (vLLM's `cpu_offload_gb`, a typo) is a TypeError naming it; a flag the CLI
accepts and ignores (`--trust-remote-code`) is accepted and ignored here too, with the server's note.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

from zserve.common.server_config import ServerConfig
from zserve.common.server_flags import FLAG_SPECS, flag_of


@dataclass(frozen=True, slots=True)
class Keyword:
    field: str  # the ServerConfig field it sets
    switch_value: Any = None  # a peer's switch (--enable-prefix-caching): the value it sets when True
    is_switch: bool = False


def keyword_of(spelling: str) -> str:
    """`--tensor-parallel-size` -> `tensor_parallel_size`."""
    return spelling.lstrip("-").replace("-", "_")


def engine_keywords() -> dict[str, Keyword]:
    """keyword -> what it sets: the ServerConfig field names, and every flag spelling of the flags table."""
    table: dict[str, Keyword] = {}
    for name, spec in FLAG_SPECS.items():
        for spelling in (flag_of(name), *spec.aliases):
            table.setdefault(keyword_of(spelling), Keyword(name))
        for switch, value in spec.switches.items():
            table.setdefault(keyword_of(switch), Keyword(name, value, is_switch=True))
    table.update({f.name: Keyword(f.name) for f in fields(ServerConfig)})  # the field names win (zserve's API)
    return table


def config_values(kwargs: Mapping[str, Any], caller: str, given: Mapping[str, str] | None = None) -> dict[str, Any]:
    """ServerConfig field -> value for the keywords `kwargs` of `caller` ("Engine()", "LLM()"); `given`: fields
    set already (field -> the argument that set it). TypeError for an unknown keyword, or two setting one field."""
    table = engine_keywords()
    bool_fields = {f.name for f in fields(ServerConfig) if f.type in ("bool", bool)}
    values: dict[str, Any] = {}
    set_by = dict(given or {})
    for keyword, value in kwargs.items():
        if keyword not in table:
            raise TypeError(
                f"{caller} got an unknown server flag {keyword!r}; the keywords are launch_server's flags "
                "in any spelling, SGLang's and vLLM's included (tp_size, tensor_parallel_size)"
            )
        entry = table[keyword]
        if entry.field in set_by:
            raise TypeError(f"{caller} got {set_by[entry.field]!r} and {keyword!r}, which set the same flag")
        set_by[entry.field] = keyword
        if not entry.is_switch:
            values[entry.field] = value
        elif not isinstance(value, bool):
            raise TypeError(f"{caller}: {keyword} takes True or False, got {value!r}")
        elif value:
            values[entry.field] = entry.switch_value
        elif entry.field in bool_fields:  # enable_prefix_caching=False: the switch's opposite
            values[entry.field] = not entry.switch_value
    return values


def flag_args(values: Mapping[str, Any]) -> list[str]:
    """ServerConfig field -> value, as launch_server arguments (a bool field: its flag when True)."""
    argv: list[str] = []
    for name, value in values.items():
        flag = flag_of(name)
        if isinstance(value, bool):
            argv += [flag] if value else []
        elif isinstance(value, (list, tuple)):
            argv += [flag, *map(str, value)]
        else:
            argv += [flag, str(value)]
    return argv
