"""Whether the server can serve requests now: GET /health answers from this state at once.

    starting --stats answered--> ready <--> stalled   (work waiting, or no answer, and no step for watchdog_s)
        ready / stalled --the stats request failed (not slow: refused, server gone)--> broken --answered--> ready
        any state --shutdown seen--> draining (final)

A background task (`run`) keeps one stats request to the server in flight, asking anew every
poll_interval_s once it is answered: an answer means the frontend, scheduler and detokenizer are
alive, and its step count tells a stalled scheduler from an idle one. A scheduler in a model step
answers when the step ends, however long that takes (a big model on CPU, a long prefill), so an
unanswered request means "busy", not "dead": the server stays ready until watchdog_s
(--watchdog-timeout, as SGLang's) pass with neither a step nor an idle answer. Dead processes are
the launcher's to see (it shuts the server down). No request is run for /health, so it costs the
server nothing and shows in no log or metric.

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
ANSWER_WAIT_S = 1.0  # how long one poll waits for the answer before judging without it
WATCHDOG_S = 300.0  # SGLang's --watchdog-timeout default
PROBE_TIMEOUT_S = 30.0


class HealthMonitor:
    def __init__(
        self, client: AsyncClient, probe_client: AsyncClient | None = None, *, poll_interval_s: float = POLL_INTERVAL_S,
        answer_wait_s: float = ANSWER_WAIT_S, watchdog_s: float = WATCHDOG_S, is_embedding: bool = False,
    ):
        self.client = client
        self.is_embedding = is_embedding  # --task embed: the probe embeds one token instead
        self.probe_client = probe_client or client
        self.poll_interval_s = poll_interval_s
        self.answer_wait_s = answer_wait_s
        self.watchdog_s = watchdog_s
        self.state = "starting"
        self.reason = "the server has not answered yet"
        self._last_num_steps: int | None = None
        self._last_progress_s = time.monotonic()  # when a step last ran (the count moved) or the server was idle
        self._asking: asyncio.Task | None = None  # the stats request in flight
        self._asked_s = 0.0  # when it was sent

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
        try:
            while True:
                await self.poll_once()
                await asyncio.sleep(self.poll_interval_s)
        finally:
            if self._asking is not None:
                self._asking.cancel()

    async def poll_once(self) -> None:
        """Wait up to answer_wait_s for the stats request in flight (sending one if none is), then
        judge: an answer by its numbers, no answer yet as a busy server."""
        if self._asking is None:
            self._asking = asyncio.ensure_future(self.client.stats())
            self._asked_s = time.monotonic()
        await asyncio.wait({self._asking}, timeout=self.answer_wait_s)
        if not self._asking.done():
            self.on_no_answer(time.monotonic())
            return
        asking, self._asking = self._asking, None
        try:
            stats = asking.result()
        except asyncio.TimeoutError:  # the client stopped waiting; the next poll asks again
            self.on_no_answer(time.monotonic())
        except Exception as exc:  # a refused or lost request is the answer, not a crash
            self._set_state(
                "broken" if self.state != "starting" else "starting",
                f"stats request failed: {type(exc).__name__}: {exc}",
            )
        else:
            self.on_stats(stats, time.monotonic())

    def on_no_answer(self, now_s: float) -> None:
        """No answer yet: a process is busy (a model step answers when it ends); stalled only once
        watchdog_s pass without progress."""
        if self.state == "starting":
            return
        waited_s, still_s = now_s - self._asked_s, now_s - self._last_progress_s
        if still_s > self.watchdog_s:
            self._set_state("stalled", f"no stats answer for {waited_s:.0f}s and no step for {still_s:.0f}s "
                                       f"(--watchdog-timeout {self.watchdog_s:g}s): a process is stuck")
        elif self.state not in ("stalled", "broken"):  # those stay until an answer (showing progress)
            self._set_state("ready", "busy: the server answers stats between model steps, and one is running")

    def on_stats(self, stats: dict, now_s: float) -> None:
        if stats.get("frontend_draining"):
            self.mark_draining("the server is shutting down: in-flight requests finish, new ones are refused")
            return
        num_steps = stats.get("num_steps", 0)
        has_work = any(stats.get(k, 0) for k in ("num_waiting", "num_running", "num_prefilling"))
        if not has_work or num_steps != self._last_num_steps:
            self._last_progress_s = now_s
        self._last_num_steps = num_steps
        if now_s - self._last_progress_s > self.watchdog_s:
            self._set_state(
                "stalled",
                f"requests are waiting or running but no step ran for {now_s - self._last_progress_s:.0f}s "
                f"(--watchdog-timeout {self.watchdog_s:g}s)",
            )
        else:
            self._set_state("ready", "every process answered; steps run when there is work")

    async def probe_generate(self) -> tuple[bool, str]:
        """One real request of one token (GET /health_generate); on an embedding server, one token embedded."""
        if self.is_embedding:
            try:
                await asyncio.wait_for(self.probe_client.embed(input_ids=[0]), PROBE_TIMEOUT_S)
            except asyncio.TimeoutError:
                return False, f"no embedding within {PROBE_TIMEOUT_S:g}s"
            except Exception as exc:  # the probe's failure is the answer
                return False, f"{type(exc).__name__}: {exc}"
            return True, "embedded one token"
        try:
            result = await asyncio.wait_for(
                self.probe_client.generate(input_ids=[0], max_tokens=1, ignore_eos=True, temperature=0.0),
                PROBE_TIMEOUT_S,
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
