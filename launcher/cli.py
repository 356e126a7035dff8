"""`launch_server` flags, read from ServerConfig's fields (defaults and help live there)."""

from __future__ import annotations

import argparse
from dataclasses import MISSING, fields

from common.server_config import ServerConfig


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="launch_server", description="Start a zserve server: tokenizer, scheduler, model worker and detokenizer processes."
    )
    for f in fields(ServerConfig):
        flag = "--" + f.name.replace("_", "-")
        default = f.default if f.default is not MISSING else None
        help_text = f.metadata.get("help", "")
        if f.type in ("bool", bool):
            parser.add_argument(flag, action="store_true", default=default, help=help_text)
            continue
        kind = {"int": int, "float": float, "str": str}[f.type if isinstance(f.type, str) else f.type.__name__]
        parser.add_argument(
            flag, type=kind, default=default, choices=f.metadata.get("choices"), help=f"{help_text} (default: {default!r})"
        )
    return parser


def parse_config(argv: list[str] | None = None) -> ServerConfig:
    ns = build_parser().parse_args(argv)
    return ServerConfig(**vars(ns))
