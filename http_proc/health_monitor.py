"""Whether the server can serve requests now: GET /health answers from this state at once.

    starting --stats answered--> ready <--> stalled   (work waiting and no step for stall_s)
        ready / stalled --no stats answer within answer_timeout_s--> broken --answered--> ready
        any state --shutdown seen--> draining (final)

A background task (`run`) asks the server for its stats every poll_interval_s: an answer means
the frontend, scheduler and detokenizer are alive (a scheduler stuck in a model step does not
answer); the step count tells a stalled scheduler from an idle one. No request is run for
/health, so it costs the server nothing and shows in no log or metric.

GET /health_generate (`probe_generate`) runs one real token, as SGLang's route of that name, as a
health probe: its client id marks it (PROBE_CLIENT_PREFIX), so the frontend counts it nowhere.
"""

from __future__ import annotations

import asyncio
import logging
import time

from zserve.client.async_client import AsyncClient

logger = logging.getLogger("http_proc")
POLL_INTERVAL_S = 1.0
ANSWER_TIMEOUT_S = 5.0
STALL_S = 30.0
PROBE_TIMEOUT_S = 30.0


class HealthMonitor:
    def __init__(
        self, client: AsyncClient, probe_client: AsyncClient | None = None, *, poll_interval_s: float = POLL_INTERVAL_S,
        answer_timeout_s: float = ANSWER_TIMEOUT_S, stall_s: float = STALL_S,
    ):
        self.client = client
        self.probe_client = probe_client or client
        self.poll_interval_s = poll_interval_s
        self.answer_timeout_s = answer_timeout_s
        self.stall_s = stall_s
        self.state = "starting"
        self.reason = "the server has not answered yet"
        self._last_num_steps: int | None = None
        self._last_step_s = 0.0  # when the step count last moved (or work last was absent)

    @property
    def is_draining(self) -> bool:
        return self.state == "draining"

    def check(self) -> tuple[bool, str]:
        """(healthy, state and reason), from the last poll: never waits."""
        return self.state == "ready", f"{self.state}: {self.reason}"

    def mark_draining(self, reason: str) -> None:
        if self.state != "draining":
            logger.info("draining: %s", reason)
            self.state, self.reason = "draining", reason

    async def run(self) -> None:
        """Poll until cancelled."""
        while True:
            await self.poll_once()
            await asyncio.sleep(self.poll_interval_s)

    async def poll_once(self) -> None:
        try:
            stats = await asyncio.wait_for(self.client.stats(), self.answer_timeout_s)
        except asyncio.TimeoutError:
            self._set_state("broken" if self.state != "starting" else "starting",
                            f"the server did not answer a stats request within {self.answer_timeout_s:g}s")
        except Exception as exc:  # any failure to get the stats is the answer, not a crash
            self._set_state("broken" if self.state != "starting" else "starting", f"stats request failed: {type(exc).__name__}: {exc}")
        else:
            self.on_stats(stats, time.monotonic())

    def on_stats(self, stats: dict, now_s: float) -> None:
        if stats.get("frontend_draining"):
            self.mark_draining("the server is shutting down: in-flight requests finish, new ones are refused")
            return
        num_steps = stats.get("num_steps", 0)
        has_work = any(stats.get(k, 0) for k in ("num_waiting", "num_running", "num_prefilling"))
        if not has_work or num_steps != self._last_num_steps:
            self._last_step_s = now_s
        self._last_num_steps = num_steps
        if now_s - self._last_step_s > self.stall_s:
            self._set_state("stalled", f"requests are waiting or running but no step ran for {now_s - self._last_step_s:.0f}s")
        else:
            self._set_state("ready", "every process answered; steps run when there is work")

    async def probe_generate(self) -> tuple[bool, str]:
        """One real request of one token (GET /health_generate)."""
        try:
            result = await asyncio.wait_for(
                self.probe_client.generate(input_ids=[0], max_tokens=1, ignore_eos=True, temperature=0.0), PROBE_TIMEOUT_S
            )
        except asyncio.TimeoutError:
            return False, f"no token within {PROBE_TIMEOUT_S:g}s"
        except Exception as exc:  # the probe's failure is the answer
            return False, f"{type(exc).__name__}: {exc}"
        if result.finish_reason not in ("stop", "length"):
            return False, f"the probe request ended with finish reason {result.finish_reason!r}"
        return True, "generated one token"

    def _set_state(self, state: str, reason: str) -> None:
        if self.state == "draining" or (state, reason) == (self.state, self.reason):
            return
        if state != self.state:
            log = logger.info if state == "ready" else logger.warning
            log("health: %s (%s)", state, reason)
        self.state, self.reason = state, reason
