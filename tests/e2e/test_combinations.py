"""End to end on CPU: verl_ext's features combined with the verl features people run them with.

Few runs, many settings each (CI time): gepo with ``base=edge_grpo`` runs EDA and GEPO in one estimator, GEC is on
(the embedded default) in every run.  Each run asserts that training happened with finite losses, that advantages
were shaped and that the methods' metrics are there.  docs/combinations.md's table points at these tests.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import pytest

from tests.e2e.conftest import assert_rollout_diagnostics_see_sampled_tokens, assert_shaped_training
from verl_ext.trainer.history_checkpoint import STATE_FILE

pytestmark = pytest.mark.e2e

EDA_AND_GEPO = ["algorithm.adv_estimator=gepo", "algorithm.gepo.base=edge_grpo"]
V1 = "trainer.use_v1=true"


def test_v1_colocate_async_with_filter_groups_then_kill_and_resume(run_main, tmp_path):
    """colocate_async + DAPO dynamic sampling + EDA/GEPO + GEC, checkpointed every step; then a new process resumes.

    The filter reads the reward after GEC's correction (``rm_scores`` of the final response), the same reward the
    advantages use: no trained group is collapsed, and rescued groups (all wrong before correction) are kept.
    """
    # 8 prompts a step: GEC makes about a third of the one-digit groups all-correct, so the filter evicts some
    settings = [V1, "trainer.v1.trainer_mode=colocate_async", *EDA_AND_GEPO, "data.train_batch_size=8",
                "algorithm.filter_groups.enable=true", "algorithm.filter_groups.metric=reward", "trainer.save_freq=1"]
    steps = run_main(*settings).metrics()
    assert_shaped_training(steps, [1, 2])
    for step, values in steps.items():
        assert values["verl_ext/collapsed_group_frac"] == 0, step  # filtered on the corrected reward
        assert values["gepo/history_updates"] == step  # one update per trained batch, in training order
    assert sum(v.get("training/filter_groups/evicted_samples", 0) for v in steps.values()) > 0  # the filter ran
    assert sum(v["gec/groups_rescued"] for v in steps.values()) > 0  # all wrong before correction, yet kept
    saved = json.loads((tmp_path / "ckpt" / "global_step_2" / STATE_FILE).read_text())["entropy_history"]
    assert saved["scopes"]["global"]["num_updates"] == 2 and len(saved["scopes"]["global"]["window"]) == 2

    resumed = run_main(*settings, "trainer.total_training_steps=3")
    assert sorted(resumed.metrics()) == [3]
    restored = [line for line in resumed.lines if "[verl_ext] restored entropy history" in line]
    assert restored and json.loads(restored[0].split(": ", 1)[1]) == saved  # exactly the thresholds of step 2
    assert resumed.metrics()[3]["gepo/history_updates"] == 3
    after = json.loads((tmp_path / "ckpt" / "global_step_3" / STATE_FILE).read_text())["entropy_history"]
    assert after["scopes"]["global"]["window"][:2] == saved["scopes"]["global"]["window"]  # appended, not re-seeded


def test_v1_separate_async_two_minibatches_per_sync(run_main):
    """separate_async on one machine: a trainer pool and a standalone rollout pool (2 logical GPUs), weights through
    verl_ext's ``cpu`` checkpoint engine, 2 trained mini-batches per weight sync (parameter_sync_step=2)."""
    steps = run_main(V1, "trainer.v1.trainer_mode=separate_async", *EDA_AND_GEPO,
                     "trainer.v1.separate_async.parameter_sync_step=2", "actor_rollout_ref.actor.ppo_mini_batch_size=2",
                     "actor_rollout_ref.rollout.checkpoint_engine.backend=cpu",
                     "actor_rollout_ref.rollout.nnodes=1", "actor_rollout_ref.rollout.n_gpus_per_node=1",
                     "ray_kwargs.ray_init.num_gpus=2").metrics()
    assert_shaped_training(steps, [1, 2])
    for step, values in steps.items():
        assert values["gepo/history_updates"] == 2 * step  # one history update per trained mini-batch
    # step 1 trains rollouts of the initial weights, and both its mini-batches are scored with them: the second with
    # the pi_old verl restores, which CPU mode keeps as a copy (verl_ext.cpu.sharded_save; without it the second was
    # scored with the weights one update on: 1.1e-2 against the first's 1.4e-6).
    # Measured (seed of the suite): step 1 rollout_probs_diff_max 1.4e-6 over both, rollout_corr/kl 6.4e-8, ppo_kl 2e-5
    assert_rollout_diagnostics_see_sampled_tokens(steps, on_policy_steps=[1])


def test_refused_combination_fails_at_start_up_naming_both_settings(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "verl_ext.main", "trainer.use_v1=false", "algorithm.filter_groups.enable=true"],
        cwd=tmp_path, env=dict(os.environ, PYTHONUNBUFFERED="1"), capture_output=True, text=True, timeout=300)
    assert proc.returncode != 0
    assert "algorithm.filter_groups.enable=true with trainer.use_v1=false" in proc.stderr, proc.stderr[-3000:]
    assert "ray.init" not in proc.stdout + proc.stderr and "Started a local Ray instance" not in proc.stderr


def test_v1_gepo_in_rollout_correction_bypass_mode(run_main):
    """gepo (token_mean, GRPO base: no entropy needed) with ``rollout_correction.bypass_mode=true`` on v1: verl skips
    the old-log-prob pass (no entropy) and takes the rollout's log-probs as old_log_probs, from which H_g comes.
    GEC stays on with its injected tokens masked (their rollout log-prob 0.0 would otherwise be read)."""
    steps = run_main(V1, "algorithm.adv_estimator=gepo", "algorithm.rollout_correction.bypass_mode=true",
                     "actor_rollout_ref.rollout.calculate_log_probs=true", "algorithm.gec.mask_injected=true").metrics()
    assert sorted(steps) == [1, 2], steps.keys()
    for step, values in steps.items():
        for key in ("actor/pg_loss", "actor/grad_norm", "gepo/H_mean", "gepo/H_low", "gepo/H_high"):
            assert math.isfinite(values[key]), (step, key, values[key])
        assert values["gepo/history_updates"] == step and values["gec/responses"] > 0
        assert "verl_ext/response_entropy_mean" not in values  # no entropy in bypass mode
    assert max(v["actor/grad_norm"] for v in steps.values()) > 0  # the actor was updated


# the padded v1 batch (verl's _balance_batch pads a step's rows to its mini-batches; gepo with sum_mean and GEC's
# credit options on v1): tests/e2e/test_gpu_settings.py, the v1 pair (CI time)
