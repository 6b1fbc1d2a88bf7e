"""Start-up checks of a run's local data files: what verl_ext can tell from the parquet files before Ray starts.

Only local ``.parquet`` files are read (remote paths and other formats are left to the rollout, where the same
problems are counted and fail loudly: ``rollout/gec_agent_loop.py``); only the fields a check needs are read, a
row group at a time, and only where the file's schema leaves the answer open.
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


BATCH_ROWS = 1024  # rows read and converted to Python at a time, within a row group


def _local_parquet_files(files: Any):
    """(path as given, ``pyarrow.parquet.ParquetFile``) for each local parquet file. Files that do not exist here
    (remote paths, data not written yet) and non-parquet files are skipped: verl's own loader reports those, and what
    they hold shows at rollout (gec/errors)."""
    import os

    for path in _as_list(files):
        local = os.path.expanduser(str(path))
        if local.endswith(".parquet") and os.path.isfile(local):
            import pyarrow.parquet as pq

            yield str(path), pq.ParquetFile(local)


def _column_path(parquet, field: str) -> str | None:
    """What to read for a dotted ``field`` (``reward_model.ground_truth``): the field itself where the file has it
    as a struct field, else its top-level column (whole), None without that column."""
    leaves = [parquet.schema.column(i).path for i in range(parquet.metadata.num_columns)]
    if any(leaf == field or leaf.startswith(field + ".") for leaf in leaves):
        return field
    top = field.split(".")[0]
    return top if any(leaf == top or leaf.startswith(top + ".") for leaf in leaves) else None


def _rows(parquet, fields: tuple[str, ...]):
    """The file's rows as dicts of the top-level columns of ``fields`` (only those fields read), batch by batch;
    nothing when the file lacks ``fields[0]``'s column (e.g. a dataset class that adds it itself)."""
    columns = [_column_path(parquet, f) for f in fields]
    if columns[0] is None:
        return
    tops = [f.split(".")[0] for f in fields]
    wanted = list(dict.fromkeys(c for c in columns if c))
    for batch in parquet.iter_batches(batch_size=BATCH_ROWS, columns=wanted, use_threads=False):
        values = {name: batch.column(name).to_pylist() for name in batch.schema.names}
        for i in range(batch.num_rows):
            yield {top: values[top][i] if top in values else None for top in tops}


def data_agent_names(files: Any) -> dict[str, dict[Any, int]]:
    """Per local parquet file with an ``agent_name`` column: {agent name: row count}."""
    found: dict[str, dict[Any, int]] = {}
    for path, parquet in _local_parquet_files(files):
        counts: dict[Any, int] = {}
        for row in _rows(parquet, ("agent_name",)):
            counts[row["agent_name"]] = counts.get(row["agent_name"], 0) + 1
        if counts:
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
    """Whether a row's ``reward_model`` gives GEC an answer to inject (``rollout.gec.ground_truth_text``, which takes
    a list's first element): None, an empty list and an empty or blank string are missing."""
    gt = reward_model.get("ground_truth") if isinstance(reward_model, dict) else reward_model
    if isinstance(gt, (list, tuple)):
        gt = gt[0] if gt else None
    return gt is not None and str(gt).strip() != ""


def _struct_names(parquet, field: str) -> list[str] | None:
    """The keys of the struct at dotted ``field`` in the file's schema; None where there is no struct there."""
    import pyarrow as pa

    node = parquet.schema_arrow
    for part in field.split("."):
        if not isinstance(node, pa.Schema) and not pa.types.is_struct(node):
            return None
        index = node.get_field_index(part)
        if index < 0:
            return None
        node = node.field(index).type
    return [node.field(i).name for i in range(node.num_fields)] if pa.types.is_struct(node) else None


def may_set_unknown_sampling_keys(parquet) -> bool:
    """Whether rows of the file can set a key ``gec_agent`` does not know: a parquet struct lists every key any row
    sets in the schema, so only a struct with such a key needs its rows read (anything else is no dict per row)."""
    names = _struct_names(parquet, "extra_info.sampling_params")
    return bool(names) and any(name not in ROW_SAMPLING_KEYS for name in names)


def _bad_rows(files: Any, fields: tuple[str, ...], bad, worth_reading=None) -> dict[str, tuple[int, int, int, Any]]:
    """Per local parquet file that has ``fields[0]`` (and passes ``worth_reading(parquet)``): (rows for which
    ``bad(row) -> detail or None`` gives a detail, total rows, first such row, its detail); only ``fields`` are read,
    a row group at a time."""
    found = {}
    for path, parquet in _local_parquet_files(files):
        if worth_reading is not None and not worth_reading(parquet):
            continue
        first, count, detail = None, 0, None
        for i, row in enumerate(_rows(parquet, fields)):
            d = bad(row)
            if d is not None:
                count += 1
                if first is None:
                    first, detail = i, d
        if count:
            found[path] = (count, parquet.metadata.num_rows, first, detail)
    return found


def check_gec_data(config: Any, gec: GecConfig) -> None:
    """What the rows of local parquet files hold that ``gec_agent`` would fail on only at rollout: unknown
    ``extra_info.sampling_params`` keys (train and val files, GEC on or off; read only where the schema shows one)
    and, with GEC on, training rows without a ground truth that can draw the answer injection."""
    data = config_value(config, "data", {})
    for key in ("train_files", "val_files"):
        for path, (count, total, first, keys) in _bad_rows(
                config_value(data, key, None), ("extra_info.sampling_params",),
                lambda row: unknown_sampling_keys(row["extra_info"]) or None, may_set_unknown_sampling_keys).items():
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
        info = row.get("extra_info")
        solution = info.get(gec.solution_key) if isinstance(info, dict) else None
        if drawable == "no_solution" and solution is not None and str(solution).strip():
            return None  # the solution branch uses the row's solution, never the answer
        return "no reward_model.ground_truth"

    fields = ("reward_model.ground_truth", *((f"extra_info.{gec.solution_key}",) if drawable == "no_solution" else ()))
    for path, (count, total, first, _) in _bad_rows(config_value(data, "train_files", None), fields,
                                                     no_ground_truth).items():
        why = (f"algorithm.gec.p_answer={gec.p_answer}" if drawable == "all" else
               f"algorithm.gec.p_solution={gec.p_solution} falls back to the answer without extra_info."
               f"{gec.solution_key}")
        raise ConfigError(
            f"data.train_files {path}: {count} of {total} rows (first: row {first}) have no reward_model.ground_truth "
            f"(missing, empty or blank), and GEC's answer injection can be drawn for them ({why}); give every row a "
            "ground truth, set algorithm.gec.p_answer=0 (and p_solution=0 or a solution per row), or algorithm.gec.enable=false")
