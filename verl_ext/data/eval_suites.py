"""The paper's five evaluation suites into validation parquet, one file and one ``data_source`` per suite.

    python -m verl_ext.data.eval_suites --input evaluation_suite --output data/eval
    python -m verl_ext.data.eval_suites --suite aime=aime24.jsonl --suite math500=HuggingFaceH4/MATH-500@test \\
        --output data/eval

Suites (``data_source``, the paper's problem count): ``aime`` 30, ``amc`` 83, ``math500`` 500, ``minerva`` 272,
``olympiadbench`` 675 (1560 in all). Sources:

* ``--input DIR``: a ``save_to_disk`` DatasetDict whose splits are the suites (the original's
  ``evaluation_suite``, splits aime / amc / math / minerva / olympiad_bench), or a folder of files named after
  the suites (``aime.jsonl``, ``math500.parquet``, ...). Split/file names are matched with the aliases in
  ``SUITES`` (e.g. ``math``, ``math_500`` for math500).
* ``--suite NAME=SOURCE[@SPLIT]`` (repeatable): one suite from a local .json/.jsonl/.parquet file, a
  ``save_to_disk`` folder or a Hugging Face datasets name (split default ``test``).

Fields: the problem from ``problem`` / ``question`` (or ``--problem-key``); the answer from ``answer`` /
``final_answer`` / ``expected_answer`` (or ``--answer-key``; a list of several answers is joined with ", "),
else the last ``\\boxed{}`` of ``solution``. Prompts as in training (Qwen2.5-Math system prompt + problem).
A suite whose size differs from the paper's is written with a warning (``--strict-counts`` makes it an error).
Writes ``<output>/<suite>.parquet`` and prints the ``data.val_files`` override; ``python -m verl_ext.evaluate``
reads this folder.
"""

from __future__ import annotations

import argparse
import os
import sys
from dataclasses import dataclass

from verl_ext.data.common import (
    LOCAL_SUFFIXES,
    SYSTEM_PROMPT,
    DataError,
    answer_text,
    is_saved_dataset,
    load_records,
    pick,
    verl_row,
    write_parquet,
)


@dataclass(frozen=True)
class Suite:
    name: str  # data_source and file stem
    title: str  # column title in the results table
    paper_count: int  # problems in the paper's evaluation
    aliases: tuple[str, ...]  # split / file names accepted for it


SUITES = (
    Suite("aime", "AIME", 30, ("aime", "aime24", "aime_2024", "aime2024")),
    Suite("amc", "AMC", 83, ("amc", "amc23", "amc_2023", "amc2023")),
    Suite("math500", "MATH", 500, ("math500", "math_500", "math", "math-500")),
    Suite("minerva", "Min", 272, ("minerva", "minerva_math", "minervamath")),
    Suite("olympiadbench", "Oly", 675, ("olympiadbench", "olympiad_bench", "olympiad")),
)
SUITE_BY_NAME = {s.name: s for s in SUITES}
PROBLEM_KEYS = ("problem", "question", "Problem", "Question")
ANSWER_KEYS = ("answer", "final_answer", "expected_answer", "Answer", "gt_answer")
SOLUTION_KEYS = ("solution", "Solution")


def suite_of(name: str) -> Suite | None:
    """The suite a split or file stem names (case- and separator-insensitive), or None."""
    key = name.lower().replace("-", "_")
    for suite in SUITES:
        if key in {a.replace("-", "_") for a in suite.aliases}:
            return suite
    return None


def build_rows(suite: Suite, records: list[dict], *, system_prompt: str | None = SYSTEM_PROMPT,
               problem_key: str | None = None, answer_key: str | None = None) -> list[dict]:
    rows = []
    for index, record in enumerate(records):
        _, problem = pick(record, [problem_key] if problem_key else PROBLEM_KEYS)
        _, answer = pick(record, [answer_key] if answer_key else ANSWER_KEYS)
        answer = answer_text(answer) if answer is not None else ""
        if not answer and answer_key is None:
            _, solution = pick(record, SOLUTION_KEYS)
            if solution is not None:
                from verl_ext.rewards.math import extract_boxed_answer

                answer = (extract_boxed_answer(str(solution)) or "").strip()
        if problem is None or not answer:
            what = "problem" if problem is None else "answer (nor a \\boxed{} in a solution)"
            raise DataError(f"{suite.name}: record {index} has no {what}; its keys: {sorted(record)}")
        rows.append(verl_row(suite.name, str(problem), answer, "test", index, None, system_prompt))
    if not rows:
        raise DataError(f"{suite.name}: no records")
    return rows


