"""Fuzz suite over everything that enters from outside: config files, traces, engine profiles, forward-pass messages.

Every generated case must end in a valid result or in the input's own one-line error (`ConfigError`,
`TraceError`, `ProfileError`, `FpmDecodeError`: a `ValueError` naming the file or message, the field and the
value), never another exception, and within a memory cap measured with `tracemalloc` (the peak of Python-level
allocations, numpy's included). Valid results are then used a little (hashed, windowed, interpolated, re-encoded) so
that a value accepted at the door but unusable behind it fails here too.

Seeded (`derandomize`) so a failure reproduces; ~1 minute in all on a 2-core machine.
"""

from __future__ import annotations

import json
import math
import tempfile
import tracemalloc
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgpack
import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from planner_core.config import ConfigError, PlannerConfig, ServiceConfig, config_hash, load_config, parse_config
from planner_core.domain import Component
from planner_core.perf.profile import ProfileError, load_profile
from planner_core.runtime.ingest import FpmDecodeError, FpmIngest, decode_fpm_message, encode_fpm_message
from planner_core.traces import TraceError, bucket_windows, load_trace

MEMORY_CAP_BYTES = 64 * 1024 * 1024  # per case; real inputs of these sizes need a few MB
MAX_ERROR_CHARS = 1000

FUZZ = settings(
    derandomize=True,
    database=None,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


def ends_cleanly(case: Callable[[], Any], errors: type[Exception] | tuple[type[Exception], ...]) -> Any:
    """Run `case` under a memory cap: its result, or None after one of `errors` with a one-line message.

    Any other exception escapes and fails the test.
    """
    tracemalloc.start()
    try:
        try:
            result = case()
        except errors as exc:
            message = str(exc)
            assert message and "\n" not in message, repr(message)
            assert len(message) <= MAX_ERROR_CHARS, message
            result = None
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak <= MEMORY_CAP_BYTES, f"peak {peak / 1e6:.1f} MB"
    return result


# --- values a hostile or broken file holds ------------------------------------------------------------------------

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.sampled_from([0, 1, -1, 2**31, 2**40, 2**63, 10**6, 10**9]),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([1e308, -1e308, 1e-308, 0.5, 60.0, 2.5]),
    st.text(max_size=20),
    st.sampled_from(["", "agg", "disagg", "sla", "load", "virtual", "1e999", "nan", "true", "50"]),
)
values = st.recursive(
    scalars,
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=10), inner, max_size=4)),
    max_leaves=12,
)

# msgpack carries integers of at most 64 bits
wire_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**63), max_value=2**64 - 1),
    st.sampled_from([0, 1, -1, 2**31, 2**63, 2**64 - 1]),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=20),
    st.binary(max_size=10),
)
wire_values = st.recursive(
    wire_scalars,
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=10), inner, max_size=4)),
    max_leaves=12,
)

KNOWN_FIELDS = sorted({*PlannerConfig.model_fields, *ServiceConfig.model_fields, "ttft", "itl"})


# --- configs ------------------------------------------------------------------------------------------------------


@FUZZ
@given(data=st.dictionaries(st.one_of(st.sampled_from(KNOWN_FIELDS), st.text(max_size=12)), values, max_size=8))
def test_fuzz_config_mappings(data: dict[str, Any]) -> None:
    def case() -> None:
        loaded = parse_config(data, "fuzz.yaml")
        policy = loaded.policy
        config_hash(policy)
        assert policy.scale_interval_seconds_effective > 0
        for component in (Component.PREFILL, Component.DECODE):
            policy.engine_limits(component)

    ends_cleanly(case, ConfigError)


yaml_text = st.text(alphabet=st.sampled_from(list("abcdefgh_:-[]{}&*!|>'\"#0123456789.e+ \n\t,?%@")), max_size=300)


@FUZZ
@given(
    text=st.one_of(yaml_text, st.builds(lambda k, v: f"{k}: {json.dumps(v)}\n", st.sampled_from(KNOWN_FIELDS), values))
)
def test_fuzz_config_files(text: str) -> None:
    with tempfile.TemporaryDirectory() as folder:
        for suffix in (".yaml", ".json"):
            path = Path(folder) / f"fuzz{suffix}"
            path.write_text(text)
            ends_cleanly(lambda path=path: load_config(path), ConfigError)


# --- traces -------------------------------------------------------------------------------------------------------

