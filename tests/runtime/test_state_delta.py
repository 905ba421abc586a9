"""Planner-state deltas (`planner_core.runtime.store.state_delta`): applying the delta of two documents gives the
second one exactly, value for value and type for type; a small change gives a small delta."""

from __future__ import annotations

import json
import zlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from planner_core.runtime.store.state_delta import (
    DELTA_DICTIONARY_1,
    StateDeltaError,
    apply_delta,
    decode_delta,
    encode_delta,
    state_delta,
)

# JSON as JSONB stores it: finite numbers, strings, booleans, null, arrays, objects.
LEAF = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(10**12), 10**12),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=8),
)
DOC = st.recursive(
    LEAF,
    lambda inner: st.one_of(st.lists(inner, max_size=8), st.dictionaries(st.text(max_size=4), inner, max_size=6)),
    max_leaves=40,
)


def _text(value) -> str:
    return json.dumps(value, sort_keys=True)


@settings(max_examples=120, deadline=None)
@given(DOC, DOC)
def test_applying_the_delta_gives_the_new_document_exactly(old, new) -> None:
    delta = state_delta(old, new)
    assert _text(apply_delta(old, delta)) == _text(new)
    assert (delta is None) == (_text(old) == _text(new))
    if delta is not None:  # and as stored: compressed, read back, applied
        assert _text(apply_delta(old, decode_delta(encode_delta(delta)))) == _text(new)


@settings(max_examples=80, deadline=None)
@given(st.lists(DOC, min_size=1, max_size=30), st.data())
def test_an_edited_list_round_trips(items, data) -> None:
    """Samples retired from anywhere and new ones appended, as an online perf model's retained set changes."""
    keep = data.draw(st.lists(st.booleans(), min_size=len(items), max_size=len(items)))
    added = data.draw(st.lists(DOC, max_size=3))
    new = [item for item, kept in zip(items, keep, strict=True) if kept] + added
    old_doc, new_doc = {"samples": items, "n": len(items)}, {"samples": new, "n": len(new)}
    assert _text(apply_delta(old_doc, state_delta(old_doc, new_doc))) == _text(new_doc)


@pytest.mark.parametrize(
    ("old", "new"),
    [(1, 1.0), (0.0, -0.0), ({"a": [1, 2]}, {"a": [1.0, 2]}), ([True], [1]), ({"a": None}, {})],
)
def test_values_equal_in_python_but_not_in_json_are_a_change(old, new) -> None:
    delta = state_delta(old, new)
    assert delta is not None
    result = apply_delta(old, delta)
    assert _text(result) == _text(new)
    assert [type(x) for x in json.loads(_text([result]))] == [type(x) for x in json.loads(_text([new]))]


def test_one_new_sample_in_a_long_list_costs_about_one_sample() -> None:
    samples = [{"seq": i, "features": [100.0 + i, 2000.0 * i], "wall_time_s": 0.01 * i} for i in range(200)]
    old = {"perf_models": {"decode": {"samples": samples, "num_accepted": 200}}, "num_load_ticks": 7}
    new_samples = [*samples[1:], {"seq": 200, "features": [300.0, 400000.0], "wall_time_s": 2.0}]
    new = {"perf_models": {"decode": {"samples": new_samples, "num_accepted": 201}}, "num_load_ticks": 8}
    delta = state_delta(old, new)
    assert apply_delta(old, delta) == new
    assert len(json.dumps(delta)) < 250 < len(json.dumps(new)) / 50


@pytest.mark.parametrize(
    ("old", "delta", "fragment"),
    [
        ([1, 2], {"{": {}}, "object patch applied to a list"),
        ({"a": 1}, {"[": [[0, 1]]}, "array patch applied to a dict"),
        ([1, 2], {"[": [[0, 3]]}, "copy range 0:3 outside an array of 2 items"),
        ([1, 2], {"[": [{"p": [2, {"=": 0}]}]}, "patched item 2 outside an array of 2 items"),
        ({}, {"?": 1}, "unknown delta form"),
    ],
)
def test_a_delta_that_does_not_fit_is_refused(old, delta, fragment) -> None:
    with pytest.raises(StateDeltaError, match=fragment):
        apply_delta(old, delta)


