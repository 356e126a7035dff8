"""The one frozen server configuration, built once by the launcher from the CLI.

`ServerConfig` is every section of config_sections.py at once, so a flag is one flat field
(`cfg.page_size`, `ServerConfig(page_size=32)`, as SGLang's ServerArgs), and a component that
reads one part of it takes that section, typed (`cfg.section(SchedulerSection)`; a ServerConfig
is an instance of every section, so tests may pass one where a section is asked for). The
flags' meaning, spellings, choices and ranges are in the flags table (server_flags.py), which
launcher/cli.py turns into the parser. Every child process receives the same config as JSON on
its command line.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, fields
from typing import TypeVar

from zserve.common.config_sections import (
    API_KEY_ENV,
    DEFAULT_CLIENT_PORT,
    DEFAULT_HTTP_PORT,
    CacheSection,
    FleetSection,
    FrontendSection,
    HttpSection,
    KernelSection,
    ModelSection,
    ParallelSection,
    SchedulerSection,
    SpeculationSection,
)

__all__ = ["API_KEY_ENV", "DEFAULT_CLIENT_PORT", "DEFAULT_HTTP_PORT", "ServerConfig"]

Section = TypeVar("Section")


# A dataclass takes its bases' fields from the last base to the first: ModelSection's fields come first,
# FleetSection's last (config_sections.SECTIONS, the order of the README's flags table).
@dataclass(frozen=True)
class ServerConfig(
    FleetSection, HttpSection, FrontendSection, KernelSection, SpeculationSection, SchedulerSection, CacheSection,
    ParallelSection, ModelSection,
):
    def section(self, kind: type[Section]) -> Section:
        """This config's values of one section's fields, as that section's own record."""
        return kind(**{f.name: getattr(self, f.name) for f in fields(kind)})

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @staticmethod
    def from_json(text: str) -> ServerConfig:
        data = json.loads(text)
        known = {f.name for f in fields(ServerConfig)}
        return ServerConfig(**{k: v for k, v in data.items() if k in known})