numbers = st.one_of(
    st.integers(min_value=-5, max_value=10**4),
    st.floats(min_value=0, max_value=1e5),
    st.sampled_from([1e308, 1e15, -1.0, 2**63, 10**12, 0, True, None, "7", 4_102_444_800_001]),
)


def _mooncake_record(timestamp: Any, isl: Any, osl: Any, hashes: Any) -> dict[str, Any]:
    record = {"timestamp": timestamp, "input_length": isl, "output_length": osl}
    if hashes is not None:
        record["hash_ids"] = hashes
    return record


# Well-typed values, a quarter of them extreme: whole files of them get past the type checks, so the bounds and
# what is done with an accepted trace are what gets tested.
plausible = st.one_of(
    st.integers(min_value=0, max_value=10**4),
    st.integers(min_value=0, max_value=10**4),
    st.integers(min_value=0, max_value=10**4),
    st.sampled_from([1e15, 1e308, 10**12, 2**53]),
)
plausible_mooncake = st.lists(
    st.builds(lambda *fields: json.dumps(_mooncake_record(*fields, None)), plausible, plausible, plausible),
    min_size=1,
    max_size=10,
)
mooncake_lines = st.lists(
    st.one_of(
        st.builds(
            lambda *fields: json.dumps(_mooncake_record(*fields)),
            numbers, numbers, numbers, st.one_of(st.none(), st.lists(numbers, max_size=5)),
        ),
        st.text(max_size=30),
    ),
    min_size=1,
    max_size=20,
)  # fmt: skip


def _dynamo_line(received: Any, isl: Any, osl: Any, event_type: str) -> str:
    event = {
        "schema": "dynamo.request.trace.v1",
        "event_type": event_type,
        "request": {"request_received_ms": received, "output_tokens": osl, "replay": {"input_length": isl}},
    }
    return json.dumps(event)


dynamo_received = st.one_of(numbers, st.integers(min_value=1_700_000_000_000, max_value=1_700_100_000_000))
dynamo_lines = st.lists(
    st.builds(_dynamo_line, dynamo_received, numbers, numbers, st.sampled_from(["request_end", "tool_end"])),
    min_size=1,
    max_size=20,
)

stamps = st.one_of(
    st.datetimes().map(lambda at: at.isoformat(sep=" ")),
    st.sampled_from(["2024-05-10 00:00:00", "2024-05-10 00:00:01.5", "1970-01-01 00:00:00", "not a date", ""]),
)
azure_rows = st.lists(st.tuples(stamps, numbers, numbers), min_size=1, max_size=20)


def _use_trace(path: Path) -> None:
    trace = load_trace(path)
    assert trace.num_requests > 0 and math.isfinite(trace.duration_s) and trace.duration_s >= 0
    end_s = min(trace.duration_s, 600.0) + 1.0
    trace.observe(0.0, end_s)
    trace.scaled(2.0)
    bucket_windows(trace, 3600.0)  # what a replay does with it: one observation per window, under the memory cap
    assert np.all(np.isfinite(trace.isl)) and np.all(np.isfinite(trace.osl))


@FUZZ
@given(lines=st.one_of(mooncake_lines, plausible_mooncake))
def test_fuzz_mooncake_traces(lines: list[str]) -> None:
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "fuzz.jsonl"
        path.write_text("\n".join(lines) + "\n")
        ends_cleanly(lambda: _use_trace(path), TraceError)


@FUZZ
@given(lines=dynamo_lines)
def test_fuzz_dynamo_traces(lines: list[str]) -> None:
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "fuzz.jsonl"
        path.write_text("\n".join(lines) + "\n")
        ends_cleanly(lambda: _use_trace(path), TraceError)


@settings(FUZZ, max_examples=50)  # pandas' CSV reader is the slowest case: half the examples keep the suite ~1 min
@given(rows=azure_rows)
def test_fuzz_azure_traces(rows: list[tuple[str, Any, Any]]) -> None:
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "fuzz.csv"
        body = "".join(f"{stamp},{isl},{osl}\n" for stamp, isl, osl in rows)
        path.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n" + body)
        ends_cleanly(lambda: _use_trace(path), TraceError)


# --- engine profiles ----------------------------------------------------------------------------------------------

profile_numbers = st.one_of(
    st.floats(min_value=0.001, max_value=1e5), st.sampled_from([0.0, -1.0, 1e308, float("nan"), None, "x"])
)
arrays = st.one_of(st.lists(profile_numbers, min_size=0, max_size=25), scalars)


