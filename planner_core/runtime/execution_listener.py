"""Execute a deployment's decisions when they are recorded: LISTEN for the tick's NOTIFY, with a slow fallback poll.

A tick that records a pending decision notifies `DECISIONS_CHANNEL` with the deployment's name inside its own
transaction (`repository.record_tick`), so Postgres delivers the notification only when the tick commits. The
listener waits on a LISTEN connection and runs the execution as soon as a notification for its deployment
arrives. Notifications are not stored: one sent while the listener is down or disconnected is lost, so the
listener also runs the execution

- right after it (re)connects (whatever was committed while it was away),
- every `retry_s` while the last run left work pending (a decision blocked or failed: the connector is retried; or
  a drain the Kubernetes connector follows until its pod is gone), or always when `retry_s` is set for a
  connector that must run regularly (the local one reconciles its processes),
- otherwise every `fallback_poll_s` (the safety net for a notification that never came).

The LISTEN connection is reconnected with a bounded exponential backoff; every wait is bounded (`wait_slice_s`),
so `stop` ends the loop within about a second and nothing here can hang the command. What an execution run is
(`execute`) is the caller's: `planner serve` runs the `execute-decisions` Prefect flow, tests call
`run_execution`. Execution is idempotent (the deployment's row lock and the decision's status), so a duplicate
notification or a poll racing a notification does nothing twice.
"""

from __future__ import annotations

import contextvars
import enum
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import psycopg

from planner_core.runtime.redact import redact_text
from planner_core.runtime.store.db import to_libpq_uri
from planner_core.runtime.store.repository import DECISIONS_CHANNEL

_log = logging.getLogger(__name__)

# libpq TCP keepalives on the LISTEN connection: a peer that vanished without closing the socket is noticed in
# ~25 s instead of hanging the wait on a dead connection until the kernel gives up (hours).
_KEEPALIVES = {"keepalives": 1, "keepalives_idle": 10, "keepalives_interval": 5, "keepalives_count": 3}


class Trigger(enum.StrEnum):
    """Why an execution run was started."""

    NOTIFY = "notify"  # a tick committed a pending decision of this deployment
    CONNECTED = "connected"  # the LISTEN connection was (re)established: catch up on what was missed
    RETRY = "retry"  # the previous run left a decision pending
    FALLBACK = "fallback"  # no notification for `fallback_poll_s`


@dataclass(frozen=True, slots=True, kw_only=True)
class ListenerSettings:
    """The listener's cadences (s)."""

    fallback_poll_s: float = 60.0
    retry_s: float = 10.0
    always_retry: bool = False  # poll every `retry_s` even with nothing pending (the local connector reconciles)
    reconnect_min_s: float = 0.5
    reconnect_max_s: float = 30.0
    wait_slice_s: float = 1.0  # the longest single wait: how soon `stop` is seen
    connect_timeout_s: int = 5


@dataclass(slots=True)
class ListenerStats:
    """What the listener did (for logs and tests)."""

    runs: dict[Trigger, int] = field(default_factory=lambda: dict.fromkeys(Trigger, 0))
    num_connects: int = 0
    num_connect_failures: int = 0
    num_run_failures: int = 0
    num_finished: int = 0  # execution runs that returned (or failed)


# An execution run: given why it runs, returns True when work is still pending afterwards (a decision, a drain).
ExecuteFn = Callable[[Trigger], bool]


