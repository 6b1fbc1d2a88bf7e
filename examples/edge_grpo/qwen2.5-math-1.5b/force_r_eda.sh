#!/usr/bin/env bash
# EDGE-GRPO paper (arXiv 2507.21848), Table 1, Qwen2.5-Math-1.5B, row "+Force-R & EDA" (paper: 42.44 avg).
# +Force-R & EDA: Force-R with the entropy-driven advantage.
# Data first: python -m verl_ext.data.deepscaler --input deepscaler_hard-1k.json --output data/train
#             python -m verl_ext.data.eval_suites --input evaluation_suite --output data/eval
# Variables with their defaults (MODEL, TRAIN_FILE, VAL_DIR, BATCH, N_GPUS, ...): ../defaults.sh; DRY_RUN=1 prints
# the checked config and trains nothing. Extra arguments are Hydra overrides and go last.
# Afterwards: python -m verl_ext.evaluate --model $MODEL --checkpoint $RUN_DIR/checkpoints/global_step_<last> --data $VAL_DIR
set -euo pipefail
MODEL="${MODEL:-Qwen/Qwen2.5-Math-1.5B}"
source "$(dirname "${BASH_SOURCE[0]}")/../defaults.sh"
vx_run_overrides verl_ext_edge_grpo "force_r_eda_$(vx_model_tag "$MODEL")_${BATCH}_seed${SEED}"  # names, loggers, paths, seed

vx_launch --config-name edge_grpo_paper \
    algorithm.adv_estimator=edge_grpo \
    algorithm.gec.enable=true \
    algorithm.gec.mode=force_reflect \
    actor_rollout_ref.model.path="$MODEL" \
    data.train_files="$TRAIN_FILE" \
    data.val_files="[$VAL_FILES]" \
    data.train_batch_size="$TRAIN_BATCH_SIZE" \
    reward.custom_reward_function.path=pkg://verl_ext.rewards.math \
    reward.custom_reward_function.name=compute_score \
    +reward.custom_reward_function.reward_kwargs.scale=original \
    trainer.n_gpus_per_node="$N_GPUS" \
    trainer.nnodes="$NNODES" \
    trainer.test_freq="$TEST_FREQ" \
    trainer.save_freq="$SAVE_FREQ" \
    "${RUN_OVERRIDES[@]}" \
    "$@"
