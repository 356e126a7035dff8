"""The README's table of `launch_server` flags, made from the flags table (common/server_flags.py)
and ServerConfig's sections (a test keeps the README's copy equal to it): section by section, each
flag with its other spellings, default, meaning and SGLang/vLLM counterpart.

    .venv/bin/python -m zserve.launcher.flags_table     # prints the table
"""

from __future__ import annotations

from dataclasses import MISSING, fields

from zserve.common.config_sections import SECTIONS
from zserve.common.server_flags import FLAG_SPECS, flag_of


def flags_table() -> str:
    rows = ["| flag (other spellings) | default | meaning | SGLang / vLLM |", "|---|---|---|---|"]
    for section in SECTIONS:
        title = section.__name__.removesuffix("Section")
        rows.append(f"| **{title}** | | {(section.__doc__ or '').strip()} | |")
        for f in fields(section):
            rows.append(_flag_row(f.name, f.default if f.default is not MISSING else None))
    return "\n".join(rows)


def _flag_row(name: str, default: object) -> str:
    spec = FLAG_SPECS[name]
    spellings = [f"`{flag_of(name)}`", *(f"`{a}`" for a in spec.aliases)]
    if spec.positional:
        spellings.append("positional `MODEL`")
    spellings += [f"`{switch}` (= `{value!r}`)" for switch, value in spec.switches.items()]
    spellings += [f"`{old}` (deprecated)" for old in spec.deprecated]
    if isinstance(default, bool):
        default_text = "off" if default is False else "on"
    else:
        default_text = f"`{default!r}`" if default != "" else ""
    same_name = "same name" if name in SAME_NAME else ""
    peers = spec.peer_note or ("the other spellings" if spec.aliases else same_name)
    return f"| {', '.join(spellings)} | {default_text} | {spec.help} | {peers} |"


# flags SGLang or vLLM spell as we do, with the same meaning
SAME_NAME = {
    "host", "api_key", "seed", "served_model_name", "chat_template", "dtype", "nnodes", "node_rank", "dist_init_addr",
    "log_level", "allowed_origins", "device", "max_queued_requests",
}

if __name__ == "__main__":
    print(flags_table())
