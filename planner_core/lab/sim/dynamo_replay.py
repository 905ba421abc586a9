"""The bridge to Dynamo's offline replay: the trace written in Mooncake JSONL (`write_replay_trace`), the
subprocess run with Dynamo's virtualenv and its line-delimited JSON (`ReplayBridge`), the simulator's interface
over Dynamo's per-tick snapshots (`ReplayView`), and a replay's records as a `SimResult` (`replay_result`). The
bench engine on top is `planner_core.lab.sim.dynamo_engine`."""

from __future__ import annotations

import json
import math
import subprocess
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import IO, Any

import numpy as np

from planner_core.domain import Component, ForwardPassMetrics, QueuedRequests, ScheduledRequests, WorkerCounts
from planner_core.lab.sim.des import SimResult, window_observation
from planner_core.lab.sim.dynamo_policy import (
    DYNAMO_PYTHON_ENV,
    DYNAMO_VERSION,
    DynamoPlannerError,
    find_dynamo_python,
)
from planner_core.planner import Planner
from planner_core.traces import RequestTrace

RUN_REPLAY_SCRIPT = Path(__file__).resolve().parents[1] / "dynamo" / "run_replay.py"
BLOCK_TOKENS = 512  # Mooncake `hash_ids` blocks
_TICK_TOLERANCE_S = 1e-6


def write_replay_trace(trace: RequestTrace, path: Path, requests: slice | None = None) -> float:
    """Requests of `trace` (all, or the index range `requests`) as the Mooncake JSONL Dynamo replays, their
    arrivals shifted so the first is at 0; returns the shift (s). Prompts without block ids get fresh ones
    (ceil(ISL / 512) each: no prefix sharing)."""
    span = requests or slice(0, trace.num_requests)
    indices = range(*span.indices(trace.num_requests))
    shift_s = float(trace.arrival_s[indices[0]]) if len(indices) else 0.0
    next_id = 0
    with path.open("w", encoding="utf-8") as handle:
        for index in indices:
            isl, osl = int(trace.isl[index]), int(trace.osl[index])
            if trace.has_hashes:
                blocks = trace.request_hashes(index).tolist()
            else:
                count = max(1, math.ceil(isl / BLOCK_TOKENS))
                blocks = list(range(next_id, next_id + count))
                next_id += count
            stamp_ms = round((float(trace.arrival_s[index]) - shift_s) * 1000.0, 3)
            handle.write(json.dumps({"timestamp": stamp_ms, "input_length": isl, "output_length": osl,
                                     "hash_ids": blocks}) + "\n")  # fmt: skip
    return shift_s


