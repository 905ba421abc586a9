"""The forward-pass ingest's memory under a flood, with its table locked or not: peak RSS per publisher count.

`python -m planner_core.lab.ingest_memory --publishers 1 4 8 --record docs/results/ingest/memory.json` starts
`planner ingest` (a process of its own, on `PLANNER_DATABASE_URL` or the embedded Postgres of `PLANNER_DATA_DIR`),
then for each flood, publisher count and table state: N publisher processes send as fast as their sockets take
them, for `--seconds`, while another session holds `LOCK TABLE fpm_samples IN ACCESS EXCLUSIVE MODE` (locked) or
not. Floods: `mixed`, a valid forward-pass message and a 256 KiB frame in turn (oversized: four times what the
ingest accepts; issue 43's flood), and `valid`, valid messages only (what fills the queue of decoded samples
while the table is locked).
The ingest's peak RSS (the kernel's `VmHWM` of its process) and its RSS a few seconds after the flood are
recorded with its own counters (its `stopped:` line). A fresh ingest per row, so each peak is that row's own.

Issue 43 measured, before the bounded design: 99 MB -> 2,325 MB with one publisher while the table was locked,
3.3-3.4 GB with 4 or 8, 1.3-2.3 GB still resident afterwards; 169 MB without the lock.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import itertools
import json
import multiprocessing
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

FRAME_BYTES = 256 * 1024
DEPLOYMENT = "ingest-memory"
SETTLE_S = 5.0  # after the flood: what stays resident


def _publish(endpoint: str, seconds: float, seed: int, flood: str, sent: multiprocessing.Value) -> None:
    """One publisher process: valid messages, with an oversized frame after each in the `mixed` flood,
    non-blocking (a full send queue drops, as an engine's PUB socket does), for `seconds`."""
    import random

    import zmq

    from planner_core.domain import Component
    from planner_core.runtime.fpm_wire import encode_fpm_message, synthetic_fpm

    rng = random.Random(seed)
    context = zmq.Context()
    socket = context.socket(zmq.PUB)
    socket.setsockopt(zmq.LINGER, 0)
    socket.connect(endpoint)
    big = bytes(FRAME_BYTES)
    num_sent, counter = 0, 0
    time.sleep(0.5)  # the subscription reaches a new connection first
    ends_at = time.monotonic() + seconds
    while time.monotonic() < ends_at:
        counter += 1
        valid = encode_fpm_message(synthetic_fpm(Component.DECODE, f"bench-{seed}", counter, rng))  # [topic, payload]
        for frames in (valid, [b"fpm.decode", big]) if flood == "mixed" else (valid,):
            with contextlib.suppress(zmq.Again):
                socket.send_multipart(frames, zmq.NOBLOCK)
                num_sent += 1
    socket.close()
    context.term()
    with sent.get_lock():
        sent.value += num_sent


def _status_kb(pid: int, field: str) -> int:
    """A field of /proc/<pid>/status in kB (VmRSS, VmHWM)."""
    text = Path(f"/proc/{pid}/status").read_text()
    match = re.search(rf"^{field}:\s+(\d+) kB", text, re.MULTILINE)
    return int(match[1]) if match else 0


def _start_ingest(port: int, env: dict[str, str]) -> tuple[subprocess.Popen, list[str]]:
    command = [
        sys.executable, "-m", "planner_cli.main", "ingest", "--bind", f"tcp://127.0.0.1:{port}",
        "--deployment", DEPLOYMENT, "--stats-every-s", "3600",
    ]  # fmt: skip
    ingest = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    lines: list[str] = []
    assert ingest.stderr is not None
    for line in ingest.stderr:
        lines.append(line)
        if line.startswith("ingesting forward-pass metrics"):
            return ingest, lines
    raise RuntimeError("planner ingest did not start: " + "".join(lines)[-2000:])


def measure(
    num_publishers: int, locked: bool, seconds: float, owner_url: str, env: dict[str, str], flood: str = "mixed"
) -> dict:
    """One row: a fresh ingest flooded (`mixed` or `valid`) by `num_publishers` for `seconds`, the table locked
    or not."""
    import psycopg

    from planner_core.runtime.localhost import free_port
    from planner_core.runtime.store.db import to_libpq_uri

    ingest, lines = _start_ingest(free_port(), env)
    endpoint = re.search(r"on (tcp://\S+?)[ ,]", lines[-1])[1]
    start_kb = _status_kb(ingest.pid, "VmRSS")
    locker = psycopg.connect(to_libpq_uri(owner_url)) if locked else None
    sent = multiprocessing.Value("q", 0)
    try:
        if locker is not None:
            locker.execute("LOCK TABLE fpm_samples IN ACCESS EXCLUSIVE MODE")  # held until the rollback
        publishers = [
            multiprocessing.Process(target=_publish, args=(endpoint, seconds, seed, flood, sent))
            for seed in range(num_publishers)
        ]
        for publisher in publishers:
            publisher.start()
        for publisher in publishers:
            publisher.join()
        peak_kb = _status_kb(ingest.pid, "VmHWM")
        time.sleep(SETTLE_S)
        after_kb = _status_kb(ingest.pid, "VmRSS")
        peak_kb = max(peak_kb, _status_kb(ingest.pid, "VmHWM"))
    finally:
        if locker is not None:
            locker.rollback()
            locker.close()
        ingest.send_signal(signal.SIGTERM)
        _, rest = ingest.communicate(timeout=120)
    stopped = next((line for line in (rest or "").splitlines() if line.startswith("stopped:")), "")
    return {
        "flood": flood,
        "publishers": num_publishers,
        "table": "locked" if locked else "not locked",
        "seconds": seconds,
        "messages_sent": sent.value,
        "rss_start_mb": round(start_kb / 1024, 1),
        "peak_rss_mb": round(peak_kb / 1024, 1),
        "rss_after_mb": round(after_kb / 1024, 1),
        "ingest": stopped.removeprefix("stopped: "),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--publishers", type=int, nargs="+", default=[1, 4, 8], help="publisher counts to run")
    parser.add_argument("--seconds", type=float, default=20.0, help="flood duration of each row")
    parser.add_argument("--floods", nargs="+", choices=["mixed", "valid"], default=["mixed", "valid"], help="floods")
    parser.add_argument("--record", type=Path, default=None, help="write the rows and how they were made as JSON")
    args = parser.parse_args(argv)
    if any(n < 1 or n > 64 for n in args.publishers) or not 0 < args.seconds <= 600:
        parser.error("--publishers in [1, 64], --seconds in (0, 600]")
    from planner_core.runtime.ingest import resolve_deployment_id
    from planner_core.runtime.localhost import code_commit
    from planner_core.runtime.settings import RuntimeSettings
    from planner_core.runtime.store.db import resolve_database_url, resolve_owner_database_url

    settings = RuntimeSettings()
    url = resolve_database_url(settings)
    from planner_core.data import DEFAULT_CONFIG

    resolve_deployment_id(url, DEPLOYMENT, DEFAULT_CONFIG)  # the deployment exists before the ingest starts
    owner_url = resolve_owner_database_url()
    env = dict(os.environ, PLANNER_DATABASE_URL=url)
    rows = []
    for flood, num_publishers, locked in itertools.product(args.floods, args.publishers, (True, False)):
        row = measure(num_publishers, locked, args.seconds, owner_url, env, flood)
        sys.stdout.write(
            f"{flood} flood, {row['publishers']} publisher(s), table {row['table']}: peak RSS {row['peak_rss_mb']} "
            f"MB (start {row['rss_start_mb']}, {SETTLE_S:g} s after {row['rss_after_mb']}); "
            f"sent {row['messages_sent']}; ingest {row['ingest']}\n"
        )
        sys.stdout.flush()
        rows.append(row)
    if args.record is not None:
        record = {
            "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
            "commit": code_commit(),
            "command": "python -m planner_core.lab.ingest_memory " + " ".join(argv or sys.argv[1:]),
            "cpus": os.cpu_count(),
            "frame_bytes": FRAME_BYTES,
            "rows": rows,
        }
        args.record.parent.mkdir(parents=True, exist_ok=True)
        args.record.write_text(json.dumps(record, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
