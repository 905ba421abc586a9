"""A stand-in engine for the local connector's tests: registers like a Dynamo engine, serves nothing.

It listens on a TCP port and writes an `instances` entry for its `generate` endpoint into the file discovery
store (`DYN_FILE_KV`), as Dynamo's engines do; on SIGTERM it removes the entry and exits after `--drain-s`
seconds (0: at once), or ignores SIGTERM with `--ignore-sigterm` (so that the connector has to SIGKILL it).

Usage: python local_worker_standin.py --namespace NS [--register-after-s S] [--drain-s S] [--ignore-sigterm]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import sys
import time
from pathlib import Path


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--namespace", default="dynamo")
    parser.add_argument("--register-after-s", type=float, default=0.0)
    parser.add_argument("--drain-s", type=float, default=0.0)
    parser.add_argument("--ignore-sigterm", action="store_true")
    args = parser.parse_args()
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    port = server.getsockname()[1]
    instance_id = f"{os.getpid():016x}"
    entry = (
        Path(os.environ["DYN_FILE_KV"]) / "v1" / "instances" / f"{args.namespace}%2Fbackend%2Fgenerate%2F{instance_id}"
    )
    stopping = {"at": None}

    def on_sigterm(*_: object) -> None:
        if not args.ignore_sigterm:
            stopping["at"] = time.monotonic()
            entry.unlink(missing_ok=True)

    signal.signal(signal.SIGTERM, on_sigterm)
    time.sleep(args.register_after_s)
    if stopping["at"] is None:
        entry.parent.mkdir(parents=True, exist_ok=True)
        body = {
            "type": "Endpoint", "namespace": args.namespace, "component": "backend", "endpoint": "generate",
            "instance_id": os.getpid(), "transport": {"tcp": f"127.0.0.1:{port}/{instance_id}/x/backend/generate"},
        }  # fmt: skip
        entry.write_text(json.dumps(body))
    while stopping["at"] is None or time.monotonic() - stopping["at"] < args.drain_s:
        time.sleep(0.05)
    return 0


if __name__ == "__main__":
    sys.exit(main())
