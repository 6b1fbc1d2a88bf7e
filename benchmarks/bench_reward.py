"""Time the boxed-math reward against verl's own math-verify reward on the same answers, one run.

    python benchmarks/bench_reward.py [--answers 400] [--threads 8] [--repeats 3]

Both grade with math-verify in child processes: verl's ``verl.utils.reward_score.math_verify.compute_score`` (a
``ProcessPoolExecutor``, the whole output parsed) and ``verl_ext.rewards.math.compute_score`` (the last box, MATH
string normalisation first, math-verify in killable processes). Answers are a fixed mix like a training batch
(right in several notations, wrong, unboxed). Calls come from ``--threads`` threads, as verl's reward loop makes
them. Prints the median wall time per answer and the ratio (goal: <= 1x). Warm-up (process start) is excluded.
"""

from __future__ import annotations

import argparse
import statistics
import time
from concurrent.futures import ThreadPoolExecutor

ANSWERS = [  # (model output, ground truth)
    ("The answer is \\boxed{5}.", "5"),
    ("So we get \\boxed{\\frac{1}{2}}", "0.5"),
    ("Therefore \\boxed{2\\sqrt{7}}", "\\sqrt{28}"),
    ("Hence \\boxed{(1,2)}", "(1, 2)"),
    ("I think it is \\boxed{17}", "18"),
    ("We find $x = 3$.", "3"),
    ("\\boxed{\\dfrac{3}{4}}", "\\frac34"),
    ("Finally \\boxed{x^2+2x+1}", "(x+1)^2"),
]


def run(fn, items, threads):
    with ThreadPoolExecutor(threads) as pool:
        t0 = time.perf_counter()
        list(pool.map(lambda a: fn(*a), items))
        return (time.perf_counter() - t0) / len(items)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--answers", type=int, default=400)
    p.add_argument("--threads", type=int, default=8)
    p.add_argument("--repeats", type=int, default=3)
    args = p.parse_args()

    from verl.utils.reward_score import math_verify as verl_mv

    from verl_ext.rewards import math as ext

    items = [ANSWERS[i % len(ANSWERS)] for i in range(args.answers)]
    fns = {
        "verl math_verify.compute_score": lambda out, gt: verl_mv.compute_score(out, gt),
        "verl_ext rewards.math.compute_score": lambda out, gt: ext.compute_score("math", out, gt)["score"],
    }
    for fn in fns.values():  # start the processes
        run(fn, items[: 4 * args.threads], args.threads)
    times = {name: [] for name in fns}
    for _ in range(args.repeats):  # interleaved, round by round
        for name, fn in fns.items():
            times[name].append(run(fn, items, args.threads))
    base = statistics.median(times["verl math_verify.compute_score"])
    print(f"{args.answers} answers, {args.threads} threads, median of {args.repeats}")
    for name, ts in times.items():
        med = statistics.median(ts)
        print(f"{name:40s} {1e3 * med:8.2f} ms/answer   x{med / base:.2f}")


if __name__ == "__main__":
    main()
