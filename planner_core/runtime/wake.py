"""Wake a pool at zero: the edge's NOTIFY, and the planner's LISTEN that runs a tick at once.

A request that finds no ready engine is held at the edge (`planner route-proxy` with `--wake-deployment`), which
sends `NOTIFY planner_wake` with the deployment's name and how many requests it holds (`wake_payload`), and sends
it again every few seconds while it still holds some (a notification is not stored: one sent while the planner was
away is lost, the next one is not). `planner serve` LISTENs on the channel (`WakeListener`) and, for its own
deployment, runs a load tick right away with the held count as the tick's input (`TickInputs.unplaced`), so the
decision that wakes the pool is a recorded, replayable tick (`planner_core.policy.scale_to_zero`), not a side door.
Notifications queued behind one are coalesced into a single tick (the largest count), and after a wake tick that
ran, the notifications of the next `quiet_s` are counted but run none: that tick recorded demand, so no pool can be
taken to zero again before the idle hold has passed (`planner serve` passes the hold), and the proxy's
renotifications while the engine starts would only record ticks that change nothing.

The LISTEN connection is reconnected with a bounded exponential backoff, and every wait is bounded so `close` ends
the loop within about a second.
"""

from __future__ import annotations

import contextvars
import json
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import psycopg

from planner_core.runtime.redact import redact_text
from planner_core.runtime.store.db import to_libpq_uri

_log = logging.getLogger(__name__)

WAKE_CHANNEL = "planner_wake"
_KEEPALIVES = {"keepalives": 1, "keepalives_idle": 10, "keepalives_interval": 5, "keepalives_count": 3}


def wake_payload(deployment: str, num_held: int) -> str:
    """The NOTIFY payload: the deployment and the requests held for it (JSON)."""
    return json.dumps({"deployment": deployment, "held": int(num_held)}, separators=(",", ":"))


def parse_wake_payload(payload: str) -> tuple[str, int] | None:
    """(deployment, held requests) of a payload, or None when it is not one of ours."""
    try:
        body = json.loads(payload)
        deployment, held = body["deployment"], body["held"]
    except (ValueError, TypeError, KeyError):
        return None
    if not isinstance(deployment, str) or not isinstance(held, int) or isinstance(held, bool) or held < 0:
        return None
    return deployment, held


def send_wake(database_url: str, deployment: str, num_held: int, *, connect_timeout_s: int = 5) -> None:
    """One NOTIFY on its own short connection (the proxy runs it off its event loop)."""
    with psycopg.connect(to_libpq_uri(database_url), autocommit=True, connect_timeout=connect_timeout_s) as conn:
        conn.execute("SELECT pg_notify(%s, %s)", (WAKE_CHANNEL, wake_payload(deployment, num_held)))


@dataclass(slots=True)
class WakeStats:
    """What the listener did (for logs and tests)."""

    num_wakes: int = 0  # ticks run
    num_notifies: int = 0  # notifications for this deployment (coalesced into the ticks)
    num_failures: int = 0  # ticks that raised
    num_quiet: int = 0  # notifications within `quiet_s` of a wake tick that ran: no tick
    num_connects: int = 0
    held: list[int] = field(default_factory=list)  # the count each tick was given


class WakeListener:
    """Runs `on_wake(num_held)` for each (coalesced) wake notification of one deployment, on a daemon thread."""

    def __init__(
        self,
        database_url: str,
        deployment: str,
        on_wake: Callable[[int], None],
        *,
        wait_slice_s: float = 1.0,
        reconnect_max_s: float = 30.0,
        quiet_s: float = 0.0,
    ) -> None:
        self._uri = to_libpq_uri(database_url)
        self.deployment = deployment
        self._on_wake = on_wake
        self._wait_slice_s = wait_slice_s
        self._reconnect_max_s = reconnect_max_s
        self._quiet_s = quiet_s
        self._woke_at: float | None = None  # monotonic time of the last wake tick that ran
        self.stop = threading.Event()
        self.listening = threading.Event()  # set while a LISTEN connection is up (tests wait on it)
        self.stats = WakeStats()
        self._thread: threading.Thread | None = None

    def start(self) -> threading.Thread:
        # in a copy of the caller's context, as the execution listener: Prefect's settings stay in force
        self._thread = threading.Thread(
            target=contextvars.copy_context().run, args=(self.run,), name=f"wake-{self.deployment}", daemon=True
        )
        self._thread.start()
        return self._thread

    def close(self, timeout_s: float = 10.0) -> None:
        self.stop.set()
        if self._thread is not None:
            self._thread.join(timeout=timeout_s)

    def _held(self, conn: psycopg.Connection, timeout_s: float) -> int | None:
        """The largest held count among the notifications for this deployment that arrived within `timeout_s`
        (and those queued behind the first), or None when none came."""
        held: int | None = None
        for timeout in (timeout_s, 0.0):
            for notify in conn.notifies(timeout=timeout):
                parsed = parse_wake_payload(notify.payload)
                if parsed is not None and parsed[0] == self.deployment:
                    self.stats.num_notifies += 1
                    held = max(held or 0, parsed[1])
                    if timeout > 0:
                        break  # then drain what is queued without waiting
            if held is None:
                return None
        return held

    def run(self) -> None:
        conn: psycopg.Connection | None = None
        backoff_s = 0.5
        try:
            while not self.stop.is_set():
                if conn is None:
                    try:
                        conn = psycopg.connect(self._uri, autocommit=True, connect_timeout=5, **_KEEPALIVES)
                        conn.execute(f"LISTEN {WAKE_CHANNEL}")
                    except Exception as exc:  # any failure to listen is retried with backoff
                        _log.warning("wake listener for %s: cannot LISTEN: %s", self.deployment, _one_line(exc))
                        conn = None
                        self.stop.wait(backoff_s)
                        backoff_s = min(2 * backoff_s, self._reconnect_max_s)
                        continue
                    backoff_s = 0.5
                    self.stats.num_connects += 1
                    self.listening.set()
                try:
                    held = self._held(conn, self._wait_slice_s)
                except Exception as exc:  # whatever broke the connection, reconnect
                    _log.warning("wake listener for %s: connection lost: %s", self.deployment, _one_line(exc))
                    self.listening.clear()
                    conn.close()
                    conn = None
                    continue
                if held is not None:
                    self._wake(held)
        finally:
            self.listening.clear()
            if conn is not None:
                conn.close()

    def _wake(self, held: int) -> None:
        if self._woke_at is not None and time.monotonic() - self._woke_at < self._quiet_s:
            self.stats.num_quiet += 1
            return
        self.stats.num_wakes += 1
        self.stats.held.append(held)
        started = time.monotonic()
        try:
            self._on_wake(held)
        except Exception as exc:  # the listener outlives a failing tick; the edge notifies again
            self.stats.num_failures += 1
            _log.warning("wake tick for %s failed: %s", self.deployment, _one_line(exc))
            return
        self._woke_at = time.monotonic()
        _log.info("wake tick for %s (%d held) in %.2f s", self.deployment, held, self._woke_at - started)


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return redact_text(f"{type(exc).__name__}: {text[0] if text else ''}")
