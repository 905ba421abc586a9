"""The live stack's traffic and engines: a recorded trace selected by name, cut, sampled and compressed (`--traffic
conv`, the Azure conversation hour; `code`, the Azure code hour; `mooncake`, Mooncake's trace with its prefix
blocks), or one day's load cycle over the conversation hour (`--traffic day`), as Mooncake JSONL for aiperf; the H200
profile slowed for the mocker and the planner alike."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

from planner_core.lab.live.stack import PROFILE_DIR, REPO, LiveError

if TYPE_CHECKING:
    from planner_core.traces import RateShape, RequestTrace

TRACES_DIR = REPO / "planner_core" / "data" / "traces"
AZURE_CONV = TRACES_DIR / "AzureLLMInferenceTrace_conv.csv"
# The recorded traces `--traffic` names (the files and their sources: planner_core/data/traces/ and its README)
RECORDED_TRACES = {
    "conv": AZURE_CONV,  # Azure 2023 conversation hour: 5.5 req/s, prompts 1,155 tokens on average
    "code": TRACES_DIR / "AzureLLMInferenceTrace_code.csv",  # Azure 2023 code hour: 2.6 req/s, very bursty
    "mooncake": TRACES_DIR / "synthetic_trace.jsonl",  # Mooncake's 17 minutes: 3.9 req/s, long shared prefixes
}


# `--traffic day`'s default compression: the policy's time constants divided by 6 (the day has no recorded length)
DAY_SPEEDUP = 6.0


def fitting_speedup(name: str, *, start_s: float, duration_s: float) -> float:
    """`planner live`'s default `--speedup`: the recorded trace `name` from `start_s` to its end in `duration_s`
    (the Azure conversation hour in 900 s: 3.89), rounded down to 0.01 so the run never asks for more trace than
    there is; `DAY_SPEEDUP` for the day cycle.

    Raises:
        LiveError: `name` is not a recorded trace, or `start_s` leaves none of it.
    """
    import math

    from planner_core.traces import load_trace

    if name == "day":
        return DAY_SPEEDUP
    if name not in RECORDED_TRACES:
        raise LiveError(f"--traffic = {name!r}: not a recorded trace (known: {', '.join(RECORDED_TRACES)}, day)")
    left_s = load_trace(RECORDED_TRACES[name]).duration_s - start_s
    if left_s <= 0:
        raise LiveError(f"--trace-start-s = {start_s:g}: past the end of the {name} trace ({left_s + start_s:.0f} s)")
    return max(0.01, math.floor(left_s / duration_s * 100) / 100)


def write_trace(
    out: Path,
    *,
    start_s: float,
    duration_s: float,
    speedup: float,
    keep_every: int,
    max_isl: int,
    max_osl: int,
    name: str = "conv",
) -> int:
    """A Mooncake JSONL for aiperf: the recorded trace `name`'s requests in [start_s, start_s + duration_s *
    speedup) of its first arrival, timestamps divided by `speedup` (ms), every `keep_every`-th request kept (with
    `keep_every == speedup` the rate is the trace's, its rises and falls `speedup` times faster), lengths as recorded
    up to the caps. A trace with prefix blocks (Mooncake's `hash_ids`) keeps them, cut to the blocks of the capped
    prompt, so requests share prefixes as recorded. Returns the request count.

    Raises:
        LiveError: `name` is not a recorded trace, the run asks for more of it than it holds, or the cut holds no
            request.
    """
    from planner_core.traces import load_trace

    if name not in RECORDED_TRACES:
        raise LiveError(f"--traffic = {name!r}: not a recorded trace (known: {', '.join(RECORDED_TRACES)}, day)")
    trace = load_trace(RECORDED_TRACES[name])
    if start_s + duration_s * speedup > trace.duration_s + 1:  # a run that would end idle is not the trace
        raise LiveError(
            f"--duration-s {duration_s:g} x --speedup {speedup:g} = {duration_s * speedup:g} s of the {name} trace "
            f"from --trace-start-s {start_s:g}, but it lasts {trace.duration_s:.0f} s: shorten the run or compress more"
        )
    inside = [i for i, t in enumerate(trace.arrival_s.tolist()) if 0 <= t - start_s < duration_s * speedup]
    kept = inside[::keep_every]
    if not kept:
        raise LiveError(
            f"--trace-start-s = {start_s:g}: no request of the {name} trace in [{start_s:g}, "
            f"{start_s + duration_s * speedup:g}) s (it lasts {trace.duration_s:.0f} s)"
        )
    with out.open("w") as f:
        for i in kept:
            isl = min(int(trace.isl[i]), max_isl)
            row: dict = {
                "timestamp": round((float(trace.arrival_s[i]) - start_s) / speedup * 1000),
                "input_length": isl,
                "output_length": max(1, min(int(trace.osl[i]), max_osl)),
            }
            if trace.has_hashes:
                row["hash_ids"] = trace.request_hashes(i)[: -(-isl // trace.block_tokens)].tolist()
            f.write(json.dumps(row) + "\n")
    return len(kept)


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
