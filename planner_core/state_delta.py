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

Stored, a delta is its compact JSON text compressed with zlib (`encode_delta`, `decode_delta`): Postgres never
compresses a row under ~2 kB, and a delta's text (about 1.1 kB at a load tick) compresses to about 0.45 kB.

Equality is decided on the canonical JSON text, so `1` and `1.0`, or `0.0` and `-0.0`, are different values and
`apply_delta(old, state_delta(old, new))` is `new` exactly, value for value and type for type.
"""

from __future__ import annotations

import difflib
import json
import zlib
from typing import Any

FULL_STATE_EVERY = 32  # a full state at least every 32 states: reading the newest applies at most 31 deltas


class StateDeltaError(ValueError):
    """A delta that does not fit the document it is applied to (a corrupt or mismatched chain)."""


def _canonical(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


def _size(value: Any) -> int:
    return len(json.dumps(value, separators=(",", ":")))


def state_delta(old: Any, new: Any) -> dict[str, Any] | None:
    """The delta taking `old` to `new`, or None when they are the same document."""
    if _canonical(old) == _canonical(new):
        return None
    return _delta(old, new)


def _delta(old: Any, new: Any) -> dict[str, Any]:
    whole = {"=": new}
    if isinstance(old, dict) and isinstance(new, dict):
        patch = _dict_delta(old, new)
    elif isinstance(old, list) and isinstance(new, list):
        patch = _list_delta(old, new)
    else:
        return whole
    return patch if _size(patch) < _size(whole) else whole


def _dict_delta(old: dict[str, Any], new: dict[str, Any]) -> dict[str, Any]:
    changed = {}
    for key, value in new.items():
        if key not in old:
            changed[key] = {"=": value}
        elif _canonical(old[key]) != _canonical(value):
            changed[key] = _delta(old[key], value)
    patch: dict[str, Any] = {"{": changed}
    removed = [key for key in old if key not in new]
    if removed:
        patch["-"] = removed
    return patch


def _list_delta(old: list[Any], new: list[Any]) -> dict[str, Any]:
    old_keys = [_canonical(item) for item in old]
    new_keys = [_canonical(item) for item in new]
    matcher = difflib.SequenceMatcher(None, old_keys, new_keys, autojunk=False)
    segments: list[Any] = []
    for tag, i1, i2, j1, j2 in matcher.get_opcodes():
        if tag == "equal":
            segments.append([i1, i2])
        elif tag == "delete":
            continue
        elif tag == "replace" and i2 - i1 == j2 - j1:
            # same number of items replaced: patch each in place when that is shorter than writing it anew
            for offset in range(i2 - i1):
                item = _delta(old[i1 + offset], new[j1 + offset])
                if "=" in item:
                    segments.append({"v": [new[j1 + offset]]})
                else:
                    segments.append({"p": [i1 + offset, item]})
        else:  # insert, or a replace of a different length
            segments.append({"v": new[j1:j2]})
    return {"[": segments}


def encode_delta(delta: dict[str, Any]) -> bytes:
    """A delta as stored: its compact JSON text, zlib-compressed (deterministic: same delta, same bytes)."""
    return zlib.compress(json.dumps(delta, separators=(",", ":"), allow_nan=False).encode(), 9)


def decode_delta(data: bytes) -> dict[str, Any]:
    """The delta `encode_delta` stored; raises StateDeltaError if the bytes are not one."""
    try:
        delta = json.loads(zlib.decompress(data))
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
