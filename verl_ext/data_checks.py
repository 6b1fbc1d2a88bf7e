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


HINT_BUDGET_ROWS = 256  # training rows per local parquet file the hint-budget check tokenizes


def hinted_prompt_builder(messages: list, gec: GecConfig, tokenizer, template_kwargs: dict | None = None):
    """A row's hinted prompt ids for a hint text, as ``gec_agent`` builds them for ``hint_placement``: the templated
    prompt then the hint's ids (``assistant_prefix``), or the template's hint appended to the last user message
    (``user``)."""
    from verl_ext.rollout import hints

    def templated(msgs):
        ids = tokenizer.apply_chat_template(msgs, add_generation_prompt=True, tokenize=True, **(template_kwargs or {}))
        return list(ids["input_ids"] if hasattr(ids, "keys") else ids)  # a BatchEncoding in newer transformers

    if gec.hint_placement == "assistant_prefix":
        base = templated(messages)
        return lambda text: hints.assistant_prefix_prompt_ids(base, tokenizer.encode(text, add_special_tokens=False))
    return lambda text: templated(hints.user_hint_messages(messages, gec.hint_template, text))


def hint_prompt_lengths(rows, gec: GecConfig, tokenizer, template_kwargs: dict | None = None) -> list[int]:
    """Per row with a hintable reference solution: the token length of its shortest hinted prompt (the lowest
    level, as ``gec_agent`` builds it for ``hint_placement``).

    Args:
        rows: dicts with the row's ``prompt`` (chat messages) and ``extra_info``.
        gec: the GEC config (``mode=hint``).
        tokenizer: the run's tokenizer (``apply_chat_template``, ``encode``).
        template_kwargs: ``data.apply_chat_template_kwargs`` (verl passes them to the chat template).

    Returns:
        The lengths, in row order; rows without messages, a solution or a step end are left out.
    """
    from verl_ext.rollout import hints

    lengths = []
    for row in rows:
        info = row.get("extra_info")
        solution = info.get(gec.solution_key) if isinstance(info, dict) else None
        messages = list(row.get("prompt") or [])
        if not messages or solution is None:
            continue
        plan = hints.plan_row_hints(str(solution), fractions=gec.hint_levels[:1], rule=gec.hint_rule,
                                    hinted_prompt_ids=hinted_prompt_builder(messages, gec, tokenizer, template_kwargs),
                                    max_prompt_length=1 << 30)
        if plan.levels:
            lengths.append(len(plan.levels[0].prompt_ids))
    return lengths


def check_hint_prompt_budget(config: Any, gec: GecConfig, load_tokenizer=None) -> None:
    """``mode=hint``: a hint is prompt, so it must fit ``data.max_prompt_length`` (``gec_agent`` skips and counts a
    level that does not, never cuts it). Refused when no hint of the first :data:`HINT_BUDGET_ROWS` training rows of a
    local parquet file fits, naming the length that would; a warning when some do not. Skipped (with a warning) when
    the tokenizer cannot be loaded here."""
    import logging

    if not (gec.enable and gec.mode == "hint"):
        return
    data = config_value(config, "data", {})
    limit = int(config_value(data, "max_prompt_length", 1024))
    prompt_key = str(config_value(data, "prompt_key", "prompt"))
    files = list(_local_parquet_files(config_value(data, "train_files", None)))
    if not files:
        return
    log = logging.getLogger(__name__)
    try:
        tokenizer = (load_tokenizer or _run_tokenizer)(config)
    except Exception as e:  # a hub name without network, a custom tokenizer: the rollout counts what does not fit
        log.warning("algorithm.gec.mode=hint: the hint prompt-length check could not load the tokenizer (%s); "
                    "hints that do not fit data.max_prompt_length are skipped and counted at rollout "
                    "(hint/skipped/prompt_too_long)", e)
        return
    template_kwargs = config_value(data, "apply_chat_template_kwargs", None)
    template_kwargs = dict(template_kwargs) if template_kwargs else None
    for path, parquet in files:
        rows = []
        for row in _rows(parquet, (prompt_key, f"extra_info.{gec.solution_key}")):
            rows.append({"prompt": row[prompt_key.split(".")[0]], "extra_info": row.get("extra_info")})
            if len(rows) >= HINT_BUDGET_ROWS:
                break
        lengths = hint_prompt_lengths(rows, gec, tokenizer, template_kwargs)
        if not lengths:
            continue
        over = sum(length > limit for length in lengths)
        if over == len(lengths):
            raise ConfigError(
                f"data.max_prompt_length={limit} leaves no room for a hint with algorithm.gec.mode=hint: in "
                f"data.train_files {path}, none of the {len(lengths)} rows read has a lowest-level hinted prompt "
                f"that fits (shortest {min(lengths)} tokens, longest {max(lengths)}; "
                f"hint_placement={gec.hint_placement}); set data.max_prompt_length >= {max(lengths)}")
        if over:
            log.warning("algorithm.gec.mode=hint: %d of %d rows read of %s have no hint that fits "
                        "data.max_prompt_length=%d (they train unhinted, counted as hint/skipped/prompt_too_long); "
                        "%d tokens would fit them all", over, len(lengths), path, limit, max(lengths))


def _run_tokenizer(config: Any):
    """The run's tokenizer (``actor_rollout_ref.model``'s ``tokenizer_path`` or ``path``), by verl's own loader."""
    from verl.utils import hf_tokenizer

    model = config_value(config, "actor_rollout_ref.model", {})
    path = config_value(model, "tokenizer_path", None) or config_value(model, "path", None)
    return hf_tokenizer(str(path), trust_remote_code=bool(config_value(model, "trust_remote_code", False)))
