"""Time verl_ext's group helpers (``verl_ext.algos.groups``) against verl's own (``verl.utils.groupwise``), one run.

    python benchmarks/bench_groupwise.py [--batches 1024 8192 65536] [--group 8] [--repeats 15]

Same inputs for both: verl's uid column (uuid4 strings, ``rollout.n`` rows per prompt) and a 0/1 outcome score per
row. Three jobs, each timed for ours and verl's in turn (interleaved, median per call), with the ratio ours / verl:

* ``group ids``: uid labels -> dense group ids (``group_ids`` vs ``as_torch_index``);
* ``mean/std``: per-group mean, unbiased std and count (``group_mean_std`` vs verl's ``group_mean_std(eps=0)``);
* ``grpo``: the GRPO scalar advantage from labels (ours: ``group_ids`` + ``grpo_scalar_advantage``; verl's:
  ``as_torch_index`` + ``group_mean_std``, as its ``compute_grpo_vectorized_outcome_advantage`` does).

It also checks the results agree (same groups up to relabelling, same statistics, same advantages).
"""

from __future__ import annotations

import argparse
import os
import sys
import uuid

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_advantage import interleaved_medians

from verl_ext.algos.groups import group_ids, group_mean_std
from verl_ext.algos.grpo import grpo_scalar_advantage


def make_inputs(batch: int, group: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    prompts = [str(uuid.UUID(int=int(rng.integers(1 << 62)) << 64 | i)) for i in range(batch // group)]
    uid = np.array([p for p in prompts for _ in range(group)], dtype=object)
    scores = torch.from_numpy(rng.integers(0, 2, size=len(uid)).astype(np.float32))
    return uid, scores


def calls(uid, scores):
    from verl.utils.groupwise import as_torch_index
    from verl.utils.groupwise import group_mean_std as verl_group_mean_std

    gid, num_groups = group_ids(uid)
    verl_gid = as_torch_index(uid, device="cpu")

    def ours_grpo():
        g, n = group_ids(uid)
        return grpo_scalar_advantage(scores, g, n)

    def verl_grpo():
        g = as_torch_index(uid, device="cpu")
        mean, std, _ = verl_group_mean_std(scores, g, eps=0.0, device="cpu")
        return (scores - mean[g]) / (std[g] + 1e-6)

    jobs = {
        "group ids": (lambda: group_ids(uid), lambda: as_torch_index(uid, device="cpu")),
        "mean/std": (lambda: group_mean_std(scores, gid, num_groups),
                     lambda: verl_group_mean_std(scores, verl_gid, eps=0.0, device="cpu")),
        "grpo": (ours_grpo, verl_grpo),
    }
    return jobs, (gid, verl_gid, ours_grpo(), verl_grpo())


def check_agreement(uid, scores, results) -> None:
    from verl.utils.groupwise import group_mean_std as verl_group_mean_std

    gid, verl_gid, ours_adv, verl_adv = results
    pairs = set(zip(gid.tolist(), verl_gid.tolist()))
    assert len(pairs) == len(set(gid.tolist())) == len(set(verl_gid.tolist())), "different groupings"
    mean, std, count = group_mean_std(scores, gid, int(gid.max()) + 1)
    order = torch.tensor([dict(pairs)[i] for i in range(len(mean))])
    v_mean, v_std, v_count = verl_group_mean_std(scores, verl_gid, eps=0.0, device="cpu")
    multi = count > 1  # verl sets singletons to mean 0 / std 1; ours reports them and lets callers decide
    assert torch.allclose(mean[multi], v_mean[order][multi], atol=1e-6)
    assert torch.allclose(std[multi], v_std[order][multi], atol=1e-6)
    assert torch.equal(count, v_count[order])
    assert torch.allclose(ours_adv, verl_adv, atol=1e-5), "different GRPO advantages"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batches", nargs="+", type=int, default=[1024, 8192, 65536])
    parser.add_argument("--group", type=int, default=8, help="responses per prompt (rollout.n)")
    parser.add_argument("--repeats", type=int, default=15, help="rounds; each times >= 20 ms of calls")
    args = parser.parse_args()
    print(f"torch {torch.__version__}, threads {torch.get_num_threads()}, group size {args.group}")
    header = f"{'rows':>7} | {'job':<10} | {'ours ms':>9} | {'verl ms':>9} | {'ours / verl':>11}"
    print(header + "\n" + "-" * len(header))
    for batch in args.batches:
        uid, scores = make_inputs(batch, args.group)
        jobs, results = calls(uid, scores)
        check_agreement(uid, scores, results)
        fns = {f"{job}/{who}": fn for job, pair in jobs.items() for who, fn in zip(("ours", "verl"), pair)}
        timings = interleaved_medians(fns, args.repeats)
        for job in jobs:
            ours, verl = timings[f"{job}/ours"], timings[f"{job}/verl"]
            print(f"{batch:>7} | {job:<10} | {ours * 1e3:9.3f} | {verl * 1e3:9.3f} | {ours / verl:10.2f}x")


if __name__ == "__main__":
    main()
