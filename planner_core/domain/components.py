"""The pools the planner scales and its two loops: the vocabulary every other domain type names."""

from __future__ import annotations

import enum


class Component(enum.StrEnum):
    """A pool of workers the planner scales."""

    PREFILL = "prefill"  # computes prompts; drives TTFT
    DECODE = "decode"  # generates tokens; drives ITL (also the single pool in aggregated mode)


class Loop(enum.StrEnum):
    """Which of the planner's two loops a tick belongs to."""

    THROUGHPUT = "throughput"  # slow, predictive: forecast -> capacity model -> replicas
    LOAD = "load"  # fast, reactive: per-engine load -> +/-1 corrections
