"""End-to-end: the real ``verl.trainer.main_ppo`` (legacy trainer, GRPO) on CPU with the ``hf`` rollout backend.

What it proves: verl_ext's CPU platform + fixes let verl's own trainer run on gloo, the ``hf`` backend serves the
agent loop (``gec_agent``, GEC off: verl's single-turn loop, registered in verl's agent-loop worker by the plugin's
lazy hook, with no import of verl_ext in the command), and the rollout's log-probs equal the actor's recomputed ``old_log_probs`` at every step, i.e. the
weights reach the rollout server after each update and the log-probs are those of the sampling distribution.
The actor runs in fp32 here (verl's FSDP default computes in bf16, which alone gives ~1e-4 of difference), so the
check can be tight. About a minute on 2 cores.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.e2e.conftest import read_metrics


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
        "actor_rollout_ref.rollout.agent.default_agent_loop=gec_agent",
        "reward.num_workers=1",
        f"reward.custom_reward_function.path={assets.reward_path}",
        f"reward.custom_reward_function.name={assets.reward_name}",
        "trainer.device=cpu",
        "trainer.n_gpus_per_node=1",
        "trainer.nnodes=1",
        "trainer.logger=[console,file]",
        "trainer.val_before_train=False",
        "trainer.test_freq=-1",
        "trainer.save_freq=-1",
        f"trainer.total_training_steps={steps}",
        "ray_kwargs.ray_init.num_cpus=8",
        "+ray_kwargs.ray_init.num_gpus=1",
        # as the toy config (docs/cpu.md "The test suite's time"): no dashboard, and no idle Python worker prestarted
        # per logical CPU (verl's actors start their own)
        "+ray_kwargs.ray_init.include_dashboard=false",
        "+ray_kwargs.ray_init._system_config={prestart_worker_first_driver:false}",
    ]
    metrics_path = tmp_path / "metrics.jsonl"  # verl's file logger (a local Ray cluster inherits the variable)
    env = dict(os.environ, VERL_PLATFORM="cpu", PYTHONUNBUFFERED="1", TOKENIZERS_PARALLELISM="false",
               VERL_FILE_LOGGER_PATH=str(metrics_path))
    proc = subprocess.run(
        [sys.executable, "-m", "verl.trainer.main_ppo", *overrides],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-6000:]

    logged = read_metrics(metrics_path)
    assert sorted(logged) == list(range(1, steps + 1)), out[-6000:]
    diffs = [logged[i]["training/rollout_probs_diff_max"] for i in sorted(logged)]
    grad_norms = [logged[i]["actor/grad_norm"] for i in sorted(logged)]
    # rollout log-probs == actor log-probs (fp32 both sides; ~1e-8 measured)
    assert max(diffs) < 1e-5, diffs
    # the check after an update is only meaningful if some update actually moved the weights
    assert max(grad_norms[:-1]) > 0, grad_norms
