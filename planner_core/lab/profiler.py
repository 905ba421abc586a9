"""Measuring a running OpenAI-compatible engine, and writing the profile (`planner profile --endpoint`).

Role: the I/O around `planner_core.perf.profiling` (which plans the sweep and aggregates): an async HTTP client
(httpx) that streams completions and times their tokens, the resumable measurements file, the profile writer
(Dynamo's layout: `selected_{prefill,decode}_interpolation/raw_data.npz` and the JSON twins
`prefill_raw_data.json` / `decode_raw_data.json`), and the plots (PNG with matplotlib, one self-contained HTML).

Requests go to `/v1/completions` with the prompt given as token ids: the prompt length is then exact for any
tokenizer (a chat request adds the chat template's tokens), and random ids make every prompt unique, so the
engine's prefix cache never shortens a prefill it should measure. The engine's own count (`usage.prompt_tokens`)
is what the measurement records.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import html
import io
import json
import os
import random
import re
import statistics
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import httpx
import numpy as np

from planner_core.perf.profile import (
    DECODE_JSON_NAME,
    DECODE_SUBDIR,
    NPZ_NAME,
    PREFILL_JSON_NAME,
    PREFILL_SUBDIR,
    DecodeProfile,
    PrefillProfile,
)
from planner_core.perf.profiling import (
    Measurement,
    ProfilingError,
    Role,
    SweepPoint,
    profile_arrays,
    steady_itl_gaps_ms,
)

__all__ = [
    "MEASUREMENTS_FILE",
    "ProfilerError",
    "StreamTiming",
    "check_endpoint",
    "engine_kv_capacity",
    "load_measurements",
    "measure_point",
    "run_sweep",
    "write_plots",
    "write_profile",
]

MEASUREMENTS_FILE = "measurements.jsonl"
PROMPT_TOKEN_IDS = (10, 1000)  # ids valid in any vocabulary of 1000+ tokens
REQUEST_TIMEOUT_S = 600.0


class ProfilerError(RuntimeError):
    """The endpoint cannot be profiled (unreachable, model not served, a request failed): one line."""


@dataclass(frozen=True, slots=True)
class StreamTiming:
    """One streamed request: when each token arrived (seconds since the request was sent), and the prompt
    length the engine reported (None if it did not)."""

    token_times_s: tuple[float, ...]
    prompt_tokens: int | None


def _prompt_ids(key: str, stream: int, num_tokens: int) -> list[int]:
    """Random token ids, the same for the same point and stream (a decode burst re-sends its warm-up prompts)."""
    seed = int.from_bytes(hashlib.sha256(f"{key}#{stream}".encode()).digest()[:8], "big")
    rng = random.Random(seed)
    low, high = PROMPT_TOKEN_IDS
    return [rng.randrange(low, high) for _ in range(num_tokens)]


async def _stream(client: httpx.AsyncClient, url: str, model: str, prompt: list[int], max_tokens: int) -> StreamTiming:
    body = {
        "model": model,
        "prompt": prompt,
        "max_tokens": max_tokens,
        "min_tokens": max_tokens,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    times: list[float] = []
    prompt_tokens: int | None = None
    started = time.perf_counter()
    async with client.stream("POST", url, json=body) as response:
        if response.status_code != 200:
            text = " ".join((await response.aread()).decode(errors="replace").split())[:200]
            raise ProfilerError(f"{url}: HTTP {response.status_code}: {text}")
        async for line in response.aiter_lines():
            if not line.startswith("data:"):
                continue
            data = line[5:].strip()
            if data == "[DONE]":
                break
            chunk = json.loads(data)
            now = time.perf_counter() - started
            if chunk.get("usage"):
                prompt_tokens = chunk["usage"].get("prompt_tokens")
            for choice in chunk.get("choices") or ():
                if choice.get("text") or (choice.get("delta") or {}).get("content"):
                    times.append(now)
                    break
    if not times:
        raise ProfilerError(f"{url}: the stream ended without a token")
    return StreamTiming(tuple(times), prompt_tokens)


def _client(timeout_s: float = REQUEST_TIMEOUT_S) -> httpx.AsyncClient:
    limits = httpx.Limits(max_connections=1024, max_keepalive_connections=1024)
    return httpx.AsyncClient(timeout=httpx.Timeout(timeout_s, connect=10.0), limits=limits)


async def measure_point(client: httpx.AsyncClient, endpoint: str, model: str, point: SweepPoint) -> Measurement:
    """Measure one sweep point (see `planner_core.perf.profiling` for what each role measures)."""
    url = endpoint.rstrip("/") + "/v1/completions"
    if point.role is Role.PREFILL:
        timing = await _stream(client, url, model, _prompt_ids(point.key, 0, point.prompt_tokens), 1)
        return Measurement(
            key=point.key,
            role=point.role,
            batch=1,
            context=point.context,
            prompt_tokens=timing.prompt_tokens or point.prompt_tokens,
            ttft_ms=timing.token_times_s[0] * 1000.0,
        )
    prompts = [_prompt_ids(point.key, i, point.prompt_tokens) for i in range(point.batch)]
    # warm-up: the same prompts once, so the burst below finds them in the prefix cache and decodes at once
    await asyncio.gather(*(_stream(client, url, model, prompt, 1) for prompt in prompts))
    sent = time.perf_counter()
    starts: list[float] = []

    async def one(prompt: list[int]) -> StreamTiming:
        starts.append(time.perf_counter() - sent)
        return await _stream(client, url, model, prompt, point.max_tokens)

    timings = await asyncio.gather(*(one(prompt) for prompt in prompts))
    # on one clock: each stream's token times are relative to its own send
    absolute = [[start + t for t in timing.token_times_s] for start, timing in zip(starts, timings, strict=True)]
    gaps = steady_itl_gaps_ms(absolute)
    if not gaps:
        raise ProfilerError(f"{point.key}: no inter-token gap measured (one token per stream?)")
    reported = [t.prompt_tokens for t in timings if t.prompt_tokens]
    return Measurement(
        key=point.key,
        role=point.role,
        batch=point.batch,
        context=point.context,
        prompt_tokens=int(statistics.median(reported)) if reported else point.prompt_tokens,
        ttft_ms=statistics.median(t.token_times_s[0] for t in timings) * 1000.0,
        itl_ms=statistics.median(gaps),
        num_gaps=len(gaps),
    )


def load_measurements(path: Path) -> list[Measurement]:
    """The measurements file's points (empty when it does not exist). A torn last line (a killed run) is
    ignored; any other bad line is an error naming the file and line."""
    if not path.exists():
        return []
    lines = path.read_text(encoding="utf-8").splitlines()
    out = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            data = json.loads(line)
        except json.JSONDecodeError as exc:
            if number == len(lines):
                break  # the run was killed while writing it: measure that point again
            raise ProfilingError(f"{path}:{number}: not JSON ({exc})") from exc
        out.append(Measurement.from_json(data, where=f"{path}:{number}"))
    return out


async def check_endpoint(endpoint: str, model: str) -> None:
    """Fail with one line unless the endpoint answers `/v1/models` and serves `model`."""
    url = endpoint.rstrip("/") + "/v1/models"
    try:
        async with _client(10.0) as client:
            response = await client.get(url)
    except httpx.HTTPError as exc:
        raise ProfilerError(f"{url}: unreachable ({type(exc).__name__}: {exc or 'no answer'})") from exc
    if response.status_code != 200:
        raise ProfilerError(f"{url}: HTTP {response.status_code}")
    try:
        served = [entry["id"] for entry in response.json()["data"]]
    except (ValueError, KeyError, TypeError) as exc:
        raise ProfilerError(f"{url}: not an OpenAI model list ({exc})") from exc
    if model not in served:
        raise ProfilerError(f"{url}: model {model!r} is not served (served: {', '.join(served) or 'none'})")


def engine_kv_capacity(endpoint: str, model: str) -> int | None:
    """The engine's KV capacity (tokens) from a Dynamo frontend's `/metrics` (total KV blocks x block size), or
    None when the endpoint does not publish them."""
    try:
        text = httpx.get(endpoint.rstrip("/") + "/metrics", timeout=10.0).text
    except httpx.HTTPError:
        return None

    def gauge(name: str) -> float | None:
        match = re.search(rf'^{name}\{{[^}}]*model="{re.escape(model)}"[^}}]*\}} ([0-9.eE+]+)$', text, re.MULTILINE)
        return float(match.group(1)) if match else None

    blocks, block_size = (
        gauge("dynamo_frontend_model_total_kv_blocks"),
        gauge("dynamo_frontend_model_kv_cache_block_size"),
    )
    if not blocks or not block_size:
        return None
    return int(blocks * block_size)


def run_sweep(
    endpoint: str,
    model: str,
    points: Sequence[SweepPoint],
    out_dir: Path,
    *,
    on_point: Callable[[SweepPoint, Measurement | None], None] | None = None,
) -> list[Measurement]:
    """Measure the points not yet in `out_dir/measurements.jsonl`, appending each as it completes.

    `on_point(point, measurement)` sees every point (measurement None: it was already measured). Returns all the
    measurements of `points` (the earlier ones and the new ones).
    """
    path = out_dir / MEASUREMENTS_FILE
    done = {m.key: m for m in load_measurements(path)}
    asyncio.run(check_endpoint(endpoint, model))

    async def go() -> None:
        async with _client() as client:
            with path.open("a", encoding="utf-8") as handle:
                for point in points:
                    if point.key in done:
                        if on_point is not None:
                            on_point(point, None)
                        continue
                    try:
                        measurement = await measure_point(client, endpoint, model, point)
                    except httpx.HTTPError as exc:
                        raise ProfilerError(f"{endpoint}: {point.key}: {type(exc).__name__}: {exc}") from exc
                    handle.write(json.dumps(measurement.to_json()) + "\n")
                    handle.flush()
                    done[point.key] = measurement
                    if on_point is not None:
                        on_point(point, measurement)

    asyncio.run(go())
    return [done[point.key] for point in points]


# --------------------------------------------------------------------------------------------------------
# Writing the profile and its plots
# --------------------------------------------------------------------------------------------------------


def _atomic_write(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
        os.chmod(tmp, 0o644)  # mkstemp makes it private; a profile is read by the planner, maybe as another user
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def write_profile(out_dir: Path, prefill: PrefillProfile, decode: DecodeProfile) -> list[Path]:
    """Write the profile in Dynamo's layout (NPZ per phase plus the JSON twins); each file atomically."""
    prefill_arrays, decode_arrays = profile_arrays(prefill, decode)
    written = []
    for subdir, json_name, arrays in (
        (PREFILL_SUBDIR, PREFILL_JSON_NAME, prefill_arrays),
        (DECODE_SUBDIR, DECODE_JSON_NAME, decode_arrays),
    ):
        buffer = io.BytesIO()
        npz = {key: np.asarray(value if isinstance(value, list) else [value]) for key, value in arrays.items()}
        np.savez(buffer, **npz)
        _atomic_write(out_dir / subdir / NPZ_NAME, buffer.getvalue())
        _atomic_write(out_dir / json_name, (json.dumps(arrays, indent=1) + "\n").encode())
        written += [out_dir / subdir / NPZ_NAME, out_dir / json_name]
    return written


