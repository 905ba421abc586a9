"""The ingest leg of `planner chaos`: kill -9 `planner ingest`, and Postgres under it, while engines publish.

A publisher thread sends numbered forward-pass metrics messages at a steady rate (message i: worker `w{i % 4}`,
`counter_id` i, its figures drawn from a generator seeded by the run's seed and i, so they can be drawn again to
check what was stored). Meanwhile faults are injected one after another, each once the ingest has caught up:

- `ingest`: SIGKILL of the `planner ingest` process at a random moment (receiving, or inside a batch's COPY), then
  a new one on the same endpoint;
- `postgres-under-ingest`: SIGKILL of the Postgres postmaster while the ingest runs; the ingest keeps its samples
  in memory, retries, and is not restarted.

At the end the stored samples are read back and checked against what was sent:
- duplicated: a message stored more than once (a retried batch whose first COPY had committed);
- changed: a stored sample whose figures differ from the message's;
- extra: a stored sample no message had;
- lost: a message never stored. A message sent while no ingest was listening, or decoded but not yet flushed by
  an ingest that was killed, is lost by design (ZMQ's PUB/SUB keeps nothing for an absent subscriber): a loss is
  *explained* when the message was sent inside an `ingest` fault's window: from the moment the ingest was last
  seen caught up before the kill (everything sent earlier was stored; the fault waits for that) to `reconnect_s`
  after the new ingest reported it was listening (the publisher's reconnection and the subscription's handshake).
  Any other loss, and any loss around a Postgres kill (the samples must wait in memory), is unexplained: a defect.
"""

from __future__ import annotations

import contextlib
import dataclasses
import random
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from planner_core.lab.chaos.queries import query_rows

if TYPE_CHECKING:
    from pathlib import Path

    from planner_core.domain import ForwardPassMetrics
    from planner_core.lab.chaos.stack import ChaosRun

INGEST_FAULTS = ("ingest", "postgres-under-ingest")
DEPLOYMENT = "chaos-ingest"
NUM_WORKERS = 4
CAUGHT_UP_LAG_S = 2.0  # before a fault, every message older than this must be stored
CATCH_UP_TIMEOUT_S = 90.0  # a fault waits this long at most for the ingest to catch up (Postgres back, backoff)


@dataclass
class IngestFault:
    """One fault of the ingest leg; times on the publisher's clock (s since the leg began)."""

    fault: str
    at_s: float  # the kill
    ready_at_s: float  # the new ingest listening (ingest), or Postgres accepting again (postgres-under-ingest)
    caught_up_at_s: float | None  # when the stored samples last covered everything older than CAUGHT_UP_LAG_S
    note: str = ""


def synthetic_message(seed: int, index: int) -> ForwardPassMetrics:
    """Message `index` of a run seeded `seed`: its figures from a generator of its own, so they can be drawn again."""
    from planner_core.domain import Component
    from planner_core.runtime.ingest import synthetic_fpm

    return synthetic_fpm(
        Component.DECODE, f"w{index % NUM_WORKERS}", index, random.Random(seed * 1_000_003 + index)
    )  # fmt: skip


def expected_sample(seed: int, index: int) -> tuple:
    """Message `index`'s stored fields, in `_sample_columns()` order."""
    fpm = synthetic_message(seed, index)
    return (
        fpm.component.value,
        fpm.worker_id,
        fpm.dp_rank,
        fpm.counter_id,
        fpm.wall_time_s,
        *dataclasses.astuple(fpm.scheduled),
        *dataclasses.astuple(fpm.queued),
    )


def _sample_columns() -> list[str]:
    from planner_core.domain import QueuedRequests, ScheduledRequests

    return [
        "component", "worker_id", "dp_rank", "counter_id", "wall_time_s",
        *(f"scheduled_{f.name}" for f in dataclasses.fields(ScheduledRequests)),
        *(f"queued_{f.name}" for f in dataclasses.fields(QueuedRequests)),
    ]  # fmt: skip


class _Publisher(threading.Thread):
    """Sends message i at `i / rate_hz` s after start and keeps each one's send time (s since `t0`)."""

    def __init__(self, endpoint: str, seed: int, rate_hz: float, t0: float) -> None:
        super().__init__(name="chaos-fpm-publisher", daemon=True)
        self.endpoint, self.seed, self.rate_hz, self.t0 = endpoint, seed, rate_hz, t0
        self.sent_at_s: list[float] = []
        self.stop = threading.Event()
        self.subscribed = threading.Event()  # set once the ingest's subscription has arrived (or never, on failure)

    def run(self) -> None:
        from planner_core.runtime.ingest import FpmPublisher

        with FpmPublisher(self.endpoint) as publisher:
            # a PUB socket drops what it sends before the subscription arrives: the first ingest is listening
            # already, so wait for it rather than count those messages as lost
            if not publisher.wait_for_subscriber(timeout_s=60.0):
                return
            self.subscribed.set()
            start_s = time.monotonic() - self.t0
            index = 0
            while not self.stop.is_set():
                publisher.publish(synthetic_message(self.seed, index))
                self.sent_at_s.append(time.monotonic() - self.t0)
                index += 1
                ahead_s = self.t0 + start_s + index / self.rate_hz - time.monotonic()
                if ahead_s > 0:
                    self.stop.wait(ahead_s)


