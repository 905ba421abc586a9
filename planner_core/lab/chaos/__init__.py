"""`planner chaos`: kill -9 the demo's processes at random and check that no decision is duplicated or lost.

The run, in a folder of its own (`--data-dir`, default a new folder under the data dir) with its own embedded
Postgres and its own Prefect server:

1. an uninterrupted `planner demo` of `--windows` windows (deployment `baseline`): the reference sequence;
2. rounds of the same demo under faults (deployments `chaos-1`, `chaos-2`, ...): each attempt is a fresh
   `planner demo` process, and before it ends one fault is injected, drawn at random:
   - `demo-random`: SIGKILL of the demo process at a random moment of its run (start-up, a tick, an execution,
     the report at the end: wherever it is);
   - `demo-after-tick`: SIGKILL as soon as a new tick row is committed (the moment between a tick's transaction
     and the execution of its decision, which a random kill rarely hits);
   - `postgres`: SIGKILL of the Postgres postmaster (crash recovery on restart); the demo loses its database and
     must end by itself (a hung demo is killed and counted);
   - `prefect`: SIGKILL of the Prefect server's process group and a restart on the same port; the demo either
     rides it out or ends (a hung demo is killed and counted);
   then the demo is started again, until the round's demo exits 0; a round ends when its run completes.
3. Every finished round is compared with the baseline: the ticks (scheduled time, reason, targets) and the
   decision history (time, targets, status, acknowledged), duplicates (two ticks at one scheduled time, two
   decisions of one tick), losses (a baseline tick or decision missing) and extras; the audit chain is verified.

Before the demo leg, `--ingest-kills N` runs the ingest leg (`planner_core.lab.chaos.ingest_leg`): kill -9 of a
`planner ingest` process, and of Postgres under it, while a publisher sends numbered forward-pass metrics; the
stored samples are checked against the messages sent.

The JSON report (`--report`) has the kill counts by kind, each kill's log line, the per-round comparison and the
ingest leg's check. The demo runs the tick and the execution in one process (Prefect runs the tasks in-process),
so "the tick process" and "the execution process" are that one process, killed at different moments; the demo
runs no FPM ingest (its traffic comes from the simulator), which is why the ingest has a leg of its own.

The room's parts: `options` (what was asked), `stack` (the run's folder, Prefect server and Postgres), `queries`
(the run's database read with psycopg), `demo_leg` (the demo attempts and the faults injected into them),
`ingest_leg`, `report`, and `suite` (`run_chaos`, the whole run). `planner_cli/chaos.py` parses and prints.
"""

from planner_core.lab.chaos.demo_leg import HUNG_FACTOR, hung_after_s
from planner_core.lab.chaos.ingest_leg import (
    DEPLOYMENT as INGEST_DEPLOYMENT,
)
from planner_core.lab.chaos.ingest_leg import (
    INGEST_FAULTS,
    IngestFault,
    check_ingest_leg,
    ingest_leg_clean,
    run_ingest_leg,
    synthetic_message,
)
from planner_core.lab.chaos.options import FAULTS, ChaosOptions
from planner_core.lab.chaos.queries import compare_round, diff_rows
from planner_core.lab.chaos.report import report_clean, report_summary
from planner_core.lab.chaos.stack import ChaosRun, Kill
from planner_core.lab.chaos.suite import run_chaos

__all__ = [
    "FAULTS",
    "HUNG_FACTOR",
    "INGEST_DEPLOYMENT",
    "INGEST_FAULTS",
    "ChaosOptions",
    "ChaosRun",
    "IngestFault",
    "Kill",
    "check_ingest_leg",
    "compare_round",
    "diff_rows",
    "hung_after_s",
    "ingest_leg_clean",
    "report_clean",
    "report_summary",
    "run_chaos",
    "run_ingest_leg",
    "synthetic_message",
]
