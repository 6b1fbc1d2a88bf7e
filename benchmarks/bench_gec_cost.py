"""GEC's whole cost per training step on the embedded toy: ``edge_grpo`` with GEC on vs off, same seed, per rollout.

    python benchmarks/bench_gec_cost.py [--steps 20] [--rollouts hf vllm] [--first 3]

Each (rollout, GEC) pair runs ``python -m verl_ext.main`` (the embedded default: 16 prompts x 8 responses, the
legacy trainer) for ``--steps`` steps with one seed, and reads verl's own timings from its file logger: generation
(``timing_s/gen``: the agent loop, GEC's scoring and continuations included), reward (``timing_s/reward``: ~0, the
agent loop scores), the old-log-prob pass and the actor update (which grow with the tokens GEC adds) and the whole
step (``timing_s/step``), median of steps ``--first``..``--steps``. Against them: the tokens per step, the part
GEC adds (reflection continuations + injected answer/solution tokens: ``gec/continuation_tokens`` +
``gec/injected_tokens``) and its share of the rest. Goal: GEC's step-time overhead no larger than its token share.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from verl_ext.metrics_file import read_steps

BATCH, N = 16, 8
TIMINGS = ("gen", "reward", "old_log_prob", "update_actor", "step")


def run(rollout: str, gec: bool, steps: int, seed: int) -> dict[int, dict[str, float]]:
    with tempfile.TemporaryDirectory() as tmp:
        metrics = Path(tmp) / "metrics.jsonl"
        args = [sys.executable, "-m", "verl_ext.main", "algorithm.adv_estimator=edge_grpo",
                f"algorithm.gec.enable={str(gec).lower()}", f"actor_rollout_ref.rollout.name={rollout}",
                f"data.train_batch_size={BATCH}", f"actor_rollout_ref.rollout.n={N}",
                "trainer.logger=[console,file]", f"trainer.file_logger_path={metrics}",
                "trainer.val_before_train=false", "trainer.test_freq=-1", "trainer.save_freq=-1",
                f"trainer.total_training_steps={steps}", f"trainer.default_local_dir={tmp}/ckpt",
                f"data.seed={seed}", f"actor_rollout_ref.rollout.seed={seed}"]
        env = {k: v for k, v in os.environ.items() if k != "VERL_PLATFORM"}
        proc = subprocess.run(args, cwd=tmp, env=dict(env, PYTHONUNBUFFERED="1"), capture_output=True, text=True,
                              timeout=3600)
        if proc.returncode != 0:
            tail = "\n".join((proc.stdout + proc.stderr).splitlines()[-40:])
            raise RuntimeError(f"{rollout} gec={gec} failed:\n{tail}")
        steps_logged, bad = read_steps(metrics)
        assert bad == 0 and sorted(steps_logged) == list(range(1, steps + 1)), sorted(steps_logged)
        return steps_logged


def summary(steps: dict[int, dict[str, float]], first: int) -> dict[str, float]:
    kept = [values for step, values in sorted(steps.items()) if step >= first]
    med = {key: statistics.median(v[f"timing_s/{key}"] for v in kept) for key in TIMINGS}
    med["tokens"] = statistics.median(v["response_length/mean"] * BATCH * N for v in kept)
    med["gec_tokens"] = statistics.median(v.get("gec/continuation_tokens", 0.0) + v.get("gec/injected_tokens", 0.0)
                                          for v in kept)
    return med


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--first", type=int, default=3)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--rollouts", nargs="+", default=["hf", "vllm"])
    args = parser.parse_args()
    print(f"embedded toy, edge_grpo, {BATCH}x{N} responses a step, seed {args.seed}, "
          f"median of steps {args.first}..{args.steps}")
    print("| rollout | GEC | gen s | reward s | old log-prob s | update s | step s | tokens/step | GEC tokens | "
          "token share | gen on/off | step on/off |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for rollout in args.rollouts:
        off = summary(run(rollout, False, args.steps, args.seed), args.first)
        on = summary(run(rollout, True, args.steps, args.seed), args.first)
        share = on["gec_tokens"] / max(on["tokens"] - on["gec_tokens"], 1.0)
        for name, m in (("off", off), ("on", on)):
            ratios = (f"{on['gen'] / off['gen']:.2f}x | {on['step'] / off['step']:.2f}x" if name == "on"
                      else "1 | 1")
            print(f"| {rollout} | {name} | {m['gen']:.2f} | {m['reward']:.3f} | {m['old_log_prob']:.2f} | "
                  f"{m['update_actor']:.2f} | {m['step']:.2f} | "
                  f"{m['tokens']:.0f} | {m['gec_tokens']:.0f} | {share if name == 'on' else 0:.2f} | {ratios} |",
                  flush=True)


if __name__ == "__main__":
    main()
