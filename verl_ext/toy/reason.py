"""The reasoning task: additions reasoned out step by step, the final answer after a marker (docs/toy.md).

The papers' setting in miniature: the model writes its steps, then the final answer after ``#`` (the toy's
``\\boxed{}``, as GSM8K's ``####``); the reward grades the text after the *last* ``#``. Three data sources:

* ``toy_chain``  -- add 3 or 4 digits left to right, the running total written at every step:
  ``3+4+2+5=`` -> ``3+4=7+2=9+5=14#14`` (one way to solve it: a low-entropy family);
* ``toy_bag``    -- add a set of 3 or 4 digits in any order: ``{3,4,2,5}=`` -> ``5+2=7+4=11+3=14#14`` or any other
  order (many ways to solve it, as open-ended tasks have: a high-entropy family);
* ``toy_chain6`` -- six digits left to right: the hard split of the first reasoning toy (``+toy=chain6``). The
  warm-up never shows more than four, so its groups start all-wrong under GRPO (GEC's case). The default toy
  replaces it with a hard split its warmed-up model picks (``designs.py``, ``chain5_unsolved``).

Reflection: ``!`` is the cue (the toy's "Wait!"). A share of the warm-up examples is a wrong attempt (one step's
result off by 1 or 2, the rest consistent with it), then ``!`` and a correct solution, with the loss on ``!`` and
what follows only; so after the cue a continuation re-solves the problem and can repair the wrong step. GEC's reflect
branch appends exactly that cue; its answer template is ``!#{answer}``.

Splits (fixed seed): ``N_VAL`` held-out prompts per data source, never trained on; the RL training pool mixes the
three sources (``N_TRAIN``); the warm-up uses other prompts of ``toy_chain`` and ``toy_bag`` only. Validation rows
as in the first toy task (``task.py``): each held-out prompt ``VAL_SAMPLES`` times sampled and once greedy
(``<source>@greedy``, ``extra_info.sampling_params``).
"""

from __future__ import annotations

import random
from dataclasses import dataclass

DATA_SOURCE_CHAIN = "toy_chain"
DATA_SOURCE_BAG = "toy_bag"
DATA_SOURCE_LONG = "toy_chain6"
DATA_SOURCES = (DATA_SOURCE_CHAIN, DATA_SOURCE_BAG, DATA_SOURCE_LONG)
WARMUP_SOURCES = (DATA_SOURCE_CHAIN, DATA_SOURCE_BAG)
GREEDY_SUFFIX = "@greedy"
GREEDY_SAMPLING = {"temperature": 0.0}
ABILITY = "arith"
ANSWER_MARK = "#"
CUE = "!"
ANSWER_TEMPLATE = "!#{answer}"

SPLIT_SEED = 4321
N_VAL = 100  # held-out prompts per data source
N_TRAIN = {DATA_SOURCE_CHAIN: 1200, DATA_SOURCE_BAG: 1200, DATA_SOURCE_LONG: 600}  # RL pool: 20% hard split
VAL_SAMPLES = 8

Problem = tuple[str, tuple[int, ...]]  # (data source, operands)


def prompt_text(source: str, operands: tuple[int, ...]) -> str:
    if source == DATA_SOURCE_BAG:
        return "{" + ",".join(str(x) for x in operands) + "}="
    return "+".join(str(x) for x in operands) + "="


def answer(operands: tuple[int, ...]) -> int:
    return sum(operands)


def solution(source: str, operands: tuple[int, ...], error: tuple[int, int] | None = None,
             order: tuple[int, ...] | None = None) -> str:
    """The worked solution (steps, ``#``, final answer): the running total after each added digit.

    ``toy_chain``/``toy_chain6`` add left to right; ``toy_bag`` adds the digits in ``order`` (a permutation of the
    operands' positions; default: as given). ``error=(step, delta)`` adds delta to that step's result and carries on
    consistently from the wrong value (so the final answer is wrong too)."""
    ops = [operands[i] for i in order] if order is not None else list(operands)
    total = _off(ops[0] + ops[1], 0, error)
    text = f"{ops[0]}+{ops[1]}={total}"
    for i, d in enumerate(ops[2:], start=1):
        total = _off(total + d, i, error)
        text += f"+{d}={total}"
    return f"{text}{ANSWER_MARK}{total}"


def _off(value: int, step: int, error) -> int:
    if error is not None and error[0] == step:
        return max(0, value + error[1])
    return value


def random_order(operands: tuple[int, ...], rng: random.Random) -> tuple[int, ...]:
    order = list(range(len(operands)))
    rng.shuffle(order)
    return tuple(order)


def n_steps(source: str, operands: tuple[int, ...]) -> int:
    return len(operands) - 1


