"""End to end on CPU: ``algorithm.edge_grpo.entropy_grad=true`` (the official EDGE-GRPO gradient through 1/H_i(θ))
through ``python -m verl_ext.main`` on verl's real trainers: legacy on 2 data-parallel ranks with 4 micro-batches
per rank, v1 with 2 mini-batches per step."""

from __future__ import annotations

import math

import pytest

pytestmark = pytest.mark.e2e

ENTROPY_GRAD = ["algorithm.adv_estimator=edge_grpo", "algorithm.edge_grpo.entropy_grad=true",
                "trainer.n_gpus_per_node=2", "ray_kwargs.ray_init.num_gpus=2",
                "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2", "trainer.total_training_steps=3"]


def test_legacy_trainer_entropy_grad_on_two_ranks(run_main):
    run = run_main("trainer.use_v1=false", *ENTROPY_GRAD)
    steps = run.metrics()
    assert sorted(steps) == [1, 2, 3], steps.keys()
    assert "[verl_ext] edge_grpo.entropy_grad=true" in run.output  # the loss was installed on the actor
    # updated at least once (a step of groups that all share one reward has zero advantages: legal, no update)
    assert max(values["actor/grad_norm"] for values in steps.values()) > 0
    for values in steps.values():
        assert math.isfinite(values["actor/grad_norm"]) and math.isfinite(values["actor/pg_loss"])
        # one mini-batch per step: the update's H_i(θ) is the old-log-prob pass's H_i(old), recomputed with
        # gradients on the other side (masked mean, same temperature), so their ratio is 1 up to float noise
        assert values["edge_grpo/entropy_ratio_mean"] == pytest.approx(1.0, abs=1e-4)
        assert values["edge_grpo/entropy_grad_fallback_frac"] == 0.0
        assert not any("entropy_grad_raw" in key for key in values)  # only the summaries reach the logger
        assert "edge_grpo/factor_mean" in values and values["verl_ext/frac_adv_modified"] > 0


def test_v1_trainer_entropy_grad_with_two_mini_batches(run_main):
    # the per-response fields travel through TransferQueue; the second mini-batch sees updated weights
    run = run_main("trainer.use_v1=true", "algorithm.edge_grpo.entropy_grad=true",
                   "actor_rollout_ref.actor.ppo_mini_batch_size=2",
                   "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4")
    steps = run.metrics()
    assert sorted(steps) == [1, 2], steps.keys()
    assert "[verl_ext] edge_grpo.entropy_grad=true" in run.output
    assert max(values["actor/grad_norm"] for values in steps.values()) > 0
    for values in steps.values():
        assert math.isfinite(values["actor/grad_norm"]) and math.isfinite(values["actor/pg_loss"])
        assert 0.5 < values["edge_grpo/entropy_ratio_mean"] < 1.5
        assert values["edge_grpo/entropy_grad_fallback_frac"] == 0.0
