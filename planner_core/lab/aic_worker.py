"""Runs aiconfigurator estimates for the planner, in whatever interpreter has aiconfigurator installed.

Role: the only code that imports aiconfigurator. `planner_core.lab.aic` starts it as
`<aic-python> -m planner_core.lab.aic_worker` (the project's own interpreter by default, or a separate virtualenv),
so the planner never needs aiconfigurator in its own environment and aiconfigurator's console output never mixes
with ours. Imports only the standard library and aiconfigurator: it must run in an interpreter that has nothing
else of this project installed.

Protocol. stdin: one JSON object `{"calls": [<keyword arguments of aiconfigurator.cli.api.cli_estimate>, ...]}`.
stdout: JSON lines, in order:
- `{"event": "ready", "aiconfigurator_version": ..., "python": ...}` once aiconfigurator is imported;
- per call, `{"event": "result", "index": i, "ttft_ms", "tpot_ms", "fits_memory", "backend_version", "precision"}`
  or `{"event": "error", "index": i, "error": "<type>: <message>"}` (the worker goes on with the next call);
- `{"event": "fatal", "error": ...}` and exit status 3 when aiconfigurator cannot be imported or the request is
  not valid JSON.
Everything else anything prints (aiconfigurator logs and prints a lot) goes to stderr.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
from typing import Any, TextIO

EXIT_FATAL = 3


def _protocol_stream() -> TextIO:
    """Keep the real stdout for protocol lines and send file descriptor 1 (prints, native code) to stderr."""
    protocol = os.fdopen(os.dup(1), "w", buffering=1, encoding="utf-8")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    return protocol


def _emit(stream: TextIO, **event: Any) -> None:
    stream.write(json.dumps(event) + "\n")
    stream.flush()


def _fits_memory(result: Any) -> bool | None:
    summary = getattr(result, "summary", None)
    if summary is not None and hasattr(summary, "check_oom"):
        return not bool(summary.check_oom())
    return None  # disaggregated estimates expose no single memory check


def _estimate(cli_estimate: Any, call: dict[str, Any]) -> dict[str, Any]:
    result = cli_estimate(**call)
    raw = result.raw if isinstance(result.raw, dict) else {}
    precision = {
        part: str(raw[part]) for part in ("gemm", "kvcache", "fmha", "moe", "comm") if raw.get(part) is not None
    }
    return {
        "ttft_ms": float(result.ttft),
        "tpot_ms": float(result.tpot),
        "fits_memory": _fits_memory(result),
        "backend_version": str(result.backend_version),
        "precision": precision,
    }


def main() -> int:
    protocol = _protocol_stream()
    try:
        request = json.loads(sys.stdin.read())
        calls = request["calls"]
        if not isinstance(calls, list) or not all(isinstance(call, dict) for call in calls):
            raise TypeError("'calls' must be a list of objects")
    except (ValueError, KeyError, TypeError) as exc:
        _emit(protocol, event="fatal", error=f"bad request: {type(exc).__name__}: {exc}")
        return EXIT_FATAL
    try:
        from importlib.metadata import version

        from aiconfigurator.cli.api import cli_estimate
    except Exception as exc:  # ImportError, or anything aiconfigurator raises while importing
        _emit(protocol, event="fatal", error=f"cannot import aiconfigurator in {sys.executable}: {exc}")
        return EXIT_FATAL
    _emit(protocol, event="ready", aiconfigurator_version=version("aiconfigurator"), python=sys.executable)
    for index, call in enumerate(calls):
        try:
            with contextlib.redirect_stdout(sys.stderr):
                outcome = _estimate(cli_estimate, call)
        except Exception as exc:  # any failure of one estimate is reported and the next one is tried
            message = " ".join(str(exc).split())
            _emit(protocol, event="error", index=index, error=f"{type(exc).__name__}: {message}")
            continue
        _emit(protocol, event="result", index=index, **outcome)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
