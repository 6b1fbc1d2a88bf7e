"""Time verl_ext's estimators against verl's own ``grpo`` and ``grpo_vectorized`` on the same tensors, one run.

    python benchmarks/bench_advantage.py [--sizes 1024x1024 8192x4096] [--group 8] [--repeats 5]

Prints the median wall time per call (estimators interleaved round by round) and ratios to ``grpo_vectorized`` (goal: <= 1.5x) and ``grpo`` (goal: < 1x).
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
import torch
from verl.trainer.ppo.core_algos import get_adv_estimator_fn

import verl_ext.algos.registry  # noqa: F401  (registers edge_grpo and gepo)
from verl_ext import GroupEntropyHistory


def make_inputs(batch: int, width: int, group: int, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, width + 1, (batch,), generator=gen)
    mask = (torch.arange(width)[None, :] < lengths[:, None]).float()
    rewards = torch.zeros(batch, width)
    rewards[torch.arange(batch), lengths - 1] = torch.randint(0, 2, (batch,), generator=gen).float()
    entropy = torch.rand(batch, width, generator=gen) + 0.05
    log_probs = -torch.rand(batch, width, generator=gen)
    uid = np.array([f"uid-{i // group}" for i in range(batch)], dtype=object)  # verl's uids are uuid strings
    data_source = np.array(["math", "code"], dtype=object)[(np.arange(batch) // group) % 2]
    return rewards, mask, entropy, log_probs, uid, data_source


def calls(inputs):
    R, M, E, L, uid, ds = inputs
    cfg = {"norm_adv_by_std_in_grpo": True}
    history = GroupEntropyHistory()
    return {
        "grpo (verl)": lambda: get_adv_estimator_fn("grpo")(token_level_rewards=R, response_mask=M, index=uid),
        "grpo_vectorized (verl)": lambda: get_adv_estimator_fn("grpo_vectorized")(
            token_level_rewards=R, response_mask=M, index=uid),
        "edge_grpo": lambda: get_adv_estimator_fn("edge_grpo")(
            token_level_rewards=R, response_mask=M, index=uid, config=cfg, entropy=E),
        "gepo": lambda: get_adv_estimator_fn("gepo")(
            token_level_rewards=R, response_mask=M, index=uid, config=cfg, old_log_probs=L, entropy=E,
            entropy_history=history, data_source=ds),
    }


def interleaved_medians(fns: dict, repeats: int, min_sample_s: float = 0.02) -> dict[str, float]:
    """Median seconds per call; the estimators take turns in every round so drift hits them all alike."""
    loops = {}
    for name, fn in fns.items():  # warm up, and size each sample to at least min_sample_s
        fn()
        start = time.perf_counter()
        fn()
        loops[name] = max(1, int(min_sample_s / max(time.perf_counter() - start, 1e-9)))
    samples = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            start = time.perf_counter()
            for _ in range(loops[name]):
                fn()
            samples[name].append((time.perf_counter() - start) / loops[name])
    return {name: statistics.median(values) for name, values in samples.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", nargs="+", default=["1024x1024", "8192x4096"])
    parser.add_argument("--group", type=int, default=8, help="responses per prompt (rollout.n)")
    parser.add_argument("--repeats", type=int, default=15, help="rounds; each times >= 20 ms of calls")
    args = parser.parse_args()
    print(f"torch {torch.__version__}, threads {torch.get_num_threads()}, group size {args.group}")
    header = f"{'B x T':>11} | {'estimator':<24} | {'median ms':>10} | {'/ grpo_vectorized':>17} | {'/ grpo':>7}"
    print(header + "\n" + "-" * len(header))
    for size in args.sizes:
        batch, width = (int(x) for x in size.lower().split("x"))
        timings = interleaved_medians(calls(make_inputs(batch, width, args.group)), args.repeats)
        vec, loop = timings["grpo_vectorized (verl)"], timings["grpo (verl)"]
        for name, seconds in timings.items():
            print(f"{size:>11} | {name:<24} | {seconds * 1e3:10.2f} | {seconds / vec:16.2f}x | {seconds / loop:6.2f}x")


if __name__ == "__main__":
    main()