def _figures(
    prefill: PrefillProfile,
    decode: DecodeProfile,
    reference: tuple[PrefillProfile, DecodeProfile] | None,
    label: str,
):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figures = {}
    fig, (ttft_ax, thpt_ax) = plt.subplots(1, 2, figsize=(11, 4))
    ttft_ax.plot(prefill.isl, prefill.ttft_ms, "o-", label=label)
    thpt_ax.plot(prefill.isl, prefill.thpt_per_gpu, "o-", label=label)
    if reference is not None:
        ref = reference[0]
        shown = ref.isl <= prefill.isl.max() * 1.2  # the reference over the measured range only
        ttft_ax.plot(ref.isl[shown], ref.ttft_ms[shown], "x--", color="grey", label="reference")
        thpt_ax.plot(ref.isl[shown], ref.thpt_per_gpu[shown], "x--", color="grey", label="reference")
    ttft_ax.set(xlabel="ISL (tokens)", ylabel="TTFT (ms)", title="Prefill: TTFT, one request at a time")
    thpt_ax.set(xlabel="ISL (tokens)", ylabel="tokens/s/GPU", title="Prefill throughput per GPU")
    for ax in (ttft_ax, thpt_ax):
        ax.grid(alpha=0.3)
        ax.legend()
    fig.tight_layout()
    figures["prefill"] = fig

    fig, (itl_ax, thpt_ax) = plt.subplots(1, 2, figsize=(11, 4))
    batches = decode.kv_usage * decode.max_kv_tokens / decode.context_length
    for context in np.unique(decode.context_length):
        rows = decode.context_length == context
        order = np.argsort(batches[rows])
        line = itl_ax.plot(batches[rows][order], decode.itl_ms[rows][order], "o-", label=f"ctx {context:g}")
        thpt_ax.plot(batches[rows][order], decode.thpt_per_gpu[rows][order], "o-", color=line[0].get_color())
        if reference is not None:
            ref = reference[1]
            ref_rows = ref.context_length == context
            if ref_rows.any():
                ref_batch = ref.kv_usage[ref_rows] * ref.max_kv_tokens / context
                keep = ref_batch <= batches[rows].max() * 1.5
                itl_ax.plot(ref_batch[keep], ref.itl_ms[ref_rows][keep], "x--", color=line[0].get_color(), alpha=0.6)
    itl_ax.set(xlabel="concurrent requests (batch)", ylabel="ITL (ms)", title="Decode: ITL by batch and context")
    if reference is not None:
        itl_ax.plot([], [], "x--", color="grey", label="reference")
    thpt_ax.set(xlabel="concurrent requests (batch)", ylabel="tokens/s/GPU", title="Decode throughput per GPU")
    for ax in (itl_ax, thpt_ax):
        ax.grid(alpha=0.3)
    itl_ax.legend()
    fig.tight_layout()
    figures["decode"] = fig
    return figures, plt