@FUZZ
@given(
    prefill=st.fixed_dictionaries({"prefill_isl": arrays, "prefill_ttft": arrays, "prefill_thpt_per_gpu": arrays}),
    decode=st.fixed_dictionaries(
        {
            "x_kv_usage": arrays,
            "y_context_length": arrays,
            "z_itl": arrays,
            "z_thpt_per_gpu": arrays,
            "max_kv_tokens": st.one_of(st.lists(profile_numbers, max_size=2), profile_numbers),
        }
    ),
)
def test_fuzz_profiles(prefill: dict[str, Any], decode: dict[str, Any]) -> None:
    with tempfile.TemporaryDirectory() as folder:
        (Path(folder) / "prefill_raw_data.json").write_text(json.dumps(prefill))
        (Path(folder) / "decode_raw_data.json").write_text(json.dumps(decode))

        def case() -> None:
            profile = load_profile(folder, decode_grid_resolution=20)
            for isl in (1.0, 1000.0, 1e6):
                assert math.isfinite(profile.prefill_interpolator.ttft_ms(isl))

        ends_cleanly(case, ProfileError)


# --- forward-pass messages ----------------------------------------------------------------------------------------

GOOD_BODY = {
    "version": 1,
    "worker_id": "w0",
    "dp_rank": 0,
    "counter_id": 1,
    "wall_time": 0.02,
    "scheduled_requests": {"num_prefill_requests": 1, "sum_prefill_tokens": 100, "num_decode_requests": 2},
    "queued_requests": {"num_prefill_requests": 0, "sum_prefill_tokens": 0},
}


def _mutated(changes: dict[str, Any]) -> bytes:
    body: dict[str, Any] = {key: dict(value) if isinstance(value, dict) else value for key, value in GOOD_BODY.items()}
    for key, value in changes.items():
        section, _, field = key.partition(".")
        if field and isinstance(body.get(section), dict):
            body[section][field] = value
        else:
            body[key] = value
    return msgpack.packb(body, use_bin_type=True)


fpm_keys = st.sampled_from(
    [*GOOD_BODY, "scheduled_requests.num_decode_requests", "scheduled_requests.var_prefill_length",
     "queued_requests.sum_decode_kv_tokens", "unknown"]
)  # fmt: skip
payloads = st.one_of(
    st.dictionaries(fpm_keys, wire_values, max_size=3).map(_mutated),
    st.binary(max_size=200),
    wire_values.map(lambda value: msgpack.packb(value, use_bin_type=True)),
)
topics = st.one_of(st.sampled_from([b"fpm.prefill", b"fpm.decode", b"fpm.", b"fpm.agg", b""]), st.binary(max_size=12))
messages = st.one_of(st.tuples(topics, payloads).map(list), st.lists(st.binary(max_size=20), max_size=4))


@FUZZ
@given(frames=messages)
def test_fuzz_fpm_messages(frames: list[bytes]) -> None:
    def case() -> None:
        fpm, version = decode_fpm_message(frames)
        again, _ = decode_fpm_message(encode_fpm_message(fpm, version=version))
        assert again == fpm

    ends_cleanly(case, FpmDecodeError)


@FUZZ
@given(stream=st.lists(messages, min_size=1, max_size=60))
def test_fuzz_fpm_stream_is_counted_and_bounded(stream: list[list[bytes]]) -> None:
    """A stream of fuzzed messages through the ingest (no database write: the queue is only filled): every message
    is either queued or counted as dropped, and the queue never holds more than `max_pending`."""
    import datetime as dt

    # the URL is never connected to: nothing is flushed
    ingest = FpmIngest("postgresql+psycopg://nobody@127.0.0.1:1/none", 1, bind=["tcp://127.0.0.1:*"], max_pending=5)
    try:
        now = dt.datetime.now(dt.UTC)
        ends_cleanly(lambda: [ingest.handle(frames, now) for frames in stream], ())
        stats = ingest.stats
        assert stats.received == len(stream)
        assert ingest.num_pending <= 5
        assert stats.num_dropped + stats.lost_pending + ingest.num_pending == len(stream)
    finally:
        ingest.close()


# --- secrets ------------------------------------------------------------------------------------------------------

# the printable ASCII range: a password may hold any of it (an operator's vault does not ask the URL's opinion)
PRINTABLE = st.characters(min_codepoint=0x20, max_codepoint=0x7E)
passwords = st.text(alphabet=PRINTABLE, min_size=1, max_size=24)
unspaced_passwords = st.text(alphabet=st.characters(min_codepoint=0x21, max_codepoint=0x7E), min_size=1, max_size=24)


