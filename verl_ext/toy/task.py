"""Synthetic addition task "a+b=?" and "a+b+c=?" (one-digit operands) as verl RL parquet rows.

* ``toy_add``  -- sum <= 9  (55 pairs + 220 triples), answer = one digit then EOS.
* ``toy_add2`` -- sum >= 10 (45 pairs + 780 triples), answer = two digits then EOS.  After the
  one-digit SFT warm-up these stay all-wrong under GRPO (advantage collapse).

Three operands widen the task (the two-operand version had only 55 + 45 prompts, so 11 and 25 held out): each data
source now has at least ``N_VAL_ONE_DIGIT`` = 100 held-out prompts, enough for a step-0 held-out figure that repeats
across runs.

Split (fixed seed): ``N_VAL_ONE_DIGIT`` one-digit prompts are held out for validation; of the two-digit prompts,
``N_TRAIN_TWO_DIGIT`` go to training (~31% of the train mix, as before) and ``N_VAL_TWO_DIGIT`` to validation.
No prompt appears in both splits.

Validation reports two figures per data source side by side (verl's ``val_kwargs.n`` is 1 in the toy config):
* sampled, ``val-core/toy_add/acc/mean@1``: each held-out prompt ``VAL_SAMPLES`` times, sampled at ``val_kwargs``
  (the toy's T=1, the policy as trained); 800 samples per source keep the step-0 figure within about +-0.03;
* greedy, ``val-core/toy_add@greedy/acc/mean@1``: each held-out prompt once with ``extra_info.sampling_params`` =
  ``{"temperature": 0}`` (n = 1, greedy: the way the papers evaluate).
verl's ``val_kwargs.n`` applies to every row, so repeating rows (rather than n = 8) keeps greedy rows from being
generated eight times over.
"""

from __future__ import annotations

import random

DATA_SOURCE_ONE = "toy_add"
DATA_SOURCE_TWO = "toy_add2"
GREEDY_SUFFIX = "@greedy"
GREEDY_SAMPLING = {"temperature": 0.0}
ABILITY = "arith"
SPLIT_SEED = 1234
N_VAL_ONE_DIGIT = 100
N_TRAIN_TWO_DIGIT = 80
N_VAL_TWO_DIGIT = 100
VAL_SAMPLES = 8

Operands = tuple[int, ...]


def prompt_text(*operands: int) -> str:
    return "+".join(str(x) for x in operands) + "=?"


def all_prompts() -> tuple[list[Operands], list[Operands]]:
    """(one-digit-sum operand tuples, two-digit-sum operand tuples): every pair and triple of digits."""
    tuples = [(a, b) for a in range(10) for b in range(10)]
    tuples += [(a, b, c) for a in range(10) for b in range(10) for c in range(10)]
    return [t for t in tuples if sum(t) <= 9], [t for t in tuples if sum(t) >= 10]


def all_pairs() -> tuple[list[Operands], list[Operands]]:
    """The two-operand prompts only (one-digit sums, two-digit sums)."""
    one, two = all_prompts()
    return [t for t in one if len(t) == 2], [t for t in two if len(t) == 2]


def split_prompts(seed: int = SPLIT_SEED) -> dict[str, list[Operands]]:
    """Return {"train_one", "val_one", "train_two", "val_two"} lists of operand tuples."""
    rng = random.Random(seed)
    one, two = all_prompts()
    rng.shuffle(one)
    rng.shuffle(two)
    return {
        "train_one": sorted(one[N_VAL_ONE_DIGIT:]),
        "val_one": sorted(one[:N_VAL_ONE_DIGIT]),
        "train_two": sorted(two[:N_TRAIN_TWO_DIGIT]),
        "val_two": sorted(two[N_TRAIN_TWO_DIGIT:N_TRAIN_TWO_DIGIT + N_VAL_TWO_DIGIT]),
    }


def make_row(operands: Operands, split: str, index: int, greedy: bool = False, sample: int = 0) -> dict:
    answer = str(sum(operands))
    source = DATA_SOURCE_ONE if sum(operands) <= 9 else DATA_SOURCE_TWO
    extra = {"split": split, "index": index, "solution": answer, "operands": list(operands), "sample": sample}
    if greedy:
        source += GREEDY_SUFFIX
        extra["sampling_params"] = dict(GREEDY_SAMPLING)
    return {
        "data_source": source,
        "prompt": [{"role": "user", "content": prompt_text(*operands)}],
        "ability": ABILITY,
        "reward_model": {"style": "rule", "ground_truth": answer},
        "extra_info": extra,
    }


def make_rows(seed: int = SPLIT_SEED) -> tuple[list[dict], list[dict]]:
    """(train_rows, val_rows). Train rows are shuffled so one- and two-digit prompts mix; every held-out prompt
    comes ``VAL_SAMPLES`` times sampled and once greedy."""
    sp = split_prompts(seed)
    train = sp["train_one"] + sp["train_two"]
    random.Random(seed + 1).shuffle(train)
    held_out = sp["val_one"] + sp["val_two"]
    val = [(t, False, k) for k in range(VAL_SAMPLES) for t in held_out] + [(t, True, 0) for t in held_out]
    val_rows = [make_row(t, "test", i, greedy=g, sample=k) for i, (t, g, k) in enumerate(val)]
    return [make_row(t, "train", i) for i, t in enumerate(train)], val_rows


def write_parquet(rows: list[dict], path: str) -> None:
    import pandas as pd

    pd.DataFrame(rows).to_parquet(path, index=False)
