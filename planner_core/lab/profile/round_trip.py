"""The profiler's round trip (`planner profile --round-trip`): Dynamo's frontend and one aggregated mocker engine
timed by the shipped H200 profile (slowed `slowdown` times, as `planner live` runs it), profiled over HTTP, the
measured profile compared with its source and with the mocker's own timing at the measured points, and
`planner capacity` run on each; the report goes to `OUT/roundtrip.json`."""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from planner_core.lab.live.stack import MODEL_NAME, PROFILE_DIR, REPO, STUBS_DIR, get, process, tool, wait_for
from planner_core.lab.live.traffic import write_slowed_profile
from planner_core.lab.profile.sweep import measure
from planner_core.runtime.localhost import code_commit, free_port

if TYPE_CHECKING:
    from planner_core.perf.profile import DecodeProfile, EngineProfile, PrefillProfile
    from planner_core.perf.profiling import ProfileComparison, SweepSpec

CAPACITY_CHECK = {"isl": 3000, "osl": 300, "ttft_ms": 200.0, "itl_ms": 10.0}
CAPACITY_TOLERANCE = 0.10


@dataclass(frozen=True)
class RoundTripTools:
    """What the round trip runs: Dynamo's interpreter and the tiny model folder."""

    dynamo: str
    model_dir: str


def round_trip_tools() -> RoundTripTools:
    """The round trip's tools, or `LiveError` naming the make target that makes the missing one."""
    return RoundTripTools(
        dynamo=tool("DYNAMO_PYTHON", REPO / ".dynamo-venv" / "bin" / "python", "dynamo-env"),
        model_dir=tool("PLANNER_LIVE_MODEL_DIR", REPO / ".planner" / "live-model", "live-env"),
    )


def _capacity(profile_dir: Path) -> dict:
    """`planner capacity --json` on a profile at the check's request shape and SLA."""
    c = CAPACITY_CHECK
    command = [
        sys.executable, "-m", "planner_cli", "capacity", "--profile", str(profile_dir), "--isl", str(c["isl"]),
        "--osl", str(c["osl"]), "--ttft-ms", str(c["ttft_ms"]), "--itl-ms", str(c["itl_ms"]), "--json",
    ]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, check=True)
    shown = [*command[3:]]
    with contextlib.suppress(ValueError):  # the record names the profile relative to where the command ran
        shown[shown.index("--profile") + 1] = os.path.relpath(profile_dir)
    return {"command": "planner " + " ".join(shown), **json.loads(done.stdout)}


def _mocker_timing(dynamo: str, source_dir: Path, out: Path):
    """The mocker's own timing table for `source_dir` (made by Dynamo's converter), as the two functions
    `compare_with` takes: TTFT by ISL, ITL by (batch, context), each interpolated linearly on its grid."""
    import numpy as np
    from scipy.interpolate import RegularGridInterpolator

    script = REPO / "planner_core" / "lab" / "dynamo" / "mocker_timing.py"
    subprocess.run([dynamo, str(script), str(source_dir), str(out)], capture_output=True, text=True, check=True)
    with np.load(out) as npz:
        isl, ttft = npz["prefill_isl"], npz["prefill_ttft_ms"]
        kv, ctx, itl = npz["decode_active_kv_tokens"], npz["decode_context_length"], npz["decode_itl"]
    grid = RegularGridInterpolator((kv, ctx), itl, bounds_error=False, fill_value=None)
    return (
        lambda x: float(np.interp(x, isl, ttft)),
        lambda batch, context: float(grid([[batch * context, context]])[0]),
    )


def _rps(value: float | None) -> str:
    """A capacity figure as the summary prints it."""
    return "none (SLA unreachable)" if value is None else f"{value:.3f}"


@contextlib.contextmanager
def _mocker_stack(tools: RoundTripTools, source_dir: Path, out: Path, *, nice: int) -> Iterator[str]:
    """Dynamo's frontend and one aggregated mocker timed by `source_dir`, up and registered; the frontend's URL.
    Both stop on leaving."""
    from planner_core.config import MOCKER_COMMAND
    from planner_core.runtime.connectors.local import render_command

    kv_dir, logs = out / "kv", out / "logs"
    for folder in (kv_dir, logs):
        folder.mkdir(exist_ok=True)
    port = free_port()
    endpoint = f"http://127.0.0.1:{port}"
    env = {**os.environ, "DYN_FILE_KV": str(kv_dir), "PYTHONPATH": str(STUBS_DIR)}
    mocker = render_command(
        MOCKER_COMMAND,
        {
            "DYNAMO_PYTHON": tools.dynamo,
            "PLANNER_LOCAL_MODEL_DIR": tools.model_dir,
            "PLANNER_LOCAL_MODEL_NAME": MODEL_NAME,
            "DISAGGREGATION_MODE": "agg",
            "PLANNER_LOCAL_PROFILE_DIR": str(source_dir),
        },
        field="mocker",
    )
    with contextlib.ExitStack() as stack:
        frontend = stack.enter_context(
            process(
                [tools.dynamo, "-m", "dynamo.frontend", "--http-port", str(port), "--discovery-backend", "file"],
                logs / "frontend.log", env, nice=nice,
            )
        )  # fmt: skip
        engine = stack.enter_context(process(mocker, logs / "mocker.log", env, nice=nice))
        wait_for("Dynamo frontend", lambda: get(f"{endpoint}/metrics"), 120, frontend)
        wait_for(
            "the mocker registered with the frontend",
            lambda: MODEL_NAME.encode() in get(f"{endpoint}/v1/models"),
            300,
            engine,
        )
        yield endpoint


