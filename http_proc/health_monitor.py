"""Whether the server can serve requests now, for GET /health.

    starting --probe ok--> ready <--probe ok / probe fails--> broken
        any state --shutdown seen--> draining (final)

A probe passes when the scheduler answers a stats request (so the frontend, scheduler and
detokenizer are alive) and a model step has completed since the last probe: either the
scheduler's step count moved (a loaded server proves it by working), or a trivial request
(one prompt token, one output token) finishes now. Concurrent checks share one probe.
"""

from __future__ import annotations

import asyncio
import logging

from client.async_client import AsyncClient

logger = logging.getLogger("http_proc")
PROBE_TIMEOUT_S = 5.0


class HealthMonitor:
    def __init__(self, client: AsyncClient, probe_timeout_s: float = PROBE_TIMEOUT_S):
        self.client = client
        self.probe_timeout_s = probe_timeout_s
        self.state = "starting"
        self.reason = "no health probe has passed yet"
        self._last_num_steps: int | None = None
        self._probe: asyncio.Task[None] | None = None

    @property
    def is_draining(self) -> bool:
        return self.state == "draining"

    def mark_draining(self, reason: str) -> None:
        if self.state != "draining":
            logger.info("draining: %s", reason)
            self.state, self.reason = "draining", reason

    async def check(self) -> tuple[bool, str]:
        """(healthy, state and reason). Runs a probe unless draining."""
        if self.state != "draining":
            if self._probe is None or self._probe.done():
                self._probe = asyncio.create_task(self._run_probe())
            await asyncio.shield(self._probe)
        return self.state == "ready", f"{self.state}: {self.reason}"

    async def _run_probe(self) -> None:
        try:
            await asyncio.wait_for(self._probe_once(), self.probe_timeout_s)
        except asyncio.TimeoutError:
            self._set_failed(f"no answer within {self.probe_timeout_s:.0f}s")
        except Exception as exc:  # any failure of the probe is the answer, not a crash
            self._set_failed(f"{type(exc).__name__}: {exc}")
        else:
            if self.state != "draining":
                self.state, self.reason = "ready", "every process answered and a model step completed"

    async def _probe_once(self) -> None:
        num_steps = (await self.client.stats())["num_steps"]
        if self._last_num_steps is not None and num_steps > self._last_num_steps:
            self._last_num_steps = num_steps
            return
        result = await self.client.generate(input_ids=[0], max_tokens=1, ignore_eos=True, temperature=0.0)
        if result.finish_reason not in ("stop", "length"):
            raise RuntimeError(f"the trivial request ended with finish reason {result.finish_reason!r}")
        self._last_num_steps = (await self.client.stats())["num_steps"]

    def _set_failed(self, reason: str) -> None:
        if self.state == "draining":
            return
        if self.state != "starting":
            self.state = "broken"
        self.reason = f"health probe failed: {reason}"
        logger.warning("health: %s (%s)", self.state, self.reason)
