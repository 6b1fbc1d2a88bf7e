"""DeepScaleR-hard-1k-style records into EDGE-GRPO's training parquet.

    python -m verl_ext.data.deepscaler --input deepscaler_hard-1k.json --output data/deepscaler_hard_1k

``--input`` is a local ``.json`` / ``.jsonl`` / ``.parquet`` file (the original's
``train_data/deepscaler_hard-1k.json``: 1000 objects with problem / answer / solution / correctness_rate), a
``save_to_disk`` folder, or a Hugging Face datasets name (``--split``, default ``train``). Writes
``<output>/train.parquet`` (``--filename``) in verl's layout:

* ``prompt``: system "Please reason step by step, and put your final answer within \\boxed{}." + the problem as the
  user turn (Qwen2.5-Math's format; ``--no-system-prompt`` leaves the system turn to the model's chat template);
* ``reward_model.ground_truth``: the answer (a string); ``data_source``: ``--data-source``
  (default ``deepscaler_hard_1k``); ``ability``: ``math``;
* ``extra_info``: split, index, problem, answer, ``solution`` (read by GEC's solution branch,
  ``algorithm.gec.solution_key``) and ``correctness_rate`` when the input has it.

A record without a problem or an answer is an error naming its index; records without a solution are kept and
counted (GEC falls back to answer injection for them).
"""

from __future__ import annotations

import argparse
import os
import sys

from verl_ext.data.common import SYSTEM_PROMPT, DataError, answer_text, load_records, pick, verl_row, write_parquet

DATA_SOURCE = "deepscaler_hard_1k"
PROBLEM_KEYS = ("problem", "question", "prompt")
ANSWER_KEYS = ("answer", "final_answer", "ground_truth")
SOLUTION_KEYS = ("solution", "reference_solution")


def build_rows(records: list[dict], *, data_source: str = DATA_SOURCE, split: str = "train",
               system_prompt: str | None = SYSTEM_PROMPT, problem_key: str | None = None,
               answer_key: str | None = None, solution_key: str | None = None) -> list[dict]:
    rows = []
    for index, record in enumerate(records):
        _, problem = pick(record, [problem_key] if problem_key else PROBLEM_KEYS)
        _, answer = pick(record, [answer_key] if answer_key else ANSWER_KEYS)
        _, solution = pick(record, [solution_key] if solution_key else SOLUTION_KEYS)
        if problem is None or answer is None or not answer_text(answer):
            missing = "problem" if problem is None else "answer"
            keys = [problem_key or "/".join(PROBLEM_KEYS), answer_key or "/".join(ANSWER_KEYS)]
            raise DataError(f"record {index} has no {missing} (looked for {keys[missing == 'answer']}); "
                            f"its keys: {sorted(record)}")
        extra = {"solution": None if solution is None else str(solution)}
        if "correctness_rate" in record:
            rate = record["correctness_rate"]
            extra["correctness_rate"] = None if rate is None else float(rate)
        rows.append(verl_row(data_source, str(problem), answer_text(answer), split, index, extra, system_prompt))
    if not rows:
        raise DataError("no records")
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m verl_ext.data.deepscaler", description=__doc__.split("\n\n")[0])
    p.add_argument("--input", required=True, help="local .json/.jsonl/.parquet, save_to_disk folder, or HF name")
    p.add_argument("--output", required=True, help="output folder")
    p.add_argument("--filename", default="train.parquet")
    p.add_argument("--split", default=None, help="split of a HF dataset / DatasetDict folder (default: train)")
    p.add_argument("--subset", default=None, help="HF dataset configuration name")
    p.add_argument("--data-source", default=DATA_SOURCE)
    p.add_argument("--no-system-prompt", action="store_true", help="user turn only")
    p.add_argument("--problem-key"), p.add_argument("--answer-key"), p.add_argument("--solution-key")
    args = p.parse_args(argv)
    try:
        records = load_records(args.input, split=args.split, subset=args.subset)
        rows = build_rows(records, data_source=args.data_source,
                          system_prompt=None if args.no_system_prompt else SYSTEM_PROMPT,
                          problem_key=args.problem_key, answer_key=args.answer_key, solution_key=args.solution_key)
    except DataError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    path = write_parquet(rows, os.path.join(args.output, args.filename))
    without = sum(r["extra_info"]["solution"] is None for r in rows)
    print(f"wrote {len(rows)} rows (data_source={args.data_source}; {without} without a reference solution) to {path}")
    print(f"use: data.train_files={os.path.abspath(path)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