class ReplayBridge:
    """The `run_replay.py` subprocess: one per bench, serving one replay after another."""

    def __init__(self, python: str | None, *, script: Path = RUN_REPLAY_SCRIPT) -> None:
        found = find_dynamo_python(python)
        if not found:
            raise DynamoPlannerError(
                f"--engine dynamo: no Dynamo interpreter: run `make dynamo-env`, or pass --dynamo-python PATH or "
                f"set {DYNAMO_PYTHON_ENV} (a virtualenv with ai-dynamo {DYNAMO_VERSION})"
            )
        self.python, self.script = found, script
        self._stderr: IO[bytes] = tempfile.TemporaryFile()
        try:
            self._process = subprocess.Popen(
                [found, str(script)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._stderr, text=True
            )
        except OSError as exc:
            raise DynamoPlannerError(f"--engine dynamo: --dynamo-python {found}: {exc.strerror}") from exc
        version = self._read("start").get("dynamo_version")
        if version != DYNAMO_VERSION:
            self.close()
            raise DynamoPlannerError(f"--engine dynamo: --dynamo-python {found}: has ai-dynamo {version}, not "
                                     f"{DYNAMO_VERSION}")  # fmt: skip

    def run(
        self,
        job: dict[str, Any],
        *,
        on_initial: Callable[[], float | None] | None = None,
        on_tick: Callable[[dict[str, Any]], dict[str, Any]] | None = None,
    ) -> dict[str, Any]:
        """One replay (`job` as run_replay.py reads it); a remote policy's calls go to `on_initial`/`on_tick`."""
        self._write({"run": job})
        while True:
            message = self._read("replay")
            if message.get("done"):
                return json.loads(Path(message["out"]).read_text(encoding="utf-8"))
            if message.get("initial"):
                assert on_initial is not None, "a remote policy needs on_initial"
                self._write({"next_tick_ms": on_initial()})
            elif "tick" in message:
                assert on_tick is not None, "a remote policy needs on_tick"
                self._write(on_tick(message["tick"]))
            else:
                self._fail(f"unexpected message {str(message)[:200]}")

    def close(self) -> None:
        process = self._process
        if process.stdin is not None and not process.stdin.closed:
            process.stdin.close()
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        if process.stdout is not None:
            process.stdout.close()
        self._stderr.close()

    def _write(self, message: dict[str, Any]) -> None:
        assert self._process.stdin is not None
        try:
            self._process.stdin.write(json.dumps(message) + "\n")
            self._process.stdin.flush()
        except BrokenPipeError:
            self._fail("writing")

    def _read(self, what: str) -> dict[str, Any]:
        assert self._process.stdout is not None
        line = self._process.stdout.readline()
        if not line:
            self._fail(what)
        return json.loads(line)

    def _fail(self, what: str) -> None:
        self._process.kill()
        self._process.wait()
        self._stderr.seek(0)
        lines = [x.strip() for x in self._stderr.read().decode("utf-8", "replace").splitlines() if x.strip()]
        ours = [x for x in lines if x.startswith("run_replay:")]
        raise DynamoPlannerError(f"Dynamo's replay stopped ({what}): {(ours or lines or ['(no message)'])[-1]}")


class ReplayView:
    """A tick of Dynamo's replay seen through the simulator's interface, for a policy's `decide`.

    `absorb` takes each snapshot; the traffic windows Dynamo drains at every tick are kept (with their end times)
    so that `observe` can merge any span of them; the engines' forward-pass snapshots are cached per worker (the
    latest, pruned to the active workers, as Dynamo's adapter caches them)."""

    def __init__(self, trace: RequestTrace) -> None:
        self.trace = trace
        self.now_s = 0.0
        self._snapshot: dict[str, Any] = {}
        self._traffic: list[tuple[float, float, dict[str, Any]]] = []  # (start_s, end_s, window)
        self._fpm: dict[tuple[str, str, int], dict[str, Any]] = {}
        self._targets: list[int | None] = [None, None]

    def absorb(self, now_s: float, snapshot: dict[str, Any]) -> None:
        previous_s, self.now_s = self.now_s, now_s
        self._snapshot = snapshot
        self._targets = [None, None]
        traffic = snapshot.get("traffic")
        if traffic:
            self._traffic.append((previous_s, now_s, traffic))
        for pool in ("prefill", "decode"):
            for fpm in snapshot.get(f"{pool}_fpm_snapshots") or []:
                self._fpm[(pool, str(fpm["worker_id"]), int(fpm.get("dp_rank", 0)))] = fpm
            active = {str(i) for i in snapshot.get(f"active_{pool}_ids") or []}
            for key in [k for k in self._fpm if k[0] == pool and k[1] not in active]:
                del self._fpm[key]

    def worker_counts(self) -> WorkerCounts:
        """Ready: Dynamo's active workers; expected: its non-draining ones (active and starting), or the target
        set at this tick."""
        snap = self._snapshot
        expected = [
            self._targets[0] if self._targets[0] is not None else int(snap.get("non_draining_prefill_count", 0)),
            self._targets[1] if self._targets[1] is not None else int(snap.get("non_draining_decode_count", 0)),
        ]
        return WorkerCounts(
            ready_prefill=int(snap.get("active_prefill_count", 0)),
            ready_decode=int(snap.get("active_decode_count", 0)),
            expected_prefill=expected[0],
            expected_decode=expected[1],
        )

    def latest_fpm(self) -> tuple[ForwardPassMetrics, ...]:
        return tuple(fpm_from_snapshot(pool, fpm) for (pool, _, _), fpm in sorted(self._fpm.items()))

    def unplaced(self, start_s: float, end_s: float) -> tuple[()]:  # noqa: ARG002 - the simulator's signature
        """Nothing: Dynamo's replay router queues every request (as our simulator's routers other than `slo`)."""
        return ()

    def observe(self, start_s: float, end_s: float, *, planner: Planner | None = None):
        """The window [start_s, end_s) by `window_observation`, with Dynamo's latency and hit-rate figures."""
        ttft_ms, itl_ms, kv_hit_rate = merged_latency(
            [w for s, e, w in self._traffic if s >= start_s - _TICK_TOLERANCE_S and e <= end_s + _TICK_TOLERANCE_S]
        )
        if not self.trace.has_hashes:  # as our simulator: no prefix blocks, no cache, no hit rate
            kv_hit_rate = None
        return window_observation(
            self.trace, start_s, end_s, ttft_ms=ttft_ms, itl_ms=itl_ms, kv_hit_rate=kv_hit_rate, planner=planner
        )

    def set_targets(self, num_prefill: int | None, num_decode: int | None) -> None:
        if num_prefill is not None:
            self._targets[0] = int(num_prefill)
        if num_decode is not None:
            self._targets[1] = int(num_decode)

    def targets(self) -> tuple[int | None, int | None]:
        return self._targets[0], self._targets[1]


def merged_latency(windows: Sequence[dict[str, Any]]) -> tuple[float | None, float | None, float | None]:
    """Mean TTFT, ITL (ms) and prefix-cache hit rate over Dynamo traffic windows, each weighted by its sample
    count (`ttft_count`, `itl_count`, `hit_rate_count`); None where no window has a sample."""

    def mean(value: str, count: str) -> float | None:
        weights = [float(w.get(count) or 0.0) for w in windows]
        total = sum(weights)
        if total <= 0:
            return None
        return sum(float(w.get(value) or 0.0) * c for w, c in zip(windows, weights, strict=True)) / total

    return mean("avg_ttft_ms", "ttft_count"), mean("avg_itl_ms", "itl_count"), mean("avg_kv_hit_rate", "hit_rate_count")


def fpm_from_snapshot(pool: str, fpm: dict[str, Any]) -> ForwardPassMetrics:
    """One engine's snapshot from Dynamo's replay (the field names `dynamo_policy.fpm_message` writes) as ours."""
    return ForwardPassMetrics(
        component=Component.PREFILL if pool == "prefill" else Component.DECODE,
        worker_id=str(fpm["worker_id"]),
        dp_rank=int(fpm.get("dp_rank", 0)),
        wall_time_s=float(fpm.get("wall_time", 0.0)),
        scheduled=ScheduledRequests(
            num_prefill_requests=int(fpm.get("num_prefill_requests", 0)),
            sum_prefill_tokens=int(fpm.get("sum_prefill_tokens", 0)),
            var_prefill_length=float(fpm.get("var_prefill_length", 0.0)),
            sum_prefill_kv_tokens=int(fpm.get("sum_prefill_kv_tokens", 0)),
            num_decode_requests=int(fpm.get("num_decode_requests", 0)),
            sum_decode_kv_tokens=int(fpm.get("sum_decode_kv_tokens", 0)),
            var_decode_kv_tokens=float(fpm.get("var_decode_kv_tokens", 0.0)),
        ),
        queued=QueuedRequests(
            num_prefill_requests=int(fpm.get("num_queued_prefill", 0)),
            sum_prefill_tokens=int(fpm.get("sum_queued_prefill_tokens", 0)),
            var_prefill_length=float(fpm.get("var_queued_prefill_length", 0.0)),
            num_decode_requests=int(fpm.get("num_queued_decode", 0)),
            sum_decode_kv_tokens=int(fpm.get("sum_queued_decode_kv_tokens", 0)),
            var_decode_kv_tokens=float(fpm.get("var_queued_decode_kv_tokens", 0.0)),
        ),
    )


def replay_result(
    trace: RequestTrace, result: dict[str, Any], *, shift_s: float = 0.0, initial: tuple[int, int] = (0, 0)
) -> SimResult:
    """Dynamo's replay report as a `SimResult` indexed like `trace` (the replayed requests, in arrival order).
    Dynamo's records are matched to the trace's requests by arrival order (equal arrivals by their order in
    the report); a request without a record stays unfinished (NaN)."""
    n = trace.num_requests
    ttft_s, itl_s, finish_s = np.full(n, np.nan), np.full(n, np.nan), np.full(n, np.nan)
    records = sorted(result["per_request"], key=lambda r: float(r.get("arrival_time_ms") or 0.0))
    for index, record in enumerate(records[:n]):
        arrival_s = float(record.get("arrival_time_ms") or 0.0) / 1000.0 + shift_s
        if record.get("ttft_ms") is not None:
            ttft_s[index] = float(record["ttft_ms"]) / 1000.0
        if record.get("e2e_latency_ms") is not None:
            finish_s[index] = arrival_s + float(record["e2e_latency_ms"]) / 1000.0
        if record.get("itl_ms") is not None and int(trace.osl[index]) > 1:
            itl_s[index] = float(record["itl_ms"]) / 1000.0
    summary = result["summary"]
    operations = result.get("lifecycle_operations") or []
    counts = {"prefill": initial[0], "decode": initial[1]}
    timeline: list[tuple[float, int, int]] = [(shift_s, initial[0], initial[1])]
    for operation in sorted(operations, key=lambda o: (float(o["at_ms"]), int(o["operation_ordinal"]))):
        counts[operation["pool"]] = len(operation["state_after_batch"]["active"])
        timeline.append((float(operation["at_ms"]) / 1000.0 + shift_s, counts["prefill"], counts["decode"]))
    return SimResult(
        ttft_s=ttft_s,
        itl_s=itl_s,
        finish_s=finish_s,
        gpu_s=float(summary["gpu_hours"]) * 3600.0,
        num_scaling_events=sum(o.get("cause") == "planner_scale" for o in operations),
        worker_timeline=tuple(timeline),
    )
