"""The range of every numeric command-line option, checked as argparse converts the value.

`build_parser` hands each parser to `bound_numeric_options`: an option whose type is `int` or `float` gets its
range from `OPTION_RANGES` (by option name: `--rate-scale` means the same in every command), its type becomes a
`Bounded` converter that refuses `nan`, infinities and values outside the range in argparse's one-line usage error
(`planner: error: argument --rate-scale: 100000 is not in (0, 1000]`), and its help ends with the range. An
option missing from the table fails the parser's construction: a new numeric option cannot ship unbounded.

The bounds are far above any real run, and low enough that a value inside them cannot exhaust the machine by itself
(`--rate-scale 100000` made `planner demo` grow past 4 GB in 21 s). What a value costs together with its inputs (a
rate scale times the trace's requests) is checked where both are known, before work starts.
"""

from __future__ import annotations

import argparse
import math
from dataclasses import dataclass

from planner_core.config.limits import MAX_COUNT, MAX_GPUS, MAX_GPUS_PER_ENGINE, MAX_LATENCY_MS, MAX_REPLICAS
from planner_core.traces.trace import MAX_REQUEST_TOKENS, MAX_TRACE_SPAN_S

DAY_S = 86_400.0
MAX_RATE_SCALE = 1000.0
"""Largest `--rate-scale`; the scaled trace is bounded too (`MAX_SCALED_REQUESTS` in planner_core/traces)."""


@dataclass(frozen=True)
class Range:
    """A closed range [lo, hi], open at `lo` when `lo_open` (a positive quantity: `(0, 1000]`)."""

    lo: float
    hi: float
    lo_open: bool = False

    def __contains__(self, value: float) -> bool:
        return (value > self.lo if self.lo_open else value >= self.lo) and value <= self.hi

    def __str__(self) -> str:
        return f"{'(' if self.lo_open else '['}{_number(self.lo)}, {_number(self.hi)}]"


def _number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else f"{value:g}"


def _positive(hi: float) -> Range:
    return Range(0, hi, lo_open=True)


def _from(lo: float, hi: float) -> Range:
    return Range(lo, hi)


_TOKENS = _from(1, MAX_REQUEST_TOKENS)
_ENGINES = _from(0, MAX_REPLICAS)
_SECONDS = _positive(DAY_S)
_RATIO = _positive(1000)

