"""The local connector's workers as Prometheus scrape targets: each worker started with a metrics port (Dynamo's
`DYN_SYSTEM_PORT`, a free port picked at its start) is listed, while its process should run, in a Prometheus
file-discovery targets file (`local_workers.metrics_targets_file`), labelled with its pool and worker id. Prometheus
reads such a file again whenever it changes, so a scale-up's new engines are scraped from their first seconds and a
drained engine stops being scraped once it has exited.

The targets are a pure function of the worker rows; the file is written whole (a temporary file renamed over it),
and only when its content changes, so Prometheus never reads half a file and a reconcile that changed nothing
writes nothing."""

from __future__ import annotations

import json
import os
import random
import socket
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

METRICS_PORT_ENV = "DYN_SYSTEM_PORT"  # the port Dynamo's runtime serves a worker's /metrics and /health on
METRICS_HOST = "127.0.0.1"  # the workers run on the planner's machine
# Dynamo 1.6.1 reads DYN_SYSTEM_PORT as a signed 16-bit integer (a port above 32767 stops the worker at start:
# "expected i16 for key SYSTEM_PORT"), and Linux hands out ephemeral ports from 32768 up: the metrics ports are
# picked below, away from the well-known ones
METRICS_PORTS = range(20000, 32768)


def free_metrics_port(*, attempts: int = 64) -> int:
    """A port of `METRICS_PORTS` that nothing listens on now (free until someone binds it).

    Raises:
        OSError: none of `attempts` random ports of the range could be bound.
    """
    for port in random.sample(METRICS_PORTS, attempts):
        with socket.socket() as sock:
            try:
                sock.bind((METRICS_HOST, port))
            except OSError:
                continue
            return port
    raise OSError(f"no free metrics port in {METRICS_PORTS.start}..{METRICS_PORTS.stop - 1} after {attempts} tries")


@dataclass(frozen=True, slots=True, kw_only=True)
class ScrapeWorker:
    """What a scrape target needs of one worker: its row id, pool and metrics port (None: started without one)."""

    worker_id: int
    role: str
    metrics_port: int | None


def scrape_targets(workers: Iterable[ScrapeWorker]) -> list[dict]:
    """Prometheus file-discovery target groups, one per worker with a metrics port, in worker id order; the labels
    `role` (prefill, decode) and `local_worker` (the row id) name the engine in every series scraped from it."""
    return [
        {"targets": [f"{METRICS_HOST}:{w.metrics_port}"], "labels": {"role": w.role, "local_worker": str(w.worker_id)}}
        for w in sorted(workers, key=lambda w: w.worker_id)
        if w.metrics_port is not None
    ]


def write_scrape_targets(path: Path, targets: list[dict]) -> bool:
    """Write the targets file when its content differs from `targets` (atomically: a temporary file renamed over
    it); whether it wrote."""
    text = json.dumps(targets, indent=1) + "\n"
    try:
        if path.read_text() == text:
            return False
    except OSError:
        pass  # absent (the first write) or unreadable: written below
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    temporary.write_text(text)
    os.replace(temporary, path)
    return True
