"""Finding the local connector's engine processes and what they registered, without the database: a process'
state and start time and the TCP ports it listens on (from `/proc`), and the instances Dynamo's file discovery
store (`DYN_FILE_KV`) holds for a namespace's generate endpoint. The parsers are pure functions of the texts; the
readers read `/proc` and the store and skip what vanishes while they read (a worker that exits or deregisters)."""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterable
from pathlib import Path

GENERATE_ENDPOINT = "generate"  # the endpoint an engine registers to serve requests


def parse_proc_stat(text: str) -> tuple[str, int]:
    """(state letter, start time in clock ticks since boot) from the text of /proc/PID/stat.

    The command name (field 2) is in parentheses and may hold spaces and parentheses: fields are counted from
    the last ')'.
    """
    rest = text[text.rindex(")") + 2 :].split()
    return rest[0], int(rest[19])  # fields 3 (state) and 22 (starttime)


def parse_listening_inodes(proc_net_tcp: str) -> dict[int, int]:
    """Socket inode -> local port of every listening TCP socket in a /proc/net/tcp (or tcp6) text."""
    listening: dict[int, int] = {}
    for line in proc_net_tcp.splitlines()[1:]:
        fields = line.split()
        if len(fields) < 10 or fields[3] != "0A":  # 0A = TCP_LISTEN
            continue
        port = int(fields[1].rsplit(":", 1)[1], 16)
        listening[int(fields[9])] = port
    return listening


_TCP_PORT = re.compile(r"^[^/]*:(\d+)(?:/|$)")


def registered_ports(entries: Iterable[str], *, namespace: str, endpoint: str = GENERATE_ENDPOINT) -> set[int]:
    """TCP ports of the instances registered for `namespace`'s `endpoint` (texts of `instances/*` entries of
    Dynamo's file discovery store); entries that do not parse are skipped (a half-written file is seen again)."""
    return set(registered_instances(entries, namespace=namespace, endpoint=endpoint))


def registered_instances(
    entries: Iterable[str], *, namespace: str, endpoint: str = GENERATE_ENDPOINT
) -> dict[int, set[str]]:
    """TCP port -> instance ids (decimal text, as the engines' forward-pass samples name them) of the instances
    registered for `namespace`'s `endpoint`; an entry without an integer `instance_id` maps its port to no id."""
    ports: dict[int, set[str]] = {}
    for text in entries:
        try:
            entry = json.loads(text)
        except ValueError:
            continue
        if not isinstance(entry, dict) or entry.get("namespace") != namespace or entry.get("endpoint") != endpoint:
            continue
        tcp = (entry.get("transport") or {}).get("tcp") if isinstance(entry.get("transport"), dict) else None
        match = _TCP_PORT.match(tcp) if isinstance(tcp, str) else None
        if match:
            ids = ports.setdefault(int(match.group(1)), set())
            instance_id = entry.get("instance_id")
            if isinstance(instance_id, int) and not isinstance(instance_id, bool):
                ids.add(str(instance_id))
    return ports


def process_start_ticks(pid: int) -> int | None:
    """The start time of a running (not zombie) process, None when it is gone or a zombie.

    Reaps the process first when it is this process' child, so that a worker started by a long-lived planner
    does not linger as a zombie.
    """
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        pass  # not our child: its parent (or init) reaps it
    try:
        state, start_ticks = parse_proc_stat(Path(f"/proc/{pid}/stat").read_text())
    except (FileNotFoundError, ProcessLookupError, ValueError, IndexError):
        return None
    return None if state in ("Z", "X") else start_ticks


def listening_ports(pid: int) -> set[int]:
    """TCP ports the process listens on (its socket inodes matched against /proc/net/tcp and tcp6)."""
    inodes: set[int] = set()
    try:
        for fd in os.scandir(f"/proc/{pid}/fd"):
            try:
                target = os.readlink(fd.path)
            except OSError:
                continue
            if target.startswith("socket:["):
                inodes.add(int(target[8:-1]))
    except OSError:
        return set()
    ports: set[int] = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            listening = parse_listening_inodes(Path(table).read_text())
        except OSError:
            continue
        ports |= {port for inode, port in listening.items() if inode in inodes}
    return ports


def discovery_ports(discovery_dir: Path, namespace: str) -> set[int]:
    """Ports registered in a file discovery store for the namespace's generate endpoint."""
    return set(discovery_instances(discovery_dir, namespace))


def discovery_instances(discovery_dir: Path, namespace: str) -> dict[int, set[str]]:
    """Port -> instance ids registered in a file discovery store for the namespace's generate endpoint."""
    instances = discovery_dir / "v1" / "instances"
    texts: list[str] = []
    try:
        for entry in os.scandir(instances):
            try:
                texts.append(Path(entry.path).read_text())
            except OSError:
                continue  # removed while listing: the worker deregistered
    except OSError:
        return {}
    return registered_instances(texts, namespace=namespace)
