"""Per-step wall time of grpo, edge_grpo and gepo on the embedded toy task (GEC off), same seeds, one run.

    python benchmarks/bench_toy_step.py [--steps 12] [--trainer legacy|v1]

Each estimator runs ``python -m verl_ext.main`` (the real verl pipeline on CPU) for ``--steps`` steps; step 1
(warm-up) is dropped and the median of the rest is reported, with verl's own ``timing_s/adv`` beside it, and
ratios against grpo (goal: <= 1.05x).
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile

ESTIMATORS = ("grpo", "edge_grpo", "gepo")


def step_timings(estimator: str, steps: int, use_v1: bool) -> dict[str, list[float]]:
    with tempfile.TemporaryDirectory() as tmp:
        args = [sys.executable, "-m", "verl_ext.main", f"algorithm.adv_estimator={estimator}",
                "algorithm.gec.enable=false", f"trainer.use_v1={str(use_v1).lower()}", "trainer.logger=[console]",
                "trainer.val_before_train=false", "trainer.test_freq=-1", "trainer.save_freq=-1",
                f"trainer.total_training_steps={steps}", f"trainer.default_local_dir={tmp}/ckpt",
                "data.seed=1", "actor_rollout_ref.rollout.seed=1"]
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        proc = subprocess.run(args, cwd=tmp, env=env, capture_output=True, text=True, timeout=1800)
    if proc.returncode != 0:
        raise RuntimeError(f"{estimator} run failed:\n" + "\n".join((proc.stdout + proc.stderr).splitlines()[-40:]))
    timings: dict[str, list[float]] = {"step": [], "adv": []}
    for line in proc.stdout.splitlines():
        match = re.search(r"step:(\d+) - ", line)
        if not match or int(match.group(1)) == 1:
            continue
        for key in timings:
            value = re.search(rf"timing_s/{key}:(?:np\.float64\()?([0-9.eE+-]+)", line)
            if value:
                timings[key].append(float(value.group(1)))
    return timings


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--trainer", choices=["legacy", "v1"], default="legacy")
    args = parser.parse_args()
    results = {name: step_timings(name, args.steps, args.trainer == "v1") for name in ESTIMATORS}
    base_step = statistics.median(results["grpo"]["step"])
    print(f"embedded toy task, {args.trainer} trainer, GEC off, median over steps 2..{args.steps}")
    print(f"{'estimator':<10} | {'step s':>7} | {'adv ms':>7} | {'step / grpo':>11}")
    for name, timing in results.items():
        step, adv = statistics.median(timing["step"]), statistics.median(timing["adv"])
        print(f"{name:<10} | {step:7.3f} | {adv * 1e3:7.2f} | {step / base_step:10.3f}x")


if __name__ == "__main__":
    main()
