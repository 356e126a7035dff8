"""`python -m zserve.launcher.fleet.router_main [launch_router flags]`: sglang-router (launch_router), with the
fleet's API key from $ZSERVE_API_KEY.

sglang-router takes its key only as a flag (--api-key), and any user's `ps` reads a command line: the key
travels in the environment (as it does to the replicas) and is added to the parsed flags in this process.
"""

from __future__ import annotations

import os
import sys

from zserve.common.server_config import API_KEY_ENV


def main(argv: list[str]) -> None:
    from sglang_router.launch_router import launch_router, parse_router_args

    key = os.environ.pop(API_KEY_ENV, "")
    launch_router(parse_router_args([*argv, "--api-key", key] if key else argv))


if __name__ == "__main__":
    main(sys.argv[1:])
