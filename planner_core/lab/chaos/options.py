"""What `planner chaos` was asked (`ChaosOptions`, checked when made) and the fault kinds of its demo leg."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

FAULTS = ("demo-random", "demo-after-tick", "postgres", "prefect")


@dataclass(frozen=True)
class ChaosOptions:
    """The fault suite's options, named as the command's flags (see `planner chaos --help`)."""

    kills: int
    ingest_kills: int
    ingest_rate_hz: float
    ingest_reconnect_s: float
    windows: int
    seed: int
    trace: Path
    config: Path
    rate_scale: float
    data_dir: Path | None
    faults: tuple[str, ...]
    cycle: bool
    max_duration_s: float | None
    report: Path | None
    attempt_timeout_s: float
    argv: tuple[str, ...] = ()  # the command line after `planner`, kept in the report

    def __post_init__(self) -> None:
        if self.kills < 0 or self.ingest_kills < 0 or self.kills + self.ingest_kills < 1:
            raise ValueError(
                f"--kills = {self.kills}, --ingest-kills = {self.ingest_kills}: need at least 1 kill in all, "
                "none negative"
            )
        if self.windows < 2:
            raise ValueError(f"--windows = {self.windows}: need at least 2 windows")
        if not self.ingest_rate_hz > 0 or not self.ingest_reconnect_s >= 0:
            raise ValueError(
                f"--ingest-rate-hz = {self.ingest_rate_hz}, --ingest-reconnect-s = {self.ingest_reconnect_s}: "
                "need a rate > 0 and a reconnection allowance >= 0"
            )
        unknown = sorted(set(self.faults) - set(FAULTS))
        if unknown:
            known = ", ".join(FAULTS)
            raise ValueError(f"--faults = {','.join(self.faults)}: unknown {', '.join(unknown)} (known: {known})")
