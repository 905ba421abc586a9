"""`planner profile`: sweep planning, aggregation into Dynamo's profile arrays, the writer (read back by the
planner's own loader), the resumable measurements file, and the HTTP client against a small local engine that
streams tokens on a known schedule. Fast (about a second): the live round trip is `tests/lab/test_profile_live.py`."""

from __future__ import annotations

import importlib.util
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import numpy as np
import pytest

from planner_core.lab.profiler import (
    MEASUREMENTS_FILE,
    ProfilerError,
    load_measurements,
    run_sweep,
    write_plots,
    write_profile,
)
from planner_core.perf.profile import load_profile
from planner_core.perf.profiling import (
    Measurement,
    ProfilingError,
    Role,
    SweepSpec,
    aggregate_profile,
    compare_profiles,
    parse_sweep_values,
    plan_sweep,
    steady_itl_gaps_ms,
)

MAX_KV = 100_000


def _measurements() -> list[Measurement]:
    out = []
    for isl, ttfts in ((100, (10.0, 12.0, 11.0)), (1000, (50.0, 52.0, 51.0)), (4000, (200.0, 199.0, 230.0))):
        out += [
            Measurement(
                key=f"prefill/isl={isl}/r={r}", role=Role.PREFILL, batch=1, context=isl, prompt_tokens=isl, ttft_ms=t
            )
            for r, t in enumerate(ttfts)
        ]
    for batch, context, itl in ((1, 500, 4.0), (8, 500, 6.0), (1, 3000, 5.0), (8, 3000, 10.0)):
        out.append(
            Measurement(
                key=f"decode/batch={batch}/ctx={context}/osl=32/r=0",
                role=Role.DECODE,
                batch=batch,
                context=context,
                prompt_tokens=context - 16,
                ttft_ms=3.0,
                itl_ms=itl,
                num_gaps=31 * batch,
            )
        )
    return out


def test_parse_sweep_values_sorts_and_names_the_bad_item():
    assert parse_sweep_values("--isls", "300, 100,300") == (100, 300)
    with pytest.raises(ProfilingError, match=r"--isls '100,x': 'x' is not a positive whole number"):
        parse_sweep_values("--isls", "100,x")
    with pytest.raises(ProfilingError, match="'0'"):
        parse_sweep_values("--batches", "0,4")


def test_sweep_spec_rejects_bad_values():
    with pytest.raises(ProfilingError, match="--decode-osl 2"):
        SweepSpec(decode_osl=2)
    with pytest.raises(ProfilingError, match="--prefill-repeats 0"):
        SweepSpec(prefill_repeats=0)
    with pytest.raises(ProfilingError, match="--decode-contexts 10: shorter than half"):
        SweepSpec(decode_contexts=(10,), decode_osl=32)


def test_plan_sweep_prefill_first_with_unique_keys():
    spec = SweepSpec(prefill_isls=(100, 200), prefill_repeats=2, decode_batches=(1, 4), decode_contexts=(500,))
    points = plan_sweep(spec)
    assert [p.role for p in points] == [Role.PREFILL] * 4 + [Role.DECODE] * 2
    assert len({p.key for p in points}) == len(points)
    decode = points[-1]
    assert (decode.batch, decode.context, decode.prompt_tokens, decode.max_tokens) == (4, 500, 484, 32)


def test_steady_gaps_only_after_every_stream_started():
    early = [0.0, 0.1, 0.2, 0.3]  # starts decoding before the late stream's first token at 0.25
    late = [0.25, 0.35, 0.45]
    gaps = steady_itl_gaps_ms([early, late])
    assert gaps == pytest.approx([100.0, 100.0])  # the late stream's two; early's 0.2 -> 0.3 began before 0.25
    # no gap after the last first token (a one-token stream came last): every gap is kept rather than none
    assert steady_itl_gaps_ms([[0.0, 0.1, 0.3], [0.5]]) == pytest.approx([100.0, 200.0])


def test_aggregate_writes_a_profile_the_planner_loads(tmp_path):
    prefill, decode = aggregate_profile(_measurements(), max_kv_tokens=MAX_KV, gpus_per_engine=2)
    assert prefill.isl.tolist() == [100, 1000, 4000]
    assert prefill.ttft_ms.tolist() == [11.0, 51.0, 200.0]  # medians
    assert prefill.thpt_per_gpu[1] == pytest.approx(1000 / 0.051 / 2)
    # Dynamo's order: by context, then by load
    assert decode.context_length.tolist() == [500, 500, 3000, 3000]
    assert decode.kv_usage.tolist() == pytest.approx([500 / MAX_KV, 4000 / MAX_KV, 3000 / MAX_KV, 24000 / MAX_KV])
    assert decode.thpt_per_gpu[3] == pytest.approx(8 / 0.010 / 2)
    write_profile(tmp_path, prefill, decode)
    loaded = load_profile(tmp_path)
    assert loaded.prefill == prefill
    assert loaded.decode == decode
    # the JSON twins hold the same arrays
    twin = json.loads((tmp_path / "decode_raw_data.json").read_text())
    assert twin["max_kv_tokens"] == MAX_KV
    assert twin["z_itl"] == decode.itl_ms.tolist()
    with np.load(tmp_path / "selected_decode_interpolation" / "raw_data.npz") as npz:
        assert npz["max_kv_tokens"].tolist() == [MAX_KV]