class ExecutionListener:
    """Runs `execute` for one deployment on its NOTIFY, on reconnect, and on the fallback poll (`run` loops until
    `stop` is set; `start` runs it on a daemon thread)."""

    def __init__(
        self,
        database_url: str,
        deployment: str,
        execute: ExecuteFn,
        settings: ListenerSettings | None = None,
        *,
        stop: threading.Event | None = None,
    ) -> None:
        self._uri = to_libpq_uri(database_url)
        self.deployment = deployment
        self._execute = execute
        self.settings = settings or ListenerSettings()
        self.stop = stop or threading.Event()
        self.stats = ListenerStats()
        self.listening = threading.Event()  # set while a LISTEN connection is up (tests wait on it)
        self._thread: threading.Thread | None = None
        self._pending = False  # the last run left a decision pending

    def start(self) -> threading.Thread:
        # the thread runs in a copy of the caller's context: settings held in context variables (Prefect's API URL
        # under `temporary_settings`) stay in force for its execution runs
        self._thread = threading.Thread(
            target=contextvars.copy_context().run,
            args=(self.run,),
            name=f"execution-listener-{self.deployment}",
            daemon=True,
        )
        self._thread.start()
        return self._thread

    def close(self, timeout_s: float = 10.0) -> None:
        """Stop the loop and wait for it (at most `timeout_s`, plus the execution run in flight)."""
        self.stop.set()
        if self._thread is not None:
            self._thread.join(timeout=timeout_s)

    def _connect(self) -> psycopg.Connection | None:
        try:
            conn = psycopg.connect(
                self._uri, autocommit=True, connect_timeout=self.settings.connect_timeout_s, **_KEEPALIVES
            )
            conn.execute(f"LISTEN {DECISIONS_CHANNEL}")
        except Exception as exc:  # any failure to listen is retried with backoff
            self.stats.num_connect_failures += 1
            _log.warning("execution listener for %s: cannot LISTEN: %s", self.deployment, _one_line(exc))
            return None
        self.stats.num_connects += 1
        self.listening.set()
        return conn

    def _run(self, trigger: Trigger) -> bool:
        """One execution run; an error is logged and counted, and the run is retried at the retry cadence."""
        self.stats.runs[trigger] += 1
        try:
            return self._execute(trigger)
        except Exception as exc:  # the listener outlives a failing run; the next one retries
            self.stats.num_run_failures += 1
            _log.warning("execution for %s (%s) failed: %s", self.deployment, trigger.value, _one_line(exc))
            return True
        finally:
            self.stats.num_finished += 1

    def _run_and_schedule(self, trigger: Trigger) -> float:
        """Run now; returns when the next run without a notification is due (monotonic s)."""
        self._pending = self._run(trigger)
        retry = self._pending or self.settings.always_retry
        return time.monotonic() + (self.settings.retry_s if retry else self.settings.fallback_poll_s)

    def _wait_for_notify(self, conn: psycopg.Connection, timeout_s: float) -> bool:
        """True when a notification for this deployment arrived within `timeout_s`; the ones queued behind it
        are drained too (one execution run covers them all: it applies the newest pending decision)."""
        mine = False
        for notify in conn.notifies(timeout=timeout_s):
            if notify.payload == self.deployment:
                mine = True
                break
        if mine:
            for notify in conn.notifies(timeout=0.0):
                _ = notify  # already covered by the run about to start
        return mine

    def run(self) -> None:
        settings = self.settings
        conn: psycopg.Connection | None = None
        backoff_s = settings.reconnect_min_s
        next_connect_at = time.monotonic()
        next_run_at = time.monotonic()  # run once at start: decisions committed before the listener existed
        try:
            while not self.stop.is_set():
                now = time.monotonic()
                if conn is None and now >= next_connect_at:
                    conn = self._connect()
                    if conn is None:
                        next_connect_at = now + backoff_s
                        backoff_s = min(2 * backoff_s, settings.reconnect_max_s)
                    else:
                        backoff_s = settings.reconnect_min_s
                        # notifications sent while the listener was away are lost: run now
                        next_run_at = self._run_and_schedule(Trigger.CONNECTED)
                        continue
                now = time.monotonic()
                if now >= next_run_at:
                    retry = self._pending or settings.always_retry
                    next_run_at = self._run_and_schedule(Trigger.RETRY if retry else Trigger.FALLBACK)
                    continue
                wait_s = min(settings.wait_slice_s, max(0.0, next_run_at - now))
                if conn is None:
                    self.stop.wait(min(wait_s, max(0.0, next_connect_at - now)))
                    continue
                try:
                    notified = self._wait_for_notify(conn, wait_s)
                except Exception as exc:  # whatever broke the connection, reconnect
                    _log.warning("execution listener for %s: connection lost: %s", self.deployment, _one_line(exc))
                    self.listening.clear()
                    conn.close()
                    conn = None
                    next_connect_at = time.monotonic()  # first reconnection at once, then with backoff
                    continue
                if notified:
                    next_run_at = self._run_and_schedule(Trigger.NOTIFY)
        finally:
            self.listening.clear()
            if conn is not None:
                conn.close()


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return redact_text(f"{type(exc).__name__}: {text[0] if text else ''}")  # a connection error may quote a URI
