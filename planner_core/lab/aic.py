"""Precomputing perf tables with aiconfigurator (offline; never called per tick).

Role: I/O around the pure perf model. `build_perf_table` asks aiconfigurator (through `planner_core.lab.aic_worker`,
run by the interpreter that has aiconfigurator) for one estimate per grid point and assembles a validated
`PerfTable`; `write_perf_table` writes it atomically. `planner perf-table` is the command line over both.

How a grid point maps to aiconfigurator (`aiconfigurator.cli.api.cli_estimate`, database mode SILICON):
- prefill (batch b, ISL s): `mode="static_ctx", batch_size=b, isl=s, osl=1`; the table keeps its TTFT, the wall
  time of the one context iteration over b prompts of s tokens;
- decode (batch b, context c): `mode="static_gen", batch_size=b, isl=c, osl=2`; the table keeps its TPOT, the
  wall time of the one generation step of b sequences holding c tokens each.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import textwrap
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import planner_core
from planner_core.perf.table import PERF_TABLE_FORMAT, PerfTable, PerfTableHeader, parse_perf_table

__all__ = [
    "DEFAULT_CTX_GRID",
    "DEFAULT_DECODE_BATCH_GRID",
    "DEFAULT_ISL_GRID",
    "DEFAULT_PREFILL_BATCH_GRID",
    "AicError",
    "AicEstimate",
    "PerfTableSpec",
    "build_perf_table",
    "parse_grid",
    "perf_table_text",
    "resolve_aic_python",
    "run_estimates",
    "write_perf_table",
]

# Default grid: 9 x 4 prefill + 12 x 9 decode = 144 points (~0.6 s each on this machine, ~1.5 min in all).
# Powers of two keep log-space interpolation evenly spaced; decode batch reaches 2048 because Dynamo's profiles
# sweep concurrency up to 2000 (the H200 profile reaches ~1570 sequences at short context).
DEFAULT_ISL_GRID = (128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768)
DEFAULT_PREFILL_BATCH_GRID = (1, 2, 4, 8)
DEFAULT_DECODE_BATCH_GRID = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048)
DEFAULT_CTX_GRID = (128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768)

INSTALL_HINT = (
    "install it with `pip install 'llm-planner[aic]'` (or `pip install 'aiconfigurator>=0.12,<0.13'`), "
    "or pass --aic-python PATH of an interpreter that has it"
)
_MS_DECIMALS = 4  # 0.1 microsecond: far below aiconfigurator's own resolution, keeps the file small


class AicError(ValueError):
    """aiconfigurator is missing, failed, or answered something unusable (one-line message)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class AicEstimate:
    """One aiconfigurator answer (or its error) for the call at `index`."""

    index: int
    ttft_ms: float | None = None
    tpot_ms: float | None = None
    fits_memory: bool | None = None
    backend_version: str | None = None
    precision: tuple[tuple[str, str], ...] = ()
    error: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class PerfTableSpec:
    """What to tabulate.

    Attributes:
        model: the model as the user names it (Hugging Face id); recorded in the header.
        system, backend, tp: aiconfigurator system name, backend and tensor-parallel size.
        backend_version: aiconfigurator database version (None: its current one for this system and backend).
        aic_model: the model id or local folder aiconfigurator is asked about (None: `model`). Offline,
            aiconfigurator knows only the models it ships configs for, so an FP8 or instruct checkpoint may be
            named through its architecturally identical base model plus `gemm_quant`.
        gemm_quant, kvcache_quant, fmha_quant: aiconfigurator quantisation modes (None: its inference).
        isl_grid, prefill_batch_grid, decode_batch_grid, ctx_grid: the grid (prefill batch must start at 1).
    """

    model: str
    system: str
    backend: str
    tp: int = 1
    backend_version: str | None = None
    aic_model: str | None = None
    gemm_quant: str | None = None
    kvcache_quant: str | None = None
    fmha_quant: str | None = None
    isl_grid: tuple[int, ...] = DEFAULT_ISL_GRID
    prefill_batch_grid: tuple[int, ...] = DEFAULT_PREFILL_BATCH_GRID
    decode_batch_grid: tuple[int, ...] = DEFAULT_DECODE_BATCH_GRID
    ctx_grid: tuple[int, ...] = DEFAULT_CTX_GRID
    extra: dict[str, Any] = field(default_factory=dict)  # more cli_estimate keywords, passed through

    def base_call(self) -> dict[str, Any]:
        call: dict[str, Any] = {
            "model_path": self.aic_model or self.model,
            "system_name": self.system,
            "backend_name": self.backend,
            "backend_version": self.backend_version,
            "database_mode": "SILICON",
            "tp_size": self.tp,
            **self.extra,
        }
        quant = {"gemm_quant_mode": self.gemm_quant, "kvcache_quant_mode": self.kvcache_quant}
        quant["fmha_quant_mode"] = self.fmha_quant
        call.update({key: value for key, value in quant.items() if value is not None})
        return call

    def calls(self) -> list[tuple[str, dict[str, Any]]]:
        """`(label, cli_estimate keywords)` per grid point: prefill rows first, then decode rows."""
        base = self.base_call()
        out = [
            (
                f"prefill batch={batch} isl={isl}",
                {**base, "mode": "static_ctx", "batch_size": batch, "isl": isl, "osl": 1},
            )
            for batch in self.prefill_batch_grid
            for isl in self.isl_grid
        ]
        out += [
            (
                f"decode batch={batch} ctx={ctx}",
                {**base, "mode": "static_gen", "batch_size": batch, "isl": ctx, "osl": 2},
            )
            for batch in self.decode_batch_grid
            for ctx in self.ctx_grid
        ]
        return out


