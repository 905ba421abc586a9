"""Compact deltas between two JSON documents (the planner state as stored), and their exact application.

Pure: no I/O, no clock. The store (`planner_core.runtime.store.repository`) writes most planner states as a delta
against the state of the deployment's previous tick, with a full state every `FULL_STATE_EVERY` states, because
consecutive states differ in a few places only: an online perf model gains a sample and retires one, a moving
window shifts by one value, a counter moves.

A delta is one of:

* `{"=": value}`: the new document whole (used when nothing finer is shorter, and for leaves);
* `{"{": {key: delta, ...}, "-": [key, ...]}`: an object patched key by key (only changed keys; "-" lists
  removed keys, omitted when none);
* `{"[": [segment, ...]}`: an array rebuilt from segments, each `[start, end]` (copy `old[start:end]`),
  `{"v": [item, ...]}` (new items) or `{"p": [index, delta]}` (item `old[index]` patched).

Stored, a delta is its compact JSON text compressed with zlib and a preset dictionary of the text deltas share
(`encode_delta`, `decode_delta`; migration 0020): Postgres never compresses a row under ~2 kB, and a delta's text
(about 1.1 kB at a load tick) compresses to about 0.2 kB (0.45 kB without the dictionary, as before 0020).

Equality is JSON equality (`same_json`): `1` and `1.0`, or `0.0` and `-0.0`, are different values, so
`apply_delta(old, state_delta(old, new))` is `new` exactly, value for value and type for type.
"""

from __future__ import annotations

import json
import math
import zlib
from collections.abc import Callable
from typing import Any

FULL_STATE_EVERY = 32  # a full state at least every 32 states: reading the newest applies at most 31 deltas
_LOOKAHEAD = 16  # old items an array delta may skip (drop) to find the next equal one


class StateDeltaError(ValueError):
    """A delta that does not fit the document it is applied to (a corrupt or mismatched chain)."""


def _not_json(value: Any) -> Any:
    raise TypeError(f"Object of type {type(value).__name__} is not JSON serializable")


def _compact_encoder() -> Callable[[Any], str]:
    """Compact JSON text, as `json.dumps(value, separators=(",", ":"))` gives it, by the C encoder `json` itself
    uses, made once: `JSONEncoder.encode` builds one per call, which cost more than encoding the small values a
    delta compares (no circular-reference check: these are JSON documents)."""
    make = json.encoder.c_make_encoder
    if make is None:  # a Python without json's C accelerator
        return json.JSONEncoder(separators=(",", ":")).encode
    encoder = make(None, _not_json, json.encoder.encode_basestring_ascii, None, ":", ",", False, False, True)
    return lambda value: "".join(encoder(value, 0))


_compact = _compact_encoder()


def _size(value: Any) -> int:
    return len(_compact(value))


def same_json(a: Any, b: Any) -> bool:
    """The same JSON value: Python's `==` (fast, in C) and then the types, which it ignores (1 == 1.0 == True,
    0.0 == -0.0)."""
    if a is b:
        return True
    if type(a) is not type(b) or a != b:
        return False
    if isinstance(a, dict | list):
        return _same_size(a, b) is not None
    if isinstance(a, float):
        return math.copysign(1.0, a) == math.copysign(1.0, b)
    return True


def _same_size(a: Any, b: Any) -> int | None:
    """The length of `b`'s compact JSON text if `a` is the same JSON value, else None. Equal texts are the same
    value, and the encoder (in C) compares a large unchanged subtree far faster than walking it in Python; only
    values `==` calls equal whose texts differ (a 1 for a 1.0, a zero's sign, keys in another order) are walked,
    to tell the types apart."""
    if type(a) is not type(b) or a != b:
        return None
    if not isinstance(b, dict | list):
        return _size(b) if same_json(a, b) else None
    text = _compact(b)
    if a is b or _compact(a) == text:
        return len(text)
    if isinstance(a, dict):
        same = all(same_json(value, b[key]) for key, value in a.items())
    else:
        same = all(map(same_json, a, b))
    return len(text) if same else None