def test_aggregate_needs_both_roles():
    prefill_only = [m for m in _measurements() if m.role is Role.PREFILL]
    with pytest.raises(ProfilingError, match="no decode measurement"):
        aggregate_profile(prefill_only, max_kv_tokens=MAX_KV)


def test_compare_is_zero_against_itself_and_scales(tmp_path):
    write_profile(tmp_path, *aggregate_profile(_measurements(), max_kv_tokens=MAX_KV))
    profile = load_profile(tmp_path)
    same = compare_profiles(profile, profile)
    for role in Role:
        assert same.median_abs(role) == pytest.approx(0.0, abs=1e-9)
        assert same.worst(role) == pytest.approx(0.0, abs=1e-9)
    half = compare_profiles(profile, profile, time_scale=2.0)
    assert half.worst(Role.DECODE) == pytest.approx(-0.5)
    assert len(half.errors(Role.PREFILL)) == 3


def test_measurements_file_ignores_a_torn_last_line_only(tmp_path):
    path = tmp_path / MEASUREMENTS_FILE
    lines = [json.dumps(m.to_json()) for m in _measurements()[:2]]
    path.write_text("\n".join([*lines, '{"key": "prefill/is']))
    assert [m.key for m in load_measurements(path)] == [m.key for m in _measurements()[:2]]
    path.write_text("\n".join(['{"key"', *lines]))
    with pytest.raises(ProfilingError, match=f"{MEASUREMENTS_FILE}:1: not JSON"):
        load_measurements(path)
    bad = {**_measurements()[5].to_json(), "ttft_ms": -1}
    path.write_text(json.dumps(bad) + "\n")
    with pytest.raises(ProfilingError, match=r":1: field ttft_ms: -1.0 is not a positive number"):
        load_measurements(path)


def test_plots_are_written(tmp_path):
    prefill, decode = aggregate_profile(_measurements(), max_kv_tokens=MAX_KV)
    written = write_plots(tmp_path, prefill, decode, title="t", reference=(prefill, decode))
    assert [p.name for p in written] == ["prefill_performance.png", "decode_performance.png", "profile.html"]
    assert (tmp_path / "prefill_performance.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    page = (tmp_path / "profile.html").read_text()
    assert page.count("data:image/png;base64,") == 2 and "http" not in page


# --------------------------------------------------------------------------------------------------------
# The client against a small engine: TTFT = 0.02 ms per prompt token + 5 ms, one token every 20 ms
# --------------------------------------------------------------------------------------------------------

TOKEN_GAP_S = 0.02


class _Engine(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    calls: list[dict] = []  # the test reads what was sent

    def log_message(self, *args) -> None:  # quiet
        pass

    def do_GET(self) -> None:
        body = json.dumps({"object": "list", "data": [{"id": "m"}]}).encode()
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self) -> None:
        request = json.loads(self.rfile.read(int(self.headers["content-length"])))
        _Engine.calls.append(request)
        self.send_response(200)
        self.send_header("content-type", "text/event-stream")
        self.send_header("connection", "close")
        self.end_headers()
        time.sleep(0.005 + 0.00002 * len(request["prompt"]))
        for i in range(request["max_tokens"]):
            if i:
                time.sleep(TOKEN_GAP_S)
            self.wfile.write(f"data: {json.dumps({'choices': [{'text': 'x'}]})}\n\n".encode())
            self.wfile.flush()
        usage = {"choices": [], "usage": {"prompt_tokens": len(request["prompt"])}}
        self.wfile.write(f"data: {json.dumps(usage)}\n\ndata: [DONE]\n\n".encode())
        self.wfile.flush()
        self.close_connection = True


@pytest.fixture
def engine():
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Engine)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    _Engine.calls.clear()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_sweep_measures_the_engine_and_resumes(engine, tmp_path):
    spec = SweepSpec(
        prefill_isls=(100, 2000), prefill_repeats=1, decode_batches=(1, 3), decode_contexts=(300,), decode_osl=6
    )
    points = plan_sweep(spec)
    seen = []
    measured = run_sweep(engine, "m", points, tmp_path, on_point=lambda _point, m: seen.append(m is None))
    assert seen == [False] * len(points)
    by_key = {m.key: m for m in measured}
    ttft = by_key["prefill/isl=2000/r=0"].ttft_ms
    assert 45.0 <= ttft < 45.0 + 40.0  # 5 + 0.02 x 2000 ms, plus this machine's scheduling
    decode = by_key["decode/batch=3/ctx=300/osl=6/r=0"]
    assert decode.prompt_tokens == 297 and decode.num_gaps >= 5
    assert 1000 * TOKEN_GAP_S <= decode.itl_ms < 1000 * TOKEN_GAP_S + 15.0
    # the decode burst sent its prompts twice (warm-up, then the burst), the same ids both times
    bursts = [c["prompt"] for c in _Engine.calls if len(c["prompt"]) == 297]
    assert len(bursts) == 2 * (1 + 3) and len({tuple(b) for b in bursts}) == 1 + 3
    # a rerun measures nothing again
    calls = len(_Engine.calls)
    seen.clear()
    again = run_sweep(engine, "m", points, tmp_path, on_point=lambda _point, m: seen.append(m is None))
    assert seen == [True] * len(points) and len(_Engine.calls) == calls
    assert [m.to_json() for m in again] == [m.to_json() for m in measured]


