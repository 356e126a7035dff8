"""`launch_server` flags: one per ServerConfig field (its type and default), with the flags table's
help, spellings, choices and ranges (common/server_flags.py).

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

from zserve.common.server_config import ServerConfig
from zserve.common.server_flags import FLAG_SPECS, FlagSpec, env_defaults, flag_of

PROG = "launch_server"


class OneLineParser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        refuse(message)


def refuse(message: str) -> NoReturn:
    """The launcher's answer to a bad configuration: one line on stderr, exit code 2."""
    sys.stderr.write(f"{PROG}: error: {' '.join(message.splitlines())}\n")  # one line, whatever the message
    sys.exit(2)


BOUNDS = (
    ("min", ">=", operator.ge), ("max", "<=", operator.le), ("above", ">", operator.gt), ("below", "<", operator.lt),
)


def ranged(kind: type, spec: FlagSpec) -> Callable[[str], int | float]:
    """argparse type: `kind`, within the flag's min / max (inclusive) and above / below (exclusive)."""
    checks = [(word, getattr(spec, key), holds) for key, word, holds in BOUNDS if getattr(spec, key) is not None]
    wanted = " and ".join(f"{word} {bound}" for word, bound, _ in checks)

    def parse(text: str) -> int | float:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"expected {'an integer' if kind is int else 'a number'}, got {text!r}"
            ) from None
        if not math.isfinite(value):
            raise argparse.ArgumentTypeError(f"expected a finite number, got {text!r}")
        if not all(holds(value, bound) for _, bound, holds in checks):
            raise argparse.ArgumentTypeError(f"must be {wanted}, got {text}")
        return value

    return parse


class DeprecatedFlag(argparse.Action):
    """An old spelling of a renamed flag: it still works, with one warning line saying why it moved."""

    def __init__(self, option_strings, dest, new_flag: str, note: str, convert: Callable[[str], object], allowed, **kw):
        super().__init__(option_strings, dest, **kw)
        self.new_flag, self.note, self.convert, self.allowed = new_flag, note, convert, allowed

    def __call__(self, parser, namespace, text, option_string=None) -> None:
        try:
            value = self.convert(text)
        except argparse.ArgumentTypeError as exc:
            parser.error(f"argument {option_string}: {exc}")
        if self.allowed is not None and value not in self.allowed:
            parser.error(
                f"argument {option_string} (now {self.new_flag}): invalid choice {text!r} (choose from "
                f"{', '.join(self.allowed)}; {self.note})"
            )
        sys.stderr.write(f"{PROG}: warning: {option_string} is deprecated, use {self.new_flag} ({self.note})\n")
        setattr(namespace, self.dest, value)


def value_type(kind: type, spec: FlagSpec) -> Callable[[str], object]:
    """argparse type of a field: ranged numbers; strings with their spelling aliases (`half`)."""
    if kind is not str:
        return ranged(kind, spec)
    return lambda text: spec.value_aliases.get(text, text)


def build_parser() -> argparse.ArgumentParser:
    """Every ServerConfig field is a flag (`--name`, or the flags table's `flag`), with the SGLang and
    vLLM spellings of the same meaning as aliases, and old spellings of renamed flags that warn."""
    parser = OneLineParser(
        prog=PROG, description="Start a zserve server: tokenizer, scheduler, model worker and detokenizer processes."
    )
    from_env = env_defaults()  # ZSERVE_* variables that set a flag's default (checked in parse_config)
    for f in fields(ServerConfig):
        spec = FLAG_SPECS[f.name]
        flag = flag_of(f.name)
        aliases = spec.aliases
        default = from_env[f.name][1] if f.name in from_env else f.default if f.default is not MISSING else None
        others = [*aliases, *spec.switches]
        help_text = spec.help + (f"; also {', '.join(others)}" if others else "")
        for switch, value in spec.switches.items():  # a peer's flag that sets one value (--disable-log-stats)
            parser.add_argument(
                switch, dest=f.name, action="store_const", const=value, default=argparse.SUPPRESS,
                help=argparse.SUPPRESS,
            )
        if f.type in ("bool", bool):
            parser.add_argument(flag, dest=f.name, action="store_true", default=default, help=help_text)
            for alias in aliases:
                parser.add_argument(
                    alias, dest=f.name, action="store_true", default=argparse.SUPPRESS, help=argparse.SUPPRESS,
                )
            continue
        kind = {"int": int, "float": float, "str": str}[f.type if isinstance(f.type, str) else f.type.__name__]
        convert = value_type(kind, spec)
        choices = spec.choices
        if choices is not None and spec.value_aliases:
            choices = [*choices, *spec.value_aliases]  # accepted spellings; the value stored is the canonical one
        checked = None if choices is None else _Choices(choices, convert)
        metavar = None if choices else flag.lstrip("-").upper().replace("-", "_")
        parser.add_argument(
            flag, dest=f.name, type=convert, default=default, choices=checked, metavar=metavar, nargs=spec.nargs,
            help=f"{help_text} (default: {default!r})",
        )
        for alias in aliases:  # its own action, so an error names the spelling the user typed
            parser.add_argument(
                alias, dest=f.name, type=convert, default=argparse.SUPPRESS, choices=checked, metavar=metavar,
                nargs=spec.nargs, help=argparse.SUPPRESS,
            )
        for old_flag, note in spec.deprecated.items():
            parser.add_argument(
                old_flag, dest=f.name, action=DeprecatedFlag, new_flag=flag, note=note, convert=convert,
                allowed=spec.choices, help=argparse.SUPPRESS,
            )
        if spec.positional:
            parser.add_argument(
                f"{f.name}_positional", nargs="?", default=None, metavar=f.name.upper(), help=f"same as {flag}",
            )
    return parser


class _Choices(list):
    """argparse checks `value in choices` after the type converted it: accept the canonical
    values; show every accepted spelling in the help and errors."""

    def __init__(self, spellings: list[str], convert: Callable[[str], object]):
        super().__init__(spellings)
        self.values = {convert(s) for s in spellings}

    def __contains__(self, value: object) -> bool:
        return value in self.values


def parse_config(argv: list[str] | None = None) -> ServerConfig:
    parser = build_parser()
    ns = vars(parser.parse_args(argv))
    for name, (variable, value) in env_defaults().items():  # argparse checks choices only on the command line
        choices = FLAG_SPECS[name].choices
        if ns[name] == value and choices is not None and value not in choices:
            parser.error(
                f"${variable}={value!r} (the default of --{name.replace('_', '-')}): "
                f"expected one of {', '.join(choices)}"
            )
    for f in fields(ServerConfig):
        if FLAG_SPECS[f.name].positional:
            given = ns.pop(f"{f.name}_positional")
            if given is not None:
                flag = flag_of(f.name)
                if ns[f.name] and ns[f.name] != given:
                    parser.error(f"the {f.name} is given twice: {given!r} and {flag} {ns[f.name]!r}")
                ns[f.name] = given
    for f in fields(ServerConfig):  # a flag taking several values (--router-worker-urls A B) is one comma-joined string
        if FLAG_SPECS[f.name].nargs and isinstance(ns[f.name], list):
            ns[f.name] = ",".join(ns[f.name])
    return ServerConfig(**ns)