@dataclass
class IngestLeg:
    """The ingest process the leg owns and the faults injected so far."""

    run: ChaosRun
    config: Path
    seed: int
    rate_hz: float
    port: int
    t0: float = field(default_factory=time.monotonic)
    process: subprocess.Popen | None = None
    num_starts: int = 0
    faults: list[IngestFault] = field(default_factory=list)

    @property
    def endpoint(self) -> str:
        return f"tcp://127.0.0.1:{self.port}"

    def now_s(self) -> float:
        return time.monotonic() - self.t0

    def start_ingest(self, timeout_s: float = 120.0) -> float:
        """Start `planner ingest` on the leg's endpoint; returns the time (leg clock) it said it was listening."""
        self.num_starts += 1
        log_path = self.run.folder / "logs" / f"ingest-{self.num_starts:03d}.log"
        log = log_path.open("wb")
        self.process = subprocess.Popen(
            [sys.executable, "-m", "planner_cli.main", "ingest", "--bind", self.endpoint, "--deployment", DEPLOYMENT,
             "--config", str(self.config), "--stats-every-s", "10"],
            env=self.run.env, stdout=log, stderr=subprocess.STDOUT, cwd=self.run.folder,
        )  # fmt: skip
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if b"ingesting forward-pass metrics" in log_path.read_bytes():
                return self.now_s()
            if self.process.poll() is not None:
                raise RuntimeError(f"planner ingest exited with {self.process.returncode}: see {log_path}")
            time.sleep(0.05)
        raise RuntimeError(f"planner ingest did not start listening within {timeout_s:g} s: see {log_path}")

    def kill_ingest(self) -> None:
        if self.process is not None and self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                self.process.send_signal(signal.SIGKILL)
            self.process.wait(timeout=30)

    def stop_ingest(self) -> None:
        """SIGTERM: the ingest flushes what it holds and exits (SIGKILL after 30 s)."""
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.kill_ingest()

    def max_stored_index(self) -> int | None:
        try:
            rows = query_rows(
                self.run.owner_url(),
                """SELECT max(s.counter_id) FROM fpm_samples s JOIN deployments d ON d.id = s.deployment_id
                    WHERE d.name = %s""",
                DEPLOYMENT,
            )
        except Exception:  # down or restarting: no answer yet
            return None
        return rows[0][0]

    def wait_caught_up(self, publisher: _Publisher) -> float | None:
        """Wait until every message sent more than CAUGHT_UP_LAG_S ago is stored (up to CATCH_UP_TIMEOUT_S, then
        None: the fault goes ahead and the losses show in the check)."""
        deadline = time.monotonic() + CATCH_UP_TIMEOUT_S
        while time.monotonic() < deadline:
            cutoff_s = self.now_s() - CAUGHT_UP_LAG_S
            sent = publisher.sent_at_s
            older = _count_before(sent, cutoff_s)
            newest = self.max_stored_index()
            if older == 0 or (newest is not None and newest >= older - 1):
                return cutoff_s
            time.sleep(0.2)
        return None


def _count_before(sent_at_s: list[float], cutoff_s: float) -> int:
    """How many messages were sent before `cutoff_s` (send times are increasing)."""
    import bisect

    return bisect.bisect_left(sent_at_s, cutoff_s)