def wrong_attempt(source: str, operands: tuple[int, ...], rng: random.Random,
                  order: tuple[int, ...] | None = None) -> str:
    """A solution with one step off by 1 or 2 (a wrong final answer)."""
    truth = answer(operands)
    for _ in range(20):
        step = rng.randrange(n_steps(source, operands))
        text = solution(source, operands, (step, rng.choice((-2, -1, 1, 2))), order)
        if final_answer(text) != str(truth):
            return text
    return solution(source, operands, (n_steps(source, operands) - 1, 1), order)


def first_departure(source: str, operands: tuple[int, ...], reply: str) -> int:
    """Where a reply first leaves the reference solution (left to right: ``toy_chain``'s and the hard split's).

    Returns:
        How many running totals the reply wrote as the solution does (a total's digits, not followed by another
        digit) before its first differing character: 0 (the first total wrong) .. ``n_steps``; ``n_steps + 1`` when
        the reply is the whole solution, answer included.
    """
    ref = solution(source, operands)
    same = 0
    for a, b in zip(ref, reply):
        if a != b:
            break
        same += 1
    if same == len(ref):
        return n_steps(source, operands) + 1
    ends, at = [], ref.find("=")
    while at >= 0:  # the position after each running total: its digits end where the next "+" or "#" starts
        end = at + 1
        while end < len(ref) and ref[end].isdigit():
            end += 1
        ends.append(end)
        at = ref.find("=", end)
    return sum(end < same or (end == same and not reply[end:end + 1].isdigit()) for end in ends)


def final_answer(text: str) -> str:
    """The graded answer: what follows the last ``#`` (stripped), or "" without one."""
    if ANSWER_MARK not in text:
        return ""
    return text.rsplit(ANSWER_MARK, 1)[-1].strip()


def _all_problems(seed: int) -> dict[str, list[tuple[int, ...]]]:
    rng = random.Random(seed)
    short = [(a, b, c) for a in range(10) for b in range(10) for c in range(10)]
    short += [(a, b, c, d) for a in range(10) for b in range(10) for c in range(10) for d in range(10)]
    rng.shuffle(short)
    half = len(short) // 2  # chain and bag get disjoint operand tuples
    long_ = sorted({tuple(rng.randrange(10) for _ in range(6)) for _ in range(3000)})
    out = {DATA_SOURCE_CHAIN: short[:half], DATA_SOURCE_BAG: short[half:], DATA_SOURCE_LONG: long_}
    for source in DATA_SOURCES:
        rng.shuffle(out[source])
    return out


@dataclass(frozen=True)
class Split:
    val: dict[str, list[tuple[int, ...]]]
    train: dict[str, list[tuple[int, ...]]]  # the RL pool
    warmup: dict[str, list[tuple[int, ...]]]  # warm-up prompts (toy_chain and toy_bag only)


def split_problems(seed: int = SPLIT_SEED) -> Split:
    """Disjoint held-out, RL-training and warm-up prompts per data source (deterministic)."""
    problems = _all_problems(seed)
    val, train, warmup = {}, {}, {}
    for source in DATA_SOURCES:
        p = problems[source]
        val[source] = sorted(p[:N_VAL])
        train[source] = sorted(p[N_VAL:N_VAL + N_TRAIN[source]])
        if source in WARMUP_SOURCES:
            warmup[source] = sorted(p[N_VAL + N_TRAIN[source]:])
    return Split(val=val, train=train, warmup=warmup)


def make_row(source: str, operands: tuple[int, ...], split: str, index: int, greedy: bool = False,
             sample: int = 0) -> dict:
    truth = str(answer(operands))
    extra = {"split": split, "index": index, "solution": solution(source, operands), "operands": list(operands),
             "sample": sample}
    data_source = source
    if greedy:
        data_source += GREEDY_SUFFIX
        extra["sampling_params"] = dict(GREEDY_SAMPLING)
    return {
        "data_source": data_source,
        "prompt": [{"role": "user", "content": prompt_text(source, operands)}],
        "ability": ABILITY,
        "reward_model": {"style": "rule", "ground_truth": truth},
        "extra_info": extra,
    }


def make_rows(seed: int = SPLIT_SEED, split: Split | None = None) -> tuple[list[dict], list[dict]]:
    """(train_rows, val_rows): the shuffled RL pool; every held-out prompt ``VAL_SAMPLES`` times sampled and once
    greedy. ``split``: another split's prompts (a hard-split design of ``designs.py``; default: ``split_problems``),
    its data sources in its own order."""
    sp = split_problems(seed) if split is None else split
    sources = tuple(sp.val)
    train = [(s, ops) for s in sources for ops in sp.train[s]]
    random.Random(seed + 1).shuffle(train)
    held_out = [(s, ops) for s in sources for ops in sp.val[s]]
    val = [(s, ops, False, k) for k in range(VAL_SAMPLES) for s, ops in held_out]
    val += [(s, ops, True, 0) for s, ops in held_out]
    val_rows = [make_row(s, ops, "test", i, greedy=g, sample=k) for i, (s, ops, g, k) in enumerate(val)]
    return [make_row(s, ops, "train", i) for i, (s, ops) in enumerate(train)], val_rows