def parse_grid(option: str, text: str) -> tuple[int, ...]:
    """A comma-separated list of positive whole numbers, sorted and without repeats."""
    values = []
    for item in text.split(","):
        item = item.strip()
        if not item.isdigit() or int(item) <= 0:
            raise ValueError(f"{option} {text!r}: {item!r} is not a positive whole number")
        values.append(int(item))
    return tuple(sorted(set(values)))


def resolve_aic_python(aic_python: str | os.PathLike[str] | None) -> str:
    """The interpreter to run aiconfigurator with: the given one, else this one if aiconfigurator is importable."""
    if aic_python is not None:
        path = Path(aic_python)
        if not path.is_file() or not os.access(path, os.X_OK):
            raise AicError(f"--aic-python {aic_python}: not an executable file")
        return str(path)
    if importlib.util.find_spec("aiconfigurator") is None:
        raise AicError(f"aiconfigurator is not installed in {sys.executable}: {INSTALL_HINT}")
    return sys.executable


def _worker_env() -> dict[str, str]:
    """Environment of the worker: this project importable (for `-m planner_core.lab.aic_worker`), quiet and offline."""
    root = str(Path(planner_core.__file__).resolve().parents[1])
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(part for part in (root, env.get("PYTHONPATH")) if part)
    env.setdefault("HF_HUB_OFFLINE", "1")  # model configs ship with aiconfigurator; never wait on the network
    env.setdefault("PYTHONUNBUFFERED", "1")
    return env


def _tail(path: Path, lines: int = 5) -> str:
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return ""
    kept = [line.strip() for line in text.splitlines() if line.strip()][-lines:]
    return " | ".join(kept)


def run_estimates(
    calls: Sequence[dict[str, Any]],
    *,
    aic_python: str,
    on_estimate: Callable[[AicEstimate], None] | None = None,
) -> tuple[str, list[AicEstimate]]:
    """Run aiconfigurator on every call (keywords of `cli_estimate`) in one worker process.

    `on_estimate` sees each estimate as it arrives (a progress bar); if it raises, the worker is stopped and
    the exception propagates.

    Returns:
        aiconfigurator's version and one `AicEstimate` per call, in order (failed calls carry `error`).

    Raises:
        AicError: the worker could not start, could not import aiconfigurator, or stopped early.
    """
    request = json.dumps({"calls": list(calls)})
    estimates: dict[int, AicEstimate] = {}
    version: str | None = None
    fatal: str | None = None
    with tempfile.TemporaryDirectory(prefix="planner-aic-") as scratch:
        stderr_path = Path(scratch) / "stderr.log"
        with stderr_path.open("w", encoding="utf-8") as stderr_file:
            try:
                process = subprocess.Popen(
                    [aic_python, "-m", "planner_core.lab.aic_worker"],
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    stderr=stderr_file,
                    env=_worker_env(),
                    text=True,
                )
            except OSError as exc:
                raise AicError(f"cannot start {aic_python}: {exc.strerror or exc}") from exc
            assert process.stdin is not None and process.stdout is not None
            try:
                process.stdin.write(request)
                process.stdin.close()
            except BrokenPipeError:
                pass  # the worker died at start; its exit status and stderr say why
            try:
                for line in process.stdout:
                    try:
                        event = json.loads(line)
                    except json.JSONDecodeError:
                        continue  # not a protocol line (should not happen: the worker sends prints to stderr)
                    kind = event.get("event")
                    if kind == "ready":
                        version = str(event.get("aiconfigurator_version"))
                    elif kind == "fatal":
                        fatal = str(event.get("error"))
                    elif kind in ("result", "error"):
                        estimate = AicEstimate(
                            index=int(event["index"]),
                            ttft_ms=event.get("ttft_ms"),
                            tpot_ms=event.get("tpot_ms"),
                            fits_memory=event.get("fits_memory"),
                            backend_version=event.get("backend_version"),
                            precision=tuple(sorted((event.get("precision") or {}).items())),
                            error=event.get("error"),
                        )
                        estimates[estimate.index] = estimate
                        if on_estimate is not None:
                            on_estimate(estimate)
            except BaseException:
                process.kill()  # a callback stopped the run (or Ctrl-C): do not leave the worker running
                process.wait()
                raise
            status = process.wait()
        if fatal is not None:
            hint = f"; {INSTALL_HINT}" if "cannot import aiconfigurator" in fatal else ""
            raise AicError(f"aiconfigurator worker ({aic_python}): {fatal}{hint}")
        if status != 0 or version is None or len(estimates) != len(calls):
            raise AicError(
                f"aiconfigurator worker ({aic_python}) stopped after {len(estimates)} of {len(calls)} estimates "
                f"(exit status {status}): {_tail(stderr_path) or 'no output'}"
            )
    return version, [estimates[index] for index in range(len(calls))]


