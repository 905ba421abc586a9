"""The live stack's traffic and engines: the Azure conversation hour cut and compressed (`--traffic conv`) or one
day's load cycle over it (`--traffic day`), as Mooncake JSONL for aiperf; the H200 profile slowed for the mocker
and the planner alike."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path
from typing import TYPE_CHECKING

from planner_core.lab.live.stack import PROFILE_DIR, REPO, LiveError

if TYPE_CHECKING:
    from planner_core.traces import RateShape, RequestTrace

AZURE_CONV = REPO / "planner_core" / "data" / "traces" / "AzureLLMInferenceTrace_conv.csv"


def write_trace(
    out: Path, *, start_s: float, duration_s: float, speedup: float, keep_every: int, max_isl: int, max_osl: int
) -> int:
    """A Mooncake JSONL for aiperf: the Azure conversation trace's requests in [start_s, start_s + duration_s *
    speedup) of its first arrival, timestamps divided by `speedup` (ms), every `keep_every`-th request kept (with
    `keep_every == speedup` the rate is the trace's, its rises and falls `speedup` times faster), lengths capped.
    Returns the request count."""
    import csv

    rows: list[tuple[float, int, int]] = []
    with AZURE_CONV.open() as f:
        reader = csv.reader(f)
        next(reader)
        first: float | None = None
        index = 0
        for stamp, isl, osl in reader:
            t = dt.datetime.fromisoformat(stamp[:26]).timestamp()
            first = t if first is None else first
            offset = t - first - start_s
            if offset < 0:
                continue
            if offset >= duration_s * speedup:
                break
            index += 1
            if (index - 1) % keep_every:
                continue
            rows.append((offset / speedup, min(int(isl), max_isl), max(1, min(int(osl), max_osl))))
    with out.open("w") as f:
        for t, isl, osl in rows:
            f.write(json.dumps({"timestamp": round(t * 1000), "input_length": isl, "output_length": osl}) + "\n")
    return len(rows)


def day_shape(duration_s: float, trough_ratio: float, window_s: float = 10.0) -> RateShape:
    """One day's load cycle over `duration_s`: a cosine from the day's mean rate at the start, down to
    `trough_ratio` of the peak at a quarter of the span (the night), up to the peak at three quarters (the day)
    and back to the mean at the end; constant within `window_s` windows (each at its centre's value)."""
    import math

    import numpy as np

    from planner_core.traces import RateShape

    if not 0 < trough_ratio <= 1:
        raise LiveError(f"--trough-ratio = {trough_ratio!r}: must be in (0, 1]")
    if not (math.isfinite(duration_s) and duration_s >= window_s > 0):
        raise LiveError(f"--duration-s = {duration_s!r}: must be at least one {window_s:g} s window")
    centres = (np.arange(math.ceil(duration_s / window_s)) + 0.5) * window_s / duration_s
    rates = trough_ratio + (1 - trough_ratio) * (1 - np.cos(2 * np.pi * (centres - 0.25))) / 2
    rates.setflags(write=False)
    return RateShape(source=f"a day's cosine (trough {trough_ratio:g} of the peak)", window_s=window_s, rates=rates)


def day_trace(*, duration_s: float, peak_rps: float, trough_ratio: float) -> RequestTrace:
    """The Azure conversation hour's requests under one day's load cycle (`day_shape`) peaking at `peak_rps`.

    The hour is fitted into the run (arrival offsets scaled to `duration_s`), thinned evenly to the cycle's mean
    rate (`RequestTrace.scaled`, deterministic), then its time axis warped so the rate follows the cycle
    (`shape_trace`, as `planner bench --shape` does): the requests' lengths and their burstiness come from the
    whole hour, in its order; the hour's own rises and falls stay on top of the cycle."""
    from planner_core.traces import load_trace, shape_trace

    if not peak_rps > 0:
        raise LiveError(f"--peak-rps = {peak_rps!r}: must be > 0")
    shape = day_shape(duration_s, trough_ratio)
    hour = load_trace(AZURE_CONV)
    fitted = hour.compressed(hour.duration_s / duration_s)
    mean_rps = peak_rps * float(shape.rates.mean() / shape.rates.max())
    thinned = fitted.scaled(mean_rps * duration_s / fitted.num_requests)
    return shape_trace(thinned, shape, duration_s=duration_s)


def write_day_trace(
    out: Path, *, duration_s: float, peak_rps: float, trough_ratio: float, max_isl: int, max_osl: int
) -> int:
    """`day_trace` as a Mooncake JSONL for aiperf (timestamps in ms, lengths capped). Returns the request count."""
    trace = day_trace(duration_s=duration_s, peak_rps=peak_rps, trough_ratio=trough_ratio)
    with out.open("w") as f:
        for t, isl, osl in zip(trace.arrival_s, trace.isl, trace.osl, strict=True):
            row = {"timestamp": round(float(t) * 1000), "input_length": min(int(isl), max_isl),
                   "output_length": max(1, min(int(osl), max_osl))}  # fmt: skip
            f.write(json.dumps(row) + "\n")
    return trace.num_requests


def write_slowed_profile(out: Path, slowdown: float) -> Path:
    """The H200 profile with every latency `slowdown` times longer and every throughput as many times lower: an
    engine that slow, for the mocker's timing and the planner's capacity model alike (both read this folder).

    Why: at the real H200 speed one engine serves ~27 requests/s of the trace's sizes, so scaling past one engine
    would need more HTTP streams than a 2-core machine carries next to the frontend and aiperf; slowed k times,
    the same decisions happen at 1/k of the request rate (and the SLA is k times looser)."""
    import numpy as np

    for part, scaled in (
        ("selected_prefill_interpolation", {"prefill_ttft": slowdown, "prefill_thpt_per_gpu": 1 / slowdown}),
        ("selected_decode_interpolation", {"z_itl": slowdown, "z_thpt_per_gpu": 1 / slowdown}),
    ):
        with np.load(PROFILE_DIR / part / "raw_data.npz") as npz:
            arrays = {key: npz[key] * scaled.get(key, 1) if key in scaled else npz[key] for key in npz.files}
        (out / part).mkdir(parents=True, exist_ok=True)
        np.savez(out / part / "raw_data.npz", **arrays)
    return out