def _descaled(measured: EngineProfile, slowdown: float) -> tuple[PrefillProfile, DecodeProfile]:
    """The measured profile with the `slowdown` undone: the H200 speed the source profile had."""
    from planner_core.perf.profile import DecodeProfile, PrefillProfile

    prefill = PrefillProfile(
        isl=measured.prefill.isl,
        ttft_ms=measured.prefill.ttft_ms / slowdown,
        thpt_per_gpu=measured.prefill.thpt_per_gpu * slowdown,
    )
    decode = DecodeProfile(
        kv_usage=measured.decode.kv_usage,
        context_length=measured.decode.context_length,
        itl_ms=measured.decode.itl_ms / slowdown,
        thpt_per_gpu=measured.decode.thpt_per_gpu * slowdown,
        max_kv_tokens=measured.decode.max_kv_tokens,
    )
    return prefill, decode


def _capacities(
    out: Path,
    comparisons: dict[str, ProfileComparison],
    prefill: PrefillProfile,
    decode: DecodeProfile,
    descaled_dir: Path,
    slowdown: float,
) -> dict[str, dict]:
    """`planner capacity` on the source, on the measured profile (descaled) and on each reference timed at the
    sweep's points (descaled).

    The same sweep points timed by each reference: the mocker's own timing there is what a perfect profiler would
    have written (so measured vs it is the profiler's error); the source there tells the sweep's coarseness apart
    from the mocker's fitting of its source."""
    from planner_core.lab.profiler import write_profile
    from planner_core.perf.profile import DecodeProfile, PrefillProfile
    from planner_core.perf.profiling import Role

    capacity = {"source": _capacity(PROFILE_DIR), "measured": _capacity(descaled_dir)}
    for against, comparison in comparisons.items():
        by_role = {role: [row for row in comparison.rows if row[0] == role.value] for role in Role}
        points_dir = out / f"{against}-at-points"
        write_profile(
            points_dir,
            PrefillProfile(
                isl=prefill.isl,
                ttft_ms=[row[4] / slowdown for row in by_role[Role.PREFILL]],
                thpt_per_gpu=[row[1] / (row[4] / slowdown / 1000.0) for row in by_role[Role.PREFILL]],
            ),
            DecodeProfile(
                kv_usage=decode.kv_usage,
                context_length=decode.context_length,
                itl_ms=[row[4] / slowdown for row in by_role[Role.DECODE]],
                thpt_per_gpu=[row[1] / (row[4] / slowdown / 1000.0) for row in by_role[Role.DECODE]],
                max_kv_tokens=decode.max_kv_tokens,
            ),
        )
        capacity[f"{against}_at_points"] = _capacity(points_dir)
    return capacity


def _report(
    comparisons: dict[str, ProfileComparison], capacity: dict[str, dict], *, command: str, slowdown: float,
    measured_s: float,
) -> dict:  # fmt: skip
    """The `roundtrip.json` record: per reference and role the errors at the measured points, and the capacities."""
    from planner_core.perf.profiling import Role

    key = "requests_per_s_per_gpu"
    src_rps, meas_rps = capacity["source"][key], capacity["measured"][key]
    capacity_error = None if not src_rps or meas_rps is None else meas_rps / src_rps - 1.0
    model_rps = capacity["mocker_model_at_points"][key]
    profiler_capacity_error = None if not model_rps or meas_rps is None else meas_rps / model_rps - 1.0
    roles = {
        against: {
            role.value: {
                "num_points": len(comparison.errors(role)),
                "median_abs_error": comparison.median_abs(role),
                "worst_error": comparison.worst(role),
            }
            for role in Role
        }
        for against, comparison in comparisons.items()
    }
    return {
        "date": dt.datetime.now(dt.UTC).replace(microsecond=0).isoformat(),
        "commit": code_commit(),
        "command": command,
        "slowdown": slowdown,
        "engine": "Dynamo 1.6.1 frontend + one aggregated mocker (--planner-profile-data: the H200 profile slowed)",
        "measure_s": round(measured_s, 1),
        "roles": roles,
        "points": {
            against: [
                dict(zip(("role", "x", "y", "measured_ms", "reference_ms", "relative_error"), row, strict=True))
                for row in comparison.rows
            ]
            for against, comparison in comparisons.items()
        },
        "capacity": capacity,
        "capacity_check": CAPACITY_CHECK,
        "capacity_relative_error": capacity_error,
        "capacity_within_tolerance": capacity_error is not None and abs(capacity_error) <= CAPACITY_TOLERANCE,
        "capacity_relative_error_vs_mocker_model": profiler_capacity_error,
    }