def state_delta(old: Any, new: Any) -> dict[str, Any] | None:
    """The delta taking `old` to `new`, or None when they are the same document."""
    if same_json(old, new):
        return None
    return _delta(old, new)[0]


_WHOLE_OVERHEAD = len('{"=":}')  # a whole value's delta is its text and these


def _delta(old: Any, new: Any) -> tuple[dict[str, Any], int]:
    """The delta taking `old` to `new` (documents that differ) and the length of `new`'s compact text: the patch
    when it is shorter than the whole value, else the whole. The length is summed up from the parts an object's
    keys already measured, so a subtree is encoded once, not once more at every level above it."""
    if isinstance(old, dict) and isinstance(new, dict):
        patch, new_size = _dict_delta(old, new)
    elif isinstance(old, list) and isinstance(new, list):
        patch, new_size = _list_delta(old, new), _size(new)
    else:
        return {"=": new}, _size(new)
    return (patch if _size(patch) < new_size + _WHOLE_OVERHEAD else {"=": new}), new_size


_ABSENT = object()


def _key_size(key: Any) -> int:
    """Characters an object's key takes in compact JSON text, with its colon."""
    return len(_compact(key)) + 1 if isinstance(key, str) else _size({key: 0}) - 3


def _dict_delta(old: dict[str, Any], new: dict[str, Any]) -> tuple[dict[str, Any], int]:
    """An object's patch, and the length of `new`'s compact text."""
    changed = {}
    new_size = 2 + max(0, len(new) - 1)  # the braces and the commas
    for key, value in new.items():
        previous = old.get(key, _ABSENT)
        value_size = None if previous is _ABSENT else _same_size(previous, value)
        if value_size is None:
            if previous is _ABSENT:
                changed[key], value_size = {"=": value}, _size(value)
            else:
                changed[key], value_size = _delta(previous, value)
        new_size += _key_size(key) + value_size
    patch: dict[str, Any] = {"{": changed}
    removed = [key for key in old if key not in new]
    if removed:
        patch["-"] = removed
    return patch, new_size


def _list_delta(old: list[Any], new: list[Any]) -> dict[str, Any]:
    """Greedy, linear in the lengths: each new item is the next old item, an equal old item at most `_LOOKAHEAD`
    further on (the items skipped are dropped, as retired samples are), the next old item patched, or a new item.
    Any choice rebuilds `new` exactly; this one keeps a shifted window or a retired-and-appended sample set to a
    few segments, without serialising every item (a general diff is quadratic on the windows' repeated values)."""
    shifted = _shifted_window(old, new)
    if shifted is not None:
        return shifted
    segments: list[Any] = []
    literal: list[Any] = []
    run: list[int] | None = None  # [start, end) of old items being copied
    cursor = 0  # the old item expected next

    def flush() -> None:
        nonlocal run, literal
        if run is not None:
            segments.append(run)
            run = None
        if literal:
            segments.append({"v": literal})
            literal = []

    for item in new:
        window = range(cursor, min(len(old), cursor + _LOOKAHEAD + 1))
        found = next((at for at in window if same_json(old[at], item)), None)
        if found is not None:
            if literal:
                flush()
            if run is not None and run[1] == found:
                run[1] += 1
            else:
                flush()
                run = [found, found + 1]
            cursor = found + 1
            continue
        if cursor < len(old) and isinstance(item, (dict, list)) and type(item) is type(old[cursor]):
            change = _delta(old[cursor], item)[0]
            if "=" not in change:  # patching the next old item is shorter than writing the item anew
                flush()
                segments.append({"p": [cursor, change]})
                cursor += 1
                continue
        if run is not None:
            flush()
        literal.append(item)
    flush()
    return {"[": segments}


