"""End-to-end: the real ``verl.trainer.main_ppo`` (legacy trainer, GRPO) on CPU with the ``hf`` rollout backend.

What it proves: verl_ext's CPU platform + fixes let verl's own trainer run on gloo, the ``hf`` backend serves the
agent loop, and the rollout's log-probs equal the actor's recomputed ``old_log_probs`` at every step, i.e. the
weights reach the rollout server after each update and the log-probs are those of the sampling distribution.
The actor runs in fp32 here (verl's FSDP default computes in bf16, which alone gives ~1e-4 of difference), so the
check can be tight. About a minute on 2 cores.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest


def _metric(lines: list[str], key: str) -> list[float]:
    pattern = re.compile(re.escape(key) + r":(?:np\.float64\()?([-+0-9.eE]+|nan|inf)")
    values = []
    for line in lines:
        m = pattern.search(line)
        if m:
            values.append(float(m.group(1)))
    return values


@pytest.mark.e2e
def test_cpu_grpo_legacy_trainer_with_hf_rollout(tmp_path):
    from verl_ext.toy import build_toy_assets

    assets = build_toy_assets(verbose=False, task="add")  # the first toy task: one-token answers
    steps = 3
    overrides = [
        "trainer.use_v1=False",
        "algorithm.adv_estimator=grpo",
        "algorithm.use_kl_in_reward=False",
        f"data.train_files={assets.train_parquet}",
        f"data.val_files={assets.val_parquet}",
        "data.train_batch_size=8",
        "data.max_prompt_length=32",
        "data.max_response_length=8",
        "data.dataloader_num_workers=0",
        f"actor_rollout_ref.model.path={assets.model_path}",
        "actor_rollout_ref.model.use_remove_padding=False",
        "+actor_rollout_ref.model.override_config.attn_implementation=sdpa",
        "actor_rollout_ref.actor.strategy=fsdp2",
        "+actor_rollout_ref.actor.fsdp_config.mixed_precision={param_dtype:fp32,reduce_dtype:fp32,buffer_dtype:fp32}",
        "actor_rollout_ref.actor.optim.lr=1e-3",
        "actor_rollout_ref.actor.ppo_mini_batch_size=8",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8",
        "actor_rollout_ref.actor.use_kl_loss=False",
        "actor_rollout_ref.rollout.name=hf",
        "actor_rollout_ref.rollout.n=4",
        "actor_rollout_ref.rollout.tensor_model_parallel_size=1",
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=8",
        "actor_rollout_ref.rollout.agent.num_workers=1",
        "reward.num_workers=1",
        f"reward.custom_reward_function.path={assets.reward_path}",
        f"reward.custom_reward_function.name={assets.reward_name}",
        "trainer.device=cpu",
        "trainer.n_gpus_per_node=1",
        "trainer.nnodes=1",
        "trainer.logger=[console]",
        "trainer.val_before_train=False",
        "trainer.test_freq=-1",
        "trainer.save_freq=-1",
        f"trainer.total_training_steps={steps}",
        "ray_kwargs.ray_init.num_cpus=8",
        "+ray_kwargs.ray_init.num_gpus=1",
    ]
    env = dict(os.environ, VERL_PLATFORM="cpu", PYTHONUNBUFFERED="1", TOKENIZERS_PARALLELISM="false")
    proc = subprocess.run(
        [sys.executable, "-m", "verl.trainer.main_ppo", *overrides],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-6000:]

    step_lines = [line for line in out.splitlines() if re.search(r"\bstep:\d+ - ", line)]
    assert len(step_lines) == steps, out[-6000:]
    diffs = _metric(step_lines, "training/rollout_probs_diff_max")
    grad_norms = _metric(step_lines, "actor/grad_norm")
    assert len(diffs) == steps and len(grad_norms) == steps, step_lines
    # rollout log-probs == actor log-probs (fp32 both sides; ~1e-8 measured)
    assert max(diffs) < 1e-5, diffs
    # the check after an update is only meaningful if some update actually moved the weights
    assert max(grad_norms[:-1]) > 0, grad_norms
