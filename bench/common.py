"""Shared by the benchmarks: where results go and how they are written (JSON + a markdown table)."""

from __future__ import annotations

import json
import platform
import statistics
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"
sys.path.insert(0, str(ROOT / "src"))


def machine() -> str:
    cores = len(__import__("os").sched_getaffinity(0))
    return f"{platform.machine()} {cores} cores, {platform.python_implementation()} {platform.python_version()}"


def measured_at() -> str:
    return f"{datetime.now(UTC):%Y-%m-%d %H:%M UTC} on {machine()}"


def write_result(name: str, payload: dict, table: list[dict], title: str) -> Path:
    """bench/results/NAME.json (everything) and NAME.md (the table a person reads)."""
    RESULTS.mkdir(parents=True, exist_ok=True)
    payload = {"measured_at": measured_at(), **payload}
    (RESULTS / f"{name}.json").write_text(json.dumps(payload, indent=2) + "\n")
    (RESULTS / f"{name}.md").write_text(f"### {title}\n\n{markdown_table(table)}\n\n_{payload['measured_at']}_\n")
    return RESULTS / f"{name}.json"


def markdown_table(rows: list[dict]) -> str:
    if not rows:
        return "(no rows)"
    cols = list(rows[0])
    fmt = lambda v: f"{v:.3g}" if isinstance(v, float) else str(v)
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    lines += ["| " + " | ".join(fmt(r.get(c, "")) for c in cols) + " |" for r in rows]
    return "\n".join(lines)


def median(values):
    values = list(values)
    return statistics.median(values) if values else float("nan")


def run_python(args: list[str], timeout: float = 900) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *args], cwd=ROOT, capture_output=True, text=True, timeout=timeout)