def test_unreachable_endpoint_and_unknown_model_are_one_line(engine, tmp_path):
    points = plan_sweep(SweepSpec(prefill_isls=(10,), prefill_repeats=1, decode_batches=(1,), decode_contexts=(50,)))
    with pytest.raises(ProfilerError, match=r"^http://127.0.0.1:1/v1/models: unreachable \(ConnectError"):
        run_sweep("http://127.0.0.1:1", "m", points, tmp_path)
    with pytest.raises(ProfilerError, match=r"model 'other' is not served \(served: m\)$"):
        run_sweep(engine, "other", points, tmp_path)
    assert not (tmp_path / MEASUREMENTS_FILE).exists()  # nothing measured, nothing written


# --------------------------------------------------------------------------------------------------------
# Choosing the parallel configuration (`planner profile --aic`)
# --------------------------------------------------------------------------------------------------------


def test_rank_prefill_best_throughput_per_gpu_meeting_ttft():
    from planner_core.perf.profiling import rank_prefill

    # TP1 misses 200 ms; TP2 and TP4 meet it, TP2 with more tokens/s per GPU (3000 / 0.15 / 2 > 3000 / 0.09 / 4)
    ranking = rank_prefill({("TP1", 1): 250.0, ("TP2", 2): 150.0, ("TP4", 4): 90.0}, isl=3000, ttft_target_ms=200)
    assert [c.config for c in ranking] == ["TP2", "TP4", "TP1"]
    assert ranking[0].thpt_per_gpu == pytest.approx(3000 / 0.150 / 2)
    assert ranking[-1].reason == "ttft_over_target" and not ranking[-1].meets_sla


def test_rank_decode_largest_fitting_batch_under_itl():
    from planner_core.perf.profiling import rank_decode

    table = {
        ("TP1", 1): {1: (5.0, True), 16: (9.0, True), 64: (12.0, True)},  # batch 16: 16 / 9 ms
        ("TP2", 2): {1: (4.0, True), 16: (6.0, True), 64: (9.5, True)},  # batch 64: 64 / 9.5 ms / 2 GPUs
        ("TP4", 4): {1: (11.0, True)},  # misses at batch 1
        ("TP8", 8): {1: (3.0, False)},  # does not fit
    }
    ranking = rank_decode(table, itl_target_ms=10.0)
    assert [(c.config, c.batch) for c in ranking[:2]] == [("TP2", 64), ("TP1", 16)]
    assert ranking[0].thpt_per_gpu == pytest.approx(64 / 0.0095 / 2)
    assert {c.config: c.reason for c in ranking[2:]} == {"TP4": "no_batch_meets_itl", "TP8": "does_not_fit_memory"}


@pytest.mark.skipif(
    importlib.util.find_spec("aiconfigurator") is None,
    reason="aiconfigurator not installed: run `make venv` (it installs the aic extra)",
)
def test_profile_from_aiconfigurator_on_a_tiny_grid(tmp_path):
    import sys

    from planner_core.lab.profile_aic import AicProfileSpec, profile_from_aic

    spec = AicProfileSpec(
        model="nvidia/Llama-3.1-8B-Instruct-FP8",
        aic_model="meta-llama/Meta-Llama-3.1-8B",
        gemm_quant="fp8",
        gpu="h200",
        isl=1024,
        osl=64,
        ttft_ms=200.0,
        itl_ms=10.0,
        tp_grid=(1, 2),
        isl_grid=(),
        choice_batch_grid=(1, 64),
        ctx_grid=(),
    )
    result = profile_from_aic(spec, aic_python=sys.executable)
    assert result.num_estimates == 2 * (1 + 2) and result.num_failed == 0  # per TP: the target ISL, two batches
    assert {c.config for c in result.prefill_ranking} == {"TP1", "TP2"}
    best = result.prefill_ranking[0]
    # per GPU, one engine of TP1 prefills more than one of TP2 (TP2 is not twice as fast), and both meet 200 ms
    assert best.config == "TP1" and best.meets_sla and result.prefill_ranking[1].meets_sla
    assert best.thpt_per_gpu > result.prefill_ranking[1].thpt_per_gpu
    decode = result.decode_ranking[0]
    assert decode.meets_sla and decode.latency_ms <= 10.0 and decode.batch in (1, 64)
    write_profile(tmp_path, result.prefill, result.decode)
    loaded = load_profile(tmp_path)
    assert loaded.prefill.isl.tolist() == [1024]
    assert loaded.decode.context_length.tolist() == [1056, 1056]
    assert loaded.decode.max_kv_tokens == 64 * 1056  # the most batch x context aiconfigurator says fits