def collect_sources(inputs: list[str], suite_args: list[str]) -> dict[str, tuple[str, str | None]]:
    """{suite name: (source, split)} from --input folders and --suite NAME=SOURCE[@SPLIT] arguments."""
    sources: dict[str, tuple[str, str | None]] = {}

    def add(suite: Suite, source: str, split: str | None, origin: str):
        if suite.name in sources:
            raise DataError(f"suite {suite.name} given twice ({sources[suite.name][0]} and {origin})")
        sources[suite.name] = (source, split)

    for folder in inputs:
        if is_saved_dataset(folder) and os.path.exists(os.path.join(folder, "dataset_dict.json")):
            import datasets

            for split in datasets.load_from_disk(folder):
                suite = suite_of(split)
                if suite is None:
                    print(f"note: {folder}: split {split!r} is not one of the suites, skipped", file=sys.stderr)
                    continue
                add(suite, folder, split, f"{folder}[{split}]")
        elif os.path.isdir(folder):
            for entry in sorted(os.listdir(folder)):
                stem, ext = os.path.splitext(entry)
                suite = suite_of(stem) if ext.lower() in LOCAL_SUFFIXES else None
                if suite is not None:
                    add(suite, os.path.join(folder, entry), None, entry)
        else:
            raise DataError(f"--input {folder}: not a folder (use --suite NAME=FILE for a single file)")
    for arg in suite_args:
        name, sep, source = arg.partition("=")
        suite = suite_of(name.strip())
        if not sep or suite is None or not source:
            raise DataError(f"--suite {arg!r}: expected NAME=SOURCE[@SPLIT] with NAME one of "
                            f"{[s.name for s in SUITES]}")
        split = None
        if "@" in source and not os.path.exists(source):
            source, _, split = source.rpartition("@")
        add(suite, source, split or ("test" if not os.path.exists(source) else None), arg)
    return sources


def prepare(sources: dict[str, tuple[str, str | None]], output: str, *, system_prompt: str | None = SYSTEM_PROMPT,
            problem_key: str | None = None, answer_key: str | None = None,
            strict_counts: bool = False) -> dict[str, tuple[str, int]]:
    """Write one parquet per suite (in SUITES order); {suite: (path, rows)}."""
    written = {}
    for suite in SUITES:
        if suite.name not in sources:
            continue
        source, split = sources[suite.name]
        rows = build_rows(suite, load_records(source, split=split), system_prompt=system_prompt,
                          problem_key=problem_key, answer_key=answer_key)
        if len(rows) != suite.paper_count:
            msg = f"{suite.name}: {len(rows)} problems, the paper evaluated {suite.paper_count}"
            if strict_counts:
                raise DataError(msg)
            print(f"warning: {msg}", file=sys.stderr)
        written[suite.name] = (write_parquet(rows, os.path.join(output, f"{suite.name}.parquet")), len(rows))
    return written


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m verl_ext.data.eval_suites", description=__doc__.split("\n\n")[0])
    p.add_argument("--input", action="append", default=[], help="DatasetDict folder or folder of suite files")
    p.add_argument("--suite", action="append", default=[], metavar="NAME=SOURCE[@SPLIT]")
    p.add_argument("--output", required=True, help="output folder (one <suite>.parquet each)")
    p.add_argument("--no-system-prompt", action="store_true", help="user turn only")
    p.add_argument("--problem-key"), p.add_argument("--answer-key")
    p.add_argument("--strict-counts", action="store_true", help="a suite size other than the paper's is an error")
    args = p.parse_args(argv)
    try:
        sources = collect_sources(args.input, args.suite)
        if not sources:
            raise DataError("no suite found: give --input and/or --suite")
        written = prepare(sources, args.output, system_prompt=None if args.no_system_prompt else SYSTEM_PROMPT,
                          problem_key=args.problem_key, answer_key=args.answer_key,
                          strict_counts=args.strict_counts)
    except DataError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    for name, (path, n) in written.items():
        print(f"{name:14s} {n:5d} rows  {path}")
    missing = [s.name for s in SUITES if s.name not in written]
    if missing:
        print(f"note: not prepared: {', '.join(missing)}")
    print("use: data.val_files=[" + ",".join(os.path.abspath(p) for p, _ in written.values()) + "]")
    return 0


if __name__ == "__main__":
    sys.exit(main())
