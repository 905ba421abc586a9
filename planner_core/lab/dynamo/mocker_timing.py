"""Write the timing table Dynamo's mocker derives from a planner profile (the NPZ its `--planner-profile-data` turns
into: prefill TTFT on an ISL grid, decode ITL on an (active KV tokens, context) grid, both from Dynamo's linear
regressions of the profile).

Runs with the Python of the Dynamo virtualenv (never the project's own). `planner profile --round-trip` compares a
measured mocker with this table as well as with the profile itself, which tells the profiler's own error apart from
the mocker's fitting of the profile.

Usage: DYNAMO_PY mocker_timing.py PROFILE_DIR OUT.npz
"""

from __future__ import annotations

import sys
from pathlib import Path

_STUBS = Path(__file__).resolve().parent / "stubs"  # the stand-in `aisimulate_core` the wheel imports


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: mocker_timing.py PROFILE_DIR OUT.npz", file=sys.stderr)  # noqa: T201 - a script
        return 2
    sys.path.insert(0, str(_STUBS))
    from dynamo.mocker.utils.planner_profiler_perf_data_converter import convert_profile_results_to_npz

    convert_profile_results_to_npz(Path(argv[0]), Path(argv[1]))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
