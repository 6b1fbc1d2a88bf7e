"""Start-up checks of a run's local data files: what verl_ext can tell from the parquet files before Ray starts.

Only local ``.parquet`` files are read (remote paths and other formats are left to the rollout, where the same
problems are counted and fail loudly: ``rollout/gec_agent_loop.py``); only the columns a check needs are read.
``verl_ext.run_checks.validate_run_config`` calls these.
"""

from __future__ import annotations

from typing import Any

from verl_ext.config import ConfigError, GecConfig, config_value
from verl_ext.names import GEC_AGENT_NAME, ROW_SAMPLING_KEYS


def _as_list(value: Any) -> list:
    if value is None:
        return []
    if isinstance(value, str):
        return [value]
    return list(value)


def _local_parquet_columns(files: Any, columns: tuple[str, ...]):
    """(path, {column: values}) for each local parquet file, with those of ``columns`` it has (pyarrow reads only
    them). Files that do not exist here (remote paths, data not written yet) and non-parquet files are skipped:
    verl's own loader reports those, and what they hold shows at rollout (gec/errors)."""
    import os

    for path in _as_list(files):
        local = os.path.expanduser(str(path))
        if not local.endswith(".parquet") or not os.path.isfile(local):
            continue
        import pyarrow.parquet as pq

        names = pq.read_schema(local).names
        present = [c for c in columns if c in names]
        table = pq.read_table(local, columns=present)
        yield str(path), {c: table.column(c).to_pylist() for c in present}, table.num_rows


def data_agent_names(files: Any) -> dict[str, dict[Any, int]]:
    """Per local parquet file with an ``agent_name`` column: {agent name: row count}."""
    found: dict[str, dict[Any, int]] = {}
    for path, cols, _ in _local_parquet_columns(files, ("agent_name",)):
        if "agent_name" not in cols:
            continue
        counts: dict[Any, int] = {}
        for name in cols["agent_name"]:
            counts[name] = counts.get(name, 0) + 1
        found[path] = counts
    return found


def unknown_sampling_keys(extra_info: Any) -> list[str]:
    """The keys of a row's ``extra_info["sampling_params"]`` that ``gec_agent`` does not know (set ones: a parquet
    struct gives every row every key of the file, unset ones as None)."""
    row = extra_info.get("sampling_params") if isinstance(extra_info, dict) else None
    if not isinstance(row, dict):
        return []
    return sorted(k for k, v in row.items() if v is not None and k not in ROW_SAMPLING_KEYS)


def has_ground_truth(reward_model: Any) -> bool:
    """Whether a row's ``reward_model`` gives GEC an answer to inject (``rollout.gec.ground_truth_text``)."""
    gt = reward_model.get("ground_truth") if isinstance(reward_model, dict) else reward_model
    return gt is not None


def _bad_rows(files: Any, columns: tuple[str, ...], bad) -> dict[str, tuple[int, int, int, Any]]:
    """Per local parquet file that has ``columns[0]``: (rows for which ``bad(row) -> detail or None`` gives a
    detail, total rows, first such row, its detail)."""
    found = {}
    for path, cols, num_rows in _local_parquet_columns(files, columns):
        if columns[0] not in cols:  # e.g. a dataset class that adds the column itself
            continue
        first, count, detail = None, 0, None
        for i in range(num_rows):
            d = bad({c: cols[c][i] if c in cols else None for c in columns})
            if d is not None:
                count += 1
                if first is None:
                    first, detail = i, d
        if count:
            found[path] = (count, num_rows, first, detail)
    return found


def check_gec_data(config: Any, gec: GecConfig) -> None:
    """What the rows of local parquet files hold that ``gec_agent`` would fail on only at rollout: unknown
    ``extra_info.sampling_params`` keys (train and val files, GEC on or off) and, with GEC on, training rows without
    a ground truth that can draw the answer injection."""
    data = config_value(config, "data", {})
    for key in ("train_files", "val_files"):
        for path, (count, total, first, keys) in _bad_rows(
                config_value(data, key, None), ("extra_info",),
                lambda row: unknown_sampling_keys(row["extra_info"]) or None).items():
            raise ConfigError(
                f"data.{key} {path}: {count} of {total} rows set unknown extra_info.sampling_params key(s) (row "
                f"{first}: {keys}); the {GEC_AGENT_NAME} loop knows {list(ROW_SAMPLING_KEYS)} (a typo would sample "
                "at the trainer's settings); fix the rows")
    drawable = gec.answer_drawable() if gec.enable else None
    if drawable is None:
        return

    def no_ground_truth(row):
        if has_ground_truth(row["reward_model"]):
            return None
        info = row["extra_info"]
        solution = info.get(gec.solution_key) if isinstance(info, dict) else None
        if drawable == "no_solution" and solution is not None and str(solution).strip():
            return None  # the solution branch uses the row's solution, never the answer
        return "no reward_model.ground_truth"

    for path, (count, total, first, _) in _bad_rows(config_value(data, "train_files", None),
                                                     ("reward_model", "extra_info"), no_ground_truth).items():
        why = (f"algorithm.gec.p_answer={gec.p_answer}" if drawable == "all" else
               f"algorithm.gec.p_solution={gec.p_solution} falls back to the answer without extra_info."
               f"{gec.solution_key}")
        raise ConfigError(
            f"data.train_files {path}: {count} of {total} rows (first: row {first}) have no reward_model.ground_truth, "
            f"and GEC's answer injection can be drawn for them ({why}); give every row a ground truth, set "
            "algorithm.gec.p_answer=0 (and p_solution=0 or a solution per row), or algorithm.gec.enable=false")
