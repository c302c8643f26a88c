"""A node's GPU health counters for the preflight gate (node.py): nvidia-smi's uncorrected ECC
errors, pages waiting for retirement, row remaps pending or failed; rocm-smi's pending retired
pages. Stdlib only: node.py runs it in a thread while torch imports.
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Callable

from hpctrain.checks.preflight import Row, check


def _smi(fields: str) -> list[list[str]] | None:
    smi = shutil.which("nvidia-smi")
    if not smi:
        return None
    try:
        out = subprocess.run(
            [smi, f"--query-gpu={fields}", "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            timeout=20,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    if out.returncode != 0:
        return None
    return [
        [c.strip() for c in row.split(",")]
        for row in out.stdout.strip().splitlines()
        if row.strip()
    ]


def check_gpu_health() -> Row:
    """nvidia-smi's error counters: uncorrected volatile ECC errors, pages waiting for retirement,
    row remaps pending or failed (A100 and later). A field the GPU does not report is skipped."""
    problems, seen = [], []
    queries: dict[str, Callable[[str], bool]] = {
        "ecc.errors.uncorrected.volatile.total": lambda v: v.isdigit() and int(v) > 0,
        "retired_pages.pending": lambda v: v.lower() == "yes",
        "remapped_rows.pending": lambda v: v.lower() == "yes",
        "remapped_rows.failure": lambda v: v.lower() == "yes",
    }
    for field, bad in queries.items():
        rows = _smi(f"index,{field}")
        if rows is None:
            continue
        seen.append(field)
        for idx, value in rows:
            if bad(value):
                problems.append(f"GPU {idx} {field}={value}")
    if shutil.which("rocm-smi") and not shutil.which("nvidia-smi"):
        try:
            out = subprocess.run(
                ["rocm-smi", "--showretiredpages"], capture_output=True, text=True, timeout=20
            )
            pending = [ln for ln in out.stdout.splitlines() if "pending" in ln.lower()]
            seen.append("rocm-smi retired pages")
            problems += [f"rocm-smi: {ln.strip()}" for ln in pending]
        except (OSError, subprocess.TimeoutExpired) as e:
            return check("gpu health", None, f"rocm-smi failed: {e}")
    if problems:
        return check("gpu health", False, "; ".join(problems))
    return check(
        "gpu health", True, "no error counters set (" + (", ".join(seen) or "none reported") + ")"
    )
