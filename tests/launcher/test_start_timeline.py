"""The start line: each process's phases (common/start_phases.py) and the launcher's summary of them."""

from __future__ import annotations

import subprocess
import sys
import time

from zserve.common.messages import LAUNCHER_INBOX, ProcReady
from zserve.common.start_phases import FIRST_PHASE, StartPhases, process_age_s
from zserve.launcher.start_timeline import StartTimeline


def test_process_age_counts_from_exec():
    """A child that sleeps 0.3 s before asking reports at least that (the kernel's start time, not the import's)."""
    code = "import time; time.sleep(0.3); from zserve.common.start_phases import process_age_s; print(process_age_s())"
    age_s = float(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout)
    assert 0.29 <= age_s < 5.0
    assert process_age_s() > 0.0  # this test process started before the test


def test_phases_add_up_in_order():
    phases = StartPhases.since_process_start()
    time.sleep(0.02)
    assert phases.done("load") >= 0.02
    phases.done("pool")
    phases.done("load")  # a name used again adds up, and keeps its first place
    assert list(phases.durations_s) == [FIRST_PHASE, "load", "pool"]
    assert phases.durations_s["load"] >= 0.02
    assert abs(phases.total_s - sum(phases.durations_s.values())) < 1e-12
    assert phases.text().startswith(f"{FIRST_PHASE} ") and ", load 0.0" in phases.text()


def test_start_phases_travel_in_proc_ready():
    msg = ProcReady(name="model", pid=7, info={"num_pages": 3}, start_phases={"torch import": 1.5, "load and pack": 0.8})
    back = LAUNCHER_INBOX.decode(LAUNCHER_INBOX.encode(msg))
    assert back.start_phases == {"torch import": 1.5, "load and pack": 0.8}
    assert ProcReady(name="tokenizer", pid=8, info={}).start_phases == {}  # a child that sends none


def test_summary_lists_the_launcher_then_children_by_ready_time():
    launcher = StartPhases({FIRST_PHASE: 0.25, "model directory": 0.05})
    timeline = StartTimeline.from_launcher_phases(launcher)
    assert 0.29 <= timeline.now_s() < 1.0  # dated from the launcher's exec, not from now
    for name in ("model", "scheduler", "tokenizer"):
        timeline.spawned(name)
    timeline.ready(ProcReady(name="tokenizer", pid=2, info={}))
    time.sleep(0.01)
    timeline.ready(ProcReady(name="model", pid=1, info={}, start_phases={"torch import": 1.25, "load and pack": 0.5}))
    timeline.ready(ProcReady(name="scheduler", pid=3, info={}))
    line = timeline.summary()
    assert line.startswith(f"start: ready {timeline.ready_s['scheduler']:.2f} s after launch; launcher 0.30 s "
                           f"({FIRST_PHASE} 0.25, model directory 0.05); tokenizer ready at ")
    assert line.index("tokenizer ready") < line.index("model ready") < line.index("scheduler ready")
    assert "model ready at" in line and "; torch import 1.25, load and pack 0.50)" in line
    assert "\n" not in line
