"""What the command groups share: default inputs and the Prefect environment."""

from __future__ import annotations

import os

from planner_core.data import AZURE_CONV_TRACE, H200_PROFILE_DIR
from planner_core.runtime.settings import RuntimeSettings

DEFAULT_TRACE = AZURE_CONV_TRACE
DEFAULT_PROFILE = H200_PROFILE_DIR


def prefect_environment(settings: RuntimeSettings) -> None:
    """Offline-friendly Prefect defaults; anything the user set wins."""
    prefect_home = (settings.data_dir / "prefect").resolve()
    prefect_home.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("PREFECT_HOME", str(prefect_home))
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    os.environ.setdefault("DO_NOT_TRACK", "1")
    # Served runs inherit this: statsmodels (ARIMA) is 10-20x slower when OpenBLAS threads contend for 2 cores.
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    # A fresh Prefect home migrates its SQLite database on first start; on a busy 2-core machine that can
    # exceed Prefect's 20 s default.
    os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "120")


def print_example_queries(database_url: str, deployment: str) -> None:
    """The example queries on the history views, each with its answer (`planner demo`, `planner history
    --examples`)."""
    import pandas as pd

    from planner_core.runtime.store.history import example_query_frames

    pd.set_option("display.width", 160)
    pd.set_option("display.max_columns", 20)
    for title, sql, frame in example_query_frames(database_url, deployment):
        print(f"\n-- {title}\n{sql};\n")
        print(frame.to_string(index=False))