def run_ingest_leg(
    run: ChaosRun, *, num_kills: int, config: Path, seed: int, rate_hz: float, rng: random.Random, port: int,
    reconnect_s: float, log: Any = None,
) -> dict[str, Any]:  # fmt: skip
    """The whole leg (module docstring); returns its part of the report."""
    from planner_core.runtime.store.migrate import upgrade

    upgrade(run.owner_url())  # the ingest expects the schema (the demo leg's demos would create it themselves)
    leg = IngestLeg(run=run, config=config, seed=seed, rate_hz=rate_hz, port=port)
    leg.start_ingest()
    publisher = _Publisher(leg.endpoint, seed, rate_hz, leg.t0)
    publisher.start()
    if not publisher.subscribed.wait(timeout=90.0):
        leg.stop_ingest()
        raise RuntimeError(f"the ingest leg's publisher saw no subscription from planner ingest on {leg.endpoint}")
    try:
        for number in range(1, num_kills + 1):
            time.sleep(rng.uniform(0.5, 4.0))
            caught_up_s = leg.wait_caught_up(publisher)
            fault = rng.choice(INGEST_FAULTS)
            time.sleep(rng.uniform(0.0, 1.0))  # anywhere in the ingest's receive/flush cycle (0.5 s)
            at_s = leg.now_s()
            if fault == "ingest":
                leg.kill_ingest()
                ready_s = leg.start_ingest()
                note = ""
            else:
                killed = run.kill_postgres()
                run.owner_url()  # crash recovery and restart; the ingest reconnects on its own
                ready_s = leg.now_s()
                note = "" if killed else "postmaster not running"
                if leg.process is not None and leg.process.poll() is not None:
                    note = f"the ingest exited ({leg.process.returncode}) after the Postgres kill: restarted"
                    leg.start_ingest()
            leg.faults.append(IngestFault(fault, at_s, ready_s, caught_up_s, note))
            if log is not None:
                log(f"ingest fault {number}: {leg.faults[-1]}")
        leg.wait_caught_up(publisher)
    finally:
        publisher.stop.set()
        publisher.join(timeout=30)
        time.sleep(1.0)  # the last messages reach the ingest before it is told to stop
        leg.stop_ingest()
    return check_ingest_leg(
        run.owner_url(), seed=seed, faults=leg.faults, sent_at_s=publisher.sent_at_s, rate_hz=rate_hz,
        reconnect_s=reconnect_s,
    )  # fmt: skip


def explain_losses(
    lost: list[int], sent_at_s: list[float], faults: list[IngestFault], *, reconnect_s: float
) -> tuple[list[int], list[int]]:
    """Split lost message indices into (explained, unexplained): explained when sent inside an `ingest` fault's
    window [last seen caught up, ready + reconnect_s] (the kill itself when it was not seen caught up)."""
    windows = [
        (f.at_s if f.caught_up_at_s is None else f.caught_up_at_s, f.ready_at_s + reconnect_s)
        for f in faults
        if f.fault == "ingest"
    ]
    explained, unexplained = [], []
    for index in lost:
        sent_s = sent_at_s[index]
        (explained if any(lo <= sent_s <= hi for lo, hi in windows) else unexplained).append(index)
    return explained, unexplained


def check_ingest_leg(
    database_url: str,
    *,
    seed: int,
    faults: list[IngestFault],
    sent_at_s: list[float],
    rate_hz: float,
    reconnect_s: float,
) -> dict[str, Any]:
    """The samples stored for the leg's deployment against the messages sent (module docstring)."""
    from collections import Counter

    columns = _sample_columns()
    rows = query_rows(
        database_url,
        f"""SELECT {", ".join("s." + c for c in columns)} FROM fpm_samples s
             JOIN deployments d ON d.id = s.deployment_id WHERE d.name = %s""",
        DEPLOYMENT,
    )
    num_sent = len(sent_at_s)
    counter_at = columns.index("counter_id")
    stored = Counter(row[counter_at] for row in rows)
    extra = sum(1 for row in rows if not 0 <= row[counter_at] < num_sent)
    changed = sum(
        1 for row in rows if 0 <= row[counter_at] < num_sent and tuple(row) != expected_sample(seed, row[counter_at])
    )
    lost = [index for index in range(num_sent) if index not in stored]
    explained, unexplained = explain_losses(lost, sent_at_s, faults, reconnect_s=reconnect_s)
    return {
        "num_kills": len(faults),
        "kills_by_fault": {fault: sum(1 for f in faults if f.fault == fault) for fault in INGEST_FAULTS},
        "rate_hz": rate_hz,
        "num_sent": num_sent,
        "num_stored": len(rows),
        "duplicated": sum(n - 1 for n in stored.values() if n > 1),
        "changed": changed,
        "extra": extra,
        "lost": len(lost),
        "lost_explained": len(explained),
        "lost_unexplained": len(unexplained),
        "unexplained_sent_at_s": [round(sent_at_s[i], 3) for i in unexplained[:50]],
        "not_caught_up": sum(1 for f in faults if f.caught_up_at_s is None),
        "reconnect_s": reconnect_s,
        "faults": [dataclasses.asdict(f) for f in faults],
    }


def ingest_leg_clean(result: dict[str, Any]) -> bool:
    """Nothing duplicated, changed, extra or lost outside a fault's window."""
    return result["duplicated"] == result["changed"] == result["extra"] == result["lost_unexplained"] == 0