def _shifted_window(old: list[Any], new: list[Any]) -> dict[str, Any] | None:
    """The greedy delta of `_list_delta` for its commonest case, found with a few comparisons of whole slices (in
    C) instead of item by item: `new` is `old` without its first `k` items (`k` within the look-ahead), then new
    items. `k` is the first old item equal to `new[0]`, as the greedy picks it; from there the greedy copies every
    old item (each is the next one it looks at) and appends the rest. None when the lists are not so related."""
    if not old or not new:
        return None
    first = next((at for at in range(min(len(old), _LOOKAHEAD + 1)) if same_json(old[at], new[0])), None)
    if first is None:
        return None
    kept = len(old) - first
    if kept > len(new) or old[first:] != new[:kept] or _compact(old[first:]) != _compact(new[:kept]):
        return None
    segments: list[Any] = [[first, len(old)]]
    if kept < len(new):
        segments.append({"v": new[kept:]})
    return {"[": segments}


# A preset dictionary for the deltas' compression (zlib's `zdict`): text most deltas share (the planner state's key
# names around an online perf model's new sample and refit, a plugin's run time, the delta markers, a fit's sentence),
# so a delta refers to it instead of spelling it out; a load tick's delta shrinks from ~0.48 kB to ~0.21 kB (3-member
# fleet bench). Its numbers are placeholders. NEVER EDIT IT: a stored delta's zlib header names the dictionary it
# was compressed with (its Adler-32, pinned by tests/runtime/test_state_delta.py) and is read with that one only; a
# better dictionary is added beside it (in `_DICTIONARIES`) and made `_DICTIONARY`.
DELTA_DICTIONARY_1 = (
    b'"load_history":{"{":{"num_req":{"[":[[1,64],{"v":[0.0]}]},"isl":{"[":[[1,64],{"v":[0.0]}]},'
    b'"osl":{"[":[[1,64],{"v":[0.0]}]},"num_windows":{"=":1},"seen_traffic":{"=":true}}},'
    b'"horizon_windows":{"[":[[1,8],{"v":[{"at_s":0.0}]}]},"threshold_planner":{"{":{"interval_start_s":{"=":0.0},'
    b'"decode_kv_samples":{"[":[[1,8],{"v":[0.0]}]},"prefill_queue_samples":{"[":[[1,8],{"v":[0.0]}]}}},'
    b'"startup":{"{":{"pending":{"=":[]},"samples":{"=":[]}}},"recent_throughput_needs":{"=":[]},'
    b'{"{":{"num_throughput_ticks":{"=":1},"pipeline":{"{":{"plugins":{"[":[{"p":[0,{"{":{"last_run_at_s":{"=":0.0}}}]},'
    b'"agg":{"{":{"samples":{"[":[[0,64],{"v":[{"seq":1,"features":[0.0,0.0],"wall_time_s":0.0}]}]},'
    b'"readiness":{"=":"perf_model_ready"},"readiness":{"=":"negative_coefficient"},'
    b'"axis_min":{"=":[0.0,0.0]},"axis_max":{"=":[0.0,0.0]},"num_idle_skipped":{"=":1},"num_invalid_skipped":{"=":1},'
    b'"readiness_detail":{"=":"wall = 0.01 + 0*num_decode_requests + 1e-07*sum_decode_kv_tokens s over 64 samples; '
    b'slope of num_decode_requests -1e-08 s clipped to 0"},'
    b'"readiness_detail":{"=":"wall = 0.02 + 2e-05*sum_prefill_tokens s over 64 samples"},'
    b'{"{":{"num_load_ticks":{"=":1},"perf_models":{"{":{"prefill":{"{":{"samples":{"[":[[0,64],'
    b'{"v":[{"seq":1,"features":[0.0],"wall_time_s":0.0}]}]},"intercept_s":{"=":0.0},"coefficients":{"=":[0.0]},'
    b'"num_accepted":{"=":1},"num_retired":{"=":1},"recent_isl":{"[":[[1,64],{"v":[0.0]}]}}},'
    b'"decode":{"{":{"samples":{"[":[[0,64],{"v":[{"seq":1,"features":[0.0,0.0],"wall_time_s":0.0}]}]},'
    b'"readiness_detail":{"=":"wall = 0.01 + 0*num_decode_requests + 1e-07*sum_decode_kv_tokens s over 64 samples; '
    b'slope of num_decode_requests -1e-08 s clipped to 0"},"intercept_s":{"=":0.0},"coefficients":{"=":[0.0,0.0]},'
    b'"num_accepted":{"=":1},"num_retired":{"=":1},"recent_decode_context":{"[":[[1,64],{"v":[0.0]}]},'
    b'"recent_num_decode":{"[":[[1,64],{"v":[0.0]}]}}}}},'
    b'"pipeline":{"{":{"plugins":{"[":[[0,1],{"p":[1,{"{":{"last_run_at_s":{"=":0.0}}}]},[2,3]]}}}}}'
)
_DICTIONARIES = {zlib.adler32(DELTA_DICTIONARY_1): DELTA_DICTIONARY_1}  # by the id a zlib header names
_DICTIONARY = DELTA_DICTIONARY_1  # the one new deltas are compressed with (migration 0020)
_FDICT = 0x20  # the zlib header's flag: a dictionary id follows (RFC 1950)