def _table(header: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    cells = "".join(f"<th>{html.escape(h)}</th>" for h in header)
    body = "".join(
        "<tr>"
        + "".join(f"<td>{html.escape(f'{v:,.4g}' if isinstance(v, float) else str(v))}</td>" for v in row)
        + "</tr>"
        for row in rows
    )
    return f"<table><tr>{cells}</tr>{body}</table>"


def write_plots(
    out_dir: Path,
    prefill: PrefillProfile,
    decode: DecodeProfile,
    *,
    title: str,
    reference: tuple[PrefillProfile, DecodeProfile] | None = None,
    label: str = "measured",
) -> list[Path]:
    """`prefill_performance.png`, `decode_performance.png` and `profile.html` (the plots inline as PNG data and
    the measured values as tables: one file, no network). Needs matplotlib.

    Raises:
        ProfilerError: matplotlib is not installed.
    """
    try:
        figures, plt = _figures(prefill, decode, reference, label)
    except ImportError as exc:
        raise ProfilerError(f"plots need matplotlib ({exc}); the profile itself is written") from exc
    written, inline = [], {}
    for name, fig in figures.items():
        buffer = io.BytesIO()
        fig.savefig(buffer, format="png", dpi=110)
        plt.close(fig)
        _atomic_write(out_dir / f"{name}_performance.png", buffer.getvalue())
        written.append(out_dir / f"{name}_performance.png")
        inline[name] = base64.b64encode(buffer.getvalue()).decode()
    batches = decode.kv_usage * decode.max_kv_tokens / decode.context_length
    page = (
        "<!doctype html><html><head><meta charset='utf-8'>"
        f"<title>{html.escape(title)}</title><style>body{{font-family:sans-serif;margin:2em}}"
        "table{border-collapse:collapse}td,th{border:1px solid #ccc;padding:2px 8px;text-align:right}</style>"
        f"</head><body><h1>{html.escape(title)}</h1>"
        f"<h2>Prefill</h2><img alt='prefill' src='data:image/png;base64,{inline['prefill']}'>"
        + _table(
            ("ISL", "TTFT (ms)", "tokens/s/GPU"),
            [
                (int(i), float(t), float(p))
                for i, t, p in zip(prefill.isl, prefill.ttft_ms, prefill.thpt_per_gpu, strict=True)
            ],
        )
        + f"<h2>Decode</h2><p>KV capacity {decode.max_kv_tokens:,} tokens</p>"
        f"<img alt='decode' src='data:image/png;base64,{inline['decode']}'>"
        + _table(
            ("context", "batch", "KV usage", "ITL (ms)", "tokens/s/GPU"),
            [
                (int(c), round(float(b)), float(k), float(i), float(p))
                for c, b, k, i, p in zip(
                    decode.context_length, batches, decode.kv_usage, decode.itl_ms, decode.thpt_per_gpu, strict=True
                )
            ],
        )
        + "</body></html>\n"
    )
    _atomic_write(out_dir / "profile.html", page.encode())
    written.append(out_dir / "profile.html")
    return written
