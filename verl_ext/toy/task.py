"""Synthetic addition task "a+b=?" (a, b single digits) as verl RL parquet rows.

* ``toy_add``  -- a+b <= 9  (55 pairs), answer = one digit then EOS.
* ``toy_add2`` -- a+b >= 10 (45 pairs), answer = two digits then EOS.  After the
  one-digit SFT warm-up these stay all-wrong under GRPO (advantage collapse).

Split (fixed seed): 20% of the one-digit pairs are held out for validation; of
the two-digit pairs, ``N_TRAIN_TWO_DIGIT`` go to training (~31% of the train
mix) and the rest to validation. No pair appears in both splits.
"""

from __future__ import annotations

import random

DATA_SOURCE_ONE = "toy_add"
DATA_SOURCE_TWO = "toy_add2"
ABILITY = "arith"
SPLIT_SEED = 1234
VAL_FRAC_ONE_DIGIT = 0.2
N_TRAIN_TWO_DIGIT = 20


def prompt_text(a: int, b: int) -> str:
    return f"{a}+{b}=?"


def all_pairs() -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
    one = [(a, b) for a in range(10) for b in range(10) if a + b <= 9]
    two = [(a, b) for a in range(10) for b in range(10) if a + b >= 10]
    return one, two


def split_pairs(seed: int = SPLIT_SEED) -> dict[str, list[tuple[int, int]]]:
    """Return {"train_one", "val_one", "train_two", "val_two"} lists of (a, b)."""
    rng = random.Random(seed)
    one, two = all_pairs()
    one = one[:]
    two = two[:]
    rng.shuffle(one)
    rng.shuffle(two)
    n_val_one = round(len(one) * VAL_FRAC_ONE_DIGIT)
    return {
        "train_one": sorted(one[n_val_one:]),
        "val_one": sorted(one[:n_val_one]),
        "train_two": sorted(two[:N_TRAIN_TWO_DIGIT]),
        "val_two": sorted(two[N_TRAIN_TWO_DIGIT:]),
    }


def make_row(a: int, b: int, split: str, index: int) -> dict:
    answer = str(a + b)
    return {
        "data_source": DATA_SOURCE_ONE if a + b <= 9 else DATA_SOURCE_TWO,
        "prompt": [{"role": "user", "content": prompt_text(a, b)}],
        "ability": ABILITY,
        "reward_model": {"style": "rule", "ground_truth": answer},
        "extra_info": {"split": split, "index": index, "solution": answer, "a": a, "b": b},
    }


def make_rows(seed: int = SPLIT_SEED) -> tuple[list[dict], list[dict]]:
    """(train_rows, val_rows). Train rows are shuffled so one- and two-digit prompts mix."""
    sp = split_pairs(seed)
    train_pairs = sp["train_one"] + sp["train_two"]
    random.Random(seed + 1).shuffle(train_pairs)
    val_pairs = sp["val_one"] + sp["val_two"]
    train = [make_row(a, b, "train", i) for i, (a, b) in enumerate(train_pairs)]
    val = [make_row(a, b, "test", i) for i, (a, b) in enumerate(val_pairs)]
    return train, val


def write_parquet(rows: list[dict], path: str) -> None:
    import pandas as pd

    pd.DataFrame(rows).to_parquet(path, index=False)
