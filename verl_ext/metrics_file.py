"""Reading verl's ``file`` logger output: one ``{"step": N, "data": {metric: value}}`` JSON record per line.

The one reader for the run report, the evaluation and the tests. verl's logger writes with orjson, which turns NaN
and inf into ``null``; those come back as NaN, non-scalar values (strings, lists) are dropped.
"""

from __future__ import annotations

import json
import math
from pathlib import Path


def _as_float(value) -> float | None:
    if value is None:  # orjson writes NaN/inf as null
        return math.nan
    if isinstance(value, (bool, int, float)):
        return float(value)
    return None  # strings, lists: not a scalar metric


def parse_record(line: str) -> tuple[int, dict] | None:
    """(step, data) of one line, or None when the line is not a file-logger record."""
    try:
        record = json.loads(line)
    except ValueError:
        return None
    if not isinstance(record, dict) or not isinstance(record.get("data"), dict):
        return None
    step = record.get("step")
    if isinstance(step, bool) or not isinstance(step, (int, float)):
        return None
    return int(step), record["data"]


def read_steps(path: str | Path) -> tuple[dict[int, dict[str, float]], int]:
    """({step: {metric: value}}, number of lines that were not records) of one file; a step logged twice (verl
    logs validation and training of one step separately) merges, the later value winning."""
    steps: dict[int, dict[str, float]] = {}
    bad = 0
    with open(path) as f:
        for line in f:
            if not line.strip():
                continue
            parsed = parse_record(line)
            if parsed is None:
                bad += 1
                continue
            step, data = parsed
            values = {k: v for k, v in ((k, _as_float(v)) for k, v in data.items()) if v is not None}
            steps.setdefault(step, {}).update(values)
    return steps, bad
