"""`python -m zserve.launcher.fleet.bound_exec PARENT_PID CMD [ARG ...]`: exec CMD so that the kernel kills it
when PARENT_PID (the process that started this one) dies, even by SIGKILL.

For a child that is not a zserve process and so does not call die_with_parent itself (the fleet's
sglang-router): PR_SET_PDEATHSIG is set here and survives the exec. Without it, a SIGKILLed fleet
supervisor would leave the router running.
"""

from __future__ import annotations

import os
import sys

from zserve.common.proc_runtime import die_with_parent


def main(argv: list[str]) -> None:
    parent_pid, cmd = int(argv[0]), argv[1:]
    die_with_parent(parent_pid)  # exits at once when the parent is already gone
    os.execvp(cmd[0], cmd)


if __name__ == "__main__":
    main(sys.argv[1:])
