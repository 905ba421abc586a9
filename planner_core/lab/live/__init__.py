"""`planner live`: the planner scales Dynamo's own serving runtime (frontend + mocker engines, no GPU), driven by
real HTTP traffic from aiperf, then the same traffic on a fixed-size pool; prints both runs side by side.

One run brings up, under its own folder: the embedded Postgres, `planner serve` (its Prefect server and the
deployments: throughput tick, execute-decisions; the local connector starts and stops mocker engines timed by
the shipped H200 profile: prefill and decode pools with `--mode disagg`, the default, one aggregated pool with
`--mode agg`), Prometheus (Debian's binary) scraping the frontend's and every engine's `/metrics` every second,
Dynamo's frontend on file discovery (it routes each request to a prefill engine, then a decode engine), the
forward-pass ingest, and aiperf replaying a Mooncake trace on its timestamps. At the end it stops
everything it started (the workers by SIGTERM, then SIGKILL) and reads the figures: aiperf's per-request TTFT and
ITL against the SLA, the workers' GPU-seconds (one GPU per engine), the decisions and their acknowledgements, the
CPU idle share of the machine, and whether the recorded ticks replay identical.

Needs the Dynamo virtualenv (`make dynamo-env`; `DYNAMO_PYTHON` points elsewhere) and the live environment
(`make live-env`: aiperf in .aiperf-venv and the tiny model folder, both made locally; `AIPERF` and
`PLANNER_LIVE_MODEL_DIR` point elsewhere).

The room's parts: `stack` (the tools, the child processes, the CPU sampler), `traffic` (the trace and the slowed
profile), `spec` (one run and its planner config), `run` (one run end to end), `scoring` (the figures, the table,
the record) and `campaign` (the runs of one `planner live`). `planner_cli/live.py` parses the command and calls
`run_live` or `summarize_runs`.
"""

from planner_core.lab.live.campaign import (
    LiveOptions,
    binding_sla,
    parse_size_list,
    parse_sizes,
    plan_runs,
    run_live,
    summarize_runs,
    write_traffic,
)
from planner_core.lab.live.run import run_once
from planner_core.lab.live.scoring import aiperf_figures, db_figures, live_record, live_table, summarize
from planner_core.lab.live.spec import RunSpec, compressed_policy, write_config
from planner_core.lab.live.stack import (
    CHARS_PER_TOKEN,
    DEPLOYMENT,
    MODEL_NAME,
    PROFILE_DIR,
    REPO,
    STUBS_DIR,
    LiveCancelled,
    LiveError,
    find_tools,
    get,
    process,
    tool,
    wait_for,
)
from planner_core.lab.live.traffic import (
    AZURE_CONV,
    day_shape,
    day_trace,
    fitting_speedup,
    write_day_trace,
    write_slowed_profile,
    write_trace,
)

__all__ = [
    "AZURE_CONV",
    "CHARS_PER_TOKEN",
    "DEPLOYMENT",
    "MODEL_NAME",
    "PROFILE_DIR",
    "REPO",
    "STUBS_DIR",
    "LiveCancelled",
    "LiveError",
    "LiveOptions",
    "RunSpec",
    "aiperf_figures",
    "binding_sla",
    "compressed_policy",
    "day_shape",
    "day_trace",
    "db_figures",
    "find_tools",
    "fitting_speedup",
    "get",
    "live_record",
    "live_table",
    "parse_size_list",
    "parse_sizes",
    "plan_runs",
    "process",
    "run_live",
    "run_once",
    "summarize",
    "summarize_runs",
    "tool",
    "wait_for",
    "write_config",
    "write_day_trace",
    "write_slowed_profile",
    "write_trace",
    "write_traffic",
]