def round_trip(
    tools: RoundTripTools,
    out: Path,
    *,
    slowdown: float,
    nice: int,
    sweep: SweepSpec,
    max_kv_tokens: int | None,
    gpus_per_engine: int,
    command: str,
) -> dict:
    """The whole round trip under `out` (resolved); its report, also written to `out/roundtrip.json`."""
    from planner_core.lab.profiler import write_plots, write_profile
    from planner_core.perf.profile import load_profile
    from planner_core.perf.profiling import compare_profiles, compare_with

    out.mkdir(parents=True, exist_ok=True)
    source_dir = write_slowed_profile(out / f"source-x{slowdown:g}", slowdown)
    started = time.monotonic()
    with _mocker_stack(tools, source_dir, out, nice=nice) as endpoint:
        measured = measure(
            endpoint, MODEL_NAME, out / "measured", sweep=sweep, max_kv_tokens=max_kv_tokens,
            gpus_per_engine=gpus_per_engine, reference=load_profile(source_dir),
        )  # fmt: skip
    measured_s = time.monotonic() - started
    source = load_profile(source_dir)
    comparisons = {"source": compare_profiles(measured, source)}
    timing = _mocker_timing(tools.dynamo, source_dir, out / "mocker-timing.npz")
    comparisons["mocker_model"] = compare_with(measured, *timing)
    # the measured engine was `slowdown` times slower than the H200 profile: undo that for the SLA check
    descaled_dir = out / "measured-descaled"
    prefill, decode = _descaled(measured, slowdown)
    write_profile(descaled_dir, prefill, decode)
    h200 = load_profile(PROFILE_DIR)
    with contextlib.suppress(RuntimeError):
        write_plots(descaled_dir, prefill, decode, title="Measured mocker, descaled, vs the H200 profile",
                    reference=(h200.prefill, h200.decode))  # fmt: skip
    capacity = _capacities(out, comparisons, prefill, decode, descaled_dir, slowdown)
    # the seed-004 TTFT/TPOT files of the measured profile (`planner profile-json`), beside it
    subprocess.run(
        [sys.executable, "-m", "planner_cli", "profile-json", "--from", "dynamo", "--profile", str(descaled_dir),
         "--model", MODEL_NAME, "--out-dir", str(descaled_dir)],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    report = _report(comparisons, capacity, command=command, slowdown=slowdown, measured_s=measured_s)
    (out / "roundtrip.json").write_text(json.dumps(report, indent=1) + "\n")
    return report


def round_trip_summary(report: dict, out: Path) -> list[str]:
    """The lines `planner profile --round-trip` prints: per reference and role the errors, then the capacities."""
    lines = [
        f"vs {against}: {role}: {figures['num_points']} points, median |error| "
        f"{100 * figures['median_abs_error']:.1f} %, worst {100 * figures['worst_error']:+.1f} %"
        for against, by_role in report["roles"].items()
        for role, figures in by_role.items()
    ]
    key = "requests_per_s_per_gpu"
    capacity, capacity_error = report["capacity"], report["capacity_relative_error"]
    src_rps, meas_rps = capacity["source"][key], capacity["measured"][key]
    model_rps = capacity["mocker_model_at_points"][key]
    lines.append(
        f"capacity at ISL {CAPACITY_CHECK['isl']}/OSL {CAPACITY_CHECK['osl']}, TTFT {CAPACITY_CHECK['ttft_ms']:g} ms/"
        f"ITL {CAPACITY_CHECK['itl_ms']:g} ms: source {_rps(src_rps)} req/s/GPU, measured {_rps(meas_rps)} req/s/GPU "
        f"({'n/a' if capacity_error is None else f'{100 * capacity_error:+.1f} %'}); the mocker's own timing at the "
        f"same points {_rps(model_rps)} req/s/GPU; {out / 'roundtrip.json'}"
    )
    return lines