def build_perf_table(
    spec: PerfTableSpec,
    *,
    aic_python: str,
    command: str | None = None,
    on_estimate: Callable[[AicEstimate], None] | None = None,
) -> PerfTable:
    """Estimate every grid point of `spec` with aiconfigurator and return the validated table.

    Raises:
        AicError: aiconfigurator is unavailable, failed at a grid point (named), or reported inconsistent
            database versions or precisions across points.
        PerfTableError: the assembled table is invalid (e.g. a grid with a prefill batch not starting at 1).
    """
    if not spec.prefill_batch_grid or spec.prefill_batch_grid[0] != 1:
        raise ValueError(f"--prefill-batch-grid {spec.prefill_batch_grid}: must start at 1 (the prefill curve)")
    labelled = spec.calls()

    def check(estimate: AicEstimate) -> None:
        if estimate.error is not None:  # stop at the first failure: the table would be incomplete anyway
            label = labelled[estimate.index][0]
            raise AicError(f"aiconfigurator failed at {label} for {spec.aic_model or spec.model}: {estimate.error}")
        if on_estimate is not None:
            on_estimate(estimate)

    version, estimates = run_estimates([call for _, call in labelled], aic_python=aic_python, on_estimate=check)
    for name in ("backend_version", "precision"):
        seen = {getattr(estimate, name) for estimate in estimates}
        if len(seen) != 1:
            raise AicError(f"aiconfigurator reported several {name} values across the grid: {sorted(map(str, seen))}")

    num_isl = len(spec.isl_grid)
    num_prefill = num_isl * len(spec.prefill_batch_grid)
    num_ctx = len(spec.ctx_grid)
    prefill, decode = estimates[:num_prefill], estimates[num_prefill:]

    def rows(values: list[Any], width: int) -> list[list[Any]]:
        return [values[start : start + width] for start in range(0, len(values), width)]

    header = PerfTableHeader(
        model=spec.model,
        system=spec.system,
        backend=spec.backend,
        backend_version=str(estimates[0].backend_version),
        tp=spec.tp,
        precision=estimates[0].precision,
        aiconfigurator_version=version,
        aic_model=spec.aic_model if spec.aic_model not in (None, spec.model) else None,
        database_mode="SILICON",
        generated_at=datetime.now(UTC).isoformat(timespec="seconds"),
        command=command,
    )
    body = {
        "format": PERF_TABLE_FORMAT,
        "header": header.to_json_dict(),
        "grid": {
            "isl": list(spec.isl_grid),
            "prefill_batch": list(spec.prefill_batch_grid),
            "decode_batch": list(spec.decode_batch_grid),
            "decode_ctx": list(spec.ctx_grid),
        },
        "prefill_ms": rows([round(float(e.ttft_ms or 0.0), _MS_DECIMALS) for e in prefill], num_isl),
        "decode_ms": rows([round(float(e.tpot_ms or 0.0), _MS_DECIMALS) for e in decode], num_ctx),
        "decode_fits_memory": rows([e.fits_memory is not False for e in decode], num_ctx),
    }
    return parse_perf_table(body, f"<aiconfigurator {spec.aic_model or spec.model} on {spec.system}>")


def perf_table_text(table: PerfTable) -> str:
    """The file text: the header and grid indented, each matrix row on one line (small, diff-friendly)."""
    body = table.to_json_dict()
    parts = [f'  "format": {json.dumps(body["format"])}']
    parts.append('  "header": ' + textwrap.indent(json.dumps(body["header"], indent=2), "  ").lstrip())
    grid = ",\n".join(f"    {json.dumps(name)}: {json.dumps(values)}" for name, values in body["grid"].items())
    parts.append('  "grid": {\n' + grid + "\n  }")
    for name in ("prefill_ms", "decode_ms", "decode_fits_memory"):
        rows = ",\n".join(f"    {json.dumps(row)}" for row in body[name])
        parts.append(f'  "{name}": [\n{rows}\n  ]')
    return "{\n" + ",\n".join(parts) + "\n}\n"


def write_perf_table(table: PerfTable, path: str | os.PathLike[str]) -> None:
    """Write the table atomically: a temporary file in the target folder, then a rename (never half-written)."""
    target = Path(path)
    text = perf_table_text(table)
    temporary: Path | None = None
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(
            "w", encoding="utf-8", dir=target.parent, prefix=f".{target.name}.", suffix=".tmp", delete=False
        ) as handle:
            temporary = Path(handle.name)
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        temporary.chmod(0o644)  # a temporary file is private (0600); a table is for everyone to read
        os.replace(temporary, target)
    except OSError as exc:
        if temporary is not None:
            temporary.unlink(missing_ok=True)
        raise ValueError(f"--out {target}: cannot write ({exc.strerror or exc})") from exc