@FUZZ
@given(password=unspaced_passwords)
def test_fuzz_redaction_masks_any_password_in_every_url_shape(password: str) -> None:
    """Without knowing the secret: each shape, its password taken from the printable range (white space aside: a
    raw space ends a URL in a text), comes out exactly as the same text with `***` in the password's place."""
    from urllib.parse import quote

    from planner_core.runtime.redact import redact_text

    encoded = quote(password, safe="")
    libpq = password.replace("\\", "\\\\").replace("'", "\\'")
    cases = {
        f"http://prom-user:{password}@127.0.0.1:9090/api/v1/query: ConnectError: [Errno 111]": (
            "http://prom-user:***@127.0.0.1:9090/api/v1/query: ConnectError: [Errno 111]"
        ),
        f"unreachable postgresql+psycopg://planner:{encoded}@db:5432/planner (x)": (
            "unreachable postgresql+psycopg://planner:***@db:5432/planner (x)"
        ),
        f"endpoint prom-user:{password}@prometheus:9090 refused": "endpoint prom-user:***@prometheus:9090 refused",
        f"GET http://prometheus:9090/api/v1/query?token={encoded}&query=up failed": (
            "GET http://prometheus:9090/api/v1/query?token=***&query=up failed"
        ),
        f"GET http://prometheus:9090/api?query=up&api_key={encoded}": "GET http://prometheus:9090/api?query=up&api_key=***",
        f"host=db user=planner password='{libpq}' dbname=planner": "host=db user=planner password=*** dbname=planner",
    }
    for text, redacted in cases.items():
        assert redact_text(text) == redacted, text


@FUZZ
@given(password=passwords.filter(lambda p: len(p.strip()) >= 6))
def test_fuzz_a_configured_secret_is_masked_in_any_text(password: str) -> None:
    """A password from the whole printable range (spaces too) in a configured URL, raw or percent-encoded: once the
    settings read it, no text the redaction passes holds the secret or its encoded form, whatever quotes it."""
    from urllib.parse import quote

    from planner_core.runtime.redact import redact_text, redact_value
    from planner_core.runtime.settings import RuntimeSettings

    raw = f"http://prom-user:{password}@127.0.0.1:9090"
    RuntimeSettings(prometheus_endpoint=raw, database_url=f"postgresql://planner:{quote(password, safe='')}@db/x")
    forms = (password, quote(password, safe=""), quote(password))
    texts = [
        f"{raw}: ConnectError: [Errno 111] Connection refused",
        f"Invalid port: {password!r} in {raw}/api/v1/query",
        f"secret was '{password}'; encoded {quote(password)}",
        f"postgresql://planner:{quote(password, safe='')}@db/x: connection refused",
    ]
    for text in texts:
        out = redact_text(text)
        assert not [form for form in forms if form in out], (text, out)
    out = json.dumps(redact_value({"problem": texts, "password": password}))
    assert password not in json.loads(out)["problem"][0] and json.loads(out)["password"] == "***"


# --- command-line numbers -----------------------------------------------------------------------------------------


def _bounded_options() -> list[tuple[str, Any]]:
    from planner_cli.main import build_parser
    from planner_cli.parser import walk_parsers
    from planner_cli.ranges import Bounded

    found = {}
    for parser in walk_parsers(build_parser()):
        for action in parser._actions:
            if isinstance(action.type, Bounded):
                found[f"{parser.prog} {action.dest}"] = action.type
    return sorted(found.items())


BOUNDED_OPTIONS = _bounded_options()
number_texts = st.one_of(
    st.sampled_from(["nan", "-nan", "inf", "-inf", "1e999", "1e308", "-1", "0", "0.0", "1", "2.5", "", " ", "0x10",
                     "1_000", "100000", "9" * 40, "true", "1e-320"]),
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
    st.integers(min_value=-(2**70), max_value=2**70).map(str),
    st.text(max_size=8),
)  # fmt: skip


@FUZZ
@given(option=st.sampled_from(BOUNDED_OPTIONS), text=number_texts)
def test_fuzz_numeric_options_take_only_finite_values_in_range(option: tuple[str, Any], text: str) -> None:
    """Any text given to any numeric option: a finite value inside the option's range, or argparse's one-line
    refusal; never nan, an infinity or a value outside the range."""
    import argparse

    _, convert = option
    value = ends_cleanly(lambda: convert(text), argparse.ArgumentTypeError)
    if value is not None:
        assert math.isfinite(value) and value in convert.bounds, (text, value)
        assert isinstance(value, convert.kind)