@pytest.mark.parametrize(
    ("data", "fragment"),
    [(b"not zlib", "not zlib-compressed JSON"), (zlib.compress(b"[1]"), "is a list, not an object")],
)
def test_stored_bytes_that_are_not_a_delta_are_refused(data, fragment) -> None:
    with pytest.raises(StateDeltaError, match=fragment):
        decode_delta(data)


def _load_tick_delta(seq: int) -> dict:
    """A delta as a load tick writes it (an online perf model's new sample and refit, a plugin's run time), with
    numbers of its own (not the preset dictionary's placeholders)."""
    old = {
        "num_load_ticks": seq - 1,
        "perf_models": {
            "prefill": {
                "samples": [
                    {"seq": i, "features": [3000.0 + 7 * i], "wall_time_s": 0.02 + i / 7919} for i in range(64)
                ],
                "intercept_s": 0.01999,
                "coefficients": [2e-05],
                "num_accepted": seq - 1,
                "num_retired": seq - 65,
                "readiness_detail": "wall = 0.01999 + 2e-05*sum_prefill_tokens s over 64 samples",
                "recent_isl": [3000.0 + i for i in range(64)],
            },
        },
        "pipeline": {"plugins": [{"last_run_at_s": 1767571700.0}, {"last_run_at_s": 1767571700.0}]},
    }
    new = json.loads(json.dumps(old))
    new["num_load_ticks"] = seq
    model = new["perf_models"]["prefill"]
    model["samples"] = [*model["samples"][1:], {"seq": seq, "features": [3391.0], "wall_time_s": 0.08781234567891}]
    model |= {"intercept_s": 0.019990922791786922, "coefficients": [1.9999423977940212e-05], "num_accepted": seq}
    model |= {"num_retired": seq - 64, "recent_isl": [*model["recent_isl"][1:], 3391.0]}
    new["pipeline"]["plugins"][1]["last_run_at_s"] = 1767571705.0
    delta = state_delta(old, new)
    assert apply_delta(old, delta) == new
    return delta


def test_the_preset_dictionary_is_pinned_and_named_by_every_delta() -> None:
    """A stored delta names its dictionary by Adler-32 (RFC 1950's FDICT header): the dictionary must never change,
    or stored deltas become unreadable (a new one is added beside it)."""
    assert zlib.adler32(DELTA_DICTIONARY_1) == 0x543F7E8F
    data = encode_delta(_load_tick_delta(300))
    assert data[1] & 0x20 and data[2:6] == bytes.fromhex("543f7e8f")


def test_the_preset_dictionary_shrinks_a_load_tick_delta() -> None:
    """The text deltas share (key names, markers, a fit's sentence) comes from the dictionary: a load tick's delta
    takes well under two thirds of what zlib alone makes of it."""
    delta = _load_tick_delta(300)
    plain = zlib.compress(json.dumps(delta, separators=(",", ":")).encode(), 9)
    assert len(encode_delta(delta)) < 0.65 * len(plain)


def test_deltas_stored_before_the_dictionary_still_read() -> None:
    """Deltas stored before migration 0020 (zlib without a dictionary) read back the same."""
    delta = _load_tick_delta(301)
    assert decode_delta(zlib.compress(json.dumps(delta, separators=(",", ":")).encode(), 9)) == delta
    assert decode_delta(encode_delta(delta)) == delta


def test_a_delta_naming_another_dictionary_is_refused() -> None:
    compressor = zlib.compressobj(9, zlib.DEFLATED, zlib.MAX_WBITS, 9, zlib.Z_DEFAULT_STRATEGY, b'{"other":1}')
    data = compressor.compress(b'{"=":1}') + compressor.flush()
    with pytest.raises(StateDeltaError, match="names dictionary .*, which this code lacks"):
        decode_delta(data)
    with pytest.raises(StateDeltaError, match="not zlib-compressed JSON"):
        decode_delta(encode_delta({"=": 1})[:-6])  # truncated


def test_a_whole_state_is_a_delta_from_nothing() -> None:
    """A full state is stored as `{"=": state}` without a base (migration 0020): applied to nothing, it is the
    state, value for value and type for type."""
    state = {"a": [1, 1.0, -0.0, None, True, "x"], "b": {"c": 1e-300}}
    assert _text(apply_delta(None, decode_delta(encode_delta({"=": state})))) == _text(state)
