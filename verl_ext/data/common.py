"""Shared by the data-preparation modules: reading records from files or the Hugging Face hub, and verl rows."""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from typing import Any

# Qwen2.5-Math's own default system prompt, used by EDGE-GRPO for training and evaluation (docs/edge-grpo.md)
SYSTEM_PROMPT = "Please reason step by step, and put your final answer within \\boxed{}."
ABILITY = "math"
LOCAL_SUFFIXES = (".json", ".jsonl", ".parquet")


class DataError(ValueError):
    """Input that cannot become a verl row; the message names the source, the row and the field."""


def _plain(value: Any) -> Any:
    """numpy scalars/arrays (from parquet or datasets) as plain Python values; a missing value (NaN, NA) as None."""
    if hasattr(value, "tolist"):
        value = value.tolist()
    if (isinstance(value, float) and value != value) or type(value).__name__ == "NAType":
        return None  # pandas fills absent fields of a record with NaN
    return value


def read_local(path: str) -> list[dict]:
    """Records of a local ``.json`` (a list of objects, or JSON lines), ``.jsonl`` or ``.parquet`` file."""
    lower = path.lower()
    if lower.endswith(".parquet"):
        import pandas as pd

        records = pd.read_parquet(path).to_dict("records")
    elif lower.endswith(".jsonl"):
        with open(path, encoding="utf-8") as f:
            records = [json.loads(line) for line in f if line.strip()]
    elif lower.endswith(".json"):
        with open(path, encoding="utf-8") as f:
            text = f.read()
        try:
            records = json.loads(text)
        except json.JSONDecodeError:  # JSON lines saved as .json
            records = [json.loads(line) for line in text.splitlines() if line.strip()]
        if isinstance(records, dict):  # {"data": [...]} or {"train": [...]}
            lists = [v for v in records.values() if isinstance(v, list)]
            if len(lists) != 1:
                raise DataError(f"{path}: a JSON object must hold exactly one list of records, found {len(lists)}")
            records = lists[0]
    else:
        raise DataError(f"{path}: unsupported file type (expected one of {', '.join(LOCAL_SUFFIXES)})")
    if not isinstance(records, list) or not all(isinstance(r, dict) for r in records):
        raise DataError(f"{path}: expected a list of objects (records)")
    return [{k: _plain(v) for k, v in r.items()} for r in records]


def is_saved_dataset(path: str) -> bool:
    """A folder written by ``datasets``' ``save_to_disk`` (a Dataset or a DatasetDict)."""
    return os.path.isdir(path) and any(
        os.path.exists(os.path.join(path, name)) for name in ("dataset_dict.json", "state.json"))


def load_records(source: str, split: str | None = None, subset: str | None = None) -> list[dict]:
    """Records from a local file, a ``save_to_disk`` folder, or a Hugging Face datasets name (``split``)."""
    if os.path.isfile(source):
        return read_local(source)
    import datasets

    if is_saved_dataset(source):
        ds = datasets.load_from_disk(source)
        if isinstance(ds, datasets.DatasetDict):
            if split is None:
                if len(ds) != 1:
                    raise DataError(f"{source}: holds splits {list(ds)}; choose one with a split")
                split = next(iter(ds))
            ds = ds[split]
        return [{k: _plain(v) for k, v in r.items()} for r in ds]
    if os.path.exists(source):
        raise DataError(f"{source}: neither a {'/'.join(LOCAL_SUFFIXES)} file nor a save_to_disk folder")
    try:
        ds = datasets.load_dataset(source, subset, split=split or "train")
    except Exception as e:
        raise DataError(f"{source!r} is not a local file, and loading it from the Hugging Face hub failed: "
                        f"{type(e).__name__}: {e}") from e
    return [{k: _plain(v) for k, v in r.items()} for r in ds]


def pick(record: dict, keys: Iterable[str]) -> tuple[str | None, Any]:
    """The first of ``keys`` present with a non-empty value: ``(key, value)`` or ``(None, None)``."""
    for key in keys:
        value = record.get(key)
        if value is None or (isinstance(value, str) and not value.strip()) or value == []:
            continue
        return key, value
    return None, None


def answer_text(value: Any) -> str:
    """A ground truth as one string: a one-element list gives its element, several are joined with ", ";
    enclosing ``$...$`` is dropped (OlympiadBench writes its answers that way)."""
    if isinstance(value, (list, tuple)):
        return ", ".join(part for part in (answer_text(v) for v in value if v is not None) if part)
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    text = str(value).strip()
    if len(text) >= 2 and text[0] == "$" and text[-1] == "$":
        text = text.strip("$").strip()
    return text


def chat_prompt(problem: str, system_prompt: str | None = SYSTEM_PROMPT) -> list[dict]:
    """The Qwen2.5-Math chat: system prompt (None: left out) then the problem as the user turn."""
    messages = [{"role": "system", "content": system_prompt}] if system_prompt else []
    return messages + [{"role": "user", "content": problem}]


def verl_row(data_source: str, problem: str, answer: str, split: str, index: int, extra: dict | None = None,
             system_prompt: str | None = SYSTEM_PROMPT) -> dict:
    """One row in verl's RL parquet layout (as verl's examples/data_preprocess scripts write them)."""
    return {
        "data_source": data_source,
        "prompt": chat_prompt(problem, system_prompt),
        "ability": ABILITY,
        "reward_model": {"style": "rule", "ground_truth": answer},
        "extra_info": {"split": split, "index": index, "problem": problem, "answer": answer, **(extra or {})},
    }


def write_parquet(rows: list[dict], path: str) -> str:
    import pandas as pd

    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    pd.DataFrame(rows).to_parquet(path, index=False)
    return path