OPTION_RANGES: dict[str, Range] = {
    "--accept-length": _from(1, 64),
    "--attempt-timeout-s": _SECONDS,
    "--audit-head-every-s": _positive(7 * DAY_S),
    "--batch-size": _from(1, MAX_COUNT),
    "--budget": _from(0, MAX_GPUS),
    "--chars-per-token": _positive(100),
    "--chunk-tokens": _TOKENS,
    "--compress": _RATIO,
    "--cooldown-s": _from(0, DAY_S),
    "--decode": _ENGINES,
    "--decode-gpus": _from(1, MAX_GPUS_PER_ENGINE),
    "--decode-osl": _TOKENS,
    "--decode-repeats": _from(1, 1000),
    "--deployments": _from(1, MAX_REPLICAS),
    "--drop-partitions-older-than": _from(1, 36_600),  # days: a century
    "--duration": _SECONDS,
    "--duration-s": _SECONDS,
    "--expect-revision": _from(0, 2**31 - 1),  # config_revisions.revision is a Postgres integer
    "--fixed-size": _ENGINES,
    "--fixed-search": _from(0, 100),  # live runs of minutes each
    "--gpus-per-engine": _from(1, MAX_GPUS_PER_ENGINE),
    "--ingest-kills": _from(0, 10_000),
    "--ingest-rate-hz": _positive(100_000),
    "--ingest-reconnect-s": _from(0, 3600),
    "--initial-size": _ENGINES,
    "--interval": _SECONDS,
    "--interval-s": _SECONDS,
    "--isl": _TOKENS,
    "--itl-ms": _positive(MAX_LATENCY_MS),
    "--itl-threshold": _RATIO,
    "--jobs": _from(1, 256),  # processes: more than any machine's cores gains nothing
    "--keep-every": _from(1, MAX_COUNT),
    "--kills": _from(0, 10_000),
    "--kv-hit-rate": _from(0, 1),
    "--limit": _from(1, MAX_COUNT),
    "--max-age-s": _SECONDS,
    "--max-concurrent": _from(1, 1024),
    "--max-duration-s": _positive(7 * DAY_S),
    "--max-gpu-budget": _from(-1, MAX_GPUS),  # -1: no ceiling
    "--max-gpus": _from(0, MAX_GPUS),
    "--max-series-age-s": _SECONDS,
    "--max-isl": _TOKENS,
    "--max-kv-tokens": _from(1, 1e9),
    "--max-num-batched-tokens": _from(1, 1e9),
    "--max-osl": _TOKENS,
    "--max-windows": _from(1, MAX_COUNT),
    "--max-workers": _from(1, 1024),
    "--metrics-port": _from(0, 65_535),
    "--min-gpus": _from(0, MAX_GPUS),
    "--nice": _from(0, 19),
    "--older-than": _from(0, 36_600),  # days
    "--oracle-context-s": _from(0, DAY_S),
    "--oracle-target": _positive(1),
    "--osl": _TOKENS,
    "--peak-rps": _positive(1e6),
    "--port": _from(0, 65_535),
    "--prefill": _ENGINES,
    "--prefill-gpus": _from(1, MAX_GPUS_PER_ENGINE),
    "--prefill-repeats": _from(1, 1000),
    "--priority": _from(-MAX_COUNT, MAX_COUNT),
    "--quantile": _from(0, 100),  # percent
    "--rate": _positive(1e6),
    "--rate-scale": _positive(MAX_RATE_SCALE),
    "--retention-minutes": _positive(366 * 24 * 60.0),
    "--revision": _from(1, 2**31 - 1),  # a config revision (config_revisions.revision)
    "--seconds": _SECONDS,
    "--seed": _from(0, 2**32 - 1),
    "--shape-hours": _positive(366 * 24),
    "--shape-start-h": _from(0, 366 * 24),
    "--slowdown": _RATIO,
    "--speedup": _positive(1e4),
    "--startup-s": _from(0, DAY_S),
    "--stats-every-s": _SECONDS,
    "--stream-interval-s": _SECONDS,
    "--throughput-interval-s": _from(1, DAY_S),
    "--timeout-s": _positive(300),
    "--tp": _from(1, MAX_GPUS_PER_ENGINE),
    "--tpot-dispatch-threshold": _RATIO,
    "--trace-start-s": _from(0, MAX_TRACE_SPAN_S),
    "--trough-ratio": _from(0, 1),
    "--ttft-dispatch-threshold": _RATIO,
    "--ttft-ms": _positive(MAX_LATENCY_MS),
    "--ttft-threshold": _RATIO,
    "--wake-max-held": _from(1, 100_000),  # requests a routing proxy holds for a pool at zero
    "--wake-renotify-s": _SECONDS,
    "--wake-timeout-s": _SECONDS,
    "--weight": _positive(1e6),
    "--window-s": _SECONDS,
    "--windows": _from(1, MAX_COUNT),
    "--workers": _from(1, 1024),
    "round_id": _from(1, 2**63 - 1),  # a bigint identity
}


class Bounded:
    """argparse `type=`: the text as an int or float inside `range`, else `argparse.ArgumentTypeError` (one line)."""

    def __init__(self, kind: type[int] | type[float], bounds: Range) -> None:
        self.kind, self.bounds = kind, bounds
        self.__name__ = kind.__name__  # argparse names the type in "invalid int value" errors

    def __call__(self, text: str) -> int | float:
        try:
            value = self.kind(text)
        except (TypeError, ValueError):
            kind = "an integer" if self.kind is int else "a number"
            raise argparse.ArgumentTypeError(f"{text!r} is not {kind}") from None
        if not math.isfinite(value) or value not in self.bounds:
            raise argparse.ArgumentTypeError(f"{text} is not in {self.bounds}")
        return value


def bound_numeric_options(parser: argparse.ArgumentParser) -> None:
    """Give every int or float option of `parser` its `Bounded` type and its range in the help.

    Raises:
        LookupError: a numeric option without a range in `OPTION_RANGES`, or whose default lies outside it.
    """
    for action in parser._actions:
        if action.type not in (int, float):
            continue
        name = action.option_strings[-1] if action.option_strings else action.dest
        bounds = OPTION_RANGES.get(name)
        if bounds is None:
            raise LookupError(f"{parser.prog} {name}: a numeric option needs its range in planner_cli/ranges.py")
        default = action.default
        if isinstance(default, int | float) and not isinstance(default, bool) and default not in bounds:
            raise LookupError(f"{parser.prog} {name}: default {default!r} is outside its range {bounds}")
        action.type = Bounded(action.type, bounds)
        action.help = f"{action.help or ''}; range {bounds}".lstrip("; ")
