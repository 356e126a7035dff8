"""`launch_server` flags, read from ServerConfig's fields (defaults, help, choices and ranges live there).

A bad value is refused here in one line (`launch_server: error: ...`, exit code 2), without the
usage text: launcher/config_check.py refuses what needs more than one flag the same way.
"""

from __future__ import annotations

import argparse
import math
import operator
import sys
from collections.abc import Callable
from dataclasses import MISSING, fields
from typing import NoReturn

from common.server_config import ServerConfig

PROG = "launch_server"


class OneLineParser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        refuse(message)


def refuse(message: str) -> NoReturn:
    """The launcher's answer to a bad configuration: one line on stderr, exit code 2."""
    sys.stderr.write(f"{PROG}: error: {' '.join(message.splitlines())}\n")  # one line, whatever the message
    sys.exit(2)


BOUNDS = (("min", ">=", operator.ge), ("max", "<=", operator.le), ("above", ">", operator.gt), ("below", "<", operator.lt))


def ranged(kind: type, metadata: dict) -> Callable[[str], int | float]:
    """argparse type: `kind`, within the field's "min" / "max" (inclusive) and "above" / "below" (exclusive)."""
    checks = [(word, metadata[key], holds) for key, word, holds in BOUNDS if key in metadata]
    wanted = " and ".join(f"{word} {bound}" for word, bound, _ in checks)

    def parse(text: str) -> int | float:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {'an integer' if kind is int else 'a number'}, got {text!r}") from None
        if not math.isfinite(value):
            raise argparse.ArgumentTypeError(f"expected a finite number, got {text!r}")
        if not all(holds(value, bound) for _, bound, holds in checks):
            raise argparse.ArgumentTypeError(f"must be {wanted}, got {text}")
        return value

    return parse


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(
        prog=PROG, description="Start a zserve server: tokenizer, scheduler, model worker and detokenizer processes."
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
            flag, type=kind if kind is str else ranged(kind, f.metadata), default=default,
            choices=f.metadata.get("choices"), help=f"{help_text} (default: {default!r})",
        )
    return parser


def parse_config(argv: list[str] | None = None) -> ServerConfig:
    ns = build_parser().parse_args(argv)
    return ServerConfig(**vars(ns))
