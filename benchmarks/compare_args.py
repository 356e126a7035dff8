"""`--compare "FLAGS" "FLAGS" ...`: server configurations given to a benchmark, one quoted string each."""

from __future__ import annotations

import sys
from pathlib import Path


def split_compare(argv: list[str], own_options: set[str]) -> tuple[list[str], list[str] | None]:
    """Take the configurations after --compare out of argv: argparse would read a lone server
    flag such as "--disable-radix-cache" as an option of this script."""
    if "--compare" not in argv:
        return argv, None
    start = argv.index("--compare")
    end = start + 1
    while end < len(argv) and argv[end].split("=", 1)[0] not in own_options:
        end += 1
    if end == start + 1:
        raise SystemExit(f"{Path(sys.argv[0]).name}: --compare needs at least one configuration")
    return argv[:start] + argv[end:], argv[start + 1:end]
