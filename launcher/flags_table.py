"""The README's table of `launch_server` flags, made from ServerConfig (a test keeps the README's
copy equal to it): each flag with its other spellings, default, meaning and SGLang/vLLM counterpart.

    .venv/bin/python -m zserve.launcher.flags_table     # prints the table
"""

from __future__ import annotations

from dataclasses import MISSING, fields

from zserve.common.server_config import ServerConfig


def flags_table() -> str:
    rows = ["| flag (other spellings) | default | meaning | SGLang / vLLM |", "|---|---|---|---|"]
    for f in fields(ServerConfig):
        meta = f.metadata
        flag = meta.get("flag", "--" + f.name.replace("_", "-"))
        spellings = [f"`{flag}`", *(f"`{a}`" for a in meta.get("aliases", ()))]
        if meta.get("positional"):
            spellings.append("positional `MODEL`")
        spellings += [f"`{switch}` (= `{value!r}`)" for switch, value in meta.get("switches", {}).items()]
        spellings += [f"`{old}` (deprecated)" for old in meta.get("deprecated", {})]
        default = f.default if f.default is not MISSING else None
        default_text = ("off" if default is False else "on") if isinstance(default, bool) else f"`{default!r}`" if default != "" else ""
        peers = meta.get("peer_note") or ("same name" if not meta.get("aliases") and f.name in SAME_NAME else
                                          "the other spellings" if meta.get("aliases") else "")
        rows.append(f"| {', '.join(spellings)} | {default_text} | {meta.get('help', '')} | {peers} |")
    return "\n".join(rows)


# flags SGLang or vLLM spell as we do, with the same meaning
SAME_NAME = {
    "host", "api_key", "seed", "served_model_name", "chat_template", "dtype", "nnodes", "node_rank", "dist_init_addr",
    "log_level", "allowed_origins", "device", "max_queued_requests",
}

if __name__ == "__main__":
    print(flags_table())