def encode_delta(delta: dict[str, Any]) -> bytes:
    """A delta as stored: its compact JSON text, zlib-compressed with the preset dictionary (deterministic: same
    delta, same bytes)."""
    compressor = zlib.compressobj(9, zlib.DEFLATED, zlib.MAX_WBITS, 9, zlib.Z_DEFAULT_STRATEGY, _DICTIONARY)
    text = json.dumps(delta, separators=(",", ":"), allow_nan=False).encode()
    return compressor.compress(text) + compressor.flush()


def decode_delta(data: bytes) -> dict[str, Any]:
    """The delta `encode_delta` stored (with the dictionary its header names, or none: deltas stored before
    migration 0020); raises StateDeltaError if the bytes are not one."""
    try:
        if len(data) >= 6 and data[1] & _FDICT:
            dictionary = _DICTIONARIES.get(int.from_bytes(data[2:6], "big"))
            if dictionary is None:
                raise StateDeltaError(f"stored delta names dictionary {data[2:6].hex()}, which this code lacks")
            decompressor = zlib.decompressobj(zlib.MAX_WBITS, dictionary)
            text = decompressor.decompress(data) + decompressor.flush()
            if not decompressor.eof:
                raise zlib.error("incomplete or truncated stream")
        else:
            text = zlib.decompress(data)
        delta = json.loads(text)
    except (zlib.error, ValueError) as exc:
        raise StateDeltaError(f"stored delta is not zlib-compressed JSON: {exc}") from exc
    if not isinstance(delta, dict):
        raise StateDeltaError(f"stored delta is a {type(delta).__name__}, not an object")
    return delta


def apply_delta(old: Any, delta: dict[str, Any] | None) -> Any:
    """`old` with `delta` applied (None: unchanged); raises StateDeltaError if the delta does not fit `old`."""
    if delta is None:
        return old
    if "=" in delta:
        return delta["="]
    if "{" in delta:
        if not isinstance(old, dict):
            raise StateDeltaError(f"object patch applied to a {type(old).__name__}")
        removed = set(delta.get("-", ()))
        result = {key: value for key, value in old.items() if key not in removed}
        for key, change in delta["{"].items():
            result[key] = apply_delta(old.get(key), change)
        return result
    if "[" in delta:
        if not isinstance(old, list):
            raise StateDeltaError(f"array patch applied to a {type(old).__name__}")
        items: list[Any] = []
        for segment in delta["["]:
            if isinstance(segment, list):
                start, end = segment
                if not 0 <= start <= end <= len(old):
                    raise StateDeltaError(f"copy range {start}:{end} outside an array of {len(old)} items")
                items.extend(old[start:end])
            elif "v" in segment:
                items.extend(segment["v"])
            else:
                index, change = segment["p"]
                if not 0 <= index < len(old):
                    raise StateDeltaError(f"patched item {index} outside an array of {len(old)} items")
                items.append(apply_delta(old[index], change))
        return items
    raise StateDeltaError(f"unknown delta form with keys {sorted(delta)}")
